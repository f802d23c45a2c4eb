"""Mistral: Llama's block, with a sliding attention window on every layer where `sliding_window` is set
(Mistral-7B v0.1: 4,096 tokens; v0.3: none). Ministral (model_type ministral) is the same block,
its windowed layers named by `layer_types`. A Mistral 3 checkpoint (model_type mistral3:
Mistral-Small-3.1 / 3.2, the Ministral 3 models, multimodal) serves its text model; one whose text model is
Mistral 4's (`mistral4`: Mistral-Small-4) is built by mistral4.py.

Ministral 3 (`ministral3`) adds Llama 4's query scaling (DecoderSpec.query_scaling, as Mistral 4's): past the
rope's `original_max_position_embeddings` (16,384), queries at position p (after the rotary) are multiplied by
1 + llama_4_scaling_beta * log(1 + floor(p / original)), the factor rounded to q's dtype; below it the factor is
exactly 1. Served up to its max_position_embeddings."""
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
    scaling = None
    if cfg.get("model_type") == "ministral3" and beta:
        if not original:
            raise ValueError("Ministral 3's llama_4_scaling_beta needs the rope's original_max_position_embeddings")
        scaling = (float(beta), int(original))
    return spec_from_hf(cfg, layer_windows=layer_windows(cfg, cfg.get("sliding_window", 4096)), query_scaling=scaling)


MODEL = TransformerDecoder
