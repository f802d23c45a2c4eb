"""What every decoder family gives the generator engine, and how a checkpoint picks its family.

A decoder model runs one iteration: `forward(batch, cache)` takes a DecoderBatch (the packed
tokens of every scheduled sequence, see decoder/batch.py), writes their keys and values into
the paged cache and returns logits (fp32 unless asked otherwise) for the rows the batch asks for.
"""
from __future__ import annotations

import dataclasses

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.decoder.state_cache import StateCache
from tritonformer.backend.checkpoints.weights import weight_getter


class DecoderModel:
    def __init__(self, config, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype):
        """`config` has num_layers, num_kv_heads, head_dim, vocab_size, max_position_embeddings and
        eos_token_ids; returns the family's weight getter over `state`."""
        self.config = config
        self.device = device
        self.dtype = dtype
        self.weight = weight_getter(state, device, dtype)
        self.tp = None  # a TensorParallelGroup where the model is one rank's share
        self.output_head_b = None  # the output head's bias, where the family has one
        self.num_kv_layers = config.num_layers  # layers with keys and values in the cache (a hybrid's attending ones)

    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        """See `logits` for `fp32_logits`."""
        raise NotImplementedError

    def set_output_head(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """The vocabulary projection `[vocab, hidden]` (and its bias `[vocab]` where it has one:
        Phi's), its rows padded with zeros to a multiple of 64: cuBLAS has no fast kernel for an
        odd N (GPT-2's 50257 took a 4x slower path on an H100); the padded logits are sliced off
        in `logits`."""
        self.vocab_size = weight.shape[0]
        pad = -weight.shape[0] % 64
        self.output_head = torch.cat([weight, weight.new_zeros(pad, weight.shape[1])]) if pad else weight
        self.output_head_b = torch.cat([bias, bias.new_zeros(pad)]) if pad and bias is not None else bias

    def logits(self, x: torch.Tensor, fp32: bool = True) -> torch.Tensor:
        """Next-token logits `[rows, vocab]` of final hidden states `[rows, hidden]`: an fp32
        copy, or with `fp32=False` the projection's own output, in the model's dtype and with
        the padded row stride (for a greedy decode graph, whose argmax reads it as it is: the
        copy alone took 10 us at batch 64).

        Through `kernels.linear_act`, which routes by rows and shape: a decode row or two runs
        the prefetching GEMV (GPT-2's head 31.0 -> 26.1 us, Llama-1B's 188 -> 167 us on the
        H100, `tools/gpu/time_small_gemm.py --layers "lm head"`), more rows the small GEMM where
        K is short (GPT-2's) or cuBLAS. Soft-capped where the config says (`final_softcap`: Gemma 2,
        Gemma 3n): cap * tanh(logits / cap), in the projection's dtype as Hugging Face computes it,
        in place; with `final_softcap_fp32` (Beam, whose transformers model caps in fp32: a 16-bit tanh
        rounds near the cap) in fp32 from the projection's output, fp32 whatever `fp32` says."""
        logits = kernels.linear_act(x, self.output_head, self.output_head_b)
        if self.tp is not None:  # each rank holds a slice of the vocabulary: all of it on every rank
            logits = self.tp.gather_columns(logits)
        logits = logits[:, : self.vocab_size]
        cap = getattr(self.config, "final_softcap", None)
        if cap is not None and getattr(self.config, "final_softcap_fp32", False):
            return torch.tanh(logits.float() / cap) * cap
        if cap is not None:
            logits.div_(cap).tanh_().mul_(cap)
        return logits.float() if fp32 else logits

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        c = self.config
        return PagedKVCache(self.num_kv_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, self.device,
                            self.dtype)

    def new_state_cache(self, num_slots: int) -> StateCache | None:
        """A hybrid model's per-sequence recurrent state (decoder/state_cache.py), `num_slots`
        sequences' worth; None for a model whose layers all attend."""
        return None

    def kv_bytes_per_token(self) -> int:
        c = self.config
        return 2 * self.num_kv_layers * c.num_kv_heads * c.head_dim * self.dtype.itemsize


def eos_ids(cfg: dict) -> tuple[int, ...]:
    """The checkpoint's end-of-sequence ids: config.json's `eos_token_id` (one or a list)."""
    eos = cfg.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))


