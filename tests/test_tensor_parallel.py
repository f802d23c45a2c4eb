"""Tensor parallelism on the CPU (gloo): a model split over two ranks, each a process reading its
own slices of the checkpoint, gives the tokens and the logits of the whole model on one rank,
through the same engine (rank 0 schedules and samples, the worker mirrors its runner)."""
from __future__ import annotations

import contextlib
import time

import pytest
import torch
import transformers

from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
from tritonformer.backend.decoder.batch import BatchEntry
from tritonformer.backend.decoder.build import EngineOptions, build_engine
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.backend.parallel.group import TensorParallelGroup
from tritonformer.backend.parallel.workers import ShardSource, start_ranks
from tritonformer.client.model_shapes import shrunk

CPU = torch.device("cpu")
PROMPTS = [[5, 9, 217, 33, 2, 319], [100, 3], list(range(20, 61)), [7]]  # ids of both ranks' embedding rows
NEW_TOKENS = 32


class Collect:
    def __init__(self):
        self.ids: dict = {}

    def send(self, handle, outputs, error, final):
        assert error is None, error
        self.ids.setdefault(handle, []).extend(outputs["output_ids"].tolist())

    def is_cancelled(self, handle):
        return False


class _Ids:
    def decode(self, ids, **kwargs) -> str:
        return " ".join(map(str, ids))


