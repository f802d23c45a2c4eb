"""Llama family (Llama 2 and 3.x, SmolLM2): RMSNorm, SwiGLU, rotary with any of the published
rope scalings (llama3, linear, dynamic, yarn), grouped-query attention, tied or untied head."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("attention_bias"):
        raise ValueError("Llama with attention_bias is not supported")
    return spec_from_hf(cfg)


MODEL = TransformerDecoder
