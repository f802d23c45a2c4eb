"""Qwen3: Llama's block with a per-head RMSNorm on q and k before rotary, no QKV biases, and a
head_dim of its own (128 where hidden / heads would say otherwise)."""
from tritonformer.backend.models.qwen2 import qwen_windows
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {"head_dim": 128, **cfg}  # Qwen3's default when the config omits it
    return spec_from_hf(cfg, qkv_bias=bool(cfg.get("attention_bias", False)), qk_norm=True,
                        layer_windows=qwen_windows(cfg))


MODEL = TransformerDecoder
