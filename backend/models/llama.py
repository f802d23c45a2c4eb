"""Llama family (Llama 2 and 3.x, SmolLM2; InternLM3 and IQuest-Coder, Llama's block under their
own model_type): RMSNorm, SwiGLU, rotary with any of the published rope scalings (llama3,
linear, dynamic, yarn), grouped-query attention, tied or untied head; biases on the attention's
four projections where `attention_bias` is set (InternLM3's config: `qkv_bias`), on the MLP's
where `mlp_bias` is (InternLM3's: `bias`). `clip_qkv` and `use_sliding_window`, which no
released checkpoint of these sets, are refused."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    for option in ("clip_qkv", "use_sliding_window"):
        if cfg.get(option):
            raise ValueError(f"{cfg.get('model_type', 'llama')} with {option} is not supported "
                             f"(supported: {option} unset)")
    if cfg.get("model_type") == "internlm3":  # (its config.json's names for the two biases)
        cfg = {"attention_bias": cfg.get("qkv_bias", False), "mlp_bias": cfg.get("bias", False), **cfg}
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, qkv_bias=bias, o_bias=bias, mlp_bias=bool(cfg.get("mlp_bias", False)))


MODEL = TransformerDecoder
