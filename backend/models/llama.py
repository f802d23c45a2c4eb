"""Llama family (Llama 2 and 3.x, SmolLM2): RMSNorm, SwiGLU, rotary with any of the published
rope scalings (llama3, linear, dynamic, yarn), grouped-query attention, tied or untied head;
biases on the attention's four projections where `attention_bias` is set, on the MLP's where
`mlp_bias` is."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, qkv_bias=bias, o_bias=bias)


MODEL = TransformerDecoder
