"""The configs of the decoder checkpoints people serve, as their `config.json` files publish them:
the shapes the benchmarks and GPU tests build with random weights (no weights ship with them).

`shrunk(name, ...)` keeps a config's features (rope scaling, biases, norms, windows, soft-caps,
head layout) at a size the CPU tests can run.
"""
from __future__ import annotations

LLAMA_3_1_8B = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
}
QWEN2_5_7B = {
    "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "sliding_window": 131072,
    "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False,
    "bos_token_id": 151643, "eos_token_id": 151645,
}
QWEN3_8B = {
    "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960, "attention_bias": False,
    "use_sliding_window": False, "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
}
MISTRAL_7B_V0_3 = {
    "model_type": "mistral", "vocab_size": 32768, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "max_position_embeddings": 32768, "sliding_window": None,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}
GEMMA_2_9B = {
    "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 8192, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": [1, 107],
}
# google/gemma-3n-E2B's text_config (the file's model_type is gemma3n, the text model's gemma3n_text), from memory of
# the published config.json: 30 layers at 2,048 wide, 8 query heads of 256 over 2 KV heads, four 512-token sliding
# layers then a full one, the last 10 layers reading the keys of the last earlier layer of their type, GeGLU MLPs of
# 8,192 columns with the first 10 layers' gates 95% sparse, 4 AltUp streams, LAuReL of rank 64, per-layer inputs of
# 256 from a 262,144-row table, logits capped at 30. Uncertain: the per-layer lists as written (the config defaults
# give the same), eos [1, 106] (the top-level file's).
GEMMA_3N_E2B = {
    "model_type": "gemma3n_text", "vocab_size": 262400, "hidden_size": 2048, "intermediate_size": [8192] * 30,
    "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "max_position_embeddings": 32768, "sliding_window": 512,
    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 6, "num_kv_shared_layers": 10,
    "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 20, "altup_num_inputs": 4, "altup_active_idx": 0,
    "altup_coef_clip": 120.0, "altup_correct_scale": True, "laurel_rank": 64, "hidden_size_per_layer_input": 256,
    "vocab_size_per_layer_input": 262144, "final_logit_softcapping": 30.0, "attention_bias": False,
    "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0,
}
# google/gemma-3n-E4B's text_config, from memory likewise (transformers' Gemma3nTextConfig defaults are this shape):
# 35 layers, MLPs of 16,384, the last 15 layers sharing keys; the rest as E2B's. Uncertain as E2B's.
GEMMA_3N_E4B = {
    **GEMMA_3N_E2B, "intermediate_size": [16384] * 35, "num_hidden_layers": 35,
    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7, "num_kv_shared_layers": 15,
    "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 25,
}
# google/gemma-4-31B's text_config (the file's model_type is gemma4, the text model's gemma4_text), from the published
# figures as collected (model card and third-party readers of its config.json): 60 layers at 5,376 wide, 32 query
# heads; the sliding layers (five of each six, 1,024 tokens) 16 KV heads of 256, the full ones 4 of 512 whose values are
# the keys' projection (attention_k_eq_v), the proportional rotary over a quarter of their frequencies (base 1e6),
# logits capped at 30, no per-layer inputs. Uncertain: intermediate_size 21,504 (4 x hidden, as one listing gives the
# FFN), max_position_embeddings 262,144 (the 256K context), eos 1 (the instruction-tuned files add 106).
GEMMA_4_31B = {
    "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 5376, "intermediate_size": 21504,
    "num_hidden_layers": 60, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256,
    "global_head_dim": 512, "num_global_key_value_heads": 4, "attention_k_eq_v": True,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
    "sliding_window": 1024, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}},
    "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 262144,
    "num_kv_shared_layers": 0, "enable_moe_block": False, "use_double_wide_mlp": False, "attention_bias": False,
    "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}
# google/gemma-4-26B-A4B's text_config, as collected likewise: 30 layers at 2,816, 16 query heads, sliding layers 8 KV
# heads of 256, full ones 2 of 512 (values from keys); in every layer a dense GeGLU MLP of 2,112 beside 128 experts of
# 704, the top 8 chosen. Uncertain as the 31B's (the layer pattern five sliding to one full, as the 31B's).
GEMMA_4_26B_A4B = {
    **GEMMA_4_31B, "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": 30, "num_attention_heads": 16,
    "num_key_value_heads": 8, "num_global_key_value_heads": 2,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5, "enable_moe_block": True, "num_experts": 128,
    "top_k_experts": 8, "moe_intermediate_size": 704,
}
# google/gemma-4-E2B's text_config, as collected likewise: 35 layers at 1,536, MLPs of 6,144 (twice that on the last
# 20 layers, which read the keys of earlier ones), 8 query heads over 1 KV head (256 wide on sliding layers, 512 on the
# full ones: values their own projection's), four 512-token sliding layers then a full one, per-layer inputs of 256.
# Uncertain: max_position_embeddings 131,072 (the 128K context), eos 1.
GEMMA_4_E2B = {
    **GEMMA_4_31B, "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35, "num_attention_heads": 8,
    "num_key_value_heads": 1, "num_global_key_value_heads": None, "attention_k_eq_v": False,
    "max_position_embeddings": 131072, "sliding_window": 512,
    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7, "hidden_size_per_layer_input": 256,
    "num_kv_shared_layers": 20, "use_double_wide_mlp": True,
}
# google/gemma-4-E4B's text_config, as collected likewise: 42 layers at 2,560, MLPs of 10,240, 2 KV heads, five sliding
# layers then a full one, the last 18 layers reading earlier ones' keys; the rest as E2B's. Uncertain as E2B's.
GEMMA_4_E4B = {
    **GEMMA_4_E2B, "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 42, "num_key_value_heads": 2,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 7, "num_kv_shared_layers": 18,
    "use_double_wide_mlp": False,
}
# google/gemma-4-12B-it's text_config (the file's model_type gemma4_unified, the text model's gemma4_unified_text), as
# transformers 5.23's configuration_gemma4_unified.py documents it: the checkpoint its docstrings name, a text model
# 3,840 wide (the vision config's mm_embed_dim / output_proj_dims, "matches the text model hidden_size"); the rest the
# config's own defaults (heads of 256 on sliding layers, 512 on full ones, their own v_proj, 1,024-token windows, five
# sliding layers to one full, 262,144 positions, no kv sharing, no soft-capping). Uncertain (not in the file: Gemma 3
# 12B's figures at that width): 48 layers, 16 query heads over 8 KV heads, MLPs of 15,360; the soft-capping (the 31B
# caps at 30); eos 1 (the instruction-tuned files add 106).
GEMMA_4_12B = {
    "model_type": "gemma4_unified_text", "vocab_size": 262144, "hidden_size": 3840, "intermediate_size": 15360,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "global_head_dim": 512, "attention_k_eq_v": False, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144, "sliding_window": 1024,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 8,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}},
    "final_logit_softcapping": None, "num_kv_shared_layers": 0, "use_double_wide_mlp": False, "attention_bias": False,
    "use_bidirectional_attention": "vision", "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1,
    "pad_token_id": 0,
}
GEMMA_7B = {
    "model_type": "gemma", "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 8192,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1,
}
GEMMA_3_1B = {
    "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
    "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "max_position_embeddings": 32768,
    "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": [1, 106],
}
PHI_3_MINI_4K = {
    "model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
    "sliding_window": 2047, "rope_scaling": None, "tie_word_embeddings": False, "bos_token_id": 1,
    "eos_token_id": 32000,
}
# The long-context Phi-3 (longrope): its factors per rotary frequency are its own; these have
# its shape (48 = head_dim / 2) and range, enough to exercise the schedule.
PHI_3_MINI_128K = {
    **PHI_3_MINI_4K, "max_position_embeddings": 131072, "sliding_window": 262144,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.02 * i for i in range(48)],
                     "long_factor": [1.0 + 0.9 * i for i in range(48)]},
}
# Phi-4-mini-instruct: Phi-3's block with GQA (24 / 8 heads of 128), a tied 200k vocabulary, and
# a partial rotary (partial_rotary_factor 0.75: 96 of 128 dims) under longrope.
PHI_4_MINI = {
    "model_type": "phi3", "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 8192,
    "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "partial_rotary_factor": 0.75, "sliding_window": 262144, "tie_word_embeddings": True,
    "bos_token_id": 199999, "eos_token_id": 200020, "pad_token_id": 199999,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [
        1.0, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649,
        2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533,
        5.984965424, 6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651,
        14.64173252, 16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03,
        32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16,
        47.77]},
}
# microsoft/Phi-4-multimodal-instruct's language model, as transformers' conversion writes its config.json (model_type
# phi4_multimodal; the original's phi4mm values, as public copies of it quote them): Phi-4-mini's text model (32 layers
# at 3,072 wide, 24 query heads of 128 over 8 KV heads, 96 of each head's dims rotating under the same longrope
# factors, a 262,144-token window, the tied 200,064-id vocabulary with the image and audio placeholders 200010 and
# 200011 inside it), eos 199999. The towers' vision_config and audio_config are left out (unread text-only).
PHI_4_MULTIMODAL = {**PHI_4_MINI, "model_type": "phi4_multimodal", "eos_token_id": 199999}
# Granite-3.1-8B-Instruct: Llama's block with muP scalars (embedding, attention, residual, logits).
GRANITE_3_1_8B = {
    "model_type": "granite", "vocab_size": 49155, "hidden_size": 4096, "intermediate_size": 12800,
    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 10000000.0, "max_position_embeddings": 131072, "embedding_multiplier": 12.0,
    "attention_multiplier": 0.0078125, "residual_multiplier": 0.22, "logits_scaling": 16.0,
    "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
}
# SmolLM3-3B: Llama's block with every fourth layer unrotated (NoPE), a tied embedding.
SMOLLM3_3B = {
    "model_type": "smollm3", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008,
    "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
    "rope_theta": 5000000.0, "max_position_embeddings": 65536, "no_rope_layer_interval": 4,
    "use_sliding_window": False, "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128012,
}
# GLM-4-9B-0414: Q/K/V biases, a fused gate/up, a rotary over half of each head in neighbouring
# pairs, sandwich norms; 2 KV heads.
GLM_4_9B = {
    "model_type": "glm4", "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696,
    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
    "partial_rotary_factor": 0.5, "attention_bias": True, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 32768, "tie_word_embeddings": False, "pad_token_id": 151329,
    "eos_token_id": [151329, 151336, 151338],
}
# Ministral-8B-Instruct-2410 (its hub config says model_type mistral, sliding_window 32,768 on
# every layer: the same layers under the ministral type, whose default windows every layer).
MINISTRAL_8B = {
    "model_type": "ministral", "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 100000000.0, "max_position_embeddings": 32768, "sliding_window": 32768,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}
ERNIE_4_5_0_3B = {
    "model_type": "ernie4_5", "vocab_size": 103424, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 18, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072, "use_bias": False,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}
# baidu/ERNIE-4.5-21B-A3B-PT (model_type ernie4_5_moe, 21B in all, 3B active): 64 experts of 1,536
# columns, the top 6 by probability plus a learnt bias, two shared experts, the first layer dense
# (its config names the counts moe_num_experts / moe_k: transformers maps these names to them).
ERNIE_4_5_21B_A3B = {
    "model_type": "ernie4_5_moe", "vocab_size": 103424, "hidden_size": 2560, "intermediate_size": 12288,
    "moe_intermediate_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 64, "num_experts_per_tok": 6, "moe_num_shared_experts": 2,
    "moe_layer_start_index": 1, "moe_layer_end_index": 27, "moe_layer_interval": 1, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 131072, "use_bias": False, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}

# kyutai/helium-1-preview-2b (the shape transformers' HeliumConfig defaults to).
HELIUM_1_2B = {
    "model_type": "helium", "vocab_size": 48000, "hidden_size": 2560, "intermediate_size": 7040,
    "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 20, "head_dim": 128,
    "rms_norm_eps": 1e-8, "rope_theta": 100000.0, "max_position_embeddings": 4096,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
}

# bigcode/starcoder2-3b: the widths transformers' Starcoder2Config defaults to; the rope base,
# window and context as its config.json was recalled (not checked against it here). LayerNorms
# with a bias, a plain GELU MLP, biases on every linear, a 4,096-token window on every layer.
STARCODER2_3B = {
    "model_type": "starcoder2", "vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288,
    "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2, "hidden_act": "gelu_pytorch_tanh",
    "norm_epsilon": 1e-5, "use_bias": True, "rope_theta": 999999.4420358813, "sliding_window": 4096,
    "max_position_embeddings": 16384, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0,
}

# stabilityai/stablelm-2-1_6b, as its config.json was recalled (not checked against it here):
# Llama's MLP with LayerNorms that have a bias, a rotary over a quarter of each head, Q/K/V biases.
STABLELM_2_1_6B = {
    "model_type": "stablelm", "vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu",
    "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25, "rope_theta": 10000.0, "use_qkv_bias": True,
    "qk_layernorm": False, "use_parallel_residual": False, "max_position_embeddings": 4096,
    "tie_word_embeddings": False, "bos_token_id": 100257, "eos_token_id": 100257,
}

# nvidia/Nemotron-Mini-4B-Instruct, as its config.json was recalled (not checked against it here):
# LayerNorm1P (a bias, the weight applied as 1 + w), a plain squared-ReLU MLP, a half-head rotary.
NEMOTRON_MINI_4B = {
    "model_type": "nemotron", "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 9216,
    "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "relu2", "norm_eps": 1e-5, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "bos_token_id": 2, "eos_token_id": 3,
}

# microsoft/phi-2, as its config.json was recalled (not checked against it here): a parallel block
# on one LayerNorm, a rotary over 32 of each head's 80 dims, a plain GELU MLP, biases everywhere.
PHI_2 = {
    "model_type": "phi", "vocab_size": 51200, "hidden_size": 2560, "intermediate_size": 10240,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "gelu_new",
    "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.4, "rope_theta": 10000.0, "max_position_embeddings": 2048,
    "tie_word_embeddings": False, "qk_layernorm": False, "bos_token_id": 50256, "eos_token_id": 50256,
}

# EleutherAI/pythia-6.9b, as its config.json was recalled (not checked against it here): GPT-NeoX's
# parallel residual (two LayerNorms), a rotary over a quarter of each head, a per-head fused QKV.
PYTHIA_6_9B = {
    "model_type": "gpt_neox", "vocab_size": 50432, "hidden_size": 4096, "intermediate_size": 16384,
    "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "gelu", "layer_norm_eps": 1e-5,
    "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048, "use_parallel_residual": True,
    "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0,
}

# abeja/gpt-neox-japanese-2.7b (model_type gpt_neox_japanese), the shape transformers' GPTNeoXJapaneseConfig
# defaults to, with its config.json's values as recalled (not checked against it here; its tie_word_embeddings
# especially, written false here, transformers' default being true): GPT-NeoX's sequential block 2,560 wide, 32
# heads of 80, 32 layers, a rotary over every dim (`rotary_pct` 1.0), an unbiased GELU MLP 4 x 2,560 wide
# (`intermediate_multiple_size`), 2,048 positions, 32,000 tokens.
GPT_NEOX_JAPANESE_2_7B = {
    "model_type": "gpt_neox_japanese", "vocab_size": 32000, "hidden_size": 2560, "num_hidden_layers": 32,
    "num_attention_heads": 32, "intermediate_multiple_size": 4, "hidden_act": "gelu", "layer_norm_eps": 1e-5,
    "rotary_pct": 1.0, "rotary_emb_base": 10000, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    "bos_token_id": 31996, "eos_token_id": 31999,
}

# The shape transformers' FalconConfig defaults to (Falcon-7B): 71 query heads of 64 dims and one KV
# head (multi_query) in one fused projection, attention and the MLP side by side on one LayerNorm.
FALCON_7B = {
    "model_type": "falcon", "vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32,
    "num_attention_heads": 71, "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False,
    "bias": False, "alibi": False, "layer_norm_epsilon": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 2048, "tie_word_embeddings": True, "bos_token_id": 11, "eos_token_id": 11,
}

# tiiuae/falcon-40b, as its config.json was recalled (not checked against it here): the new decoder
# architecture, 128 query heads in 8 groups with a KV head each, a LayerNorm each for attention and the MLP.
FALCON_40B = {
    "model_type": "falcon", "vocab_size": 65024, "hidden_size": 8192, "num_hidden_layers": 60,
    "num_attention_heads": 128, "num_kv_heads": 8, "new_decoder_architecture": True, "parallel_attn": True,
    "bias": False, "alibi": False, "layer_norm_epsilon": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 2048, "tie_word_embeddings": True, "bos_token_id": 11, "eos_token_id": 11,
}

# bigscience/bloom-560m and bloom-7b1, as their config.json files were recalled (not checked against them here), in
# transformers' canonical names (the files say n_layer, n_head): ALiBi and no position table, so no
# max_position_embeddings (trained on 2,048 tokens: the family's default), a LayerNorm on the embeddings, 4 x hidden
# MLPs, a tied head. pad 3 and unk 0 beside bos 1 / eos 2; bloom-7b1's pretraining_tp (1 or 4: not sure, and it does
# not change the math) left out.
BLOOM_560M = {
    "model_type": "bloom", "vocab_size": 250880, "hidden_size": 1024, "num_hidden_layers": 24,
    "num_attention_heads": 16, "layer_norm_epsilon": 1e-5, "apply_residual_connection_post_layernorm": False,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
}
BLOOM_7B1 = {**BLOOM_560M, "hidden_size": 4096, "num_hidden_layers": 30, "num_attention_heads": 32}

# jhu-clsp/ettin-decoder-150m (ModernBERT's decoder; transformers' ModernBertDecoderConfig documents
# blab-jhu/test-32m-dec): the values below are that config class's defaults, which its docstring calls the
# modernbert-base decoder style configuration, not checked against either checkpoint's config.json here. Uncertain:
# local_rope_theta (10,000 is transformers' default; Ettin may train its local layers at 160,000 too),
# max_position_embeddings (7,999 or 8,192) and the ids of bos / eos (ModernBERT's tokenizer's [CLS] / [SEP]).
# GeGLU with the exact GELU, a global layer every 3 from the first, local windows of 128 // 2 = 64 tokens, LayerNorms
# without biases, the prediction head's dense without a bias, a bias on the tied vocabulary projection.
ETTIN_DECODER_150M = {
    "model_type": "modernbert-decoder", "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152,
    "num_hidden_layers": 22, "num_attention_heads": 12, "hidden_activation": "gelu", "max_position_embeddings": 8192,
    "norm_eps": 1e-5, "norm_bias": False, "attention_bias": False, "mlp_bias": False, "decoder_bias": True,
    "classifier_bias": False, "classifier_activation": "gelu", "local_attention": 128, "global_attn_every_n_layers": 3,
    "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "tie_word_embeddings": True,
    "bos_token_id": 50281, "eos_token_id": 50282, "pad_token_id": 50283,
}

# mosaicml/mpt-7b, as its config.json was recalled (not checked against it here), in its own names: ALiBi (slopes
# from alibi_bias_max 8), LayerNorms without biases, no linear biases, 4 x hidden MLPs, a tied head. Its file names no
# bos / eos ids (its tokenizer, GPT-NeoX-20B's, ends text with id 0: not written here); learned_pos_emb true there is
# unused under ALiBi (transformers reads neither).
MPT_7B = {
    "model_type": "mpt", "vocab_size": 50432, "d_model": 4096, "n_layers": 32, "n_heads": 32, "max_seq_len": 2048,
    "expansion_ratio": 4, "no_bias": True, "norm_type": "low_precision_layernorm", "layer_norm_epsilon": 1e-5,
    "learned_pos_emb": True, "logit_scale": None, "tie_word_embeddings": True,
    "attn_config": {"attn_type": "multihead_attention", "attn_impl": "torch", "alibi": True, "alibi_bias_max": 8,
                    "clip_qkv": None, "softmax_scale": None, "prefix_lm": False, "qk_ln": False,
                    "attn_uses_sequence_id": False, "attn_pdrop": 0},
}

# bigcode/starcoder (StarCoder-15.5B), as its config.json was recalled (not checked against it here),
# in transformers' canonical names (its file says n_embd, n_head, n_layer, n_positions): one KV head,
# learnt positions over 8,192 tokens.
STARCODER_15B = {
    "model_type": "gpt_bigcode", "vocab_size": 49152, "hidden_size": 6144, "num_hidden_layers": 40,
    "num_attention_heads": 48, "max_position_embeddings": 8192, "multi_query": True,
    "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
    "bos_token_id": 0, "eos_token_id": 0,
}

# The shape transformers' OPTConfig defaults to (OPT-125M, vLLM's first test model): learnt positions,
# a ReLU MLP, biases everywhere.
OPT_125M = {
    "model_type": "opt", "vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "ffn_dim": 3072,
    "num_attention_heads": 12, "max_position_embeddings": 2048, "do_layer_norm_before": True,
    "word_embed_proj_dim": 768, "activation_function": "relu", "enable_bias": True, "tie_word_embeddings": True,
    "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1,
}

# The shape transformers' GPTJConfig defaults to (GPT-J-6B), in canonical names (its file says n_embd,
# n_head, n_layer, n_positions): 16 heads of 256 dims, 64 of them rotating in neighbouring pairs.
GPT_J_6B = {
    "model_type": "gptj", "vocab_size": 50400, "hidden_size": 4096, "num_hidden_layers": 28,
    "num_attention_heads": 16, "max_position_embeddings": 2048, "rotary_dim": 64, "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False, "bos_token_id": 50256, "eos_token_id": 50256,
}

# Salesforce/codegen-350M-mono (model_type codegen): GPT-J's block at 1,024 wide over 16 heads of 64, a rotary over
# 32 of each head's dims, 20 layers (config.json writes them with GPT-2's names). Values as its config.json is
# believed to have them (not checked against the file here; the bos id especially).
CODEGEN_350M = {
    "model_type": "codegen", "vocab_size": 51200, "hidden_size": 1024, "num_hidden_layers": 20,
    "num_attention_heads": 16, "max_position_embeddings": 2048, "rotary_dim": 32, "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 50256,
}

# EleutherAI/gpt-neo-125m (model_type gpt_neo): GPT-2's sizes (768 wide, 12 heads, 12 layers) with unscaled
# attention and global and local (256-token) layers in turn; config.json names the layers and heads num_layers /
# num_heads (written here by their canonical names, as transformers reads them).
GPT_NEO_125M = {
    "model_type": "gpt_neo", "vocab_size": 50257, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "max_position_embeddings": 2048, "attention_types": [[["global", "local"], 6]],
    "window_size": 256, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
    "bos_token_id": 50256, "eos_token_id": 50256,
}

# openai-community/openai-gpt (model_type openai-gpt, GPT-1), as its config.json was recalled (not checked against it
# here), in transformers' canonical names (its file says n_embd, n_head, n_layer, n_positions; transformers'
# OpenAIGPTConfig defaults to the same): 768 wide, 12 heads, 12 layers, a (tanh) GELU MLP of 4 x 768, 512 learnt
# positions, a tied head over 40,478 tokens, no bos / eos ids.
OPENAI_GPT = {
    "model_type": "openai-gpt", "vocab_size": 40478, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "max_position_embeddings": 512, "afn": "gelu", "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
}

# Salesforce/ctrl (model_type ctrl, CTRL 1.6B), as its config.json was recalled (not checked against it here; its
# n_positions especially, recalled as 50,000 where transformers' CTRLConfig defaults to 256), in transformers'
# canonical names (its file says n_embd, n_head, n_layer, n_positions): 1,280 wide, 16 heads, 48 layers, a ReLU MLP
# of 8,192 (`dff`), sinusoidal positions added to embeddings scaled by sqrt(1,280), a tied head with a bias over
# 246,534 tokens, no bos / eos ids.
CTRL = {
    "model_type": "ctrl", "vocab_size": 246534, "hidden_size": 1280, "num_hidden_layers": 48,
    "num_attention_heads": 16, "dff": 8192, "max_position_embeddings": 50000, "layer_norm_epsilon": 1e-6,
    "tie_word_embeddings": True,
}

# openbmb/cpm-ant-10b (model_type cpmant), its config.json: 48 pre-RMSNorm layers 4,096 wide, 32 heads of 128, a gated
# GELU MLP 10,240 wide; 32 virtual prompt tokens (of 32 prompt types) before the text, 32 segment types, a position bias
# of 512 buckets up to 2,048 positions; 30,720 tokens, no eos id in the config (its tokenizer's </d> ends a document).
CPM_ANT_10B = {
    "model_type": "cpmant", "vocab_size": 30720, "hidden_size": 4096, "num_attention_heads": 32, "dim_head": 128,
    "dim_ff": 10240, "num_hidden_layers": 48, "dropout_p": 0.0, "position_bias_num_buckets": 512,
    "position_bias_max_distance": 2048, "eps": 1e-6, "init_std": 1.0, "prompt_types": 32, "prompt_length": 32,
    "segment_types": 32, "use_cache": True, "tie_word_embeddings": True,
}

# microsoft/biogpt (model_type biogpt), transformers' BioGptConfig defaults: OPT's block 1,024 wide over 16 heads,
# 24 layers, its embeddings scaled by sqrt(1,024), 1,024 positions.
BIOGPT = {
    "model_type": "biogpt", "vocab_size": 42384, "hidden_size": 1024, "intermediate_size": 4096,
    "num_hidden_layers": 24, "num_attention_heads": 16, "max_position_embeddings": 1024, "hidden_act": "gelu",
    "scale_embedding": True, "layer_norm_eps": 1e-12, "tie_word_embeddings": True, "bos_token_id": 0,
    "eos_token_id": 2, "pad_token_id": 1,
}

# The shape transformers' CwmConfig defaults to (facebook/cwm, 32B): Llama-3.1-8B's vocabulary, context, token ids
# and 128-dim heads with 8 KV heads at larger widths (48 query heads), Llama 3's rope scaling 16 times at base 1e6, and
# 8,192-token windows on three of every four layers (the first of each four global; transformers writes them out
# as `layer_types`, left to that rule here so that shrunk() keeps it).
CWM_32B = {**LLAMA_3_1_8B, "model_type": "cwm", "hidden_size": 6144, "intermediate_size": 21504,
           "num_hidden_layers": 64, "num_attention_heads": 48, "rope_theta": 1000000.0, "sliding_window": 8192,
           "rope_scaling": {**LLAMA_3_1_8B["rope_scaling"], "factor": 16.0}}

# The shape transformers' GraniteSWAConfig defaults to (ibm-granite/granite-swash-2b): Granite's block with
# 128-token windows on all but every fourth layer from the first, a sink logit per head, GQA 20 / 4, a tied
# embedding. Uncertain: the muP scalars and the rope base, which the config class leaves at Granite's defaults
# (1.0, 10,000) and the checkpoint's config.json likely sets as Granite 3.x's do.
GRANITE_SWASH_2B = {
    "model_type": "granite_swa", "vocab_size": 100352, "hidden_size": 2560, "intermediate_size": 8192,
    "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 4, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 8192, "sliding_window": 128, "embedding_multiplier": 1.0,
    "attention_multiplier": 1.0, "residual_multiplier": 1.0, "logits_scaling": 1.0, "tie_word_embeddings": True,
    "bos_token_id": 100257, "eos_token_id": 100257,
}

# OLMo-7B as transformers converts it (allenai/OLMo-7B-hf; OlmoConfig's defaults): Llama's block with LayerNorms
# without a weight or a bias, 32 heads each with its own KV head, no clip_qkv (OLMo-1.7-7B's 8.0 is refused).
OLMO_7B = {
    "model_type": "olmo", "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "rope_theta": 10000.0,
    "max_position_embeddings": 2048, "attention_bias": False, "clip_qkv": None, "tie_word_embeddings": False,
    "bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1,
}

# nanochat d32 (karpathy/nanochat-d32): depth 32, width 64 x depth, 128-dim heads each with its own KV head, a 4x
# squared-ReLU MLP, logits soft-capped at 15. Uncertain: the vocabulary (nanochat's tokenizer, 65,536; transformers'
# NanoChatConfig defaults to 50,304), the token ids and the context length (nanochat's 2,048).
NANOCHAT_D32 = {
    "model_type": "nanochat", "vocab_size": 65536, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 16, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "max_position_embeddings": 2048, "hidden_act": "relu2", "final_logit_softcapping": 15.0,
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
}

# The shape transformers' HyperCLOVAXConfig defaults to (Granite's generic sizes, not HyperCLOVAX-SEED-Think-14B's,
# which transformers does not give: a stand-in), with its Peri-LN post norms and queries scaled by head_dim^-1/2.
HYPERCLOVAX = {
    "model_type": "hyperclovax", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "max_position_embeddings": 2048, "use_post_norm": True, "embedding_multiplier": 1.0,
    "residual_multiplier": 1.0, "logits_scaling": 1.0, "tie_word_embeddings": False, "bos_token_id": 1,
    "eos_token_id": 2,
}

# microsoft/bitnet-b1.58-2B-4T (model_type bitnet), as its config.json reads to our knowledge: the widths, heads,
# vocabulary, relu2, tied head and token ids are sure; rms_norm_eps 1e-5, rope_theta 500000 and 4096 positions are
# less so. The packed checkpoint's quantization_config (autobitlinear, offline) is left to the test rows.
BITNET_B158_2B_4T = {
    "model_type": "bitnet", "vocab_size": 128256, "hidden_size": 2560, "intermediate_size": 6912,
    "num_hidden_layers": 30, "num_attention_heads": 20, "num_key_value_heads": 5, "hidden_act": "relu2",
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 4096, "tie_word_embeddings": True,
    "bos_token_id": 128000, "eos_token_id": 128001,
}

# kajuma/DiffLlama-0.3B-handcut (model_type diffllama), the checkpoint transformers' DiffLlamaConfig docstring names.
# Its config.json was not at hand: these are DiffLlamaConfig's defaults (Llama's block, multi-head attention), sure
# for the kind of model only. The widths, layers, heads and vocabulary are uncertain (they add up to about 1B
# parameters, not 0.3B), as are rope_theta and the token ids.
DIFFLLAMA_0_3B = {
    "model_type": "diffllama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    "attention_bias": False, "attention_dropout": 0.0, "lambda_std_dev": 0.1, "bos_token_id": 1, "eos_token_id": 2,
}

# SmallDoge/Doge-320M (model_type doge): the widths, layers, heads, dynamic rope and tied head as SmallDoge's training
# recipe (recipes/doge/Doge-320M/config_full.yaml in SmallDoges/small-doge) writes its model config; keep_window_size,
# rms_norm_eps and the dense MLP (is_moe false) are DogeConfig's defaults, which the recipe leaves alone. The token ids
# are in neither: left out.
DOGE_320M = {
    "model_type": "doge", "vocab_size": 32768, "hidden_size": 1024, "intermediate_size": 2048,
    "num_hidden_layers": 32, "num_attention_heads": 8, "num_key_value_heads": 4, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": True,
    "rope_scaling": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 2048},
    "keep_window_size": 2048, "is_moe": False, "attention_bias": False, "mlp_bias": False,
}