# model_type -> the module of its family under backend/models/. A family module has
# `from_hf(config: dict) -> its config` and `MODEL`, the class built from that config and the
# checkpoint's tensors; it may have `adapt(config, state) -> (config, state)` for checkpoints that
# wrap the decoder (a multimodal model's text part). Adding a family: one file and one line here.
DECODER_FAMILIES = {
    "llama": "llama",
    "mistral": "mistral",
    "ministral": "mistral",
    "mistral3": "mistral",
    "ministral3": "mistral",
    "mixtral": "mixtral",
    "phimoe": "phimoe",  # (Phi-3.5-MoE: the sparsemixer router)
    "mimo_v2_flash": "mimo_v2_flash",  # (windowed layers with sinks and twice the KV heads, v heads narrower)
    "dbrx": "dbrx",
    "cohere2_moe": "cohere2_moe",
    "hy_v3": "hy_v3",
    "hy_v4": "hy_v4",  # (hyper-connection streams, sparse latent attention run sparse, dense and MoE layers)
    "deepseek_v4": "deepseek_v4",  # (Sinkhorn hyper-connections, windowed + compressed attention, hash / top-k MoE)
    "llama4_text": "llama4",
    "llama4": "llama4",  # (Llama-4-Scout / Maverick's multimodal checkpoint: its text part)
    "mllama_text_model": "mllama",  # (Llama 3.2 Vision's text model: its self-attention layers, text-only)
    "mllama": "mllama",  # (Llama 3.2 Vision's multimodal checkpoint: its text model, cross-attention layers skipped)
    "emu3_text_model": "emu3",  # (Emu3's text model: Llama's block)
    "emu3": "emu3",  # (Emu3-Chat / Emu3-Gen's multimodal checkpoint: its text model, the VQ-GAN unread)
    "aria_text": "aria",  # (Aria's language model: Llama's block, MoE layers with shared experts)
    "aria": "aria",  # (rhymes-ai/Aria's multimodal checkpoint: its text model, the vision tower unread)
    "flint": "flint",
    "minimax_m2": "minimax_m2",
    "minimax_m3_vl_text": "minimax_m3",  # (MiniMax-M3's text model: block-sparse attention run sparse)
    "minimax_m3_vl": "minimax_m3",  # (the multimodal checkpoint's text model, its towers unread)
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "qwen3_next": "qwen3_next",  # (hybrids: gated DeltaNet layers beside full attention)
    "qwen3_5": "qwen3_5",  # (Qwen3.5's multimodal checkpoints: the text model, text in and out)
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
    "qwen4_exp_text": "qwen4_exp",  # (Qwen3.5-MoE's hybrid in gated residual streams, hashed n-gram PLE, QSA attention)
    "qwen4_exp": "qwen4_exp",  # (the multimodal checkpoint's text model, its vision tower unread)
    # (multimodal Qwen-VL checkpoints and their text models' own types: the text model, text in and out)
    "qwen2_vl": "qwen_vl",
    "qwen2_vl_text": "qwen_vl",
    "qwen2_5_vl": "qwen_vl",
    "qwen2_5_vl_text": "qwen_vl",
    "qwen3_vl": "qwen_vl",
    "qwen3_vl_text": "qwen_vl",
    "qwen3_vl_moe": "qwen_vl",
    "qwen3_vl_moe_text": "qwen_vl",
    "mellum": "mellum",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "vaultgemma": "vaultgemma",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",
    "gemma3n_text": "gemma3n",  # (AltUp streams, LAuReL, per-layer inputs, KV shared by the last layers)
    "gemma3n": "gemma3n",  # (Gemma 3n's multimodal checkpoint: its text model)
    "gemma4_text": "gemma4",  # (per-layer head shapes, values from keys, per-layer inputs, shared KV, experts)
    "gemma4": "gemma4",  # (Gemma 4's multimodal checkpoint: its text model)
    "gemma4_unified_text": "gemma4",  # (Gemma 4's layers without per-layer inputs or experts)
    "gemma4_unified": "gemma4",  # (Gemma 4 unified's multimodal checkpoint: its text model)
    "phi3": "phi3",
    "phi4_multimodal": "phi4_multimodal",  # (Phi-4-multimodal's language model, text-only: base weights, no adapters)
    "granite": "granite",
    "granitemoe": "granitemoe",
    "granitemoeshared": "granitemoe",
    "jetmoe": "jetmoe",  # (mixtures of attention heads and of MLP experts)
    "granite_swa": "granite_swa",
    "hyperclovax": "hyperclovax",
    "granitemoe_swa": "granite_swa",
    "granitemoehybrid": "granitemoehybrid",
    "bamba": "bamba",
    "nemotron_h": "nemotron_h",
    "falcon_h1": "falcon_h1",
    "kimi_linear": "kimi_linear",  # (Kimi Delta Attention layers beside latent attention without a rotary)
    "bailing_hybrid": "bailing_hybrid",  # (Ling 3.0: bounded-gate KDA layers beside head-gated latent attention)
    "minimax": "minimax",  # (lightning attention layers beside softmax attention, experts in every layer)
    "mamba": "mamba",  # (attention-free: Mamba-1 layers only, no KV cache layers)
    "falcon_mamba": "mamba",
    "xlstm": "xlstm",  # (attention-free: mLSTM layers with a matrix memory per head, each followed by an MLP)
    "rwkv": "rwkv",  # (attention-free: RWKV-4's time and channel mixes, their state per sequence)
    "mamba2": "mamba2_lm",  # (attention-free: Mamba-2 layers only)
    "jamba": "jamba",  # (hybrid: Mamba-1 layers beside attending ones)
    "zamba2": "zamba2",  # (Mamba-2 layers fed by shared transformer blocks)
    "zamba": "zamba",  # (Mamba-1 layers fed by one shared transformer block)
    "smollm3": "smollm3",
    "seed_oss": "seed_oss",
    "ernie4_5": "ernie4_5",
    "ernie4_5_moe": "ernie4_5_moe",
    "helium": "helium",
    "glm": "glm",
    "glm4": "glm",
    "glm4_moe": "glm4_moe",
    "glm4v": "glm_v",  # (GLM-4.1V / GLM-4.5V: the text model, text in and out)
    "glm4v_text": "glm_v",
    "glm4v_moe": "glm_v",
    "glm4v_moe_text": "glm_v",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v32": "deepseek_v32",  # (DeepSeek Sparse Attention served dense, up to index_topk tokens a sequence)
    "glm_moe_dsa": "glm_moe_dsa",  # (GLM-5: DeepSeek-V3.2's block at GLM's sizes, likewise)
    "dots3_note_text": "dots3",  # (indexed, sliding and plain latent-attention layers, each of its own shape)
    "dots3_note": "dots3",  # (Dots3's multimodal checkpoint: its text model)
    "kimi_k2": "deepseek_v3",  # (Kimi K2: DeepSeek-V3's architecture under its own name)
    "longcat_flash": "longcat_flash",  # (two latent-attention sublayers a layer, a shortcut MoE with identity experts)
    "axk1": "axk1",  # (A.X-K1: DeepSeek-V3 with a norm after each expert block)
    "axk2": "axk2",  # (A.X-K2: DeepSeek-V3.2 with gated norms and a gated query projection, served dense likewise)
    "laguna": "laguna",  # (AFMoE's attention with a softplus gate, a rotary per layer type, sigmoid experts)
    "beam": "beam",  # (AFMoE's attention, a gate bias per head, NoPE layers' scaled queries, residual adds by depth)
    "kolibri1": "kolibri1",  # (EXAONE 4's hybrid attention, GLM-4's sandwich, experts chosen by logit)
    "deepseek_v2": "deepseek_v2",
    "glm4_moe_lite": "glm4_moe_lite",
    "youtu": "youtu",
    "mistral4": "mistral4",  # (Mistral Small 4: latent attention, softmax experts, Llama 4's query scaling)
    "minicpm3": "minicpm3",  # (latent attention with muP's scalars)
    "dots1": "dots1",
    "solar_open": "solar_open",
    "olmo": "olmo",
    "olmo2": "olmo2",
    "olmo3": "olmo2",
    "olmo_hybrid": "olmo_hybrid",  # (OLMo 3's attention beside gated DeltaNet layers)
    "olmoe": "olmoe",
    "flex_olmo": "flex_olmo",
    "hunyuan_v1_dense": "hunyuan",
    "hunyuan_v1_moe": "hunyuan_moe",
    "exaone4": "exaone4",
    "exaone_moe": "exaone_moe",
    "cohere": "cohere",
    "cohere2": "cohere",
    "cohere_compass_text": "cohere_compass",  # (Cohere2's block, rotate-half rotary with a rope per layer type)
    "cohere_compass": "cohere_compass",  # (North-Micro-Vision's multimodal checkpoint: its text model)
    "gpt_oss": "gpt_oss",
    "starcoder2": "starcoder2",
    "internlm3": "llama",  # (Llama's block under its own name)
    "iquestcoder": "llama",
    "cwm": "cwm",
    "stablelm": "stablelm",
    "nemotron": "nemotron",
    "apertus": "apertus",
    "arcee": "arcee",
    "afmoe": "afmoe",
    "zaya": "zaya",  # (CCA convolutions into attention, residual scalings, an MLP router carried across layers)
    "inkling_text": "inkling",  # (relative logits, no rotary; short convolutions around attention and the MLP)
    "inkling_mm_model": "inkling",  # (Inkling's multimodal checkpoint: its text model, the towers unread)
    "inkling2_text": "inkling2",  # (Inkling with block attention residuals, sinks, gates, dynamic convolutions)
    "lfm2": "lfm2",
    "lfm2_moe": "lfm2_moe",
    "lfm3": "lfm3",  # (LFM2 with windowed layers, sandwich norms and per-head attention gates)
    "recurrent_gemma": "recurrent_gemma",  # (RG-LRU recurrent layers beside local multi-query attention)
    "jais2": "jais2",
    "phi": "phi",
    "persimmon": "persimmon",
    "gpt_neox": "gpt_neox",
    "gpt_neox_japanese": "gpt_neox_japanese",  # (GPT-NeoX's sequential block unbiased, the last layer's dense_bias)
    "falcon": "falcon",
    "bloom": "bloom",  # (ALiBi, a LayerNorm on the embeddings)
    "mpt": "mpt",  # (ALiBi, LayerNorms without biases)
    "gpt_bigcode": "gpt_bigcode",
    "opt": "opt",
    "gptj": "gptj",
    "codegen": "codegen",
    "gpt_neo": "gpt_neo",
    "biogpt": "biogpt",
    "xglm": "xglm",  # (OPT's block with fairseq's sinusoidal positions)
    "nanochat": "nanochat",
    "gpt2": "gpt2",
    "gpt-sw3": "gpt2",  # (GPT-SW3: transformers maps it to GPT-2's config and model)
    "openai-gpt": "openai_gpt",  # (GPT-1: GPT-2's tensors in BERT's post-LN block, no final norm)
    "ctrl": "ctrl",  # (a pre-LN block with sinusoidal positions added to scaled embeddings, a head with a bias)
    "cpmant": "cpmant",  # (virtual prompt tokens, a segment and bucketed position bias, the prompt attending both ways)
    "bitnet": "bitnet",  # (BitNet b1.58: sub norms, ternary linears with per-token int8 activations)
    "diffllama": "diffllama",  # (differential attention: two maps over halves of the heads, served as one over 2d)
    "modernbert-decoder": "modernbert_decoder",  # (Ettin: an embedding norm, a prediction head before the projection)
    "doge": "doge",  # (dynamic mask attention: a bias per key from its values, kept in the cache beside the key)
    "hrm_text": "hrm_text",  # (HRM-Text: two stacks run recurrently, each invocation a cache layer of its own)
}


