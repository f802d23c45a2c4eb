"""DeepSeek-V2 (`deepseek_v2`: DeepSeek-V2-Lite, DeepSeek-V2, V2.5): DeepSeek-V3's block (deepseek_v3.py) with
multi-head latent attention whose rotary always turns neighbouring dims together (transformers rotates q_pe
and k_pe as complex numbers), and its own experts from layer `first_k_dense_replace` on
(glm4_moe.softmax_group_moe): softmax scores from fp32 router logits, the top k of them (`topk_method`
greedy, or group_limited_greedy: among the best `topk_group` of `n_group` groups) unrenormalised, scaled by
`routed_scaling_factor`, `n_shared_experts` shared experts added as they are. Refused: renormalised weights
(transformers ignores `norm_topk_prob`; every published checkpoint leaves it false) and MLP biases (the
shared experts have none here)."""
from tritonformer.backend.models.glm4_moe import softmax_group_moe
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

# transformers' DeepseekV2Config defaults, where a config.json leaves them out
DEFAULTS = {"n_shared_experts": 2, "routed_scaling_factor": 1.0, "first_k_dense_replace": 0, "q_lora_rank": 1536,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "topk_method": "greedy", "moe_intermediate_size": 1407}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg, "rope_interleave": True}
    if cfg.get("norm_topk_prob"):
        raise ValueError("DeepSeek-V2 with norm_topk_prob true is not supported (supported: norm_topk_prob false)")
    if cfg.get("mlp_bias"):
        raise ValueError("DeepSeek-V2 with mlp_bias is not supported (supported: mlp_bias false)")
    return spec_from_hf(cfg, **mla_options(cfg), moe=softmax_group_moe(cfg))


MODEL = TransformerDecoder
