"""Mistral 4 (`mistral4`: Mistral-Small-4-119B; served as the text part of its multimodal `mistral3` checkpoint by
mistral.py): DeepSeek-V3's block (deepseek_v3.py) with its own router and Llama 4's query scaling.

- Attention: multi-head latent attention (mla.py): queries through a latent of `q_lora_rank` (or q_proj), keys
  and values from one of `kv_lora_rank` plus a shared rotary key of `qk_rope_head_dim` dims, the rotary interleaved
  where `rope_interleave` (the default), scores times qk_head_dim ** -0.5 (times mscale ** 2 under YaRN with
  `mscale_all_dim`, mla.softmax_scale). The rotary turns the rope dims only: transformers reaches them as a partial
  rotary (`partial_rotary_factor` = qk_rope_head_dim / (qk_nope_head_dim + qk_rope_head_dim)), so another factor
  is refused by name. Default rope: YaRN, factor 128 over 8,192 positions, mscale = mscale_all_dim = 1.
- Query scaling (`llama_4_scaling_beta` in the rope parameters, 0.1 published): each query at position p times
  1 + beta * log(1 + floor(p / original_max_position_embeddings)), on every layer (DecoderSpec.query_scaling);
  exactly 1 below the original length.
- Experts from layer `first_k_dense_replace` on (0: every layer): softmax probabilities of the router's logits
  (no choice bias), the top `num_experts_per_tok` among the best `topk_group` of `n_group` groups (a group ranked
  by the sum of its two best probabilities), renormalised where `norm_topk_prob` (the default), times
  `routed_scaling_factor`; `n_shared_experts` shared experts of moe_intermediate_size columns each added as they
  are. transformers takes the softmax in the activation dtype (fp32 here: MoE families are checked in fp32).

Mistral Large 4 (`mistral_large4`) is not this architecture: its text model is GLM-MoE-DSA's (DeepSeek-V3.2's
sparse attention with a token indexer), with NoPE layers, latent caches shared between layers and soft-capped
logits; it is refused (not in the family table)."""
from dataclasses import replace

from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, rope_parameters, spec_from_hf

# transformers' Mistral4Config defaults, where a config.json leaves them out
DEFAULTS = {"vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 2048,
            "num_hidden_layers": 36, "num_attention_heads": 32, "n_shared_experts": 1, "n_routed_experts": 128,
            "routed_scaling_factor": 1.0, "kv_lora_rank": 256, "q_lora_rank": 1024, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "qk_nope_head_dim": 64, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 4,
            "first_k_dense_replace": 0, "norm_topk_prob": True, "max_position_embeddings": 1048576,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_interleave": True, "attention_bias": False}
DEFAULT_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0, "original_max_position_embeddings": 8192,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    if not rope_parameters(cfg):
        cfg["rope_parameters"] = dict(DEFAULT_ROPE)
    params = rope_parameters(cfg)
    rope, head = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    cfg["head_dim"] = head  # (transformers' head_dim: a query / key head's, of which the rope dims are a share)
    partial = params.get("partial_rotary_factor", rope / head)
    if int(head * partial) != rope:
        raise ValueError(f"Mistral 4 with partial_rotary_factor {partial} is not supported (supported: "
                         f"partial_rotary_factor = qk_rope_head_dim / (qk_nope_head_dim + qk_rope_head_dim), "
                         f"{rope / head} here: the rotary turns the rope dims)")
    beta, original = params.get("llama_4_scaling_beta"), params.get("original_max_position_embeddings")
    if beta and not original:
        raise ValueError("Mistral 4's llama_4_scaling_beta needs the rope's original_max_position_embeddings")
    moe = replace(sigmoid_moe(cfg, first_moe=0), scoring="softmax", score_bias=False, router_fp32=False)
    return spec_from_hf(cfg, **mla_options(cfg), moe=moe,
                        query_scaling=(float(beta), int(original)) if beta else None)


MODEL = TransformerDecoder