def _checkpoint(tmp_path, name: str, hidden: int = 128, vocab: int = 320, heads: int = 8, changes: dict | None = None):
    cfg = {**shrunk(name, layers=2, hidden=hidden, heads=heads, vocab=vocab), **(changes or {})}
    config = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(3)
    # (Mistral 4's causal LM, which transformers' Auto class maps as a multimodal one only)
    mistral4 = cfg["model_type"] == "mistral4"
    model = (transformers.Mistral4ForCausalLM._from_config(config, dtype=torch.float32) if mistral4
             else transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)).eval()
    with torch.no_grad():  # norms away from 1, so a norm taken whole vs split would show (and the
        # biases and gpt-oss's sinks away from 0, so one split or added twice would)
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith(("bias", "sinks")):
                p.add_(torch.randn_like(p) * 0.1)
            if pname.endswith("router.gate.weight") and not p.any():  # (AFMoE's router starts at zero)
                p.add_(torch.randn_like(p) * 0.1)
            if pname.endswith(("act_fn.alpha_p", "act_fn.alpha_n")):  # (Apertus's xIELU scalars, whole on each rank)
                p.add_(torch.randn_like(p))
            if pname.endswith("altup.correct_output_scale"):  # (Gemma 3n's starts at zero: the per-layer inputs muted)
                p.add_(torch.randn_like(p))
    folder = tmp_path / name
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _serve(model, workers=None, prompts=PROMPTS):
    on_gpu = model.device.type == "cuda"  # there: the decode CUDA graphs, NCCL captured in them
    options = EngineOptions(max_running_sequences=8, max_tokens_per_iteration=64, kv_cache_tokens="1024",
                            kv_block_size=8, cuda_graphs=on_gpu)
    sink = Collect()
    engine = build_engine(model, _Ids(), sink, options, workers=workers)
    if on_gpu:
        engine.runner.warm_up()
    engine.admit([engine.new_sequence(i, p, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True), True)
                  for i, p in enumerate(prompts)])
    while engine.has_work():
        engine.step()
    # One more forward, a prefill of every prompt at once: its logits, compared below.
    entries, block = [], 0
    recurrent = engine.runner.cache.state is not None  # (hybrid models: a state slot each, zeroed as they start)
    for i, p in enumerate(prompts):
        blocks = list(range(block, block + -(-len(p) // 8)))
        block += len(blocks)
        entries.append(BatchEntry(p, 0, blocks, True, i if recurrent else -1))
    logits = engine.runner.run(entries).logits
    return [sink.ids[i] for i in range(len(prompts))], logits, engine.runner


# Every family: separate projections (Llama); fused qkv / gate_up (Phi-3); a scaled, tied embedding
# with sandwich norms and soft-capping (Gemma 2); Q/K/V biases, split with their heads (Qwen2.5,
# 14 heads: 2 KV heads at its ratio of 7); per-head Q/K norms (Qwen3); local and global layers
# with windows (Gemma 3); a sliding window (Mistral); a partial rotary, its Q and K dims reordered
# within each rank's heads (Phi-4-mini); muP scalars folded into each rank's weights (Granite);
# a layer without rotary (SmolLM3); a rotary of neighbouring pairs over half of each head, 2 KV
# heads at its ratio of 16 (GLM-4); mixture-of-experts layers, each rank with its columns of every
# expert (Mixtral, Granite MoE, GLM-4.5: its router's bias whole) and of the shared expert (Qwen2-MoE);
# norms only after attention and the MLP, a local and a NoPE global layer (EXAONE 4 on OLMo 2's sizes);
# attention and the MLP side by side, their partial sums reduced together (Command R7B, likewise);
# attention sinks split with their heads, the output projection's and the experts' down biases
# added by one rank (gpt-oss); LayerNorms with biases, a plain MLP whose down bias one rank adds
# (Starcoder2); the same with an fp32 router and an ungated shared MLP (Hunyuan MoE, on OLMo 2's sizes);
# a global layer and a windowed one, 12 heads for 2 KV heads at its ratio of 6 (CWM); sink logits split with
# their heads, an unrotated global layer and a windowed one at a rope base of its own (Granite SWA, dense and MoE);
# LayerNorms of no tensors, the attention's biases (OLMo); the embedding normalised and each q / k head's halves
# swapped at load by every rank for its rows, a tied head kept apart (nanochat); post norms scaled at load on
# every rank (HyperCLOVA X); a windowed dense layer and a global MoE one with their ropes, 16 heads for 2 KV
# heads at its ratio of 8 (Mellum); a dense layer of its own width beside a MoE one whose shared expert, split, is
# halved at load on every rank (Cohere2 MoE); a windowed dense layer and a NoPE MoE one with a shared expert, each
# rank's heads' sinks (Flint).
CHANGES = {"llama4": ("llama-4-scout", {"attention_chunk_size": 16, "interleave_moe_layer_step": 2}),  # (chunks)
           "exaone-4": {"model_type": "exaone4", "sliding_window": 8, "sliding_window_pattern": 2},
           "exaone-moe": {"model_type": "exaone_moe", "sliding_window": 8, "sliding_window_pattern": 2, "num_experts": 8,
                          "num_experts_per_tok": 2, "moe_intermediate_size": 80, "first_k_dense_replace": 1},
           "command-r7b": {"model_type": "cohere2", "sliding_window": 8,
                           "layer_types": ["sliding_attention", "full_attention"]},
           "hunyuan-7b": {"model_type": "hunyuan_v1_dense", "head_dim": 16,  # q/k norms on each rank's rotated heads
                          "rope_parameters": {"rope_type": "dynamic", "alpha": 1e3, "factor": 1.0, "rope_theta": 1e4}},
           "starcoder-mha": ("starcoder-15b", {"multi_query": False}),  # learnt positions on every rank
           "granite-swa": ("granite-swash-2b", {"layer_rope_theta": [0, 500.0]}),
           "granitemoe-swa": ("granitemoe-swa-3b", {"layer_rope_theta": [0, 500.0]}),
           "olmo": ("olmo-7b", {"attention_bias": True}),
           "nanochat": ("nanochat-d32", {"tie_word_embeddings": True, "attention_bias": True,
                                         "num_key_value_heads": 2}),
           "hyperclovax": ("hyperclovax", {"residual_multiplier": 0.5, "logits_scaling": 0.5,
                                           "num_key_value_heads": 2}),
           "mellum": ("mellum2-12b-a2.5b", {"layer_types": ["sliding_attention", "full_attention"],
                                            "mlp_layer_types": ["dense", "sparse"]}),
           "cohere2-moe": ("command-a-plus", {"layer_types": ["sliding_attention", "full_attention"],
                                              "mlp_layer_types": ["dense", "sparse"], "num_shared_experts": 1,
                                              "prefix_dense_intermediate_size": 200, "num_key_value_heads": 2}),
           "flint": ("flint", {"layer_types": ["sliding_attention", "full_attention"], "mlp_only_layers": [0]}),
           # AFMoE: each rank's heads' rows of the attention's output gate, a windowed dense layer, a NoPE MoE one
           "trinity-mini": ("trinity-mini", {"num_dense_layers": 1, "global_attn_every_n_layers": 2}),
           # latent attention: each rank's heads' rows of q_b and kv_b (q_proj without a query latent) and columns of
           # o_proj, the latent projections whole, o_proj's bias added by one rank (DeepSeek-V3, DeepSeek-V2-Lite)
           "deepseek-v3": ("deepseek-v3", {"first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
                                           "attention_bias": True}),
           "deepseek-v2-lite": ("deepseek-v2-lite", {}),
           # DeepSeek Sparse Attention served dense (DeepSeek-V3.2, GLM-5): latent attention split as above, the
           # indexers' tensors checked on every rank and not read
           "deepseek-v3.2-moe": ("deepseek-v3.2", {"first_k_dense_replace": 1, "attention_bias": True}),
           "glm-5-moe": ("glm-5", {"first_k_dense_replace": 1}),
           # A.X-K1: DeepSeek-V3's split (above) with the expert layers' norm after the MLP whole on each rank, after
           # the all-reduce; its published norm names (beside the layer, as save_pretrained writes them)
           "a.x-k1-biases": ("a.x-k1", {"attention_bias": True}),
           # A.X-K2: DeepSeek-V3.2's split with each rank's heads' query and gate rows of q_gate_proj (its output
           # gate per element with its heads), the gated norms whole on each rank after the all-reduce
           "a.x-k2-biases": ("a.x-k2", {"attention_bias": True}),
           # Kolibri-1: heads, q / k norms and sandwich norms as Qwen3's and GLM-4's split, its experts by columns with
           # the router whole (each rank chooses by logit + bias the same way), a windowed layer and a NoPE one
           "kolibri-1-kv2": ("kolibri-1", {"num_key_value_heads": 2, "layer_types": ["sliding_attention",
                                                                                   "full_attention"]}),
           # Laguna: the softplus gate's rows (a per-head gate's repeated over its head's columns) split by heads as
           # q's, the full layer's q / k rows in the kernels' order within each head, experts by columns; its
           # published names (the choice bias under `mlp.experts`, `mlp.shared_expert`), as save_pretrained writes them
           "laguna-xs.2-kv2-biases": ("laguna-xs.2", {"num_key_value_heads": 2, "attention_bias": True}),
           # Beam: the output gate's rows and its bias per head split by heads as q's, experts by columns, each
           # sublayer's output summed over the ranks before its post-norm and depth-scaled residual add
           "beam-kv2-biases": ("beam-1.0-501b-a23b", {"num_key_value_heads": 2, "attention_bias": True}),
           # Recurrent mixers, each rank with its heads' (or channels') rows of the input projection and the
           # convolution, their state and their columns of the output projection: gated DeltaNet with Qwen3-Next's
           # grouped projections (and Qwen3.5's flat ones, experts beside them); Mamba-2 with its B / C groups split
           # (Nemotron-H; Mamba-Codestral, attention-free) or one group whole on each rank and its gated norm's mean
           # square summed over the ranks (Bamba, with projection biases; Falcon-H1 beside attention with its muP
           # vector on each rank's rows, the norm before the gate); LFM2's short convolutions by channel, with biases;
           # Kimi Linear's KDA by heads (the gates' low-rank first projections whole) beside latent attention;
           # Mamba-1 by channels, x_proj's partial dt / B / C summed over the ranks (Jamba with its weighted norms
           # of dt / B / C, biases, experts; Falcon-Mamba, attention-free, its weightless norms)
           "jamba": ("jamba-mini", {"mamba_proj_bias": True}),
           "qwen3-next": ("qwen3-next-80b-a3b", {"layer_types": ["linear_attention", "full_attention"],
                                                 "num_key_value_heads": 2}),
           "qwen3.5-moe": ("qwen3.5-35b-a3b", {"layer_types": ["linear_attention", "full_attention"],
                                               "num_key_value_heads": 2}),
           "bamba-bias": ("bamba-9b", {"mamba_proj_bias": True}),
           "falcon-h1-norm": ("falcon-h1-0.5b", {"mamba_rms_norm": True, "mamba_norm_before_gate": True,
                                                 "projectors_bias": True}),
           "lfm2-bias": ("lfm2-1.2b", {"conv_bias": True}),
           "minimax": ("minimax-text-01", {"num_key_value_heads": 2}),  # (lightning heads split, their norm summed)
           # Zamba2: Mamba-2 layers by heads (one group whole, its norm summed over the ranks) and the two shared
           # blocks' attention (GQA) and MLP split, each hybrid layer's own linear whole on its rank's partial sums;
           # and a hybrid layer first, one block run twice with q / k / v adapters (their B's rows split), the rotary,
           # the MLP's biases (down's added once), 2 groups of B / C split, an untied head (and blocks)
           "zamba2": ("zamba2-2.7b", {"num_hidden_layers": 3, "layers_block_type": ["mamba", "hybrid", "hybrid"],
                                      "num_key_value_heads": 2, "initializer_range": 0.1}),
           "zamba2-adapters": ("zamba2-2.7b", {
               "num_hidden_layers": 3, "layers_block_type": ["hybrid", "mamba", "hybrid"], "num_mem_blocks": 1,
               "use_shared_attention_adapter": True, "use_mem_rope": True, "add_bias_linear": True,
               "mamba_ngroups": 2, "tie_word_embeddings": False, "initializer_range": 0.1}),
           # Gemma 3n: attention by heads (the last layers reading the first layers' KV heads on each rank), the MLPs
           # by columns (a sparse gate's mean and spread summed over the ranks), the per-layer table by vocabulary rows;
           # AltUp, LAuReL and the per-layer gates whole
           "gemma3n": ("gemma-3n-e2b", {"initializer_range": 0.05}),
           # RecurrentGemma: the RG-LRU by heads (blocks of channels: their gates, taps, rates and state), linear_out's
           # bias added by one rank; 2 KV heads (the published models' one does not split)
           "recurrent-gemma": ("recurrentgemma-2b", {"num_key_value_heads": 2}),
           "minimax-m2-kv2": ("minimax-m2", {"num_key_value_heads": 2}),
           # ModernBERT decoder: the embedding norm and the prediction head whole on every rank, the projection's bias
           # by vocabulary rows, the GeGLU's [a | g] halves split by columns, Wo's and mlp.Wo's biases added once
           "modernbert-decoder": ("ettin-decoder-150m", {"local_attention": 16, "cls_token_id": 1, "sep_token_id": 2,
                                                         "norm_bias": True, "classifier_bias": True,
                                                         "attention_bias": True, "mlp_bias": True}),
           # ALiBi: each rank its heads' slopes (BLOOM's, MPT's, Falcon-RW's over sqrt(head_dim))
           "falcon-rw-alibi": ("falcon-7b", {"alibi": True, "multi_query": False, "parallel_attn": False,
                                             "bias": True}),
           "hunyuan-moe": {"model_type": "hunyuan_v1_moe", "head_dim": 16, "num_experts": 8, "moe_topk": 2,
                           "rope_parameters": {"rope_type": "dynamic", "alpha": 1e3, "factor": 1.0, "rope_theta": 1e4}}}


@pytest.mark.parametrize("family, heads", [("llama-3.1-8b", 8), ("phi-3-mini", 8), ("gemma-2-9b", 8),
                                           ("qwen2.5-7b", 14), ("qwen3-8b", 8), ("gemma-3-1b", 8),
                                           ("mistral-7b", 8), ("phi-4-mini", 8), ("granite-3.1-8b", 8),
                                           ("smollm3-3b", 8), ("glm-4-9b", 32),
                                           ("gemma-7b", 8), ("mixtral-8x7b", 8), ("qwen1.5-moe-a2.7b", 8),
                                           ("granite-3.1-3b-a800m", 8), ("glm-4.5-air", 24), ("exaone-4", 8),
                                           ("command-r7b", 8), ("hunyuan-7b", 8), ("gpt-oss-20b", 16),
                                           ("ernie-4.5-21b-a3b", 10), ("dots.llm1", 8),
                                           ("starcoder2-3b", 24), ("stablelm-2-1.6b", 8),
                                           ("nemotron-mini-4b", 8), ("arcee-afm", 8), ("jais2", 8),
                                           ("solar-open-100b", 16), ("exaone-moe", 8), ("phi-2", 8),
                                           ("pythia-6.9b", 8), ("hunyuan-moe", 8),
                                           ("falcon-40b", 32), ("starcoder-mha", 8),
                                           ("opt-125m", 8), ("gpt-j-6b", 8),
                                           ("cwm-32b", 12), ("granite-swa", 10), ("granitemoe-swa", 8),
                                           ("olmo", 8), ("nanochat", 8),
                                           ("hyperclovax", 8), ("mellum", 16), ("cohere2-moe", 8),
                                           ("codegen-350m-mono", 8), ("gpt-neo-125m", 8),
                                           ("hy3-preview", 16), ("llama4", 10), ("biogpt", 8), ("flint", 16),
                                           ("trinity-mini", 16), ("persimmon-8b", 8),
                                           ("deepseek-v3", 8), ("deepseek-v2-lite", 8), ("glm-4.7-flash", 8),
                                           ("youtu-llm-2b", 8), ("apertus-8b", 8),
                                           # (latent attention: Mistral 4's queries scaled by position, its softmax
                                           # experts; MiniCPM3's muP scalars folded into each rank's weights)
                                           ("mistral-small-4", 8), ("minicpm3-4b", 8),
                                           ("deepseek-v3.2-moe", 8), ("glm-5-moe", 8),
                                           ("a.x-k1-biases", 8), ("kolibri-1-kv2", 8),
                                           ("a.x-k2-biases", 8),
                                           ("laguna-xs.2-kv2-biases", 8),
                                           ("beam-kv2-biases", 8),
                                           ("xglm-564m", 8),  # (each rank: the sinusoidal table built whole)
                                           # (GPT-1: each rank's part of each Conv1D weight, read transposed;
                                           # the post-LN norms on the summed outputs)
                                           ("openai-gpt", 8),
                                           ("ctrl", 8),  # (the head's bias split by vocabulary rows as the head)
                                           # (GPT-NeoX-Japanese: the last layer's dense_bias added by one rank)
                                           ("gpt-neox-japanese-2.7b", 8),
                                           ("dbrx-132b", 16), ("qwen3-next", 8), ("qwen3.5-moe", 8),
                                           ("bamba-bias", 8), ("nemotron-h-8b", 8), ("falcon-h1-norm", 8),
                                           ("lfm2-bias", 8), ("mamba-codestral-7b", 8),
                                           ("kimi-linear-48b-a3b", 8), ("jamba", 8), ("falcon-mamba-7b", 8),
                                           # (Ling 3.0: KDA heads split as Kimi's, the latent attention's per-head
                                           # gate rows with their heads)
                                           ("ling-3.0-flash", 8),
                                           ("minimax", 8),
                                           # whole-width q / k norms (their squares summed over the ranks): OLMo 2,
                                           # OLMoE, FlexOlmo, MiniMax-M2 (a partial rotary), OLMo hybrid (beside
                                           # gated DeltaNet)
                                           ("olmo-2-7b", 8), ("olmoe-1b-7b", 8), ("flex-olmo-7x7b", 8),
                                           ("minimax-m2-kv2", 8), ("olmo-hybrid-7b", 8),
                                           ("zamba2", 8), ("zamba2-adapters", 8), ("gemma3n", 8),
                                           ("bloom-560m", 8), ("mpt-7b", 8), ("falcon-rw-alibi", 8),
                                           ("modernbert-decoder", 8),
                                           # Gemma 4: a sliding layer (8 KV heads of 32) and a full one (2 of 64,
                                           # values from the keys), each rank its share of both cache shapes (31B's
                                           # kind); the full layer's single KV head replicated, a dense MLP beside
                                           # experts split by columns (26B-A4B's); one KV head on every layer,
                                           # replicated, per-layer inputs, two layers reading the first two's KV
                                           # (E2B's); Gemma 4 unified (12B's kind: 4 KV heads of 32 and 4 of
                                           # 64, their own v_proj, no per-layer inputs or experts)
                                           ("gemma-4-31b", 16), ("gemma-4-26b-a4b", 8), ("gemma-4-e2b", 8),
                                           ("gemma-4-12b", 8),
                                           ("recurrent-gemma", 8)])
def test_two_ranks_give_the_tokens_and_logits_of_one(tmp_path, family, heads):
    if family in CHANGES:  # (on OLMo 2's sizes, or the shape named beside the changes)
        shape, changes = CHANGES[family] if isinstance(CHANGES[family], tuple) else ("olmo-2-7b", CHANGES[family])
        folder = _checkpoint(tmp_path, shape, hidden=16 * heads, heads=heads, changes=changes)
    else:
        folder = _checkpoint(tmp_path, family, hidden=16 * heads, heads=heads)
    config = load_config(folder)
    whole = load_decoder(config, load_state_dict(folder), CPU, torch.float32)
    tokens_one, logits_one, _ = _serve(whole)

    model, workers = start_ranks(ShardSource(str(folder), config, "float32", "cpu", 0), 2)
    try:
        assert model.config.num_heads == whole.config.num_heads // (2 if whole.config.attends else 1)
        # each rank holds its half of the vocabulary (padded), of the embedding and of the head
        assert whole.config.vocab_size <= model.embed.shape[0] * 2 < whole.config.vocab_size + 128
        assert model.output_head.shape == model.embed.shape
        assert (model.output_head is model.embed) == whole.config.tie_word_embeddings
        moe, whole_moe = getattr(model.layers[0], "moe", None), getattr(whole.layers[0], "moe", None)
        if whole_moe is not None:  # each rank: its half of every expert's columns, the router whole
            assert moe.gate_up.shape[1] * 2 == whole_moe.gate_up.shape[1]
            assert moe.down.shape[2] * 2 == whole_moe.down.shape[2]
            assert torch.equal(moe.router, whole_moe.router)
        for layout, whole_layout in zip(getattr(model, "state_layouts", []), getattr(whole, "state_layouts", [])):
            # each rank: its heads' states
            for name in set(layout) & {"recurrent", "ssm"}:
                assert layout[name][0] * 2 == whole_layout[name][0]
        tokens_two, logits_two, _ = _serve(model, workers)
        assert workers.alive()
    finally:
        workers.stop()
        model.tp.leave()
    assert not any(p.is_alive() for p in workers.processes)
    assert tokens_two == tokens_one
    torch.testing.assert_close(logits_two, logits_one, atol=1e-4, rtol=1e-4)


def test_fp8_ranks_quantise_their_own_slices_as_accurately_as_one_gpu(tmp_path):
    """quantization fp8 at TP=2 (CPU, fp32 activations, FP8 emulated): every linear of every rank
    is FP8, quantised from that rank's slices, and the split model's logits are as close to the
    unquantised model's as the one-rank FP8 model's: no closer (every rank did quantise) and no
    further (a row-parallel slice's scale comes from its own half of the row: no coarser)."""
    from tritonformer.kernels.fp8 import Fp8Weight

    folder = _checkpoint(tmp_path, "llama-3.1-8b")
    config = load_config(folder)
    _, exact, _ = _serve(load_decoder(config, load_state_dict(folder), CPU, torch.float32))
    _, one, _ = _serve(load_decoder(config, load_state_dict(folder), CPU, torch.float32, quantization="fp8"))
    model, workers = start_ranks(ShardSource(str(folder), config, "float32", "cpu", 0, quantization="fp8"), 2)
    try:
        assert all(isinstance(getattr(layer, name), Fp8Weight)
                   for layer in model.layers for name in type(model).LINEAR_WEIGHTS)
        _, two, _ = _serve(model, workers)
    finally:
        workers.stop()
        model.tp.leave()
    error_one, error_two = (one - exact).abs().max().item(), (two - exact).abs().max().item()
    # (0.034 and 0.035 here; with rank 1 left unquantised the split model's error fell to 0.022)
    assert 1e-3 < error_one and 0.75 * error_one < error_two < 1.5 * error_one, (error_one, error_two)


@pytest.mark.parametrize("per_tensor", [False, True])
def test_an_fp8_checkpoint_splits_as_stored(tmp_path, per_tensor):
    """An FP8 checkpoint (E4M3 values with per-channel or per-tensor weight_scale) at TP=2: each
    rank reads its slices of the values and the scales that go with them, so the split model is
    the one-rank FP8 model: the same tokens, the same logits. Every forward stays within
    fp8.WEIGHT_ONLY_MAX_ROWS rows (weight-only: the activations 16-bit): past it each rank would quantise
    its own share of a row-parallel linear's input per token, with scales of its own, as it should."""
    from test_fp8 import _random_llama, _write_fp8_checkpoint

    from tritonformer.kernels.fp8 import WEIGHT_ONLY_MAX_ROWS, Fp8Weight

    config, state = _random_llama(seed=7)
    folder = tmp_path / "fp8"
    _write_fp8_checkpoint(folder, config, state, per_tensor)
    config = load_config(folder)
    one = load_decoder(config, load_state_dict(folder), CPU, torch.float32)
    assert isinstance(one.layers[0].o_w, Fp8Weight)
    prompts = [[5, 9, 217, 33, 2, 319], [100, 3], list(range(20, 40)), [7]]
    assert sum(map(len, prompts)) <= WEIGHT_ONLY_MAX_ROWS
    tokens_one, logits_one, _ = _serve(one, prompts=prompts)
    model, workers = start_ranks(ShardSource(str(folder), config, "float32", "cpu", 0), 2)
    try:
        layer, whole = model.layers[0], one.layers[0]
        assert isinstance(layer.qkv_w, Fp8Weight) and isinstance(layer.down_w, Fp8Weight)
        assert layer.down_w.data.shape[1] * 2 == whole.down_w.data.shape[1]  # half the columns, every scale
        torch.testing.assert_close(layer.down_w.scale, whole.down_w.scale, rtol=0, atol=0)
        tokens_two, logits_two, _ = _serve(model, workers, prompts)
    finally:
        workers.stop()
        model.tp.leave()
    assert tokens_two == tokens_one
    torch.testing.assert_close(logits_two, logits_one, atol=1e-4, rtol=1e-4)


def test_heads_that_do_not_divide_fail_at_load_and_say_so():
    cfg = {**shrunk("llama-3.1-8b", layers=1, hidden=72, heads=9, vocab=64), "num_key_value_heads": 3}  # SmolLM2's
    state = {}  # never read: the split is checked first
    with pytest.raises(ValueError, match=r"attention heads \(9\) do not divide by tensor_parallel_size 2"):
        load_decoder(cfg, state, CPU, torch.float32, tp=TensorParallelGroup(0, 2))


def test_a_split_that_cannot_be_made_fails_before_any_rank_starts(tmp_path):
    """Refused before a process group exists or a worker is spawned: nothing left behind, so the
    same process can load another model (a group left initialised refused every later one)."""
    import torch.distributed as dist

    folder = _checkpoint(tmp_path, "qwen2.5-7b")  # 8 heads at its ratio of 7: 1 KV head
    with pytest.raises(ValueError, match=r"KV heads \(1\) do not divide by tensor_parallel_size 2"):
        start_ranks(ShardSource(str(folder), load_config(folder), "float32", "cpu", 0), 2)
    assert not dist.is_initialized()


def test_gemma4_kv_heads_split_or_replicate_and_the_rest_is_refused_by_layer():
    """Gemma 4's KV heads, layer by layer: shared out where they divide by the ranks; where the ranks are a
    multiple of them, each rank the one its query heads read (replicated); else refused, the layer named."""
    from tritonformer.backend.models.decoder import check_tensor_parallel
    from tritonformer.backend.models.gemma4 import kv_heads_part

    # 8 query heads over 2 KV heads on 4 ranks: ranks 0 and 1 read KV head 0, ranks 2 and 3 KV head 1
    assert [kv_heads_part(2, 8, TensorParallelGroup(r, 4), 1) for r in range(4)] == \
        [slice(0, 1), slice(0, 1), slice(1, 2), slice(1, 2)]
    assert kv_heads_part(4, 8, TensorParallelGroup(1, 2), 0) == slice(2, 4)
    cfg = {**shrunk("gemma-4-31b", layers=2), "num_attention_heads": 12, "num_key_value_heads": 6,
           "num_global_key_value_heads": 3}
    check_tensor_parallel({**cfg, "num_global_key_value_heads": 2}, 2)
    with pytest.raises(ValueError, match=r"layer 1's KV heads \(3, over 12 attention heads\) neither divide"):
        check_tensor_parallel(cfg, 2)


def test_gpt2_refuses_tensor_parallelism():
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2).to_dict()
    with pytest.raises(ValueError, match="tensor parallelism is not supported for model_type 'gpt2'"):
        load_decoder(cfg, {}, CPU, torch.float32, tp=TensorParallelGroup(0, 2))


@pytest.mark.parametrize("shape, changes, message", [
    # Mixer heads that do not divide, named by the family's config key (Zamba2's Mamba-2 heads; its shared blocks
    # split as attention)
    ("zamba2-2.7b", {"hidden_size": 96, "n_mamba_heads": 3}, r"Mamba-2 heads \(n_mamba_heads\) \(3\) do not divide"),
    ("minimax-text-01", {"num_attention_heads": 3, "num_key_value_heads": 1}, "lightning attention heads"),
    ("jamba-mini", {"mamba_expand": 3, "hidden_size": 125}, "Mamba-1 channels"),
    ("zamba-7b", {}, "Zamba with tensor parallelism is not supported"),  # (refused whole, by name)
    # Heads and groups of the mixers that split must divide
    ("qwen3-next-80b-a3b", {"linear_num_key_heads": 3, "linear_num_value_heads": 6}, "gated DeltaNet key heads"),
    ("nemotron-h-8b", {"n_groups": 1, "mamba_num_heads": 5}, r"Mamba-2 heads"),
    ("mamba-codestral-7b", {"n_groups": 3, "num_heads": 12, "head_dim": 32, "hidden_size": 192},
     "groups of B / C do not divide"),
])
def test_mixers_that_cannot_split_fail_before_any_rank_starts_and_say_why(shape, changes, message):
    from tritonformer.backend.models.decoder import check_tensor_parallel

    with pytest.raises(ValueError, match=message):
        check_tensor_parallel({**shrunk(shape), **changes}, 2)


class Answers:
    """Final responses by handle, with the time each came."""

    def __init__(self):
        self.final: dict = {}

    def send(self, handle, outputs, error, final):
        if final:
            self.final[handle] = (error, time.monotonic())

    def is_cancelled(self, handle):
        return False


@contextlib.contextmanager
def _split_engine_serving(tmp_path, requests: int):
    """A Llama split over two CPU ranks, its engine running `requests` long requests. Yields
    (engine, workers, sink, failures): what the workers' monitor reported lands in `failures`,
    and fails the engine, as the generator's glue does."""
    folder = _checkpoint(tmp_path, "llama-3.1-8b")
    model, workers = start_ranks(ShardSource(str(folder), load_config(folder), "float32", "cpu", 0), 2)
    sink = Answers()
    options = EngineOptions(max_running_sequences=8, max_tokens_per_iteration=64, kv_cache_tokens="4096",
                            kv_block_size=8, cuda_graphs=False)
    engine = build_engine(model, _Ids(), sink, options, workers=workers)
    failures = []
    workers.on_failure = lambda problem: (failures.append(problem), engine.fail(RuntimeError(problem)))
    engine.start()
    try:
        for i in range(requests):  # long enough to be running when the rank fails
            params = SamplingParams(max_tokens=200, ignore_eos=True)
            engine.submit(engine.new_sequence(i, PROMPTS[i % len(PROMPTS)], params, True))
        time.sleep(0.3)
        yield engine, workers, sink, failures
    finally:
        workers.stop()  # (kills a stopped worker too: rank 0's collective then fails and returns)
        engine.stop(timeout=5.0)
        model.tp.leave()


def _answered_or_failed(sink, failures, requests: int, deadline: float) -> None:
    while (len(sink.final) < requests or not failures) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_dead_rank_fails_every_request_within_seconds_and_refuses_new_ones(tmp_path):
    from tritonformer.backend.engine_loop import EngineFailed

    with _split_engine_serving(tmp_path, 6) as (engine, workers, sink, failures):
        killed = time.monotonic()
        workers.processes[0].kill()
        _answered_or_failed(sink, failures, 6, killed + 5.0)
        assert failures and "rank 1" in failures[0]
        assert sorted(sink.final) == list(range(6)), "a request was left without an answer"
        assert all(error is not None and at - killed < 5.0 for error, at in sink.final.values())
        with pytest.raises(EngineFailed):
            engine.submit(engine.new_sequence(99, [1, 2], SamplingParams(max_tokens=2), True))
        assert not workers.alive()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("family", ["llama-3.1-8b", "phi-3-mini", "bamba-9b", "lfm2-1.2b", "olmo-2-7b",
                                    "zamba2-2.7b", "gemma-3n-e2b", "gemma-4-31b", "gemma-4-26b-a4b",
                                    "gemma-4-e2b"])
def test_two_gpus_give_the_tokens_and_logits_of_one(tmp_path, family):
    """fp16 on two GPUs (NCCL, all-reduces captured in the decode graphs) against one GPU (and two
    hybrids: Bamba's Mamba-2 layers, one group of B / C, and LFM2's convolutions, split too; OLMo 2's
    whole-width q / k norms over the ranks; Zamba2's shared block and Gemma 3n's AltUp model, models of
    their own; Gemma 4's two cache shapes, its full layers' single KV head replicated, the 26B's experts
    and E2B's per-layer inputs): the
    logits of a prefill of every prompt close (cosine >= 0.999 per row), the greedy tokens equal
    over the first 8 of each answer (later ones may part at a near tie: the sums are ordered
    differently)."""
    import faulthandler

    # A run that hangs says where (with -s): on the H100 pair it once hung leaving the group, the
    # decode graphs (NCCL's gathers captured in them) still alive; the runner's close() drops them first.
    faulthandler.dump_traceback_later(200)
    folder = _checkpoint(tmp_path, family, hidden=1024, vocab=32000)
    config = load_config(folder)
    whole = load_decoder(config, load_state_dict(folder), torch.device("cuda:0"), torch.float16)
    tokens_one, logits_one, _ = _serve(whole)
    del whole
    model, workers = start_ranks(ShardSource(str(folder), config, "float16", "cuda", 0), 2)
    runner = None
    try:
        tokens_two, logits_two, runner = _serve(model, workers)
    finally:
        workers.stop()
        if runner is not None:
            runner.close()  # its graphs, then the group (NCCL lets go of it only once they are gone)
        else:
            model.tp.leave()
        faulthandler.cancel_dump_traceback_later()
    cos = torch.nn.functional.cosine_similarity(logits_two.float(), logits_one.float(), dim=-1)
    assert cos.min() >= 0.999, cos
    assert [t[:8] for t in tokens_two] == [t[:8] for t in tokens_one]


def test_a_frozen_rank_is_noticed_by_its_silent_heartbeat(tmp_path):
    """A worker that stops (SIGSTOP: alive, but running nothing) leaves rank 0 in a collective
    for ever; its heartbeat goes silent and every request is answered all the same."""
    import os
    import signal

    from tritonformer.backend.parallel.workers import SILENCE_S

    with _split_engine_serving(tmp_path, 4) as (engine, workers, sink, failures):
        stopped = time.monotonic()
        os.kill(workers.processes[0].pid, signal.SIGSTOP)
        _answered_or_failed(sink, failures, 4, stopped + SILENCE_S + 5)
        assert failures and "no heartbeat" in failures[0], failures
        assert sorted(sink.final) == list(range(4)) and all(e is not None for e, _ in sink.final.values())
