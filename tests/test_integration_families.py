"""Every decoder family through a real tritonserver: one generator per family in one model
repository, each pointed (config parameter `checkpoint`) at a checkpoint folder saved by Hugging
Face transformers from the family's published config shrunk to a few layers; `/generate` with
`input_ids` answers HF's greedy continuation, token for token."""
from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path

import pytest
import torch

from helpers import http_post
from test_decoder_families import DEEPSEEK_V4_SMALL

pytestmark = [pytest.mark.server, pytest.mark.slow]
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
# Hunyuan's head size and NTK-alpha rope on Llama's shrunk sizes (dense and MoE)
HUNYUAN_ON_LLAMA = {"head_dim": 16, "rope_scaling": None, "rope_parameters": {
    "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}}
# (served model name, shape, config changes): the families and their distinguishing features.
FAMILIES = [
    ("gen_llama31", "llama-3.1-8b", {}),
    ("gen_qwen25", "qwen2.5-7b", {}),
    ("gen_qwen3", "qwen3-8b", {}),
    ("gen_mistral", "mistral-7b", {"sliding_window": 8}),
    ("gen_gemma2", "gemma-2-9b", {}),
    ("gen_gemma3", "gemma-3-1b", {"sliding_window_pattern": 2}),
    ("gen_phi3", "phi-3-mini", {}),
    ("gen_phi4_mini", "phi-4-mini", {}),
    ("gen_granite", "granite-3.1-8b", {}),
    ("gen_smollm3", "smollm3-3b", {}),
    ("gen_glm4", "glm-4-9b", {}),
    ("gen_gemma", "gemma-7b", {}),
    ("gen_helium", "helium-1-2b", {}),
    ("gen_mixtral", "mixtral-8x7b", {}),
    ("gen_qwen3_moe", "qwen3-30b-a3b", {}),
    ("gen_granite_moe", "granite-3.1-3b-a800m", {}),
    ("gen_glm45", "glm-4.5-air", {}),
    ("gen_ernie45_moe", "ernie-4.5-21b-a3b", {}),
    ("gen_dots1", "dots.llm1", {}),
    ("gen_olmo3", "olmo-2-7b", {"model_type": "olmo3", "sliding_window": 8,
                                "layer_types": ["sliding_attention", "full_attention"]}),
    ("gen_exaone4", "olmo-2-7b", {"model_type": "exaone4", "sliding_window": 8, "sliding_window_pattern": 2}),
    ("gen_cohere2", "olmo-2-7b", {"model_type": "cohere2", "sliding_window": 8,
                                  "layer_types": ["sliding_attention", "full_attention"]}),
    ("gen_olmoe", "olmoe-1b-7b", {}),
    ("gen_jetmoe", "jetmoe-8b", {}),
    ("gen_flex_olmo", "flex-olmo-7x7b", {"norm_topk_prob": True}),
    ("gen_hunyuan", "llama-3.1-8b", {"model_type": "hunyuan_v1_dense", **HUNYUAN_ON_LLAMA}),
    ("gen_gpt_oss", "gpt-oss-20b", {}),
    ("gen_starcoder2", "starcoder2-3b", {}),
    ("gen_stablelm", "stablelm-2-1.6b", {}),
    ("gen_nemotron", "nemotron-mini-4b", {}),
    ("gen_arcee", "arcee-afm", {}),
    ("gen_bitnet", "bitnet-b1.58-2b-4t", {}),  # (the -bf16 form: sub norms, gated relu2, tied head)
    ("gen_diffllama", "diffllama-0.3b", {"num_key_value_heads": 4}),  # (differential attention, grouped queries)
    ("gen_doge", "doge-320m", {"initializer_range": 0.1}),  # (dynamic mask: each key's bias kept in the cache with it)
    ("gen_apertus", "apertus-8b", {}),
    ("gen_dbrx", "dbrx-132b", {}),
    ("gen_phimoe", "phi-3.5-moe", {}),  # (LayerNorms, biases, longrope's mscales, the sparsemixer router)
    ("gen_mimo_v2_flash", "mimo-v2-flash", {}),  # (sinks and twice the KV heads on windowed layers, narrow v heads)
    ("gen_internlm3", "llama-3.1-8b", {"model_type": "internlm3", "head_dim": 16, "attention_bias": True,
                                       "mlp_bias": True}),
    ("gen_iquestcoder", "llama-3.1-8b", {"model_type": "iquestcoder", "head_dim": 16}),
    ("gen_vaultgemma", "gemma-2-9b", {"model_type": "vaultgemma"}),
    ("gen_jais2", "jais2", {}),
    ("gen_phi", "phi-2", {}),
    ("gen_gpt_neox", "pythia-6.9b", {}),
    ("gen_falcon", "falcon-7b", {}),
    ("gen_falcon_40b", "falcon-40b", {}),
    # ALiBi (Falcon-RW's is not served here: transformers' eager attention, which this compares with, adds its biases
    # twice; tests/test_decoder_families.py checks it against the SDPA path)
    ("gen_bloom", "bloom-560m", {}),
    ("gen_mpt", "mpt-7b", {}),
    ("gen_gpt_bigcode", "starcoder-15b", {}),
    ("gen_opt", "opt-125m", {}),
    ("gen_gptj", "gpt-j-6b", {}),
    ("gen_codegen", "codegen-350m-mono", {}),
    ("gen_gpt_neo", "gpt-neo-125m", {}),
    ("gen_biogpt", "biogpt", {}),
    ("gen_cwm", "cwm-32b", {}),
    ("gen_granite_swa", "granite-swash-2b", {"layer_rope_theta": [0, 500.0]}),
    ("gen_granitemoe_swa", "granitemoe-swa-3b", {}),
    ("gen_olmo", "olmo-7b", {}),
    ("gen_nanochat", "nanochat-d32", {}),
    ("gen_mellum", "mellum2-12b-a2.5b", {"layer_types": ["sliding_attention", "full_attention"],
                                         "mlp_layer_types": ["dense", "sparse"]}),
    ("gen_minimax_m2", "minimax-m2", {}),
    ("gen_hy_v3", "hy3-preview", {}),
    # HY-V4: hyper-connections; sparse attention past 8 keys; 16 index heads, as published (with the shrunk shape's 4
    # one key in 16 scores exactly 0, and ties at the top-k boundary break by position, otherwise than HF's topk)
    ("gen_hy_v4", "hy4-preview", {"num_hidden_layers": 3, "indexer_types": ["full", "shared", "full"],
                                  "mlp_layer_types": ["dense", "sparse", "sparse"], "index_topk": 8,
                                  "index_head_dim": 32, "index_n_heads": 16, "initializer_range": 0.05}),
    # DeepSeek-V4: Sinkhorn hyper-connections; a sliding layer, compressed-sparse ones (entries of 4, the indexer's
    # best 3) and a heavily compressed one (entries of 8), hash-routed then top-k experts
    ("gen_deepseek_v4", "deepseek-v4-flash", DEEPSEEK_V4_SMALL),
    # MiniMax-M3's text model: block-sparse attention (blocks of 4 keys, the best 3) on the first and last layers
    ("gen_minimax_m3", "minimax-m3", {"num_hidden_layers": 3,
                                      "layer_types": ["minimax_m3_sparse", "full_attention", "minimax_m3_sparse"],
                                      "mlp_layer_types": ["dense", "sparse", "sparse"], "dense_intermediate_size": 160,
                                      "index_n_heads": 8, "index_head_dim": 32, "index_block_size": 4,
                                      "index_topk_blocks": 3, "initializer_range": 0.05}),
    ("gen_llama4", "llama-4-scout", {"attention_chunk_size": 16}),
    ("gen_flint", "flint", {"layer_types": ["sliding_attention", "full_attention"], "mlp_only_layers": [0]}),
    ("gen_afmoe", "trinity-mini", {"num_dense_layers": 1, "global_attn_every_n_layers": 2}),
    ("gen_qwen3_next", "qwen3-next-80b-a3b", {}),
    ("gen_qwen3_5", "qwen3.5-27b", {}),
    ("gen_qwen3_5_moe", "qwen3.5-35b-a3b", {}),
    # Qwen4-Exp's text model: gated residual streams, PLE on the DeltaNet layers, QSA attention (blocks of 4 keys, the
    # best 2) on the others, experts in every layer
    ("gen_qwen4_exp", "qwen4-exp", {"num_hidden_layers": 4,
                                    "layer_types": ["linear_attention", "indexed_attention"] * 2,
                                    "ple_layer_ids": [1, 3], "ple_embed_dim": 64, "ngram_vocab_size_base": 1000,
                                    "indexer_n_heads": 8, "indexer_head_dim": 32, "indexer_budget": 8,
                                    "indexer_compress_ratio": 4, "hc_lowrank": 24}),
    ("gen_olmo_hybrid", "olmo-hybrid-7b", {"num_hidden_layers": 3,
                                           "layer_types": ["linear_attention", "full_attention", "linear_attention"]}),
    ("gen_lfm2", "lfm2-1.2b", {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
                               "initializer_range": 0.1}),  # (wider weights: continuations that vary)
    ("gen_lfm2_moe", "lfm2-8b-a1b", {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
                                     "initializer_range": 0.1}),
    ("gen_lfm3", "lfm3-1.7b", {"num_hidden_layers": 4, "initializer_range": 0.1,
                               "layer_types": ["conv", "sliding_attention", "full_attention", "conv"]}),
    # RecurrentGemma: RG-LRU layers (conv and recurrent state per sequence), local multi-query attention (weights drawn
    # wider by its own initialisation's scale: continuations that vary)
    ("gen_recurrent_gemma", "recurrentgemma-2b", {"num_hidden_layers": 3, "w_init_variance_scale": 1.0}),
    # ZAYA: CCA projections (conv and delayed-value state per sequence), an MLP router carried across layers, a skip
    # class (weights drawn wider: continuations that vary)
    ("gen_zaya", "zaya1-8b", {"router_hidden_size": 64, "initializer_range": 0.3}),
    # Inkling: relative logits (no rotary), short convolutions (conv state per sequence), a sliding and a full layer
    # of their own KV shapes, sigmoid experts beside shared ones (weights drawn wider: continuations that vary)
    ("gen_inkling", "inkling", {"initializer_range": 0.1}),
    # Inkling 2: attention residuals over blocks, sinks and output gates, dynamic k / v convolutions on the full layer
    # (conv state per sequence), softcapped experts run without decode graphs; saved in the release's tensor layout
    # (weights drawn wider: continuations that vary)
    ("gen_inkling2", "inkling2-small", {"initializer_range": 0.1}),
    ("gen_granite_4_h", "granite-4.0-h-tiny", {}),
    ("gen_bamba", "bamba-9b", {}),
    ("gen_nemotron_h", "nemotron-h-8b", {}),
    ("gen_nemotron_h_moe", "nemotron-3-nano-30b-a3b", {"initializer_range": 0.1}),  # (Nemotron 3's MoE blocks)
    ("gen_falcon_h1", "falcon-h1-0.5b", {}),
    # attention-free (a KV cache of no layer): Mamba-1 (weights drawn wider: continuations that vary), Falcon-Mamba,
    # Mamba-2
    ("gen_mamba", "mamba-2.8b", {"initializer_range": 0.3}),
    ("gen_falcon_mamba", "falcon-mamba-7b", {}),
    ("gen_mamba2", "mamba-codestral-7b", {}),
    # RWKV-4: time and channel mixes with their token shifts and WKV state, the residual stream halved every 2 layers
    ("gen_rwkv", "rwkv-4-169m-pile", {"num_hidden_layers": 3, "rescale_every": 2}),
    # xLSTM: mLSTM blocks (a matrix memory per head) with an MLP each, prompts past the 16-token chunks
    ("gen_xlstm", "xlstm-7b", {}),
    ("gen_jamba", "jamba-mini", {}),  # (Mamba-1 with dt / B / C norms and a dense MLP, attention with experts)
    ("gen_kimi_linear", "kimi-linear-48b-a3b", {}),
    ("gen_bailing_hybrid", "ling-3.0-flash", {}),  # (bounded-decay KDA, then latent attention gated per head; experts)
    ("gen_minimax", "minimax-text-01", {}),  # (a lightning-attention layer, then softmax attention; experts in both)
    ("gen_zamba2", "zamba2-2.7b", {"num_hidden_layers": 5, "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid",
                                                                                 "hybrid"], "initializer_range": 0.1}),
    # Zamba: Mamba-1 layers of two Mamba heads fed by one shared block, run twice
    ("gen_zamba", "zamba-7b", {"num_hidden_layers": 4, "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
                               "initializer_range": 0.2}),
    # Gemma 3n: AltUp streams, LAuReL, per-layer inputs, the last two layers reading the first two's keys
    ("gen_gemma3n", "gemma-3n-e2b", {"initializer_range": 0.05}),
    # Gemma 4: sliding and full layers of different KV shapes (values from keys on the full one) in one paged cache
    ("gen_gemma4", "gemma-4-31b", {"initializer_range": 0.05}),
    # Gemma 4 unified: Gemma 4's layers without per-layer inputs or experts (two cache shapes, each its own v_proj)
    ("gen_gemma4_unified", "gemma-4-12b", {"initializer_range": 0.05}),
    ("gen_persimmon", "persimmon-8b", {}),
    ("gen_deepseek_v3", "deepseek-v3", {"first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}),
    ("gen_deepseek_v2", "deepseek-v2-lite", {}),
    ("gen_glm4_moe_lite", "glm-4.7-flash", {}),
    # DeepSeek Sparse Attention served dense below index_topk (DeepSeek-V3.2; GLM-5 with a "shared" indexer layer)
    ("gen_deepseek_v32", "deepseek-v3.2", {"first_k_dense_replace": 1}),
    ("gen_axk1", "a.x-k1", {}),  # (DeepSeek-V3 with a norm after the experts of its second layer)
    ("gen_axk2", "a.x-k2", {}),  # (DeepSeek-V3.2 served dense, with gated norms and a gated query projection)
    # (a windowed rotating layer, then a global NoPE one; experts chosen by logit + bias)
    ("gen_kolibri1", "kolibri-1", {"layer_types": ["sliding_attention", "full_attention"]}),
    # (softplus gates per head, a sliding layer rotating whole heads, then a full one YaRN over half of each)
    ("gen_laguna", "laguna-xs.2", {}),
    # (sigmoid gates with a bias per head, a sliding rotating dense layer, then a global NoPE one with scaled queries
    # and grouped experts; residual adds scaled by depth)
    ("gen_beam", "beam-1.0-501b-a23b", {}),
    ("gen_glm_moe_dsa", "glm-5", {"num_hidden_layers": 3, "first_k_dense_replace": 1, "index_topk_freq": 2}),
    ("gen_youtu", "youtu-llm-2b", {}),
    ("gen_mistral4", "mistral-small-4", {}),  # (latent attention, softmax experts, queries scaled past 64 positions)
    ("gen_minicpm3", "minicpm3-4b", {}),  # (latent attention with muP's scalars, longrope)
    ("gen_xglm", "xglm-564m", {}),  # (OPT's block with fairseq's sinusoidal positions, scaled embeddings)
    ("gen_cohere2_moe", "command-a-plus", {"layer_types": ["sliding_attention", "full_attention"],
                                           "mlp_layer_types": ["dense", "sparse"], "num_shared_experts": 1}),
    ("gen_hyperclovax", "hyperclovax", {"residual_multiplier": 0.5, "logits_scaling": 0.5}),
    ("gen_hunyuan_moe", "llama-3.1-8b", {"model_type": "hunyuan_v1_moe", "num_experts": 8, "moe_topk": 2,
                                         **HUNYUAN_ON_LLAMA}),
    ("gen_solar_open", "solar-open-100b", {}),
    ("gen_exaone_moe", "olmo-2-7b", {"model_type": "exaone_moe", "sliding_window": 8, "sliding_window_pattern": 2,
                                     "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 80,
                                     "first_k_dense_replace": 1}),
    ("gen_ministral3", "mistral-7b", {"model_type": "ministral3", "head_dim": 16, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}}),
    # LongCat-Flash: two layers of two latent-attention sublayers and a shortcut MoE with identity experts
    ("gen_longcat_flash", "longcat-flash-chat", {"num_hidden_layers": 4}),
    # ModernBERT decoder (Ettin): an embedding norm, the first layer without its attention norm, a global layer then a
    # local one (8 tokens), GeGLU, the prediction head before a tied projection with a bias
    ("gen_modernbert_decoder", "ettin-decoder-150m", {"local_attention": 16, "cls_token_id": 1, "sep_token_id": 2}),
    # Cohere Compass text: Cohere2's parallel block with the rotate-half rotary, a rope per layer type (a windowed
    # layer at base 500, a global one at 1e6; weights drawn wider: continuations that vary)
    ("gen_cohere_compass", "command-r7b", {"model_type": "cohere_compass_text", "initializer_range": 0.1,
                                           "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                                               "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}),
    # Llama 3.2 Vision's text model (MllamaForCausalLM's checkpoint): cross-attention layers at 1 and 3 of five, served
    # text-only as HF skips them without an image; the embedding 8 rows longer than the head
    ("gen_mllama", "llama-3.2-11b-vision", {"num_hidden_layers": 5, "cross_attention_layers": [1, 3]}),
    # GPT-1: GPT-2's Conv1D tensors in BERT's post-LN block (norms after the residual adds, none at the end), an untied
    # head (weights drawn wider: continuations that vary)
    ("gen_openai_gpt", "openai-gpt", {"tie_word_embeddings": False, "initializer_range": 0.2}),
    # CTRL: a pre-LN block with sinusoidal positions added to scaled embeddings, a head with a bias, untied (weights
    # drawn wider: continuations that vary)
    ("gen_ctrl", "ctrl", {"tie_word_embeddings": False, "initializer_range": 0.2}),
    # CPM-Ant: virtual prompt tokens before the text, a segment and bucketed position bias, the prompt attending both
    # ways (run whole: the scheduler never chunks it)
    ("gen_cpmant", "cpm-ant-10b", {}),
    # GPT-NeoX-Japanese: GPT-NeoX's sequential block without biases but the last layer's `dense_bias`, half of each
    # head rotating (weights drawn wider: continuations that vary)
    ("gen_gpt_neox_japanese", "gpt-neox-japanese-2.7b", {"rotary_pct": 0.5, "initializer_range": 0.1}),
    # Emu3's text model (Emu3ForCausalLM's checkpoint, emu3_text_model): Llama's block at base 1e6
    ("gen_emu3", "emu3-chat", {}),
    # Aria's language model: Llama's block, the top 6 of the experts and 2 shared experts in every layer
    ("gen_aria", "aria", {}),
    # HRM-Text: two stacks of 2 layers run 2 x (3 + 1) times, each invocation a cache layer of its own over the
    # stack's one set of weights; prefix_lm as published (a plain prompt attends causally, as in transformers)
    ("gen_hrm_text", "hrm-text-1b", {}),
    # Phi-4-multimodal (Phi4MultimodalForCausalLM's checkpoint: tiny image and audio towers beside the language model,
    # unread): Phi-4-mini's block, its longrope with an original length past these sequences (inside it ours is HF's)
    ("gen_phi4_multimodal", "phi-4-multimodal", {
        "original_max_position_embeddings": 128,
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                          "image_size": 28, "patch_size": 14, "crop_size": 28},
        "audio_config": {"hidden_size": 32, "intermediate_size": 64, "num_blocks": 1, "num_attention_heads": 2,
                         "ext_pw_out_channel": 32, "depthwise_separable_out_channel": 32, "nemo_conv_channels": 32,
                         "input_size": 16, "time_reduction": 2, "bias_max_distance": 10}}),
    # Dots3's text model: an indexed, a sliding (8 tokens, its own latent attention shape) and a plain latent-attention
    # layer, per-head output gates, a dense MLP then sigmoid experts with a shared one
    ("gen_dots3", "dots3-note-prev", {"num_hidden_layers": 3, "use_dsa": None,
                                      "layer_types": ["indexed_attention", "sliding_attention", "full_attention"]}),
]

REAL_GEMMA = "gen_gemma3_270m"
# The Llama checkpoint again, split over two ranks (processes started from Triton's stub; gloo here).
SPLIT = ("gen_llama31_tp2", "gen_llama31")
# The families are served by GROUPS servers one after the other, family i by server i % GROUPS (the real Gemma and
# the split Llama by the first): one server with every family's stub (a Python process each, ~100) outgrew a 24 GiB
# host. The tests run in SERVED's order, grouped by server, so each server starts once.
GROUPS = 2
SERVED = sorted([(i % GROUPS, name) for i, (name, _, _) in enumerate(FAMILIES)] + [(0, SPLIT[0])],
                key=lambda served: served[0])
assert [name for name, _, _ in FAMILIES].index(SPLIT[1]) % GROUPS == 0


class FamilyServers:
    """The group's server on demand: asking for another group stops the running server first."""

    def __init__(self, root, smollm2_dir):
        self.root, self.smollm2_dir = root, smollm2_dir
        self.group, self.stack, self.current = None, None, None

    def serve(self, group: int):
        """(the server of `group`, {model name: its HF model}), started if another group's was running."""
        if group != self.group:
            self.close()
            self.stack = contextlib.ExitStack()
            self.current = _start_group(self.stack, self.root / f"group{group}", self.smollm2_dir, group)
            self.group = group
        return self.current

    def close(self):
        if self.stack is not None:
            self.stack.close()
        self.group, self.stack, self.current = None, None, None


@pytest.fixture(scope="module")
def family_servers(tmp_path_factory, smollm2_dir, gemma3_270m_dir):
    servers = FamilyServers(tmp_path_factory.mktemp("families"), smollm2_dir)
    yield servers
    servers.close()


def _start_group(stack, root, smollm2_dir, group):
    """Server `group` (its share of FAMILIES; the first also the real Gemma and the split Llama), entered on
    `stack`, and {model name: its HF model}."""
    from tritonformer.client.model_shapes import shrunk
    from helpers import serving

    from test_decoder_families import CONFIG_CLASSES, HF_CLASSES

    repo = root / "repository"
    hf_models = {}
    for i, (name, shape, changes) in enumerate(FAMILIES):
        if i % GROUPS != group:
            continue
        cfg = {**shrunk(shape, vocab=512), **changes}
        model_type = cfg.pop("model_type")
        torch.manual_seed(20 + i)
        hf = getattr(transformers, HF_CLASSES[model_type])._from_config(
            getattr(transformers, CONFIG_CLASSES[model_type])(**cfg), attn_implementation="eager").eval()
        checkpoint = root / name
        hf.save_pretrained(checkpoint)
        # The served folder needs a tokenizer; these requests send and read token ids, so any
        # tokenizer whose ids cover the vocabulary will do: SmolLM2's.
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(smollm2_dir / f, checkpoint / f)
        model_dir = repo / name
        shutil.copytree(REPO / "model_repository" / "generator", model_dir,
                        ignore=shutil.ignore_patterns("__pycache__"))
        config = (model_dir / "config.pbtxt").read_text()
        config = re.sub(r'name: "generator"', f'name: "{name}"', config)
        config = re.sub(r'(key: "checkpoint" value: \{ string_value: )""', rf'\1"{checkpoint}"', config)
        config = re.sub(r'(key: "kv_cache_tokens" value: \{ string_value: )"auto"', r'\1"2048"', config)
        (model_dir / "config.pbtxt").write_text(config)
        hf_models[name] = hf
        if name == SPLIT[1]:
            split_dir = repo / SPLIT[0]
            shutil.copytree(model_dir, split_dir)
            config = config.replace(f'name: "{name}"', f'name: "{SPLIT[0]}"')
            config = re.sub(r'(key: "tensor_parallel_size" value: \{ string_value: )"1"', r'\1"2"', config)
            (split_dir / "config.pbtxt").write_text(config)
            hf_models[SPLIT[0]] = hf
    served = list(hf_models)
    if group == 0:  # The real Gemma 3 270M, chosen by its documented name.
        model_dir = repo / REAL_GEMMA
        shutil.copytree(REPO / "model_repository" / "generator", model_dir,
                        ignore=shutil.ignore_patterns("__pycache__"))
        config = (model_dir / "config.pbtxt").read_text().replace('name: "generator"', f'name: "{REAL_GEMMA}"')
        config = re.sub(r'(key: "checkpoint" value: \{ string_value: )""', r'\1"gemma-3-270m"', config)
        config = re.sub(r'(key: "max_model_len" value: \{ string_value: )"auto"', r'\1"1024"', config)
        config = re.sub(r'(key: "kv_cache_tokens" value: \{ string_value: )"auto"', r'\1"2048"', config)
        (model_dir / "config.pbtxt").write_text(config)
        served.append(REAL_GEMMA)
    server = stack.enter_context(serving(repo, served, timeout=600))
    return server, hf_models


def test_real_gemma3_270m_served_by_name_equals_hf(family_servers, gemma3_270m_dir):
    """`checkpoint: "gemma-3-270m"`: text in, HF's greedy continuation of the same tokens out."""
    from tritonformer.backend.tokenization import TextTokenizer

    server, _ = family_servers.serve(0)
    status, body = http_post(server, f"/v2/models/{REAL_GEMMA}/generate", {
        "text_input": "The capital of France is", "stream": False, "max_tokens": 16})
    assert status == 200, body
    hf = transformers.Gemma3ForCausalLM.from_pretrained(gemma3_270m_dir, attn_implementation="eager",
                                                        dtype=torch.float32).eval()
    prompt = TextTokenizer(gemma3_270m_dir).encode("The capital of France is")
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0)
    expected = ref[0, len(prompt):].tolist()
    assert body["output_ids"] == expected[: len(body["output_ids"])] and body["text_output"].startswith(" the capital")


@pytest.mark.parametrize("group,name", SERVED, ids=[name for _, name in SERVED])
def test_family_served_greedy_equals_hf(family_servers, group, name):
    server, hf_models = family_servers.serve(group)
    hf = hf_models[name]
    g = torch.Generator().manual_seed(5)
    for n in (3, 21, 40):
        prompt = torch.randint(3, 512, (n,), generator=g).tolist()
        status, body = http_post(server, f"/v2/models/{name}/generate", {
            "input_ids": prompt, "stream": False, "max_tokens": 32, "ignore_eos": True})
        assert status == 200, body
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, n, dtype=torch.long),
                              max_new_tokens=32, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert body["output_ids"] == ref[0, n:].tolist(), (name, n)