# The shape transformers' ArceeConfig defaults to (AFM-4.5B's widths): Llama's block with a plain
# squared-ReLU MLP.
ARCEE_AFM = {
    "model_type": "arcee", "vocab_size": 32000, "hidden_size": 2560, "intermediate_size": 18432,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "relu2",
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "bos_token_id": 128000, "eos_token_id": 128001,
}

# swiss-ai/Apertus-8B-2509 (model_type apertus), as its config.json was recalled (not checked against it here): 32
# layers at 4,096 wide, 32 query heads of 128 over 8 KV heads, per-head q / k norms, a plain xIELU MLP 21,504 wide
# (what makes 8.05B parameters with the untied 131,072-row embedding and head: 14,336 would make 6.2B), llama3 rope
# scaling x8 from 8,192 positions at theta 12M, 65,536 positions. Uncertain: the token ids (transformers' defaults).
# (Apertus-70B: 80 layers at 8,192 wide, 64 query heads.)
APERTUS_8B = {
    "model_type": "apertus", "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 21504,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "xielu",
    "rms_norm_eps": 1e-5, "rope_theta": 12000000.0, "max_position_embeddings": 65536,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
}

# databricks/dbrx-base / dbrx-instruct (model_type dbrx, 132B with 36B active), as its config.json was recalled (not
# checked against it here): 40 layers at 6,144 wide, 48 query heads of 128 over 8 KV heads, the QKV clamped to +-8,
# 16 experts of 10,752 columns, the top 4 renormalised (p = 1), rope base 500,000 (in attn_config), 32,768 positions,
# a 100,352-row vocabulary. Uncertain: the token ids. (Its own top-level names: DbrxConfig computes the experts'
# width from `d_model` before it maps transformers' `hidden_size` onto it, so only these build the right model.)
DBRX_132B = {
    "model_type": "dbrx", "vocab_size": 100352, "d_model": 6144, "n_layers": 40, "n_heads": 48, "max_seq_len": 32768,
    "attn_config": {"clip_qkv": 8.0, "kv_n_heads": 8, "rope_theta": 500000.0},
    "ffn_config": {"ffn_act_fn": {"name": "silu"}, "ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4,
                   "moe_normalize_expert_weights": 1.0},
    "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": 100257, "pad_token_id": 100277,
}

# The shape transformers' Jais2Config defaults to: LayerNorms with biases, a plain squared-ReLU
# MLP, biases on every linear.
JAIS2 = {
    "model_type": "jais2", "vocab_size": 150272, "hidden_size": 3328, "intermediate_size": 26624,
    "num_hidden_layers": 32, "num_attention_heads": 26, "num_key_value_heads": 26, "hidden_act": "relu2",
    "layer_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 8192, "attention_bias": True,
    "mlp_bias": True, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 150024,
}

# Mixture-of-experts shapes. Mixtral-8x7B-Instruct-v0.1: every layer 8 experts, the top 2 per token.
MIXTRAL_8X7B = {
    "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "sliding_window": None, "num_local_experts": 8,
    "num_experts_per_tok": 2, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}
