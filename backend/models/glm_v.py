"""GLM-4.1V / GLM-4V (`glm4v`) and GLM-4.5V (`glm4v_moe`) checkpoints served text in, text out by
their text model (multimodal.text_part), the vision tower left unread.

For text the text models are GLM's decoders. GLM-4.1V's is GLM-4-0414's block (glm.py's `glm4`:
biases on Q, K, V, a fused gate_up_proj, norms after attention and after the MLP before each
residual add, a rotary pairing neighbouring dims (2i, 2i + 1)); GLM-4.5V's is GLM-4.5's
(glm4_moe.py: rotate-half, sigmoid-routed experts with a shared one). Their multimodal rotary is
the ordinary one for text tokens (multimodal.mrope_as_rotary).

Where they differ from the text-only families' defaults: GLM-4.1V's head is always hidden / heads
wide and rotates the share `partial_rotary_factor` of it (default 1, all of it; the published
config says 0.5), its rms_norm_eps defaults to 1e-5; GLM-4.5V's attention has Q, K, V biases
unless `attention_bias` says otherwise. The `*_text` model types are the text models' own configs."""
from __future__ import annotations

import importlib

from tritonformer.backend.models.multimodal import mrope_as_rotary, text_part
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, rope_parameters

# model_type of the multimodal checkpoint -> its text model's model_type
TEXT_TYPES = {"glm4v": "glm4v_text", "glm4v_moe": "glm4v_moe_text"}
# text model_type -> (the family module that serves its block, the model_type that module reads)
BLOCKS = {"glm4v_text": ("glm", "glm4"), "glm4v_moe_text": ("glm4_moe", "glm4_moe")}


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    model_type = cfg.get("model_type")
    if model_type in TEXT_TYPES:
        tie = bool(cfg.get("tie_word_embeddings")) or bool((cfg.get("text_config") or {}).get("tie_word_embeddings"))
        cfg, state = text_part(cfg, state, TEXT_TYPES[model_type])
        cfg = {**cfg, "tie_word_embeddings": tie}
        model_type = cfg["model_type"]
    if model_type not in BLOCKS:
        return cfg, state
    params = rope_parameters(cfg) or {}
    if model_type == "glm4v_text":
        partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        cfg = {"rms_norm_eps": 1e-5, **cfg, "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
               "partial_rotary_factor": partial, "attention_bias": True}
    else:
        partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5))
        cfg = {"attention_bias": True, **cfg, "partial_rotary_factor": partial}
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return mrope_as_rotary(cfg, int(head_dim * partial)), state


def from_hf(cfg: dict) -> DecoderSpec:
    model_type = cfg.get("model_type")
    if model_type not in BLOCKS:
        raise ValueError(f"unsupported GLM-V text model_type {model_type!r} (supported: {', '.join(BLOCKS)})")
    module, block_type = BLOCKS[model_type]
    return importlib.import_module(f"tritonformer.backend.models.{module}").from_hf({**cfg, "model_type": block_type})


MODEL = TransformerDecoder
