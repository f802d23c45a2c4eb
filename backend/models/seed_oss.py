"""Seed-OSS (ByteDance): Llama's block with biases on Q, K and V (`attention_bias`), as Qwen2's."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("attention_out_bias"):
        raise ValueError("Seed-OSS with attention_out_bias (a bias on the output projection) is not supported")
    return spec_from_hf(cfg, qkv_bias=cfg.get("attention_bias", True))


MODEL = TransformerDecoder