# microsoft/Phi-3.5-MoE-instruct (model_type phimoe, 42B in all, 6.6B active): 16 experts of 6,400 columns, the top 2
# by the sparsemixer router (router_jitter_noise 0.01), LayerNorms, biases on attention and on the head, longrope with
# its own mscales. Uncertain: the 64 short / long factors (recalled only as rising from 1.02 to about 1.1 and equal to
# each other; a ramp of that kind stands in) and the two mscales (recalled as 1.243163121016122 both); the rest as
# recalled from its config.json.
PHI_3_5_MOE = {
    "model_type": "phimoe", "vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 6400,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "rope_scaling": {"type": "longrope", "short_factor": [1.02 + 0.0015 * i for i in range(64)],
                     "long_factor": [1.02 + 0.0015 * i for i in range(64)], "short_mscale": 1.243163121016122,
                     "long_mscale": 1.243163121016122, "original_max_position_embeddings": 4096},
    "sliding_window": 131072, "num_local_experts": 16, "num_experts_per_tok": 2, "router_jitter_noise": 0.01,
    "input_jitter_noise": 0.01, "attention_bias": True, "lm_head_bias": True, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 32000,
}
# XiaomiMiMo/MiMo-V2-Flash (model_type mimo_v2_flash, 309B in all, 15B active), as transformers' MiMoV2FlashConfig
# defaults to it: 48 layers, the first and every 6th with full attention over 4 KV heads, the rest a 128-token window
# (129 keys with the query's) over 8 KV heads with sinks; q / k heads of 192, v heads of 128 scaled by 0.707; a
# rotary over a third of each head, base 5e6 (full) or 1e4 (windowed); a dense first layer, then 256 experts of 2,048
# columns, the top 8 by sigmoid score + bias, renormalised. Uncertain: max_position_embeddings (transformers'
# 131,072; the model card claims a longer context), the special ids (transformers' bos 1, no eos), whether the
# config.json's own keys (sliding_window_size, swa_*) say anything transformers does not read.
MIMO_V2_FLASH = {
    "model_type": "mimo_v2_flash", "vocab_size": 152576, "hidden_size": 4096, "intermediate_size": 16384,
    "num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192, "v_head_dim": 128,
    "attention_value_scale": 0.707, "sliding_window": 129, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "attention_bias": False, "tie_word_embeddings": False,
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334}},
    "bos_token_id": 1,
}
# MiniMaxAI/MiniMax-M2 (model_type minimax_m2, 230B in all, 10B active): 256 experts of 1,536 columns, the top 8 by
# sigmoid score plus a learnt bias, renormalised; 48 query heads of 128 over a hidden size of 3,072 (head_dim not
# hidden / heads), q / k norms over all heads, a rotary over 64 of each head's 128 dims (config.json's
# `rotary_dim`). transformers' MiniMaxM2Config's values; the checkpoint's config.json is believed to match them.
MINIMAX_M2 = {
    "model_type": "minimax_m2", "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536,
    "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "rotary_dim": 64,
    "num_local_experts": 256, "num_experts_per_tok": 8, "rms_norm_eps": 1e-6, "rope_theta": 5000000.0,
    "max_position_embeddings": 196608, "tie_word_embeddings": False, "bos_token_id": 200034, "eos_token_id": 200020,
}
# The shape transformers' MiniMaxM3VLTextConfig defaults to (MiniMaxAI/MiniMax-M3's text model, model_type
# minimax_m3_vl_text): 60 layers at 6,144 wide, 64 query heads of 128 over 4 KV heads, 128 experts of 3,072 columns,
# the top 4 by sigmoid score plus a learnt bias, renormalised and scaled by 2, a shared expert of 3,072, gpt-oss's
# clamped SwiGLU; indexers of 4 heads of 128 choosing 16 blocks of 128 keys. Uncertain: the published config.json's
# per-layer kinds (transformers' defaults: every layer full attention and MoE) and its rope share.
MINIMAX_M3 = {
    "model_type": "minimax_m3_vl_text", "vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 3072,
    "num_hidden_layers": 60, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
    "num_local_experts": 128, "num_experts_per_tok": 4, "dense_intermediate_size": 12288,
    "shared_intermediate_size": 3072, "routed_scaling_factor": 2.0, "rotary_dim": 64, "index_n_heads": 4,
    "index_head_dim": 128, "index_block_size": 128, "index_topk_blocks": 16, "index_local_blocks": 1,
    "rms_norm_eps": 1e-6, "rope_theta": 5000000.0, "max_position_embeddings": 524288, "tie_word_embeddings": False,
    "bos_token_id": 200034, "eos_token_id": 200020,
}
# MiniMaxAI/MiniMax-Text-01 (model_type minimax, 456B in all, 46B active) in transformers' names (the -hf
# conversion's), as recalled, not read from the file: 80 layers at 6,144 wide, 64 heads of 128 (head_dim not hidden /
# heads), 8 KV heads on the softmax layers; every 8th layer softmax attention, the other 7 lightning attention (the
# original config.json's attn_type_list of 0 / 1); 32 experts of 9,216 columns in every layer, the top 2; residual
# factors alpha (2 x 80) ** 0.25 = 3.5566 and beta 1 for every kind of layer (the original's
# layernorm_*_alpha / _beta). Uncertain: rope_theta, max_position_embeddings, the token ids, and the rotary: the
# original rotates 64 of each head's 128 dims (`rotary_dim`), which transformers' MiniMax does not read (it rotates
# whole heads) and minimax.from_hf refuses by name, so it is left out here.
MINIMAX_TEXT_01 = {
    "model_type": "minimax", "vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 9216,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "layer_types": (["linear_attention"] * 7 + ["full_attention"]) * 10, "block_size": 256,
    "num_local_experts": 32, "num_experts_per_tok": 2, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "rope_theta": 10000000.0, "max_position_embeddings": 10240000, "sliding_window": None,
    "full_attn_alpha_factor": 3.5565588200778455, "full_attn_beta_factor": 1.0,
    "linear_attn_alpha_factor": 3.5565588200778455, "linear_attn_beta_factor": 1.0,
    "mlp_alpha_factor": 3.5565588200778455, "mlp_beta_factor": 1.0,
    "tie_word_embeddings": False, "bos_token_id": 200034, "eos_token_id": 200020,
}
# Cohere's Command A Plus (model_type cohere2_moe), as transformers' Cohere2MoeConfig defaults to it: Command R7B's
# parallel block (LayerNorms without a bias, 4,096-token windows on three of every four layers, NoPE global
# layers) with 8 experts, the top 2 by softmax. Uncertain: every size here (the defaults look like Command A's
# dense ones: 64 heads of 128 with as many KV heads, 22,528 columns per expert), and whether the checkpoint has
# dense first layers, shared experts or RMSNorms (transformers' defaults: none).
COMMAND_A_PLUS = {
    "model_type": "cohere2_moe", "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528,
    "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128,
    "num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 0, "expert_selection_fn": "softmax",
    "shared_expert_combination_strategy": "average", "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
    "rope_theta": 10000.0, "max_position_embeddings": 8192, "sliding_window": 4096, "sliding_window_pattern": 4,
    "tie_word_embeddings": True, "bos_token_id": 5, "eos_token_id": 255001, "pad_token_id": 0,
}
# The shape transformers' HYV3Config defaults to (tencent/Hy3-preview, model_type hy_v3): 80 layers at 4,096 wide, 64
# query heads of 128 over 8 KV heads, the first layer dense (13,312 columns), then 192 experts of 1,536 columns, the
# top 8 by sigmoid score plus a learnt bias, renormalised and scaled by 2.826, one shared expert. Uncertain: whether
# the checkpoint's config.json sets the token ids (transformers' default: none) and attention biases.
HY3_PREVIEW = {
    "model_type": "hy_v3", "vocab_size": 120832, "hidden_size": 4096, "intermediate_size": 13312,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "num_experts": 192, "num_experts_per_tok": 8, "num_shared_experts": 1, "moe_intermediate_size": 1536,
    "router_scaling_factor": 2.826, "rms_norm_eps": 1e-5, "rope_theta": 11158840.0, "max_position_embeddings": 131072,
    "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
}
# The shape transformers' HYV4Config defaults to (tencent/Hy4-preview, model_type hy_v4): 34 layers at 2,816 wide, 4
# hyper-connection streams (post gates times 2), latent attention at 32 heads (a query latent of 1,536, a key / value
# latent of 512 plus a 64-dim rotary key, 192 + 64 query / key dims, 256 value dims), sinks and an output gate, DSA
# indexers of 16 heads of 128 choosing 2,048 keys on layer 0 and every fourth from 1 (the others reuse the choice),
# the first layer dense (6,912 columns), then 256 experts of 768 columns, the top 8 by sigmoid score plus a learnt
# bias, renormalised and scaled by 2.827, their SwiGLU clamped at 10, one shared expert. Uncertain: the published
# config.json's rope (transformers' default: base 10,000, unscaled) and whether it lists the per-layer kinds.
HY4_PREVIEW = {
    "model_type": "hy_v4", "vocab_size": 120832, "hidden_size": 2816, "intermediate_size": 6912,
    "moe_intermediate_size": 768, "num_hidden_layers": 34, "num_attention_heads": 32, "num_key_value_heads": 32,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "routed_scaling_factor": 2.827,
    "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256, "index_topk": 2048, "index_head_dim": 128,
    "index_n_heads": 16, "hc_mult": 4, "hc_magnitude": 2.0, "hc_eps": 1e-6, "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 262144, "attention_bias": False,
    "tie_word_embeddings": False, "bos_token_id": 120000, "eos_token_id": 120025, "pad_token_id": 120002,
}
# The shape transformers' DeepseekV4Config defaults to (its docstring names deepseek-ai/DeepSeek-V4-Flash-Base; no
# published config.json is known here, so these are those defaults): 43 layers at 4,096 wide, 4 Sinkhorn hyper-
# connection streams (20 iterations), 64 query heads of 512 from a 1,024 query latent over one shared key-value head,
# a 64-dim interleaved rotary, a 128-token window, sinks, the output in 8 groups of 1,024; two heavily compressed
# layers (entries of 128 tokens) then compressed-sparse (entries of 4, an indexer of 64 heads of 128 keeping 512) and
# heavily compressed in turn; 256 experts of 2,048 columns, the top 6 by sqrt(softplus) score (the first 3 layers by a
# token-id table), renormalised and scaled by 1.5, clamped at 10, one shared expert. Uncertain: the published
# config's rope scaling of the compressed layers (YaRN, believed) and its per-layer kinds.
DEEPSEEK_V4_FLASH = {
    "model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048,
    "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "q_lora_rank": 1024, "num_experts_per_tok": 6, "n_routed_experts": 256, "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
    "max_position_embeddings": 1048576, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0, "sliding_window": 128, "o_groups": 8,
    "o_lora_rank": 1024, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
}
# meta-llama/Llama-4-Scout-17B-16E's text model (its config.json's text_config, model_type llama4_text; the
# checkpoint's own model_type is llama4): 48 layers at 5,120 wide, 40 query heads of 128 over 8 KV heads, every
# fourth layer NoPE with full attention and temperature tuning (floor_scale 8,192, attn_scale 0.1), the others
# rotating (llama3-scaled, factor 16, base 500,000), L2 q / k norms and attention chunked in 8,192 tokens; every
# layer MoE: 16 experts of 8,192 columns, the top 1 by sigmoid score scaling its input, one shared expert of the
# same width (the dense MLP's 16,384 columns unused). Its no_rope_layers list is the every-fourth rule written out.
# Uncertain: the rope scaling's low / high frequency factors (believed 1.0 and 1.0).
LLAMA_4_SCOUT = {
    "model_type": "llama4_text", "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
    "head_dim": 128, "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
    "no_rope_layer_interval": 4, "attention_chunk_size": 8192, "attn_temperature_tuning": True, "floor_scale": 8192,
    "attn_scale": 0.1, "use_qk_norm": True, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192},
    "max_position_embeddings": 10485760, "tie_word_embeddings": False, "bos_token_id": 200000,
    "eos_token_id": [200001, 200007, 200008], "pad_token_id": 200018,
}
# meta-llama/Llama-3.2-11B-Vision's text model (its config.json's text_config, model_type mllama_text_model; the
# checkpoint's own model_type is mllama), served text-only: 40 layers at 4,096 wide of which 8 are cross-attention
# layers (at 3, 8, ..., 38), skipped without an image, so 32 Llama layers run; 32 query heads of 128 over 8 KV heads,
# a SwiGLU MLP of 14,336, Llama 3's vocabulary (the embedding 8 rows longer for the image tokens) and llama3-scaled
# rope (factor 8, base 500,000), untied head. Uncertain: max_position_embeddings 131,072 and the special ids (eos
# 128001 is the base model's; the instruction-tuned files add 128008 and 128009).
LLAMA_3_2_11B_VISION = {
    "model_type": "mllama_text_model", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38], "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "bos_token_id": 128000,
    "eos_token_id": 128001, "pad_token_id": 128004,
}
# BAAI/Emu3-Chat's text model as transformers' conversion writes it (config.json's text_config, model_type
# emu3_text_model; the checkpoint's own model_type is emu3, the VQ-GAN beside it; Emu3-Gen's has the same sizes, and
# the original checkpoints the same values under model_type Emu3): Llama's block, 32 layers at 4,096 wide, 32
# query heads of 128 over 8 KV heads, a SwiGLU MLP of 14,336, rope base 1e6 unscaled, an untied head over 184,622 ids
# (the VQ-GAN's 32,768 visual tokens among them). Uncertain: max_position_embeddings (transformers' default, 9,216,
# here; an original (pre-transformers) Emu3 config.json, as public copies quote it, says 5,120).
EMU3_CHAT = {
    "model_type": "emu3_text_model", "vocab_size": 184622, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "max_position_embeddings": 9216, "tie_word_embeddings": False,
    "bos_token_id": 151849, "eos_token_id": 151850, "pad_token_id": 151643,
}
# sapientinc/HRM-Text-1B (hrm_text), as a public copy of its config.json quotes it (a quantised derivative's, its
# quantization_config aside): two stacks (L, H) of 16 layers at 1,536 wide, run H_cycles 2 x (L_cycles 3 + 1) times,
# 12 heads of 128 (as many KV heads), a SwiGLU MLP of 4,096, weightless RMSNorms, gated attention output, rope base 1e4
# unscaled, embeddings times 39.19 (1 / initializer_range), an untied head over 65,536 ids, prefix_lm true (served
# causally for a plain prompt, as transformers computes it without token_type_ids). The file writes
# num_hidden_layers 128 (16 x 2 x 4: transformers' cache slots) beside num_layers_per_stack 16; written here in the
# form transformers first builds from (num_hidden_layers the per-stack count), which both it and we read the same
# and which shrinks to a few layers per stack. Uncertain: the special ids, as the copy gives them.
HRM_TEXT_1B = {
    "model_type": "hrm_text", "vocab_size": 65536, "hidden_size": 1536, "intermediate_size": 4096,
    "num_hidden_layers": 16, "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 128,
    "hidden_act": "silu", "H_cycles": 2, "L_cycles": 3, "L_bp_cycles": [0, 3], "prefix_lm": True,
    "embedding_scale": 39.191835884530846, "initializer_range": 0.025515518153991442, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "max_position_embeddings": 4096,
    "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "bos_token_id": 6, "eos_token_id": 11,
    "pad_token_id": 5,
}
# rhymes-ai/Aria's language model (config.json's text_config, model_type aria_text; the checkpoint's own model_type is
# aria, the vision tower and projector beside it), from memory of the published config: Llama's block, 28 layers at
# 2,560 wide, 20 query heads of 128 (as many KV heads), rope base 5e6, a 100,352-id vocabulary, an untied head; every
# layer's MLP 64 experts of 1,664 columns, the top 6, and 2 shared experts (3,328 columns). Sure: the expert counts,
# k, the widths, the layers. Uncertain: rope_theta, max_position_embeddings (64K context), the special ids.
ARIA = {
    "model_type": "aria_text", "vocab_size": 100352, "hidden_size": 2560, "intermediate_size": 1664,
    "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 20, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "rope_theta": 5000000.0, "max_position_embeddings": 65536, "tie_word_embeddings": False,
    "moe_num_experts": 64, "moe_topk": 6, "moe_num_shared_experts": 2, "attention_bias": False, "mlp_bias": False,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}
# arcee-ai/Trinity-Mini (model_type afmoe), as its config.json reads (its values quoted by public ports of the model;
# the sizes are those of the Trinity technical report's table): 32 layers at 2,048 wide, 32 query heads of 128 over 4
# KV heads, 2,048-token windows on three of every four layers (the fourth global, NoPE), a gated attention output,
# the first two layers dense (6,144 columns), then 128 experts of 1,024 columns, the top 8 by sigmoid score plus a
# learnt bias, renormalised and scaled by 2.826, one shared expert; embeddings times sqrt(hidden) (mup_enabled).
# Uncertain: the token ids (not among the values seen; transformers' default: none).
TRINITY_MINI = {
    "model_type": "afmoe", "vocab_size": 200192, "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 32, "num_dense_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "num_shared_experts": 1,
    "moe_intermediate_size": 1024, "route_scale": 2.826, "score_func": "sigmoid", "route_norm": True, "n_group": 1,
    "topk_group": 1, "global_attn_every_n_layers": 4, "sliding_window": 2048, "mup_enabled": True,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 131072,
    "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
}
# state-spaces/mamba-2.8b-hf's config.json (model_type mamba), from memory of the published file: 64 attention-free
# Mamba-1 layers at 2,560 wide (intermediate 5,120, state 16, dt rank 160, 4 conv taps), the head tied (transformers'
# default: the file does not say), GPT-NeoX's tokenizer padded to 50,280 ids. No max_position_embeddings: the model
# has none (mamba1.DEFAULT_MAX_POSITIONS serves it).
MAMBA_2_8B = {
    "model_type": "mamba", "vocab_size": 50280, "hidden_size": 2560, "intermediate_size": 5120,
    "num_hidden_layers": 64, "state_size": 16, "expand": 2, "conv_kernel": 4, "time_step_rank": 160,
    "use_bias": False, "use_conv_bias": True, "hidden_act": "silu", "layer_norm_epsilon": 1e-5,
    "residual_in_fp32": True, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
}
# RWKV/rwkv-4-169m-pile's config.json (model_type rwkv), from memory of the published file: 12 RWKV-4 layers at 768
# wide (the time mix as wide, attention_hidden_size 768; the channel mix 3,072), the residual stream halved every 6
# layers, an untied head, GPT-NeoX's tokenizer (50,277 ids, eos and bos 0), a 1,024-token context.
RWKV_4_169M_PILE = {
    "model_type": "rwkv", "vocab_size": 50277, "hidden_size": 768, "attention_hidden_size": 768,
    "intermediate_size": 3072, "num_hidden_layers": 12, "context_length": 1024, "layer_norm_epsilon": 1e-5,
    "rescale_every": 6, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0, "use_cache": True,
}
# tiiuae/falcon-mamba-7b's config.json (model_type falcon_mamba), from memory of the published file: 64 Mamba-1
# layers at 4,096 wide (intermediate 8,192, state 16, dt rank 256) with weightless RMSNorms on dt, B and C
# (mixer_rms_eps 1e-6), an untied head, a 65,024-id vocabulary. Uncertain: `expand` (2 here, as intermediate / hidden:
# transformers reads intermediate_size) and the token ids (eos / pad 11).
FALCON_MAMBA_7B = {
    "model_type": "falcon_mamba", "vocab_size": 65024, "hidden_size": 4096, "intermediate_size": 8192,
    "num_hidden_layers": 64, "state_size": 16, "expand": 2, "conv_kernel": 4, "time_step_rank": 256,
    "use_bias": False, "use_conv_bias": True, "hidden_act": "silu", "layer_norm_epsilon": 1e-5,
    "mixer_rms_eps": 1e-6, "residual_in_fp32": True, "tie_word_embeddings": False, "bos_token_id": 0,
    "eos_token_id": 11, "pad_token_id": 11,
}
# mistralai/Mamba-Codestral-7B-v0.1's config.json (model_type mamba2), from memory of the published file: 64 Mamba-2
# layers at 4,096 wide, 128 heads of 64 (expand 2), state 128 in 8 groups, 4 conv taps, 256-token chunks, the gated
# norm after the gate (norm_before_gate false), an untied head, a 32,768-id vocabulary. Uncertain: the token ids
# (bos 0, eos 0 here; transformers' Mamba2Config defaults are bos 0, eos 2) and dt's rank (256, unused by Mamba-2).
MAMBA_CODESTRAL_7B = {
    "model_type": "mamba2", "vocab_size": 32768, "hidden_size": 4096, "num_hidden_layers": 64, "num_heads": 128,
    "head_dim": 64, "state_size": 128, "n_groups": 8, "expand": 2, "conv_kernel": 4, "chunk_size": 256,
    "use_bias": False, "use_conv_bias": True, "hidden_act": "silu", "layer_norm_epsilon": 1e-5, "rms_norm": True,
    "norm_before_gate": False, "residual_in_fp32": True, "time_step_rank": 256, "time_step_min": 0.001,
    "time_step_max": 0.1, "time_step_limit": (0.0, float("inf")), "tie_word_embeddings": False, "bos_token_id": 0,
    "eos_token_id": 0, "pad_token_id": 0,
}
# ai21labs/AI21-Jamba-1.5-Mini's config.json (model_type jamba; Jamba-v0.1's has the same sizes), from memory of the
# published file: 32 layers at 4,096 wide, every 8th from the 5th attending (32 query heads over 8 KV heads, no
# rotary), the others Mamba-1 (expand 2, state 16, dt rank 256, 4 conv taps) with dt / B / C norms; every 2nd layer
# from the 2nd 16 experts of 14,336 (the top 2), the others a SwiGLU MLP of 14,336; a 65,536-id vocabulary, untied.
# Uncertain: Jamba-1.5-Mini's token ids (Jamba-v0.1's and JambaConfig's defaults here: bos 1, eos 2, pad 0).
JAMBA_MINI = {
    "model_type": "jamba", "vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "num_experts": 16, "num_experts_per_tok": 2,
    "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8, "attn_layer_offset": 4,
    "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 256, "mamba_conv_bias": True,
    "mamba_proj_bias": False, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}
