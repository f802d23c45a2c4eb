"""Helium (Kyutai): Llama's block with a rotary that pairs neighbouring dims (2i, 2i + 1) over the
whole head, as ERNIE 4.5's (rope.rotary_order, interleaved); its own defaults where a config
omits them (rope base 100,000, RMSNorm eps 1e-8)."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("attention_bias"):  # (Hugging Face's Helium then biases Q, K and V but not the output)
        raise ValueError("Helium with attention_bias is not supported")
    cfg = {"rms_norm_eps": 1e-8, **cfg}
    return spec_from_hf(cfg, default_theta=100000.0, rotary_interleaved=True)


MODEL = TransformerDecoder