def load_decoder(config: dict, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 max_model_len: int | None = None, tp=None, quantization: str = "none") -> DecoderModel:
    """The decoder family named by the checkpoint's `model_type`, built on `device` in `dtype`.
    `max_model_len` caps the longest sequence (prompt + output) below the checkpoint's
    max_position_embeddings: rotary tables, decode graphs and the KV cache's guarantee of one
    whole sequence are sized by it. `tp` (a TensorParallelGroup): build this rank's share.
    `quantization` ("none" | "fp8", backend/quantization.py): FP8 linears; an FP8 checkpoint
    loads as FP8 whatever it says."""
    from tritonformer.backend import quantization as quant

    model_type = config.get("model_type", "llama")
    family, config, state = decoder_family(config, state)
    family_config = family.from_hf(config)
    if (quant.parse(quantization) != "none" or quant.is_fp8_checkpoint(state)) and (
            not hasattr(family_config, "names") or getattr(family_config, "moe", None)
            or getattr(family_config, "mla", None) or getattr(family_config, "mixers", None)
            or getattr(family_config, "fp8_refused", False)):
        raise ValueError(f"FP8 linears are not supported for model_type {model_type!r} (supported: the dense families "
                         f"built on the shared decoder, transformer.py, without latent attention or recurrent layers)")
    state, quantize = quant.prepare(state, quantization, device, dtype, tensor_parallel=tp is not None)
    if max_model_len is not None:
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {max_model_len}")
        if hasattr(family_config, "check_max_model_len"):  # (a family whose longest sequence is a hard limit: DSA's)
            family_config.check_max_model_len(max_model_len)
        longest = family_config.max_position_embeddings
        family_config = dataclasses.replace(family_config, max_position_embeddings=min(longest, max_model_len))
    if tp is None:
        model = family.MODEL(family_config, state, device, dtype)
        return quant.quantize_model(model) if quantize else model
    _check_split(config, family_config, tp)
    model = family.MODEL(family_config, state, device, dtype, tp=tp)
    return quant.quantize_model(model) if quantize else model


