"""GLM-4.7-Flash (`glm4_moe_lite`): DeepSeek-V3's block (deepseek_v3.py: multi-head latent attention, mla.py, its
rotary interleaved where `rope_interleave`) with GLM-4.5's experts (glm4_moe.sigmoid_moe: sigmoid scores from fp32
router logits, the top k by score plus `e_score_correction_bias`, renormalised, scaled by `routed_scaling_factor`,
shared experts added) in the layers `mlp_layer_types` calls sparse (all but the first by default). Its value
heads (256) are as wide as its query / key heads (192 + 64): the cache's values need no padding. A partial
rotary over the rotary dims (`partial_rotary_factor` below 1) is refused."""
from dataclasses import replace

from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, rope_parameters, spec_from_hf

# transformers' Glm4MoeLiteConfig defaults, where a config.json leaves them out
DEFAULTS = {"n_shared_experts": 1, "routed_scaling_factor": 1.8, "norm_topk_prob": True, "rope_interleave": True,
            "q_lora_rank": 768, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
            "v_head_dim": 256, "rms_norm_eps": 1e-5}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    partial = (rope_parameters(cfg) or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"GLM-4.7-Flash with partial_rotary_factor {partial} is not supported (supported: "
                         f"partial_rotary_factor 1.0)")
    layers = cfg["num_hidden_layers"]
    types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    moe = replace(sigmoid_moe(cfg, first_moe=1), layers=tuple(t == "sparse" for t in types))
    return spec_from_hf(cfg, **mla_options(cfg), moe=moe)


MODEL = TransformerDecoder
