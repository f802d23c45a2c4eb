"""GLM-4 (`glm`: GLM-4-9B-chat-hf) and GLM-4-0414 (`glm4`): Llama's block with biases on Q, K,
V, a fused `gate_up_proj`, and a rotary over the first half of each head's dims (partial 0.5)
that pairs neighbouring dims (2i, 2i + 1) rather than halves; `glm4` adds norms after attention
and after the MLP, before each residual add (Gemma's sandwich, plain RMSNorms)."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames, spec_from_hf

GLM4_NAMES = WeightNames(gate_up="mlp.gate_up_proj", attn_post_norm="post_self_attn_layernorm",
                         mlp_post_norm="post_mlp_layernorm")


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {"partial_rotary_factor": 0.5, "head_dim": 128, **cfg}  # GLM's defaults where the config omits them
    sandwich = cfg.get("model_type") == "glm4"
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1.5625e-07), qkv_bias=cfg.get("attention_bias", True),
                        rotary_interleaved=True, sandwich_norms=sandwich,
                        names=GLM4_NAMES if sandwich else WeightNames(gate_up="mlp.gate_up_proj"))


MODEL = TransformerDecoder