def check_tensor_parallel(config: dict, world: int) -> None:
    """Raise the load's error now where the checkpoint of `config` cannot split `world` ways:
    before any rank joins a process group or any worker starts."""
    from tritonformer.backend.parallel.group import TensorParallelGroup

    family, config, _ = decoder_family(config, {})
    _check_split(config, family.from_hf(config), TensorParallelGroup(0, world))


def decoder_family(config: dict, state: dict):
    """(the family module of the checkpoint's `model_type`, its config and tensors as the family
    reads them)."""
    import importlib

    if "model_type" not in config and "ssm_cfg" in config:  # (state-spaces' own format: Mamba, Mamba-2)
        from tritonformer.backend.models.mamba1 import mamba_ssm_config

        config = mamba_ssm_config(config)
    model_type = config.get("model_type", "llama")
    if model_type not in DECODER_FAMILIES:
        raise ValueError(f"unsupported decoder model_type {model_type!r} (supported: {', '.join(DECODER_FAMILIES)})")
    family = importlib.import_module(f"tritonformer.backend.models.{DECODER_FAMILIES[model_type]}")
    if hasattr(family, "adapt"):
        config, state = family.adapt(config, state)
    return family, config, state


def _check_split(config: dict, spec, tp) -> None:
    """The split a tensor-parallel rank makes of `spec` (the family's config) is possible."""
    if hasattr(spec, "check_split"):  # a family with a model of its own that splits (Gemma 3n): its own checks
        spec.check_split(tp)
        return
    if not hasattr(spec, "names"):  # the shared decoder's spec (transformer.py) splits; GPT-2's does not
        raise ValueError(f"tensor parallelism is not supported for model_type {config.get('model_type', 'llama')!r}")
    if spec.mixers:  # (their heads divide, or the family's mixers do not split: it says which)
        spec.split_mixers(tp)
    if spec.attends:
        tp.part(spec.num_heads, "attention heads")
        tp.part(spec.num_kv_heads, "KV heads")
    tp.part(spec.intermediate_size, "MLP columns (intermediate_size)")
    if spec.moe:
        tp.part(spec.moe.intermediate_size, "expert columns (moe_intermediate_size)")
        tp.part(spec.moe.shared_intermediate_size, "shared expert columns")
