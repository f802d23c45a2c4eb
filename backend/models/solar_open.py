"""Solar Open (Upstage's Solar-Open-100B): Llama's attention (biases on Q, K and V where
`attention_bias` is set, none on the output; a rotary over the whole head) with GLM-4.5's
mixture of experts in every layer: sigmoid scores from fp32 router logits, the top k by score
plus `e_score_correction_bias`, renormalised and scaled by `routed_scaling_factor`, and
`n_shared_experts` shared experts added (glm4_moe.sigmoid_moe)."""
from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    # (Hugging Face's default where the config omits n_shared_experts; no dense MLP in any layer,
    # so HF's config has no intermediate_size)
    cfg = {"n_shared_experts": 1, "intermediate_size": 0, **cfg}
    return spec_from_hf(cfg, default_theta=1e6, norm_eps=cfg.get("rms_norm_eps", 1e-5),
                        qkv_bias=bool(cfg.get("attention_bias", False)), moe=sigmoid_moe(cfg, first_moe=0))


MODEL = TransformerDecoder