# NX-AI/xLSTM-7b's config.json (model_type xlstm), from memory of the published file: 32 mLSTM blocks at 4,096 wide
# (embedding_dim, num_blocks), 8 heads with q / k half as wide (qk_dim_factor 0.5: heads of 256 keys, 512 values),
# gates soft-capped at 15, logits at 30, a SwiGLU MLP of round_up(4,096 x 2.667, 64) = 10,944, 64-token chunks, an
# untied head, a 50,304-id vocabulary (GPT-NeoX's tokenizer, padded). Uncertain: weight_mode (single here) and the
# kernels: the published file names the xlstm package's Triton kernels, which transformers without that package
# refuses to load (and this runtime refuses by name); here the native ones, transformers' defaults (left unset).
XLSTM_7B = {
    "model_type": "xlstm", "vocab_size": 50304, "hidden_size": 4096, "embedding_dim": 4096, "num_hidden_layers": 32,
    "num_blocks": 32, "num_heads": 8, "qk_dim_factor": 0.5, "v_dim_factor": 1.0, "use_bias": False,
    "add_out_norm": True, "norm_eps": 1e-6, "norm_reduction_force_float32": True, "eps": 1e-6, "chunk_size": 64,
    "mode": "inference", "return_last_states": True, "inference_state_dtype": "float32",
    "autocast_kernel_dtype": "bfloat16", "ffn_proj_factor": 2.667, "ffn_round_up_to_multiple_of": 64,
    "gate_soft_cap": 15.0, "output_logit_soft_cap": 30.0, "weight_mode": "single", "max_inference_chunksize": 16384,
    "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1,
}
# google/recurrentgemma-2b's config.json (model_type recurrent_gemma), from memory of the published file: 26 layers
# at 2,560 wide in turn recurrent, recurrent, attention (block_types); RG-LRU width 2,560 in 10 heads of 256, a conv
# of 4 taps; local attention over 2,048 tokens, 10 query heads of 256 over one KV head, half of each head rotating
# (base 10,000); the MLP 7,680 wide (intermediate_size 15,360, halved by transformers); logits soft-capped at 30; a
# 256,000-token vocabulary, the head tied. Uncertain: intermediate_size 15,360 (transformers' default is 3 x 2,560,
# which would make the MLP 3,840 wide).
RECURRENTGEMMA_2B = {
    "model_type": "recurrent_gemma", "vocab_size": 256000, "hidden_size": 2560, "intermediate_size": 15360,
    "num_hidden_layers": 26, "num_attention_heads": 10, "num_key_value_heads": 1, "head_dim": 256,
    "lru_width": 2560, "attention_window_size": 2048, "conv1d_width": 4, "logits_soft_cap": 30.0,
    "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "partial_rotary_factor": 0.5,
    "rope_theta": 10000.0, "block_types": ["recurrent", "recurrent", "attention"], "attention_bias": False,
    "embeddings_scale_by_sqrt_dim": True, "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1,
    "pad_token_id": 0,
}
# thinkingmachines/Inkling's text model (model_type inkling_text; the checkpoint's own model_type is inkling_mm_model,
# this under its text_config), from transformers' InklingTextConfig defaults and docstring (its checkpoint): 66 layers
# at 6,144 wide, every sixth full (64 query heads of 128 over 8 KV heads, relative logits over 1,024 tokens), the
# others sliding over 512 (64 over 16); short convolutions of 4 taps; every layer's MLP 256 experts of 3,072 (top 6)
# beside 2 shared ones; the head untied, its rows past 200,058 dropped. Uncertain: whether the published config.json
# writes other values (dense_mlp_idx, log_scaling_n_floor, the token ids).
INKLING = {
    "model_type": "inkling_text", "vocab_size": 201024, "unpadded_vocab_size": 200058, "hidden_size": 6144,
    "num_hidden_layers": 66, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "swa_num_attention_heads": 64, "swa_num_key_value_heads": 16, "swa_head_dim": 128, "sliding_window_size": 512,
    "d_rel": 16, "rel_extent": 1024, "conv_kernel_size": 4, "intermediate_size": 24576, "moe_intermediate_size": 3072,
    "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 2, "route_scale": 8.0,
    "logits_mup_width_multiplier": 24.0, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131072, "bos_token_id": 1, "eos_token_id": 2,
}
# thinkingmachines/Inkling-2-Small's text model (model_type inkling2_text, under the checkpoint's text_config), from
# transformers' Inkling2TextConfig defaults and docstring (its checkpoint): 48 layers at 4,608 wide, every sixth full
# (48 query heads of 128 over 8 KV heads, relative logits over 1,024 tokens, dynamic k / v convolutions), the others
# sliding over 1,024 (48 over 8); attention residuals over blocks of 6 layers; short convolutions of 4 taps; every
# layer's MLP 384 routed experts of 2,304 (top 8); the head untied, softcapped at 30, its rows past 200,058 dropped.
# Uncertain: whether the published config.json writes other values (the token ids); its experts are MXFP8, not read.
INKLING2_SMALL = {
    "model_type": "inkling2_text", "vocab_size": 201024, "unpadded_vocab_size": 200058, "hidden_size": 4608,
    "num_hidden_layers": 48, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
    "swa_num_attention_heads": 48, "swa_num_key_value_heads": 8, "swa_head_dim": 128, "sliding_window_size": 1024,
    "d_rel": 16, "rel_extent": 1024, "log_scaling_n_floor": 128000, "log_scaling_alpha": 0.1, "conv_kernel_size": 4,
    "moe_intermediate_size": 2304, "n_routed_experts": 384, "num_experts_per_tok": 8, "route_scale": 8.0,
    "qk_l2_clip_threshold": 22.627416997969522, "rel_l2_clip_threshold": 8.0, "n_layers_per_attn_res_block": 6,
    "mlp_gate_softcap": 4.0, "mlp_up_softcap": 25.0, "final_logit_softcapping": 30.0, "scoring_func": "sigmoid",
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 1048576, "eos_token_id": 200006,
}
# Zyphra/ZAYA1-8B (model_type zaya), from transformers' ZayaConfig defaults and docstring (its checkpoint): 40
# layers at 2,048 wide, each attending through CCA projections (8 query heads of 128 over 2 KV heads; convolutions of
# 2 and 2 taps) and routing each token to one of 16 experts of 2,048 (or to none) by an MLP router of 256; half of each
# head rotating at theta 5e6; the head tied. Uncertain: whether the published config.json writes other values than
# those defaults (layer_types, sliding_window, the token ids 2 / 106 / 0, max_position_embeddings).
ZAYA1_8B = {
    "model_type": "zaya", "vocab_size": 262272, "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "num_experts": 16, "num_experts_per_tok": 1,
    "moe_intermediate_size": 2048, "router_hidden_size": 256, "cca_time0": 2, "cca_time1": 2, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "attention_bias": False, "lm_head_bias": False,
    "rope_parameters": {"hybrid": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5}},
    "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 106, "pad_token_id": 0,
}
# LiquidAI/LFM2-1.2B's config.json (model_type lfm2), from memory of the published file: 16 layers at 2,048 wide,
# six of them attending (full_attn_idxs; later revisions also write them as layer_types), the other ten gated short
# convolutions of 3 taps; 32 query heads of 64 over 8 KV heads with q / k norms; block_ff_dim 12,288 auto-adjusted
# to an MLP of 8,192; the head tied (tie_embedding). Uncertain: the exact attending indices and eos id 7 (<|im_end|>).
LFM2_1_2B = {
    "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048, "block_ff_dim": 12288,
    "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256,
    "num_hidden_layers": 16, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "num_attention_heads": 32,
    "num_key_value_heads": 8, "conv_L_cache": 3, "conv_bias": False, "norm_eps": 1e-5, "rope_theta": 1000000.0,
    "max_position_embeddings": 128000, "tie_embedding": True, "bos_token_id": 1, "eos_token_id": 7,
    "pad_token_id": 0,
}
# LiquidAI/LFM2-8B-A1B's config.json (model_type lfm2_moe), from memory of the published file: 24 layers at 2,048
# wide, six attending (layer_types), the first two with a dense MLP of 7,168, then 32 experts of 1,792 columns, the
# top 4 by sigmoid score plus a learnt expert_bias, renormalised (routed_scaling_factor 1); the head tied.
# Uncertain: the exact attending layers and eos id 7.
LFM2_8B_A1B = {
    "model_type": "lfm2_moe", "vocab_size": 65536, "hidden_size": 2048, "intermediate_size": 7168,
    "moe_intermediate_size": 1792, "num_hidden_layers": 24, "num_dense_layers": 2, "num_experts": 32,
    "num_experts_per_tok": 4, "use_expert_bias": True, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
    "layer_types": ["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)],
    "num_attention_heads": 32, "num_key_value_heads": 8, "conv_L_cache": 3, "conv_bias": False, "norm_eps": 1e-5,
    "rope_theta": 1000000.0, "max_position_embeddings": 128000, "tie_embedding": True, "bos_token_id": 1,
    "eos_token_id": 7, "pad_token_id": 0,
}
# LiquidAI/LFM3-1.7B (model_type lfm3): transformers' Lfm3Config defaults, which its docstring calls that model's
# configuration (the published config.json is not known here exactly): 24 layers at 2,048 wide, per four layers a
# global attending one (i % 4 == 2, a "proportional" rotary over half of each head's frequencies, base 1e6), a
# windowed one of 256 tokens past the first (i % 4 == 0, a plain rotary of base 10,000) and gated short convolutions
# of 7 taps; 16 query heads of 128 over 4 KV heads with per-head q / k norms and sigmoid gates; sandwich norms; a
# SwiGLU of 7,680; the head tied. The layer kinds and ropes are left to those defaults (as the class fills them).
LFM3_1_7B = {
    "model_type": "lfm3", "vocab_size": 128000, "hidden_size": 2048, "intermediate_size": 7680,
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
    "conv_L_cache": 7, "conv_bias": False, "sliding_window": 256, "use_sandwich_norm": True,
    "use_attention_gate": True, "attention_bias": False, "norm_eps": 1e-5, "max_position_embeddings": 128000,
    "tie_word_embeddings": True, "bos_token_id": 124894, "eos_token_id": 124900, "pad_token_id": 124893,
}
# ibm-granite/granite-4.0-h-tiny's config.json (model_type granitemoehybrid), from memory of the published file: 40
# layers at 1,536 wide, four attending (layer_types: 5, 15, 25, 35; NoPE), the rest Mamba-2 (48 heads of 64 over
# 2 x 1,536, state 128, one group, 4 conv taps); 12 query heads over 4 KV heads; 64 experts of 512 columns, the top
# 6, plus a shared MLP of 1,024; Granite's muP scalars (weights drawn at initializer_range 0.1); the head tied.
# Uncertain: the attending indices.
GRANITE_4_0_H_TINY = {
    "model_type": "granitemoehybrid", "vocab_size": 100352, "hidden_size": 1536, "intermediate_size": 512,
    "shared_intermediate_size": 1024, "num_hidden_layers": 40, "num_attention_heads": 12, "num_key_value_heads": 4,
    "num_local_experts": 64, "num_experts_per_tok": 6,
    "layer_types": ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)],
    "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4,
    "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
    "position_embedding_type": "nope", "embedding_multiplier": 12.0, "attention_multiplier": 0.0078125,
    "residual_multiplier": 0.22, "logits_scaling": 6.0, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 131072, "hidden_act": "silu", "initializer_range": 0.1, "tie_word_embeddings": True,
    "bos_token_id": 100257, "eos_token_id": 100257, "pad_token_id": 100256,
}
# ibm-granite/granite-4.0-h-small's config.json, from memory as granite-4.0-h-tiny's: 40 layers at 4,096 wide, four
# attending (NoPE), Mamba-2 with 128 heads of 64, state 128; 32 query heads over 8 KV heads; 72 experts of 768
# columns, the top 10, a shared MLP of 4,096. Uncertain: the experts' and shared MLP's widths, logits_scaling.
GRANITE_4_0_H_SMALL = {
    **GRANITE_4_0_H_TINY, "hidden_size": 4096, "intermediate_size": 768, "shared_intermediate_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 72, "num_experts_per_tok": 10,
    "mamba_n_heads": 128, "logits_scaling": 8.0,
}
# ibm-ai-platform/Bamba-9B's config.json (model_type bamba), from memory of the published file: 32 layers at 4,096
# wide, three attending (attn_layer_indices 9, 18, 27: a rotary over half of each head, as transformers fixes it),
# the rest Mamba-2 (128 heads of 64 over 2 x 4,096, state 128, one group, 4 conv taps); 32 query heads over 8 KV
# heads; a SwiGLU MLP of 14,336; Llama 3's vocabulary. Uncertain: the special ids and max_position_embeddings.
BAMBA_9B = {
    "model_type": "bamba", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_indices": [9, 18, 27],
    "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4,
    "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 262144, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "bos_token_id": 128000,
    "eos_token_id": 128001, "pad_token_id": 128004,
}
# nvidia/Nemotron-H-8B-Base-8K's config.json (model_type nemotron_h), from memory of the published file: 52
# single-operator blocks at 4,096 wide (hybrid_override_pattern: 24 Mamba-2 "M", 4 attending "*" without a rotary, 24
# squared-ReLU MLPs "-" of 21,504), Mamba-2 with 128 heads of 64, state 128 in 8 groups, 4 conv taps; 32 query heads
# of 128 over 8 KV heads. Uncertain: where in the pattern the attending blocks sit (here each after the 4th, 8th,
# 12th and 16th "M").
NEMOTRON_H_8B = {
    "model_type": "nemotron_h", "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 21504,
    "num_hidden_layers": 52, "hybrid_override_pattern": "M-M-M-M*-" + "M-M-M-M*-" * 3 + "M-" * 8,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "mlp_hidden_act": "relu2",
    "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
    "expand": 2, "chunk_size": 128, "use_conv_bias": True, "use_bias": False, "mlp_bias": False,
    "attention_bias": False, "time_step_min": 0.001, "layer_norm_epsilon": 1e-5, "max_position_embeddings": 8192,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}
# nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's config.json (model_type nemotron_h), from memory of the published file:
# 52 single-operator blocks at 2,688 wide: 23 Mamba-2 "M" (64 heads of 64, state 128 in 8 groups, 4 conv taps), 23
# MoE "E" and 6 attending "*" (32 query heads of 128 over 2 KV heads, no rotary), no dense MLP; each MoE block 128
# ungated squared-ReLU experts of 1,856, top 6 by sigmoid score + correction bias in one group, renormalised, times
# 2.5, and a shared expert of 3,712. Uncertain: the pattern's exact order, the Mamba-2 option names the file uses
# (transformers' canonical ones here), intermediate_size (unused: no "-" block), eos_token_id (the chat end token
# may be listed instead) and max_position_embeddings.
NEMOTRON_3_NANO_30B_A3B = {
    "model_type": "nemotron_h", "vocab_size": 131072, "hidden_size": 2688, "intermediate_size": 1856,
    "num_hidden_layers": 52, "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "mlp_hidden_act": "relu2",
    "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
    "expand": 2, "chunk_size": 128, "use_conv_bias": True, "use_bias": False, "mlp_bias": False,
    "attention_bias": False, "time_step_min": 0.001, "layer_norm_epsilon": 1e-5, "max_position_embeddings": 262144,
    "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}
# tiiuae/Falcon-H1-0.5B-Instruct's config.json (model_type falcon_h1), from memory of the published file: 36
# parallel-hybrid layers at 1,024 wide, each attention (8 query heads of 64 over 2 KV heads) beside Mamba-2 (24 heads
# of 64: mamba_d_ssm 1,536, state 128, one group, no gated norm), a SwiGLU MLP of 2,048; muP multipliers throughout.
# Uncertain: the multipliers' values, the vocabulary and the rope base.
FALCON_H1_0_5B = {
    "model_type": "falcon_h1", "vocab_size": 32784, "hidden_size": 1024, "intermediate_size": 2048,
    "num_hidden_layers": 36, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "mamba_d_ssm": 1536, "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1,
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 128, "mamba_conv_bias": True, "mamba_proj_bias": False,
    "mamba_rms_norm": False, "mamba_norm_before_gate": False, "projectors_bias": False, "attention_bias": False,
    "mlp_bias": False, "rms_norm_eps": 1e-5, "rope_theta": 100000000000.0, "max_position_embeddings": 16384,
    "hidden_act": "silu", "embedding_multiplier": 5.656854249492381, "lm_head_multiplier": 0.0390625,
    "attention_in_multiplier": 1.0, "attention_out_multiplier": 0.9375, "key_multiplier": 0.390625,
    "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.23570226039551587,
    "mlp_multipliers": [0.8838834764831844, 0.5859375],
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 11, "pad_token_id": 0,
}
# moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json (model_type kimi_linear, 48B in all, 3B active) as recalled
# (not read from the file), the options transformers' KimiLinearConfig renames under its names (num_experts_per_tok
# for num_experts_per_token, norm_topk_prob for moe_renormalize, n_group for num_expert_group, n_shared_experts for
# num_shared_experts, max_position_embeddings for model_max_length; kimi_linear.from_hf reads either), the KDA's
# sizes and the layer kinds in `linear_attn_config` as published: 27 layers at 2,304 wide, latent attention without
# a rotary in the 4th, 8th, ..., 24th and the 27th (counting from 1: 32 heads, keys and values from a latent of 512
# plus a 64-dim key part every head shares, queries from q_proj, 128 + 64 query / key dims and 128 value dims a
# head), Kimi Delta Attention in the other 20 (32 heads of 128, 4-tap convolutions); the first layer a dense
# SwiGLU of 9,216 columns, then 256 experts of 1,024, the top 8 by sigmoid score plus a learnt bias, renormalised,
# scaled by 2.446, one shared expert. Uncertain: the layer lists (transformers' default rule, without them, puts
# latent attention in the 5th, 9th, ... layers instead) and the token ids.
KIMI_LINEAR_48B_A3B = {
    "model_type": "kimi_linear", "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": 32, "q_lora_rank": None,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                           "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                           "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26]},
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 1024, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "moe_router_activation_func": "sigmoid", "norm_topk_prob": True,
    "routed_scaling_factor": 2.446, "n_group": 1, "topk_group": 1, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "max_position_embeddings": 1048576, "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
}
# inclusionAI/Ling-3.0-Flash (model_type bailing_hybrid) at transformers' BailingHybridConfig defaults, which its
# docstring names as that checkpoint's (not read from the published config.json): 42 layers at 2,560 wide, the last of
# every 6 latent attention (32 heads, keys and values from a latent of 512 plus a 64-dim rotary key every head shares,
# queries from q_proj, 128 + 64 query / key dims and 128 value dims a head, the interleaved rotary of base 6e6, a gate
# per head), Kimi Delta Attention in the other 35 (32 heads of 128, 4-tap convolutions, the bounded forget gate of
# lower bound -5); the first two layers a dense SwiGLU of 6,144, then 512 experts of 768, the top 8 by sigmoid score
# plus a learnt bias among the best 4 of 8 groups, renormalised, scaled by 2.5, one shared expert; one MTP layer (not
# read). Uncertain: all of it as published (the config.json may write the options under its own names:
# num_experts_per_token, num_shared_experts, ...; bailing_hybrid.from_hf reads either), the vocabulary and token ids.
LING_3_0_FLASH = {
    "model_type": "bailing_hybrid", "vocab_size": 157184, "hidden_size": 2560, "intermediate_size": 6144,
    "num_hidden_layers": 42, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "layer_group_size": 6, "short_conv_kernel_size": 4, "kda_safe_gate": True, "kda_lower_bound": -5.0,
    "num_experts": 512, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "n_shared_experts": 1,
    "first_k_dense_replace": 2, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "rope_theta": 6000000.0,
    "attention_bias": False, "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
    "pad_token_id": 156892, "eos_token_id": 156895,
}
# Zyphra/Zamba2-2.7B's config.json (model_type zamba2), from memory of the published file: 54 Mamba-2 layers at 2,560
# wide (80 heads of 64 over 2 x 2,560, state 64, one group, 4 conv taps), nine of them (6, 12, ..., 42, 47, 51) fed by
# two shared transformer blocks in turn (32 heads of 160 over the 5,120-wide concatenation, no rotary, an exact-GELU
# GeGLU MLP of 10,240 with LoRA adapters of rank 128 per invocation, none on the attention); Mistral's vocabulary, a
# tied head. Uncertain: use_mem_rope and use_shared_attention_adapter (false here; Zamba2-1.2B's may set them).
ZAMBA2_2_7B = {
    "model_type": "zamba2", "vocab_size": 32000, "hidden_size": 2560, "intermediate_size": 10240,
    "num_hidden_layers": 54, "layers_block_type": ["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4
    + ["hybrid"] + ["mamba"] * 3 + ["hybrid"] + ["mamba"] * 2, "hybrid_layer_ids": [6, 12, 18, 24, 30, 36, 42, 47, 51],
    "num_attention_heads": 32, "num_key_value_heads": 32, "num_mem_blocks": 2, "adapter_rank": 128,
    "use_shared_attention_adapter": False, "use_shared_mlp_adapter": True, "use_mem_rope": False,
    "n_mamba_heads": 80, "mamba_headdim": 64, "mamba_d_state": 64, "mamba_ngroups": 1, "mamba_d_conv": 4,
    "mamba_expand": 2, "chunk_size": 256, "use_conv_bias": True, "add_bias_linear": False, "hidden_act": "gelu",
    "time_step_min": 0.001, "time_step_max": 0.1, "time_step_floor": 1e-4, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 4096, "use_long_context": False, "tie_word_embeddings": True, "bos_token_id": 1,
    "eos_token_id": 2, "pad_token_id": 0,
}
# Zyphra/Zamba-7B-v1's config.json (model_type zamba), from memory of the published file (transformers' ZambaConfig
# defaults are this checkpoint's): 76 Mamba-1 layers at 3,712 wide (2 Mamba heads over 2 x 3,712 channels, state 16,
# 4 conv taps, dt rank 232 = ceil(3,712 / 16)), the third and every 6th from the 8th (2, 7, 13, ..., 73: 13 of them,
# transformers' layout from attn_layer_period / offset 6 / 4) fed by one shared block (16 heads of 464
# over the 7,424-wide concatenation, an exact-GELU GeGLU MLP of 14,848); Mistral's vocabulary, a tied head.
# Uncertain: whether the file lists layers_block_type itself (not set here: transformers derives it as above),
# mamba_conv_bias / mamba_proj_bias (the defaults, true / false) and max_position_embeddings.
ZAMBA_7B = {
    "model_type": "zamba", "vocab_size": 32000, "hidden_size": 3712, "intermediate_size": 14848,
    "num_hidden_layers": 76, "num_attention_heads": 16, "num_key_value_heads": 16, "n_mamba_heads": 2,
    "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": "auto", "mamba_conv_bias": True,
    "mamba_proj_bias": False, "attn_layer_period": 6, "attn_layer_offset": 4, "hidden_act": "gelu",
    "hidden_mamba_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}
# adept/persimmon-8b-base, as its config.json reads (a snapshot of the Hub's file): 36 layers at 4,096 wide, 64
# heads of 64 (as many KV heads), per-head q / k LayerNorms with biases, a rotary over half of each head
# (transformers' default: the file has no partial_rotary_factor), a squared-ReLU MLP of 16,384 columns.
PERSIMMON_8B = {
    "model_type": "persimmon", "vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384,
    "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 64, "hidden_act": "relu2",
    "layer_norm_eps": 1e-5, "qk_layernorm": True, "rope_theta": 25000.0, "max_position_embeddings": 16384,
    "tie_word_embeddings": False, "bos_token_id": 71013, "eos_token_id": 71013,
}
# The shape transformers' FlintConfig defaults to (RecursiveSI/flint, model_type flint): 49 layers, 32 query heads of
# 128 over 4 KV heads, sink logits, 513-token windows on most layers (the rest NoPE), the first two layers dense
# (6,144 columns), then 256 experts of 512 columns, the top 6 by sigmoid score, and a shared expert of 1,024.
# Uncertain: the hidden size, norm epsilon and rope base (Qwen2MoeConfig's defaults, which FlintConfig keeps) and
# the token ids (none by default).
FLINT = {
    "model_type": "flint", "vocab_size": 150144, "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 49, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 256, "num_experts_per_tok": 6, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 1024,
    "norm_topk_prob": True, "sliding_window": 513, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 262144, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
}
# Qwen3-30B-A3B: 128 experts of 768 columns, the top 8 per token, renormalised.
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
    "attention_bias": False, "use_sliding_window": False, "tie_word_embeddings": False, "bos_token_id": 151643,
    "eos_token_id": 151645,
}
# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json: 48 layers, every 4th gated full attention (16 query heads of 256
# over 2 KV heads, a quarter of each head rotating), the others gated DeltaNet (16 key heads and 32 value heads of
# 128, a 4-tap convolution); 512 experts of 512 columns, the top 10 renormalised, a gated shared expert of 512.
# (Its `mtp` weights: a speculative-decoding head, left unread.)
QWEN3_NEXT_80B_A3B = {
    "model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120,
    "num_hidden_layers": 48, "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "partial_rotary_factor": 0.25, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512,
    "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "rope_theta": 10000000.0, "max_position_embeddings": 262144, "attention_bias": False,
    "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
}
# Qwen/Qwen3.5-27B's text model (its config.json's `text_config`, flattened: model_type qwen3_5_text): 64 layers,
# every 4th gated full attention (24 query heads of 256 over 4 KV heads, a quarter of each head rotating, M-RoPE
# sections [11, 11, 10] interleaved), the others gated DeltaNet (16 key heads and 48 value heads of 128), a dense
# SwiGLU of 17,408 columns. Uncertain: the token ids (left unset).
QWEN3_5_27B = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24, "num_key_value_heads": 4,
    "head_dim": 256, "partial_rotary_factor": 0.25, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "rope_theta": 10000000.0, "max_position_embeddings": 262144, "attention_bias": False,
    "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
}
# Qwen/Qwen3.5-35B-A3B's text model (model_type qwen3_5_moe_text): 40 layers, every 4th gated full attention (16
# query heads of 256 over 2 KV heads), the others gated DeltaNet (16 key heads and 32 value heads of 128); 256
# experts of 512 columns in every layer, the top 8 renormalised, a gated shared expert of 512. Uncertain: the
# token ids (left unset).
QWEN3_5_35B_A3B = {
    "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "partial_rotary_factor": 0.25, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 256,
    "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000000.0, "max_position_embeddings": 262144,
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
}
# Qwen4-Exp's text model (model_type qwen4_exp_text): no published checkpoint config is known, so these are
# transformers' Qwen4ExpTextConfig defaults: 40 layers, every 4th gated attention with QSA (16 query heads of 256
# over 2 KV heads, the whole head rotating), the others gated DeltaNet (16 key heads and 32 value heads of 128);
# 512 experts of 512 columns, the top 10 renormalised, a gated shared expert of 512; 4 gated residual streams
# (rank 320), no PLE layers. Uncertain: the five QSA options, which the defaults leave unset (and with which
# transformers cannot build an attention layer): 16 index heads of 256, one key, blocks of 64, 2,048 tokens are
# placeholders; the token ids (eos 248044, needed by PLE only, likewise).
QWEN4_EXP = {
    "model_type": "qwen4_exp_text", "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512, "num_experts_per_tok": 10,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "max_position_embeddings": 32768, "attention_bias": False, "tie_word_embeddings": False, "hc_count": 4,
    "hc_lowrank": 320, "indexer_n_heads": 16, "indexer_kv_heads": 1, "indexer_head_dim": 256,
    "indexer_budget": 2048, "indexer_compress_ratio": 64, "bos_token_id": None, "eos_token_id": 248044,
}
# Qwen1.5-MoE-A2.7B (model_type qwen2_moe): 60 experts, the top 4 (not renormalised), and a
# shared expert of 5,632 columns behind a sigmoid gate.
QWEN1_5_MOE_A2_7B = {
    "model_type": "qwen2_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
    "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 8192, "use_sliding_window": False,
    "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151643,
}
# JetMoE-8B (model_type jetmoe), from memory of the published config.json: 24 layers of hidden 2,048, a mixture of
# attention heads (8 experts, the top 2, each 16 heads of kv_channels 128; 16 KV heads shared) and of MLP experts
# (8 of 5,632 columns, the top 2), Llama's 32,000-token vocabulary, the head tied. Sure: the widths, experts, k,
# layers, vocabulary. Uncertain: rms_norm_eps (1e-5 here; only the final norm reads it), rope_theta (10,000),
# max_position_embeddings (4,096). num_attention_heads is transformers' derived kv heads x k.
JETMOE_8B = {
    "model_type": "jetmoe", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 16, "kv_channels": 128,
    "num_local_experts": 8, "num_experts_per_tok": 2, "activation_function": "silu", "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": True, "bos_token_id": 1,
    "eos_token_id": 2,
}
# Granite-3.1-3B-A800M (model_type granitemoe): Granite's block and muP scalars, 40 experts of 512
# columns in every layer, the top 8 (a softmax over their logits); head_dim 64.
GRANITE_3_1_3B_A800M = {
    "model_type": "granitemoe", "vocab_size": 49155, "hidden_size": 1536, "intermediate_size": 512,
    "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8, "num_local_experts": 40,
    "num_experts_per_tok": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000000.0, "max_position_embeddings": 131072,
    "embedding_multiplier": 12.0, "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
    "logits_scaling": 6.0, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
}
# Granite MoE SWA (model_type granitemoe_swa) on Granite-3.1-3B-A800M's sizes and scalars: a stand-in, as
# granite-swash-3b-a600m's own sizes are not in transformers (its config class defaults to GraniteMoeShared's
# generic ones); GraniteMoeSWAConfig's 128-token windows, sinks and no shared MLP.
GRANITEMOE_SWA_3B = {**GRANITE_3_1_3B_A800M, "model_type": "granitemoe_swa", "sliding_window": 128,
                     "shared_intermediate_size": 0}
# The shape transformers' MellumConfig defaults to (JetBrains/Mellum2-12B-A2.5B-Base): Qwen3-MoE's block, 64 experts
# of 896 columns, the top 8 renormalised, a rope base per layer type. Uncertain: the heads (32 / 4, Qwen3-MoE's
# defaults, which MellumConfig does not set) and the layers' types, which transformers defaults to all full and
# all sparse where the checkpoint's config.json likely lists sliding-window and dense layers.
MELLUM2_12B = {
    "model_type": "mellum", "vocab_size": 98304, "hidden_size": 2304, "intermediate_size": 7168,
    "num_hidden_layers": 28, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 896, "norm_topk_prob": True,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "sliding_window": 1024,
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
}
# GLM-4.5-Air (model_type glm4_moe, 106B in all, 12B active): 128 experts of 1,408 columns, the
# top 8 by sigmoid score plus a learnt bias, one shared expert, the first layer dense; 96 query
# heads of 128 over a hidden size of 4,096; a rotary over half of each head.
GLM_4_5_AIR = {
    "model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8,
    "head_dim": 128, "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
    "use_qk_norm": False, "attention_bias": True, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "bos_token_id": None, "eos_token_id": [151329, 151336, 151338], "pad_token_id": 151329,
}
# rednote-hilab/dots.llm1 (model_type dots1, 142B in all, 14B active): transformers' Dots1Config
# sizes (hidden 4,608 over 32 heads of 144, 62 layers) with the model card's experts: 128 of 1,408
# columns, the top 6 by sigmoid score plus a learnt bias, 2 shared, the first layer dense.
DOTS_LLM1 = {
    "model_type": "dots1", "vocab_size": 152064, "hidden_size": 4608, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 32,
    "n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0, "max_position_embeddings": 32768, "sliding_window": None, "tie_word_embeddings": False,
    "bos_token_id": None, "eos_token_id": 151645, "pad_token_id": 151643,
}

# deepseek-ai/DeepSeek-V3 (model_type deepseek_v3, 671B in all, 37B active; DeepSeek-R1's and, under model_type
# kimi_k2, Kimi K2's architecture), its config.json's values as recalled (not read from the file): multi-head
# latent attention (128 heads, queries through a latent of 1,536, keys and values from one of 512 plus a shared
# 64-dim rotary key, 128 + 64 query / key dims and 128 value dims a head), YaRN to 160K with mscale_all_dim; the
# first 3 layers dense (18,432 columns), then 256 experts of 2,048, the top 8 by sigmoid score plus a learnt bias
# among the best 4 of 8 groups, scaled by 2.5, one shared expert. The published weights are block-scaled FP8
# (refused at load: random weights here).
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "n_group": 8, "topk_group": 4, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "rope_interleave": True, "max_position_embeddings": 163840,
    "rope_scaling": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
}
# deepseek-ai/DeepSeek-V3.2 (model_type deepseek_v32; DeepSeek-V3.2-Exp's shape too): DeepSeek-V3's (above) with
# DeepSeek Sparse Attention's indexer in every layer (64 heads of 128, the top 2,048 keys a query), as recalled (not
# read from the file); served dense up to index_topk (2,048) tokens a sequence. Uncertain: whether the published
# config.json names `rope_scaling` or `rope_parameters` (the values are DeepSeek-V3's). FP8 weights as published.
DEEPSEEK_V3_2 = {**DEEPSEEK_V3, "model_type": "deepseek_v32", "index_topk": 2048, "index_head_dim": 128,
                 "index_n_heads": 64}
# skt/A.X-K1 (model_type axk1): DeepSeek-V3's block with a norm after each expert block, at the values of
# transformers' AXK1Config defaults (its docstring's checkpoint; not read from the published config.json): 61 layers
# of 7,168, 64 latent-attention heads (a query latent of 1,536, keys and values from one of 512 plus a shared 64-dim
# rotary key), the first layer dense (18,432 columns), then 192 experts of 2,048, the top 8 by sigmoid score among
# the best 4 of 8 groups, scaled by 2.5, one shared expert. Uncertain: the rope (the default's theta 10,000 and no
# YaRN here) and max_position_embeddings (32,768, the default).
# poolside/Laguna-XS.2 (model_type laguna, 33B in all, 3B active), its config.json's values as quoted by public copies
# of it (not read from the file here): 40 layers of 2,048, 48 heads of 128 over 8 KV heads with a softplus gate per
# head, the full layers' rotary YaRN (factor 32 over 4,096) over half of each head at theta 500,000, the sliding
# layers' (512 tokens) the whole head at theta 10,000; 256 experts of 512, the top 8 by sigmoid score + bias, a
# shared expert of 512, a dense first layer of 8,192. Uncertain: which layers slide (mixed, the pattern not known
# here: three sliding then a full one assumed), the dense layers (transformers' default: the first only),
# moe_routed_scaling_factor (transformers' default 1.0 assumed) and num_attention_heads_per_layer (48 in every layer
# assumed).
LAGUNA_XS2 = {
    "model_type": "laguna", "vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 40, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 131072, "attention_bias": False, "rms_norm_eps": 1e-6, "num_experts": 256,
    "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "gating": True,
    "sliding_window": 512, "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 10,
    "rope_parameters": {
        "full_attention": {"rope_theta": 500000.0, "rope_type": "yarn", "factor": 32.0,
                           "original_max_position_embeddings": 4096, "beta_slow": 1.0, "beta_fast": 64.0,
                           "attention_factor": 1.0, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}},
    "tie_word_embeddings": False, "bos_token_id": 2, "eos_token_id": [2, 24], "pad_token_id": 9,
}
# reflection/Beam-1.0-501B-A23B (model_type beam, 501B in all, 23B active), at the values of transformers' BeamConfig
# defaults (its docstring's checkpoint; not read from the published config.json): 52 layers of 5,120, 48 heads of 128
# over 8 KV heads with an output gate (a bias per head), five of every six layers windowed (512 tokens, rotary at
# theta 10,000), every sixth and the last global without a rotary; the first three layers dense (20,480 columns), then
# 256 experts of 2,560, the top 8 by sigmoid score + bias among the best 4 of 8 groups, scaled by 2.5, no shared
# expert; logits soft-capped at 30. Uncertain: max_position_embeddings (8,192, the default), the vocabulary (151,936,
# the default) and the special ids (none in the defaults).
BEAM_1_0 = {
    "model_type": "beam", "vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 20480,
    "num_hidden_layers": 52, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
    "sliding_window": 512, "layer_types": ["full_attention" if (i + 1) % 6 == 0 or i == 51 else "sliding_attention"
                                           for i in range(52)],
    "mlp_layer_types": ["dense"] * 3 + ["sparse"] * 49, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 2560, "norm_topk_prob": True, "n_group": 8, "topk_group": 4,
    "routed_scaling_factor": 2.5, "final_logit_softcapping": 30.0, "tie_word_embeddings": False,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": None},
}
# Aleph-Alpha/Kolibri-1 (model_type kolibri1), at the values of transformers' Kolibri1Config defaults (its
# docstring's checkpoint; not read from the published config.json): 50 layers of 2,560, 48 heads of 128 over 4 KV
# heads, four of every five layers windowed (513 tokens; the fifth global, NoPE), 384 experts of 512 in every layer,
# the top 6 by logit + bias, unrenormalised, one shared expert of 512. Uncertain: the rope (the default's theta
# 10,000), max_position_embeddings (262,144, the default) and the special ids (none in the defaults).
KOLIBRI1 = {
    "model_type": "kolibri1", "vocab_size": 128000, "hidden_size": 2560, "num_hidden_layers": 50,
    "num_attention_heads": 48, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 262144,
    "sliding_window": 513, "num_experts": 384, "num_experts_per_tok": 6, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "norm_topk_prob": False, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": False,
}
AXK1 = {
    "model_type": "axk1", "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 192, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
    "n_group": 8, "topk_group": 4, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "rope_interleave": True, "max_position_embeddings": 32768,
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 163691, "eos_token_id": 163691,
}
# skt/A.X-K2 (model_type axk2): DeepSeek-V3.2's block with gated RMSNorms and a gated query projection, at the
# values of transformers' AXK2Config defaults (its docstring's checkpoint; not read from a published config.json):
# 48 layers of 2,048, 32 latent-attention heads (a query latent of 384, keys and values from one of 128 plus a
# shared 32-dim rotary key, values of 64), the first layer dense (5,120 columns), then 128 experts of 512, the top 8
# by sigmoid score over all experts (no groups), scaled by 2.5, one shared expert; the indexer 16 heads of 128, the
# top 2,048 keys; gates of rank 16. Uncertain: which release these are (the config's comments say A.X-K2-Light
# routes without groups, as here; the larger releases set n_group / topk_group), the rope (the default's theta
# 10,000, no YaRN) and max_position_embeddings (131,072, the default; served up to index_topk, 2,048).
AXK2 = {
    "model_type": "axk2", "vocab_size": 163840, "hidden_size": 2048, "intermediate_size": 5120,
    "moe_intermediate_size": 512, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 32,
    "q_lora_rank": 384, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
    "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
    "n_group": None, "topk_group": None, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "max_position_embeddings": 131072, "index_topk": 2048, "index_head_dim": 128,
    "index_n_heads": 16, "gated_norm_rank": 16, "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": 163691, "eos_token_id": 163691,
}
# deepseek-ai/DeepSeek-V2-Lite (model_type deepseek_v2, 16B in all, 2.4B active), its config.json's values as
# recalled (not read from the file): latent attention without a query latent (16 heads, q_proj straight from the
# hidden row), keys and values from a latent of 512 plus a shared 64-dim rotary key, YaRN with mscale_all_dim
# 0.707; the first layer dense (10,944 columns), then 64 experts of 1,408, the top 6 by softmax probability
# (greedy, not renormalised), two shared experts.
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
    "topk_method": "greedy", "n_group": 1, "topk_group": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 163840,
    "rope_scaling": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 100000, "eos_token_id": 100001,
}
# meituan-longcat/LongCat-Flash-Chat (model_type longcat_flash, 560B in all, 18.6-31.3B active), its config.json's
# values as recalled (not read from the file; they are transformers' LongcatFlashConfig defaults, which follow it):
# 28 layers of two latent-attention sublayers (64 heads, a query latent of 1,536, a key / value latent of 512 plus a
# shared 64-dim rotary key), two dense MLPs of 12,288 and one shortcut MoE: the top 12 of 512 experts of 2,048 and
# 256 identity experts by softmax probability + bias, times 6. Uncertain: the `mla_scale_*` / `zero_expert_type` /
# `router_bias` keys (the original code's, transformers reads none of them) and whether `head_dim` is written.
LONGCAT_FLASH_CHAT = {
    "model_type": "longcat_flash", "vocab_size": 131072, "hidden_size": 6144, "ffn_hidden_size": 12288,
    "expert_ffn_hidden_size": 2048, "num_layers": 28, "num_attention_heads": 64, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 512, "zero_expert_num": 256, "zero_expert_type": "identity", "moe_topk": 12,
    "routed_scaling_factor": 6.0, "router_bias": False, "mla_scale_q_lora": True, "mla_scale_kv_lora": True,
    "rms_norm_eps": 1e-5, "rope_theta": 10000000.0, "max_position_embeddings": 131072, "attention_bias": False,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}
