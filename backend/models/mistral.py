"""Mistral: Llama's block, with a sliding attention window on every layer where `sliding_window` is set
(Mistral-7B v0.1: 4,096 tokens; v0.3: none). Ministral (model_type ministral) is the same block,
its windowed layers named by `layer_types`. A Mistral 3 checkpoint (model_type mistral3:
Mistral-Small-3.1 / 3.2, multimodal) serves its text model."""
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    if cfg.get("model_type") != "mistral3":
        return cfg, state
    return text_part(cfg, state, (cfg.get("text_config") or {}).get("model_type", "mistral"))


def from_hf(cfg: dict) -> DecoderSpec:
    return spec_from_hf(cfg, layer_windows=layer_windows(cfg, cfg.get("sliding_window", 4096)))


MODEL = TransformerDecoder
