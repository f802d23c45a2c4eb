"""Mistral: Llama's block, with a sliding attention window on every layer where `sliding_window` is set
(Mistral-7B v0.1: 4,096 tokens; v0.3: none). Ministral (model_type ministral) is the same block,
its windowed layers named by `layer_types`. A Mistral 3 checkpoint (model_type mistral3:
Mistral-Small-3.1 / 3.2, the Ministral 3 models, multimodal) serves its text model; one whose text model is
Mistral 4's (`mistral4`: Mistral-Small-4) is built by mistral4.py.

Ministral 3 (`ministral3`) adds Llama 4's query scaling: past the rope's
`original_max_position_embeddings` (16,384), queries at position p are multiplied by
1 + llama_4_scaling_beta * log(1 + floor(p / original)); below it the factor is exactly 1. That
scaling is not implemented, so such a checkpoint is served up to `original` positions (the
longest sequence it takes, its max_position_embeddings, is capped there)."""
from tritonformer.backend.models import mistral4
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, layer_windows, rope_parameters,
                                                     spec_from_hf)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    if cfg.get("model_type") != "mistral3":
        return cfg, state
    return text_part(cfg, state, (cfg.get("text_config") or {}).get("model_type", "mistral"))


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("model_type") == "mistral4":  # (a mistral3 checkpoint's text model: Mistral-Small-4)
        return mistral4.from_hf(cfg)
    params = rope_parameters(cfg) or {}
    beta, original = params.get("llama_4_scaling_beta"), params.get("original_max_position_embeddings")
    if cfg.get("model_type") == "ministral3" and beta and original:
        cfg = {**cfg, "max_position_embeddings": min(cfg.get("max_position_embeddings", original), original)}
    return spec_from_hf(cfg, layer_windows=layer_windows(cfg, cfg.get("sliding_window", 4096)))


MODEL = TransformerDecoder