# The shape transformers' Glm4MoeLiteConfig defaults to (zai-org/GLM-4.7-Flash, model_type glm4_moe_lite, 30B in all,
# 3B active): DeepSeek-V3's latent attention at 20 heads (a query latent of 768, a key / value latent of 512 plus a
# shared 64-dim rotary key, 192 + 64 query / key dims and 256 value dims a head), the first layer dense (10,240
# columns), then 64 experts of 1,536, the top 4 by sigmoid score plus a learnt bias, renormalised, scaled by 1.8, one
# shared expert. Uncertain: the rope base and token ids (transformers' defaults: 10,000; 0 and 1).
GLM_4_7_FLASH = {
    "model_type": "glm4_moe_lite", "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240,
    "moe_intermediate_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20,
    "q_lora_rank": 768, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "n_routed_experts": 64, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 1.8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "rope_interleave": True, "max_position_embeddings": 202752, "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": 0, "eos_token_id": 1,
}
# zai-org/GLM-5 (model_type glm_moe_dsa, 744B in all, 40B active; GLM-5.1's shape too), as transformers'
# GlmMoeDsaConfig defaults to it and GLM-5's report lists it: 78 layers at 6,144 wide, latent attention at 64 heads (a
# query latent of 2,048, a key / value latent of 512 plus a shared 64-dim rotary key, 192 + 64 query / key dims and
# 256 value dims a head), DSA's indexer of 32 heads of 128 keeping the top 2,048 keys (served dense up to 2,048 tokens
# a sequence); the first 3 layers dense (12,288 columns), then 256 experts of 2,048, the top 8 by sigmoid score plus a
# learnt bias, renormalised, scaled by 2.5, one shared expert; 202,752 positions. Uncertain: the rope base and token ids
# (transformers' defaults: 10,000; 0 and 1), the experts' groups (1 of 1) and scale (2.5: transformers' defaults), and
# the indexer kinds (every layer "full", transformers' default rule).
GLM_5 = {
    "model_type": "glm_moe_dsa", "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 202752, "index_topk": 2048, "index_head_dim": 128,
    "index_n_heads": 32, "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
}
# dots-studio/dots3-note-prev's text model (model_type dots3_note_text; the multimodal dots3_note checkpoint's), as
# transformers' Dots3NoteTextConfig defaults to it: 46 layers at 5,120 wide, the first two and every 4th from the
# second DSA layers (indexed: latent attention at 128 heads, a query latent of 1,024, a key / value latent of 512 plus
# a shared 64-dim rotary key, 128 + 64 query / key dims, 128 value dims; an indexer of 64 heads of 128 keeping the top
# 2,048 keys, served dense up to 2,048 tokens a sequence), the others sliding over 512 keys (64 heads from latents of
# 1,024 and 1,024, 192 + 64 query / key dims, 128 value dims), written as the published config.json writes them
# (`swa_*`); rotary bases 8e7 and 5e4; the first layer dense (13,824 columns), then 256 experts of 1,536, the top 8 by
# sigmoid score plus a learnt bias, renormalised, unscaled, one shared expert of 1,536; 524,288 positions. Uncertain:
# all of it is transformers' defaults (the checkpoint's own config.json was not read).
DOTS3_NOTE_PREV = {
    "model_type": "dots3_note_text", "vocab_size": 152064, "hidden_size": 5120, "intermediate_size": 13824,
    "moe_intermediate_size": 1536, "num_hidden_layers": 46, "num_attention_heads": 128, "num_key_value_heads": 128,
    "q_lora_rank": 1024, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "head_dim": 256, "n_routed_experts": 256, "n_shared_experts": 1, "shared_experts_intermediate_size": 1536,
    "num_experts_per_tok": 8, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 1.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "rope_theta": 80000000.0, "swa_rope_theta": 50000.0, "use_sliding_window": True, "sliding_window": 512,
    "swa_num_attention_heads": 64, "swa_num_key_value_heads": 64, "swa_q_lora_rank": 1024, "swa_kv_lora_rank": 1024,
    "swa_head_dim": 256, "swa_qk_nope_head_dim": 192, "swa_qk_rope_head_dim": 64, "swa_v_head_dim": 128,
    "max_position_embeddings": 524288, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64,
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151668,
    "pad_token_id": 151659,
}
# The shape transformers' YoutuConfig defaults to (tencent/Youtu-LLM-2B, model_type youtu): Llama's block at 2,048
# wide, 32 layers, a dense MLP of 6,144 columns, with DeepSeek-V3's latent attention at 16 heads (a query latent of
# 1,536, a key / value latent of 512 plus a shared 64-dim rotary key, 128 + 64 query / key dims, 128 value dims),
# a tied head. Uncertain: the rope base (transformers' default: 10,000).
YOUTU_LLM_2B = {
    "model_type": "youtu", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "rope_interleave": True, "max_position_embeddings": 131072, "attention_bias": False,
    "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001,
}
# The text model of mistralai/Mistral-Small-4-119B-2603 (model_type mistral4 inside its multimodal mistral3
# checkpoint; 119B in all), as transformers' Mistral4Config defaults to it: latent attention at 32 heads (a query
# latent of 1,024, a key / value latent of 256 plus a shared 64-dim rotary key, 64 + 64 query / key dims and 128
# value dims a head, the rotary interleaved: transformers' partial rotary of 64 / 128), YaRN (factor 128 over 8,192
# positions, mscale = mscale_all_dim = 1) with Llama 4's query scaling (beta 0.1) past 8,192; 128 experts of 2,048
# in every layer, the top 4 by softmax probability, renormalised, one shared expert. Uncertain: max_position_embeddings
# (1,048,576, transformers' default, = 128 x 8,192), the rope base (10,000) and the token ids (1, 2).
MISTRAL_SMALL_4 = {
    "model_type": "mistral4", "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 32,
    "q_lora_rank": 1024, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 0,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0, "rms_norm_eps": 1e-6,
    "rope_interleave": True, "max_position_embeddings": 1048576,
    "rope_scaling": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
                     "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1, "partial_rotary_factor": 0.5},
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}
# openbmb/MiniCPM3-4B (model_type minicpm3), as transformers' MiniCPM3Config defaults to it: Llama's block at 2,560
# wide, 62 layers, a dense MLP of 6,400 columns, latent attention at 40 heads (a query latent of 768, a key / value
# latent of 256 plus a shared 32-dim rotary key, 64 + 32 query / key dims, 64 value dims, Llama's rotate-half
# rotary), muP's scalars (embeddings times 12, residual branches times 1.4 / sqrt(62), logits divided by
# 2,560 / 256), a tied head; longrope whose original length is its longest (32,768: the short factors only).
# Uncertain: the factors, which are its own (these have its shape, 16 = qk_rope_head_dim / 2, and a range),
# the rope base (10,000) and the end-of-sequence ids (2 here).
MINICPM3_4B = {
    "model_type": "minicpm3", "vocab_size": 73448, "hidden_size": 2560, "intermediate_size": 6400,
    "num_hidden_layers": 62, "num_attention_heads": 40, "num_key_value_heads": 40, "q_lora_rank": 768,
    "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "rms_norm_eps": 1e-5,
    "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256, "rope_theta": 10000.0,
    "max_position_embeddings": 32768,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(16)],
                     "long_factor": [1.0 + 2.0 * i for i in range(16)], "original_max_position_embeddings": 32768},
    "attention_bias": False, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
}
# facebook/xglm-564M (model_type xglm), as transformers' XGLMConfig defaults to it, under transformers' canonical
# names for its d_model, attention_heads and num_layers: OPT's pre-LN block at 1,024 wide, 24 layers, 16 heads, a
# GELU MLP of 4,096 (`ffn_dim`), fairseq's sinusoidal positions (2,048, offset by 2), embeddings scaled by
# sqrt(1,024), a tied head over 256,008 tokens.
XGLM_564M = {
    "model_type": "xglm", "vocab_size": 256008, "hidden_size": 1024, "ffn_dim": 4096, "intermediate_size": 4096,
    "num_hidden_layers": 24, "num_attention_heads": 16, "activation_function": "gelu", "scale_embedding": True,
    "max_position_embeddings": 2048, "tie_word_embeddings": True, "pad_token_id": 1, "bos_token_id": 0,
    "eos_token_id": 2,
}

# upstage/Solar-Open-100B (the shape transformers' SolarOpenConfig defaults to): Llama's attention
# with GLM-4.5's mixture of experts in every layer, 128 experts, the top 8, one shared.
SOLAR_OPEN_100B = {
    "model_type": "solar_open", "vocab_size": 196608, "hidden_size": 4096, "num_hidden_layers": 48,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
    "rope_theta": 1e6, "max_position_embeddings": 131072, "moe_intermediate_size": 1280, "n_routed_experts": 128,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 1,
    "eos_token_id": 2,
}
# OLMo-2-1124-7B (model_type olmo2): Llama's sizes with the norms after attention and the MLP,
# and q / k norms over all heads.
OLMO_2_7B = {
    "model_type": "olmo2", "vocab_size": 100352, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-6,
    "rope_theta": 500000.0, "max_position_embeddings": 4096, "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": None, "eos_token_id": 100257, "pad_token_id": 100277,
}
# allenai/Olmo-Hybrid-7B (model_type olmo_hybrid): transformers' OlmoHybridConfig defaults, which its docstring
# names that checkpoint's (the published config.json is not known here exactly): 32 layers at 3,840 wide, every 4th
# OLMo 3 attention (30 heads of 128, q / k norms over all heads, post-norm), the others gated DeltaNet (30 key heads
# of 96 and 30 value heads of 192, beta in [0, 2]); an MLP of 11,008. No rotary: the released checkpoints' rope base
# is null (transformers' modeling file says so), which this writes as rope_theta None.
OLMO_HYBRID_7B = {
    "model_type": "olmo_hybrid", "vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 30, "num_key_value_heads": 30, "linear_num_key_heads": 30,
    "linear_num_value_heads": 30, "linear_key_head_dim": 96, "linear_value_head_dim": 192,
    "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "rope_theta": None, "max_position_embeddings": 65536, "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": None, "eos_token_id": 100257, "pad_token_id": 100277,
}
# OLMoE-1B-7B-0924 (model_type olmoe): 64 experts of 1,024 columns, the top 8 (not renormalised),
# q / k norms over all heads.
OLMOE_1B_7B = {
    "model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 1024,
    "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64,
    "num_experts_per_tok": 8, "norm_topk_prob": False, "clip_qkv": None, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False, "bos_token_id": None,
    "eos_token_id": 50279, "pad_token_id": 1,
}
# The shape transformers' FlexOlmoConfig defaults to (FlexOlmo-7x7B): OLMo 2's 7B block with 7
# experts of its MLP's width in every layer, the top 5 by softmax, not renormalised.
FLEX_OLMO_7X7B = {
    "model_type": "flex_olmo", "vocab_size": 100352, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "num_experts": 7,
    "num_experts_per_tok": 5, "norm_topk_prob": False, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": 100257,
    "pad_token_id": 100277,
}
# Command R7B (c4ai-command-r7b-12-2024, model_type cohere2): the parallel block on a bias-free
# LayerNorm; three sliding-window layers (4,096 tokens) to one global NoPE layer; tied head
# scaled by logit_scale.
COMMAND_R7B = {
    "model_type": "cohere2", "vocab_size": 256000, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "layer_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": 132096, "sliding_window": 4096,
    "sliding_window_pattern": 4, "logit_scale": 0.25, "attention_bias": False, "tie_word_embeddings": True,
    "bos_token_id": 5, "eos_token_id": 255001, "pad_token_id": 0,
}
# gpt-oss-20b (model_type gpt_oss): 32 experts of 2,880 columns, the top 4, with biases and a
# clamped SwiGLU; attention sinks; 128-token windows on every other layer (the published
# `layer_types`: sliding, full, sliding, ...; left to that default rule here, so that fewer layers
# keep it); YaRN. (gpt-oss-120b: 36 layers, 128 experts.)
GPT_OSS_20B = {
    "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 4096},
    "max_position_embeddings": 131072, "attention_bias": True, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "eos_token_id": 200002, "pad_token_id": 199999,
}

# Llama-3.1-70B / 3.3-70B: 141 GB in fp16, the shape tensor parallelism is for.
LLAMA_3_1_70B = {**LLAMA_3_1_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                 "num_attention_heads": 64, "num_key_value_heads": 8}

