"""Mistral: Llama's block, with a sliding attention window on every layer where `sliding_window` is set
(Mistral-7B v0.1: 4,096 tokens; v0.3: none). Ministral (model_type ministral) is the same block,
its windowed layers named by `layer_types`."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    return spec_from_hf(cfg, layer_windows=layer_windows(cfg, cfg.get("sliding_window", 4096)))


MODEL = TransformerDecoder
