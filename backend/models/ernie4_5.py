"""ERNIE 4.5 (dense, Baidu): Llama's block with a rotary that pairs neighbouring dims (2i, 2i + 1),
as GLM's does but over the whole head (rope.rotary_order, interleaved)."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("use_bias"):
        raise ValueError("ERNIE 4.5 with use_bias (biases on every linear) is not supported")
    return spec_from_hf(cfg, tie_default=True, rotary_interleaved=True)


MODEL = TransformerDecoder