DECODER_SHAPES = {
    "llama-3.1-8b": LLAMA_3_1_8B,
    "llama-3.1-70b": LLAMA_3_1_70B,
    "qwen2.5-7b": QWEN2_5_7B,
    "qwen3-8b": QWEN3_8B,
    "mistral-7b": MISTRAL_7B_V0_3,
    "gemma-7b": GEMMA_7B,
    "gemma-2-9b": GEMMA_2_9B,
    "gemma-3-1b": GEMMA_3_1B,
    "gemma-3n-e2b": GEMMA_3N_E2B,
    "gemma-3n-e4b": GEMMA_3N_E4B,
    "gemma-4-31b": GEMMA_4_31B,
    "gemma-4-26b-a4b": GEMMA_4_26B_A4B,
    "gemma-4-e2b": GEMMA_4_E2B,
    "gemma-4-e4b": GEMMA_4_E4B,
    "gemma-4-12b": GEMMA_4_12B,
    "phi-3-mini": PHI_3_MINI_4K,
    "phi-3-mini-128k": PHI_3_MINI_128K,
    "phi-4-mini": PHI_4_MINI,
    "phi-4-multimodal": PHI_4_MULTIMODAL,
    "granite-3.1-8b": GRANITE_3_1_8B,
    "smollm3-3b": SMOLLM3_3B,
    "glm-4-9b": GLM_4_9B,
    "ministral-8b": MINISTRAL_8B,
    "ernie-4.5-0.3b": ERNIE_4_5_0_3B,
    "ernie-4.5-21b-a3b": ERNIE_4_5_21B_A3B,
    "helium-1-2b": HELIUM_1_2B,
    "starcoder2-3b": STARCODER2_3B,
    "stablelm-2-1.6b": STABLELM_2_1_6B,
    "nemotron-mini-4b": NEMOTRON_MINI_4B,
    "arcee-afm": ARCEE_AFM,
    "bitnet-b1.58-2b-4t": BITNET_B158_2B_4T,
    "diffllama-0.3b": DIFFLLAMA_0_3B,
    "doge-320m": DOGE_320M,
    "apertus-8b": APERTUS_8B,
    "dbrx-132b": DBRX_132B,
    "phi-2": PHI_2,
    "pythia-6.9b": PYTHIA_6_9B,
    "gpt-neox-japanese-2.7b": GPT_NEOX_JAPANESE_2_7B,
    "falcon-7b": FALCON_7B,
    "falcon-40b": FALCON_40B,
    "bloom-560m": BLOOM_560M,
    "bloom-7b1": BLOOM_7B1,
    "ettin-decoder-150m": ETTIN_DECODER_150M,
    "mpt-7b": MPT_7B,
    "starcoder-15b": STARCODER_15B,
    "opt-125m": OPT_125M,
    "gpt-j-6b": GPT_J_6B,
    "codegen-350m-mono": CODEGEN_350M,
    "gpt-neo-125m": GPT_NEO_125M,
    "biogpt": BIOGPT,
    "openai-gpt": OPENAI_GPT,
    "ctrl": CTRL,
    "cpm-ant-10b": CPM_ANT_10B,
    "cwm-32b": CWM_32B,
    "granite-swash-2b": GRANITE_SWASH_2B,
    "olmo-7b": OLMO_7B,
    "nanochat-d32": NANOCHAT_D32,
    "hyperclovax": HYPERCLOVAX,
    "jais2": JAIS2,
    "mixtral-8x7b": MIXTRAL_8X7B,
    "phi-3.5-moe": PHI_3_5_MOE,
    "mimo-v2-flash": MIMO_V2_FLASH,
    "minimax-m2": MINIMAX_M2,
    "minimax-m3": MINIMAX_M3,
    "command-a-plus": COMMAND_A_PLUS,
    "hy3-preview": HY3_PREVIEW,
    "hy4-preview": HY4_PREVIEW,
    "deepseek-v4-flash": DEEPSEEK_V4_FLASH,
    "llama-4-scout": LLAMA_4_SCOUT,
    "llama-3.2-11b-vision": LLAMA_3_2_11B_VISION,
    "emu3-chat": EMU3_CHAT,
    "aria": ARIA,
    "hrm-text-1b": HRM_TEXT_1B,
    "flint": FLINT,
    "trinity-mini": TRINITY_MINI,
    "recurrentgemma-2b": RECURRENTGEMMA_2B,
    "lfm2-1.2b": LFM2_1_2B,
    "zaya1-8b": ZAYA1_8B,
    "inkling": INKLING,
    "inkling2-small": INKLING2_SMALL,
    "lfm2-8b-a1b": LFM2_8B_A1B,
    "lfm3-1.7b": LFM3_1_7B,
    "persimmon-8b": PERSIMMON_8B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "qwen3-next-80b-a3b": QWEN3_NEXT_80B_A3B,
    "qwen3.5-27b": QWEN3_5_27B,
    "qwen3.5-35b-a3b": QWEN3_5_35B_A3B,
    "qwen4-exp": QWEN4_EXP,
    "qwen1.5-moe-a2.7b": QWEN1_5_MOE_A2_7B,
    "granite-3.1-3b-a800m": GRANITE_3_1_3B_A800M,
    "jetmoe-8b": JETMOE_8B,
    "granitemoe-swa-3b": GRANITEMOE_SWA_3B,
    "mellum2-12b-a2.5b": MELLUM2_12B,
    "glm-4.5-air": GLM_4_5_AIR,
    "dots.llm1": DOTS_LLM1,
    "deepseek-v3": DEEPSEEK_V3,
    "deepseek-v3.2": DEEPSEEK_V3_2,
    "a.x-k1": AXK1,
    "a.x-k2": AXK2,
    "kolibri-1": KOLIBRI1,
    "laguna-xs.2": LAGUNA_XS2,
    "beam-1.0-501b-a23b": BEAM_1_0,
    "glm-5": GLM_5,
    "dots3-note-prev": DOTS3_NOTE_PREV,
    "deepseek-v2-lite": DEEPSEEK_V2_LITE,
    "glm-4.7-flash": GLM_4_7_FLASH,
    "youtu-llm-2b": YOUTU_LLM_2B,
    "mistral-small-4": MISTRAL_SMALL_4,
    "longcat-flash-chat": LONGCAT_FLASH_CHAT,
    "minicpm3-4b": MINICPM3_4B,
    "xglm-564m": XGLM_564M,
    "solar-open-100b": SOLAR_OPEN_100B,
    "olmo-2-7b": OLMO_2_7B,
    "olmo-hybrid-7b": OLMO_HYBRID_7B,
    "olmoe-1b-7b": OLMOE_1B_7B,
    "flex-olmo-7x7b": FLEX_OLMO_7X7B,
    "command-r7b": COMMAND_R7B,
    "gpt-oss-20b": GPT_OSS_20B,
    "granite-4.0-h-tiny": GRANITE_4_0_H_TINY,
    "granite-4.0-h-small": GRANITE_4_0_H_SMALL,
    "bamba-9b": BAMBA_9B,
    "nemotron-h-8b": NEMOTRON_H_8B,
    "nemotron-3-nano-30b-a3b": NEMOTRON_3_NANO_30B_A3B,
    "falcon-h1-0.5b": FALCON_H1_0_5B,
    "kimi-linear-48b-a3b": KIMI_LINEAR_48B_A3B,
    "ling-3.0-flash": LING_3_0_FLASH,
    "minimax-text-01": MINIMAX_TEXT_01,
    "zamba2-2.7b": ZAMBA2_2_7B,
    "zamba-7b": ZAMBA_7B,
    "mamba-2.8b": MAMBA_2_8B,
    "falcon-mamba-7b": FALCON_MAMBA_7B,
    "rwkv-4-169m-pile": RWKV_4_169M_PILE,
    "mamba-codestral-7b": MAMBA_CODESTRAL_7B,
    "jamba-mini": JAMBA_MINI,
    "xlstm-7b": XLSTM_7B,
}


_DBRX_NAMES = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
               "max_seq_len": "max_position_embeddings"}


def shrunk(name: str, layers: int = 2, hidden: int = 128, heads: int = 8, vocab: int = 320,
           window: int | None = 8) -> dict:
    """`name`'s config with few layers, a small hidden size and vocabulary, and sliding windows
    (where it has any) of `window` tokens, keeping its head-count ratios and everything else."""
    cfg = dict(DECODER_SHAPES[name])
    dbrx = "ffn_config" in cfg  # (DBRX's own top-level names: shrunk under transformers' canonical ones, then back)
    mpt = cfg["model_type"] == "mpt"  # (MPT's: the same names)
    if dbrx or mpt:
        cfg = {_DBRX_NAMES.get(k, k): v for k, v in cfg.items()}
    if dbrx:
        cfg["num_key_value_heads"] = cfg["attn_config"]["kv_n_heads"]
    if "num_attention_heads" not in cfg and "state_size" in cfg:  # attention-free (Mamba, Mamba-2): no heads
        return _shrunk_attention_free(cfg, layers, hidden, vocab)
    if cfg["model_type"] == "rwkv":  # (attention-free, no heads: the time mix as wide as hidden, the channel mix's
        # width not a multiple of 64, at most 256 tokens a sequence)
        cfg.update(vocab_size=vocab, hidden_size=hidden, attention_hidden_size=hidden,
                   intermediate_size=2 * hidden + 32, num_hidden_layers=layers, context_length=256, bos_token_id=1,
                   eos_token_id=2, pad_token_id=0)
        return cfg
    if cfg["model_type"] == "xlstm":  # xLSTM: `layers` mLSTM blocks at `hidden` (embedding_dim, num_blocks too), its
        # heads and width factors kept, 16-token chunks (so that the prompts cross them), at most 256 tokens a sequence
        cfg.update(vocab_size=vocab, hidden_size=hidden, embedding_dim=hidden, num_hidden_layers=layers,
                   num_blocks=layers, chunk_size=16, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                   pad_token_id=0)
        return cfg
    kv = cfg.get("num_key_value_heads", cfg.get("num_kv_heads", cfg["num_attention_heads"]))
    ratio = cfg["num_attention_heads"] // kv
    if name.startswith("phi-2"):
        hidden = heads * 20  # head_dim 20 (Phi-2's is 80): 0.4 of it, the rotating dims, even as Phi-2's 32
    elif name.startswith("phi"):
        hidden = heads * 24  # head_dim = hidden / heads, not a power of two (Phi-3's is 96)
    cfg.update(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden + 32, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=max(1, heads // ratio),
               # (BLOOM's config has no max_position_embeddings: ALiBi; the family's default is 2,048)
               max_position_embeddings=min(cfg.get("max_position_embeddings", 2048), 256), bos_token_id=1,
               eos_token_id=2, pad_token_id=0)
    if "num_kv_heads" in cfg:  # (Falcon's name for them)
        cfg["num_kv_heads"] = cfg["num_key_value_heads"]
    if "intermediate_size_mlp" in cfg:  # (Llama 4's dense MLP width beside its experts' intermediate_size)
        cfg["intermediate_size_mlp"] = 2 * hidden + 96
    if "ffn_dim" in cfg:  # (OPT's names for the MLP's width and the embeddings')
        cfg.update(ffn_dim=cfg["intermediate_size"], word_embed_proj_dim=hidden)
    if "dff" in cfg:  # (CTRL's name for the MLP's width)
        cfg["dff"] = cfg["intermediate_size"]
    if "dim_ff" in cfg:  # (CPM-Ant's names for the MLP's width and the heads')
        cfg.update(dim_ff=cfg["intermediate_size"], dim_head=hidden // heads)
    if "head_dim" in cfg:
        # A head_dim unlike hidden / heads stays unlike it (Gemma's 256 for 3,584 / 16; Qwen3's 128,
        # which its smaller models keep beside other widths).
        published = DECODER_SHAPES[name]
        own = published["head_dim"] != published["hidden_size"] // published["num_attention_heads"]
        cfg["head_dim"] = 2 * hidden // heads if own or name.startswith("qwen3") else hidden // heads
    if "kv_channels" in cfg:  # (JetMoE's head width)
        cfg["kv_channels"] = hidden // heads
    if "rotary_dim" in cfg:  # the published share of a head that rotates (GPT-J-6B: 64 of 256, MiniMax-M2: 64 of 128)
        published = DECODER_SHAPES[name]
        published_head = published.get("head_dim") or published["hidden_size"] // published["num_attention_heads"]
        cfg["rotary_dim"] = published["rotary_dim"] * (cfg.get("head_dim") or hidden // heads) // published_head
    if cfg.get("sliding_window") and window and cfg["model_type"] != "qwen2":
        cfg["sliding_window"] = window
    if cfg.get("window_size") and window:  # (GPT-Neo's local layers, the published kinds in turn over the few)
        kinds = cfg["attention_types"][0][0]
        cfg.update(window_size=window, attention_types=[[kinds, layers // len(kinds)]])
    if "num_experts_per_tok" in cfg:  # MoE: fewer, narrower experts (each I not a multiple of 64), k kept
        top_k = cfg["num_experts_per_tok"]
        experts = next(k for k in ("num_local_experts", "n_routed_experts", "num_experts") if k in cfg)
        cfg[experts] = min(cfg[experts], max(8, 2 * top_k))
        if "moe_intermediate_size" in cfg:
            cfg["moe_intermediate_size"] = hidden + 16
        if "shared_expert_intermediate_size" in cfg:
            cfg["shared_expert_intermediate_size"] = hidden + 48
    if "moe_topk" in cfg and "moe_num_experts" in cfg:  # (Aria's names for k and the experts: fewer likewise, k kept)
        cfg["moe_num_experts"] = min(cfg["moe_num_experts"], max(8, 2 * cfg["moe_topk"]))
    if dbrx:  # (its nested options: its KV heads; fewer, narrower experts, k kept)
        ffn = cfg["ffn_config"]
        cfg["attn_config"] = {**cfg["attn_config"], "kv_n_heads": cfg.pop("num_key_value_heads")}
        cfg["ffn_config"] = {**ffn, "ffn_hidden_size": hidden + 16,
                             "moe_num_experts": min(ffn["moe_num_experts"], max(8, 2 * ffn["moe_top_k"]))}
        del cfg["intermediate_size"]
        cfg = {next((own for own, canonical in _DBRX_NAMES.items() if canonical == k), k): v for k, v in cfg.items()}
    if mpt:  # (back to its own names; its MLP width and KV heads are not in its config: 4 x hidden, every head)
        del cfg["intermediate_size"], cfg["num_key_value_heads"]
        cfg = {next((own for own, canonical in _DBRX_NAMES.items() if canonical == k), k): v for k, v in cfg.items()}
    if "conv_L_cache" in cfg:  # LFM2: a short-conv layer and an attending one in turn over the few, the MLP's width
        # where transformers reads it (block_ff_dim over intermediate_size), a dense layer before the MoE ones
        cfg.pop("full_attn_idxs", None)
        cfg["layer_types"] = (["conv", "full_attention"] * layers)[:layers]
        if "block_ff_dim" in cfg:
            cfg["block_ff_dim"] = cfg["intermediate_size"]
        if "num_dense_layers" in cfg:
            cfg["num_dense_layers"] = min(cfg["num_dense_layers"], 1)
    if "lru_width" in cfg:  # RecurrentGemma: the RG-LRU as wide as hidden (8 heads of 16), a recurrent layer then an
        # attending one in turn over the few, a window of `window` tokens
        cfg.update(lru_width=hidden, block_types=["recurrent", "attention"])
        if window:
            cfg["attention_window_size"] = window
    if "mamba_n_heads" in cfg:  # Mamba-2 hybrids: 8 heads over expand x hidden, a small state, 16-token chunks (so
        # that the prompts cross them), a Mamba-2 layer then an attending one in turn over the few
        cfg.update(mamba_n_heads=8, mamba_d_head=cfg.get("mamba_expand", 2) * hidden // 8, mamba_d_state=16,
                   mamba_chunk_size=16)
        if cfg.get("mamba_d_ssm"):  # (Falcon-H1's own Mamba width: 1.5 x hidden, as 0.5B's)
            cfg.update(mamba_d_ssm=3 * hidden // 2, mamba_d_head=3 * hidden // 2 // 8)
        if "layer_types" in cfg:
            cfg["layer_types"] = (["mamba", "attention"] * layers)[:layers]
        if "attn_layer_indices" in cfg:
            cfg["attn_layer_indices"] = list(range(1, layers, 2))
        if cfg.get("shared_intermediate_size"):
            cfg["shared_intermediate_size"] = hidden + 48
    if cfg["model_type"] == "zamba":  # Zamba: its Mamba-1 heads (2) and state kept, dt's rank derived ("auto"), a
        # Mamba layer then a hybrid one in turn over the few
        cfg.update(mamba_dt_rank="auto", layers_block_type=(["mamba", "hybrid"] * layers)[:layers])
    elif "n_mamba_heads" in cfg:  # Zamba2: Mamba-2 as above, rank-16 adapters, a Mamba-2 layer then a hybrid one in
        # turn over the few (hybrid_layer_ids left to follow them)
        cfg.update(n_mamba_heads=8, mamba_headdim=cfg.get("mamba_expand", 2) * hidden // 8, mamba_d_state=16,
                   chunk_size=16, adapter_rank=16, layers_block_type=(["mamba", "hybrid"] * layers)[:layers])
        cfg.pop("hybrid_layer_ids", None)
    if "hybrid_override_pattern" in cfg:  # Nemotron-H: Mamba-2 as above (2 groups); an "M" without an MLP, then "*-"
        # and "M-": three of the decoder's layers, `layers` ignored. With experts (Nemotron 3): "ME", "*-", "ME" and an
        # "M" without one, the shared expert narrower
        pattern = "ME*-MEM" if cfg.get("n_routed_experts") else "M*-M-"
        cfg.update(mamba_num_heads=8, mamba_head_dim=cfg.get("expand", 2) * hidden // 8, ssm_state_size=16,
                   chunk_size=16, n_groups=2, hybrid_override_pattern=pattern, num_hidden_layers=len(pattern))
        if cfg.get("n_routed_experts"):
            cfg["moe_shared_expert_intermediate_size"] = hidden + 48
    if "mamba_dt_rank" in cfg and cfg["model_type"] == "jamba":  # Jamba: dt's rank as transformers derives it
        # ("auto"), an attending layer among the few
        period = min(cfg["attn_layer_period"], layers)
        cfg.update(mamba_dt_rank="auto", attn_layer_period=period,
                   attn_layer_offset=min(cfg["attn_layer_offset"], period - 1))
    if "v_head_dim" in cfg and "kv_lora_rank" not in cfg:  # v heads narrower than q / k's (MiMo-V2-Flash): the ratio
        published = DECODER_SHAPES[name]
        cfg["v_head_dim"] = published["v_head_dim"] * cfg["head_dim"] // published["head_dim"]
    if "kv_lora_rank" in cfg:  # latent attention (DeepSeek): its ranks and head dims an eighth of the published
        for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            cfg[key] = cfg[key] // 8 if cfg.get(key) else cfg.get(key)
    if cfg["model_type"] == "longcat_flash":  # LongCat-Flash, under its own names: `layers` sublayers (two a layer),
        # the rotary as wide as the shrunk rotary key (transformers' is head_dim wide), fewer, narrower experts (k kept)
        # and identity experts in the published ratio to them (1 to 2)
        published = DECODER_SHAPES[name]
        top_k = cfg["moe_topk"]
        routed = min(published["n_routed_experts"], max(8, 2 * top_k))
        cfg.update(num_layers=max(1, layers // 2), ffn_hidden_size=cfg.pop("intermediate_size"),
                   head_dim=cfg["qk_rope_head_dim"], n_routed_experts=routed, expert_ffn_hidden_size=hidden + 16,
                   zero_expert_num=routed * published["zero_expert_num"] // published["n_routed_experts"])
    if "index_topk" in cfg:  # DSA's indexer (DeepSeek-V3.2, GLM-5): 4 heads, an eighth of the published head width
        cfg.update(index_n_heads=4, index_head_dim=cfg["index_head_dim"] // 8)
    if cfg["model_type"] == "dots3_note_text":  # Dots3: the sliding layers' latent attention shrunk as the others' (its
        # heads in the published ratio to theirs, its ranks and head dims an eighth), an indexed layer then a sliding
        # one in turn over the few, the shared expert narrower
        published = DECODER_SHAPES[name]
        swa_heads = max(1, heads * published["swa_num_attention_heads"] // published["num_attention_heads"])
        cfg.update({key: cfg[key] // 8 for key in ("swa_q_lora_rank", "swa_kv_lora_rank", "swa_head_dim",
                                                   "swa_qk_nope_head_dim", "swa_qk_rope_head_dim", "swa_v_head_dim")},
                   swa_num_attention_heads=swa_heads, swa_num_key_value_heads=swa_heads,
                   layer_types=(["indexed_attention", "sliding_attention"] * layers)[:layers],
                   shared_experts_intermediate_size=hidden + 48)
    if "linear_num_value_heads" in cfg:  # gated DeltaNet (Qwen3-Next, Qwen3.5): 2 key heads, the value heads' ratio
        ratio = cfg["linear_num_value_heads"] // cfg["linear_num_key_heads"]  # kept, heads as wide as attention's
        cfg.update(linear_num_key_heads=2, linear_num_value_heads=2 * ratio, linear_key_head_dim=2 * hidden // heads,
                   linear_value_head_dim=2 * hidden // heads)
    if cfg["model_type"] == "bailing_hybrid":  # Ling 3.0: a KDA layer then a latent-attention one in turn over the
        # few (the last of each group of `layers`), experts from the second layer on
        cfg.update(layer_group_size=min(cfg["layer_group_size"], layers),
                   first_k_dense_replace=min(cfg["first_k_dense_replace"], 1))
    if "linear_attn_config" in cfg:  # Kimi Linear: 4 KDA heads as wide as attention's, a KDA layer then a
        # latent-attention one in turn over the few (its lists count from 1)
        cfg["linear_attn_config"] = {**cfg["linear_attn_config"], "num_heads": 4, "head_dim": 2 * hidden // heads,
                                     "kda_layers": list(range(1, layers + 1, 2)),
                                     "full_attn_layers": list(range(2, layers + 1, 2))}
    if cfg["model_type"] == "inkling_text":  # Inkling: the sliding layers' heads in the published ratio to the full
        # ones', a sliding layer then a full one in turn over the few, a window of `window` tokens, relative logits
        # over 32 tokens (shorter than the prompts), every row of the head giving logits
        published = DECODER_SHAPES[name]
        cfg.update(swa_num_attention_heads=heads * published["swa_num_attention_heads"] // published[
            "num_attention_heads"], swa_num_key_value_heads=max(1, heads * published["swa_num_key_value_heads"] //
                                                                  published["num_attention_heads"]),
                   swa_head_dim=cfg["head_dim"], layer_types=(["hybrid_sliding", "hybrid"] * layers)[:layers],
                   rel_extent=32, unpadded_vocab_size=None)
        if window:
            cfg["sliding_window_size"] = window
    if cfg["model_type"] == "inkling2_text":  # Inkling 2: as Inkling above (the experts' width under its own name
        # only: transformers reads `intermediate_size` as it; every row of the head giving logits, which transformers
        # must be told), blocks of attention residuals kept at the published 6
        published = DECODER_SHAPES[name]
        cfg.pop("intermediate_size")
        cfg.update(swa_num_attention_heads=heads * published["swa_num_attention_heads"] // published[
            "num_attention_heads"], swa_num_key_value_heads=max(1, heads * published["swa_num_key_value_heads"] //
                                                                  published["num_attention_heads"]),
                   swa_head_dim=cfg["head_dim"], layer_types=(["hybrid_sliding", "hybrid"] * layers)[:layers],
                   rel_extent=32, unpadded_vocab_size=vocab)
        if window:
            cfg["sliding_window_size"] = window
    if cfg["model_type"] == "laguna":  # Laguna: a sliding layer then a full one in turn over the few (each type's own
        # rotary: the full layers' over half of each head)
        cfg["layer_types"] = (["sliding_attention", "full_attention"] * layers)[:layers]
    if cfg["model_type"] == "beam":  # Beam: a sliding layer then a full (NoPE) one in turn over the few, a dense layer
        # then sparse ones
        cfg.update(layer_types=(["sliding_attention", "full_attention"] * layers)[:layers],
                   mlp_layer_types=["dense"] + ["sparse"] * (layers - 1), n_group=min(cfg["n_group"], 4),
                   topk_group=min(cfg["topk_group"], 2))
    if cfg["model_type"] == "minimax":  # MiniMax: a lightning layer then a softmax one in turn over the few, blocks
        # of 16 tokens in transformers' prompt form (so that the prompts cross them)
        cfg.update(layer_types=(["linear_attention", "full_attention"] * layers)[:layers], block_size=16)
    if "num_kv_shared_layers" in cfg and cfg["model_type"] == "gemma3n_text":  # Gemma 3n: a sliding layer then a full
        # one in turn over at least four, the last half reading the keys of the last earlier layer of their type, the
        # first half's MLP gates sparse; per-layer inputs of 16 from a table shorter than the vocabulary (ids past it
        # read its row 0), LAuReL of rank 8
        n = max(layers, 4)
        cfg.update(num_hidden_layers=n, layer_types=(["sliding_attention", "full_attention"] * n)[:n],
                   num_kv_shared_layers=n // 2, activation_sparsity_pattern=[0.95] * (n // 2) + [0.0] * (n - n // 2),
                   hidden_size_per_layer_input=16, vocab_size_per_layer_input=vocab - 64, laurel_rank=8)
    if cfg["model_type"] in ("gemma4_text", "gemma4_unified_text"):  # Gemma 4 (and unified): the full layers' heads
        # as much wider than the sliding ones' as published (512 to 256) and their KV heads in the published ratio, a
        # sliding layer then a full one in turn (the last full); the E models' per-layer inputs of 16 and at least four
        # layers, the last half reading the keys of earlier ones; the 26B's experts fewer and narrower, k kept
        published = DECODER_SHAPES[name]
        cfg["global_head_dim"] = published["global_head_dim"] * cfg["head_dim"] // published["head_dim"]
        if published.get("num_global_key_value_heads"):
            cfg["num_global_key_value_heads"] = max(
                1, heads * published["num_global_key_value_heads"] // published["num_attention_heads"])
        n = max(layers, 4) if published.get("num_kv_shared_layers") else layers
        cfg.update(num_hidden_layers=n, layer_types=(["sliding_attention", "full_attention"] * n)[:n],
                   num_kv_shared_layers=n // 2 if published.get("num_kv_shared_layers") else 0)
        if published.get("hidden_size_per_layer_input"):
            cfg.update(hidden_size_per_layer_input=16, vocab_size_per_layer_input=vocab)
        if published.get("enable_moe_block"):
            cfg.update(num_experts=min(published["num_experts"], 2 * published["top_k_experts"]),
                       moe_intermediate_size=hidden + 16)
    if "cross_attention_layers" in cfg:  # Llama 3.2 Vision: its last layer of the few a cross-attention one (skipped
        # for text)
        cfg["cross_attention_layers"] = [layers - 1]
    if "full_attention_interval" in cfg:  # a full-attention layer among the few (Qwen3-Next: every 4th)
        cfg["full_attention_interval"] = min(cfg["full_attention_interval"], layers)
    if "no_rope_layer_interval" in cfg:  # a NoPE layer among the few (SmolLM3: every 4th of 36)
        cfg["no_rope_layer_interval"] = min(cfg["no_rope_layer_interval"], layers)
    if "query_pre_attn_scalar" in cfg:
        cfg["query_pre_attn_scalar"] = 24
    if "rope_scaling" in cfg and cfg["rope_scaling"] and "original_max_position_embeddings" in cfg["rope_scaling"]:
        cfg["rope_scaling"] = {**cfg["rope_scaling"], "original_max_position_embeddings": 64}
    if cfg.get("rope_scaling") and "long_factor" in cfg["rope_scaling"]:  # longrope: a factor per frequency
        half = int(cfg["hidden_size"] // heads * cfg.get("partial_rotary_factor", 1.0)) // 2
        if "kv_lora_rank" in cfg:  # (latent attention, MiniCPM3's: the shared rotary key's frequencies)
            half = cfg["qk_rope_head_dim"] // 2
        cfg["rope_scaling"] = {**cfg["rope_scaling"], "short_factor": cfg["rope_scaling"]["short_factor"][:half],
                               "long_factor": cfg["rope_scaling"]["long_factor"][:half]}
        cfg["original_max_position_embeddings"] = 64
        published = DECODER_SHAPES[name]
        if published["rope_scaling"].get("original_max_position_embeddings") == published["max_position_embeddings"]:
            longest = cfg["max_position_embeddings"]  # (MiniCPM3: the original length its longest, kept so)
            cfg["rope_scaling"]["original_max_position_embeddings"] = cfg["original_max_position_embeddings"] = longest
    return cfg


def _shrunk_attention_free(cfg: dict, layers: int, hidden: int, vocab: int) -> dict:
    """shrunk() of an attention-free model (Mamba, Falcon-Mamba, Mamba-2): `layers` layers at `hidden`, a state of 16,
    dt's rank as transformers derives it ("auto"), the intermediate width expand x hidden; Mamba-2's 8 heads over it in
    2 groups, 16-token chunks (so that the prompts cross them); at most 256 tokens a sequence."""
    cfg.pop("intermediate_size", None)
    cfg.update(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, state_size=16, time_step_rank="auto",
               max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if "num_heads" in cfg:
        cfg.update(num_heads=8, head_dim=cfg.get("expand", 2) * hidden // 8, n_groups=2, chunk_size=16)
    return cfg


def random_decoder(name_or_config, device, dtype, max_model_len: int | None = None, seed: int = 0,
                   quantization: str = "none"):
    """Our decoder at a published shape with random weights, built on `device` directly (a 9B
    model never passes through host memory): weights ~ N(0, 0.02), norm weights ~ N(1, 0.02) as
    applied (whatever the family's (offset + w) convention), its linears quantised as the
    `quantization` parameter says. Returns the model."""
    import torch

    from tritonformer.backend.models.decoder import load_decoder

    cfg = DECODER_SHAPES[name_or_config] if isinstance(name_or_config, str) else name_or_config
    spec = _spec(cfg)
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, shape in tensor_shapes(spec).items():
        t = torch.empty(shape, device=device, dtype=dtype).normal_(0.0, 0.02, generator=gen)
        state[name] = t.add_(1.0 - spec.norm_offset) if _is_norm_weight(name) else t
    if max_model_len is not None and hasattr(spec, "check_max_model_len"):  # (a benchmark's length, as a cap: DSA's
        max_model_len = min(max_model_len, spec.max_position_embeddings)  # families refuse one past index_topk)
    return load_decoder(cfg, state, device, dtype, max_model_len, quantization=quantization)


def _spec(cfg: dict):
    import importlib

    from tritonformer.backend.models.decoder import DECODER_FAMILIES

    return importlib.import_module(f"tritonformer.backend.models.{DECODER_FAMILIES[cfg['model_type']]}").from_hf(cfg)


def _is_norm_weight(name: str) -> bool:
    """Whether a checkpoint tensor is a norm's weight (random ones are drawn around 1; a norm's bias around 0): a
    name with "norm" in it, or a LayerNorm module named ln* / *_ln (RWKV's ln1, ln_out, pre_ln)."""
    module = name.rpartition(".")[0].rpartition(".")[2]
    return ("norm" in name or module.startswith("ln") or module.endswith("_ln")) and not name.endswith(".bias")


def tensor_shapes(spec) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this DecoderSpec holds, by name (the model prefix stripped);
    a MoE layer's experts stacked (moe.tensor_shapes)."""
    from tritonformer.backend.models.mla import tensor_shapes as mla_tensor_shapes
    from tritonformer.backend.models.moe import tensor_shapes as moe_tensor_shapes

    if hasattr(spec, "tensor_shapes"):  # (a family with a model class of its own names its tensors: Gemma 3n)
        return spec.tensor_shapes()
    n, hidden, head = spec.names, spec.hidden_size, spec.head_dim
    q, kv, inter = spec.num_heads * head, spec.num_kv_heads * head, spec.intermediate_size
    shapes = {n.embed: (spec.vocab_size, hidden)}
    if not spec.post_ln:  # (post_ln: the last layer's norms close the stack, no final norm)
        shapes[n.final_norm] = (hidden,)
    if spec.norm_bias and not spec.post_ln:
        shapes[n.final_norm.removesuffix(".weight") + ".bias"] = (hidden,)
    if not spec.tie_word_embeddings:
        shapes[n.lm_head] = (spec.vocab_size, hidden)
    if spec.head_bias:
        shapes[n.lm_head.removesuffix(".weight") + ".bias"] = (spec.vocab_size,)
    if spec.learned_positions:
        shapes[n.positions] = (spec.position_offset + spec.max_position_embeddings, hidden)
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        layer = {n.attn_norm: (hidden,), n.mlp_norm: (hidden,)} if spec.layer_pre_norms(i) else {}
        if not spec.layer_attn_norm(i):  # (a pre-norm layer without its attention norm: ModernBERT decoder's first)
            layer.pop(n.attn_norm, None)
        layer[n.o] = (hidden, q)
        if spec.mla and (spec.mixer(i) is None or spec.parallel_mixers):  # latent attention's projections (mla.py),
            # o_proj over the heads' values (a layer with a mixer in place of attention: the mixer's, below)
            own = spec.layer_mla[i] if spec.layer_mla else None  # (a layer's own shape of it: Dots3's)
            mla, mla_heads = (own.spec, own.heads) if own else (spec.mla, spec.num_heads)
            layer[n.o] = (hidden, mla_heads * mla.v_head_dim)
            shapes.update(mla_tensor_shapes(mla, p, hidden, mla_heads))
        else:
            layer.update({n.qkv: (q + 2 * kv, hidden)} if n.qkv else {n.q: (q, hidden), n.k: (kv, hidden),
                                                                         n.v: (kv, hidden)})
        if spec.moe and spec.moe.layers[i]:
            shapes.update(moe_tensor_shapes(spec.moe, p, hidden))
        elif not spec.gated_mlp:  # a plain MLP: up and down
            layer.update({n.up: (inter, hidden), n.down: (hidden, inter)})
            if spec.activation == "xielu":  # (its learnt scalars; beta and eps left to their defaults)
                shapes.update({p + n.act + ".alpha_p": (1,), p + n.act + ".alpha_n": (1,)})
        else:
            layer[n.down] = (hidden, inter)
            layer.update({n.gate_up: (2 * inter, hidden)} if n.gate_up else {n.gate: (inter, hidden),
                                                                               n.up: (inter, hidden)})
        if spec.layer_post_norms(i):
            layer.update({n.attn_post_norm: (hidden,), n.mlp_post_norm: (hidden,)})
        if spec.qk_norm:
            layer.update({n.q_norm: (q,), n.k_norm: (kv,)} if spec.qk_norm_full else {n.q_norm: (head,), n.k_norm: (head,)})
        if spec.attn_output_gate:
            layer[n.attn_gate] = (spec.num_heads if spec.attn_gate_per_head else q, hidden)
        if spec.attn_gate_head_bias:
            shapes[p + n.attn_gate_bias] = (spec.num_heads,)
        shapes.update({p + name + ".weight": shape for name, shape in layer.items()})
        if spec.qk_norm_bias:
            shapes.update({p + n.q_norm + ".bias": (head,), p + n.k_norm + ".bias": (head,)})
        if spec.qkv_bias:
            shapes.update({p + n.q + ".bias": (q,), p + n.k + ".bias": (kv,), p + n.v + ".bias": (kv,)} if not n.qkv
                          else {p + n.qkv + ".bias": (q + 2 * kv,)})
        if spec.o_bias:
            shapes[p + n.o + ".bias"] = (hidden,)
        if spec.mlp_bias and not (spec.moe and spec.moe.layers[i]):
            shapes[p + n.down + ".bias"] = (hidden,)
            shapes.update({p + n.gate_up + ".bias": (2 * inter,)} if spec.gated_mlp and n.gate_up else
                          {p + n.gate + ".bias": (inter,), p + n.up + ".bias": (inter,)} if spec.gated_mlp else
                          {p + n.up + ".bias": (inter,)})
        if spec.norm_bias:
            shapes.update({p + name + ".bias": (hidden,) for name in (n.attn_norm, n.mlp_norm, n.attn_post_norm,
                                                                      n.mlp_post_norm) if name in layer})
        if spec.sinks:
            shapes[p + n.sinks] = (spec.num_heads,)
        if spec.mixers and spec.mixer(i) is not None:  # a recurrent mixer in place of attention: its own tensors,
            # which the family's spec names (DecoderSpec subclass: mixer_tensors(layer, prefix)); beside attention's
            # where it runs beside it (parallel_mixers: Falcon-H1)
            for name in (n.q, n.k, n.v, n.qkv, n.o, n.q_norm, n.k_norm, n.attn_gate) * (not spec.parallel_mixers):
                for suffix in (".weight", ".bias"):
                    shapes.pop(f"{p}{name}{suffix}", None)
                shapes.pop(p + n.sinks, None)
            shapes.update(spec.mixer_tensors(i, p))
        if not spec.has_mlp(i):  # (the block ends after attention or its mixer: Nemotron-H's mixer-only layers)
            for name in (n.gate, n.up, n.down, n.gate_up, n.mlp_norm):
                for suffix in (".weight", ".bias"):
                    shapes.pop(f"{p}{name}{suffix}", None)
    if hasattr(spec, "extra_tensor_shapes"):  # (a family's own beside the shared decoder's: BLOOM's embedding norm;
        shapes.update(spec.extra_tensor_shapes())  # a name given None: one the family does not hold, A.X-K2's)
    return {name: shape for name, shape in shapes.items() if shape is not None}


class RandomTensor:
    """A checkpoint tensor of random values made where and when it is read, whole or in part
    (like backend/checkpoints/weights.LazyTensor): a tensor-parallel rank builds only its share
    of a 70B-shaped model on its own GPU. Values ~ N(0, 0.02), a norm's ~ N(1, 0.02) as applied.

    With a `seed`, the values are one whole tensor's whatever part is read (the same model at
    any split): each block of SEED_ROWS rows comes from its own generator seeded by `seed` and
    the block's index, so a read makes only the blocks it touches, one at a time, straight into
    a tensor of the part's shape in `dtype` (default fp32). No whole-tensor temporaries: those
    fragmented the allocator until a 70B shape's share no longer fit two 80 GB GPUs."""

    SEED_ROWS = 256

    def __init__(self, shape: tuple[int, ...], device: str, offset: float, seed: int | None = None,
                 dtype: str | None = None):
        self.shape, self.device, self.offset, self.seed, self.dtype = shape, device, offset, seed, dtype

    def __getitem__(self, index):
        import torch

        index = index if isinstance(index, tuple) else (index,)
        part = torch.empty(self.shape, device="meta")[index].shape
        if self.seed is None:
            return torch.empty(part, device=self.device).normal_(0.0, 0.02).add_(self.offset)
        rows, rest = index[0], index[1:]
        start, stop, step = rows.indices(self.shape[0]) if isinstance(rows, slice) else (0, 0, 0)
        if step != 1 or len(part) != len(self.shape):
            raise IndexError(f"a seeded random tensor reads a range of rows (then any columns), not {index!r}")
        out = torch.empty(part, device=self.device, dtype=getattr(torch, self.dtype or "float32"))
        block = self.SEED_ROWS
        for b in range(start // block, -(-stop // block)):
            lo, hi = b * block, min((b + 1) * block, self.shape[0])
            gen = torch.Generator(device=self.device).manual_seed((self.seed << 24) + b)
            rows_made = torch.empty((hi - lo, *self.shape[1:]), device=self.device).normal_(0.0, 0.02, generator=gen)
            first, last = max(lo, start), min(hi, stop)
            out[first - start:last - start] = rows_made[(slice(first - lo, last - lo), *rest)].add_(self.offset)
        return out

    def to(self, device=None, dtype=None, **kwargs):
        return self[:].to(device=device, dtype=dtype)


def random_shard_state(name_or_config, device: str) -> dict:
    """Random tensors (RandomTensor) for every weight of a published shape, made on `device` as
    each rank reads its share: the `state_factory` of a tensor-parallel ShardSource."""
    cfg = DECODER_SHAPES[name_or_config] if isinstance(name_or_config, str) else name_or_config
    spec = _spec(cfg)
    return {name: RandomTensor(shape, device, 1.0 - spec.norm_offset if _is_norm_weight(name) else 0.0)
            for name, shape in tensor_shapes(spec).items()}


def seeded_shard_state(name_or_config, seed: int, device: str, dtype: str | None = None) -> dict:
    """random_shard_state's tensors with values fixed by `seed` and each tensor's name, whatever
    share a rank reads: the same whole model at every tensor-parallel size (on GPUs of one kind),
    so that sizes can be compared token for token. Each rank makes the row blocks its share
    touches, in `dtype` (the model's: nothing to convert at load; default fp32)."""
    import zlib

    cfg = DECODER_SHAPES[name_or_config] if isinstance(name_or_config, str) else name_or_config
    spec = _spec(cfg)
    return {name: RandomTensor(shape, device, 1.0 - spec.norm_offset if _is_norm_weight(name) else 0.0,
                               seed=zlib.crc32(f"{seed}:{name}".encode()), dtype=dtype)
            for name, shape in tensor_shapes(spec).items()}
