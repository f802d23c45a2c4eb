"""Qwen3.5 (`qwen3_5`, `qwen3_5_moe`: Qwen3.5-27B, Qwen3.5-35B-A3B, Qwen3.5-397B-A17B and kin) served text in,
text out by its text model (`qwen3_5_text`, `qwen3_5_moe_text`), the vision tower left unread.

The text model is Qwen3-Next's hybrid (qwen3_next.py): gated DeltaNet layers (gated_deltanet.py) with every 4th
layer gated full attention, (1 + w) RMSNorms, q / k norms and a partial rotary. Where it differs: the DeltaNet's
input projections are stored flat, `in_proj_qkv` ([q; k; v] head after head), `in_proj_z`, `in_proj_b`,
`in_proj_a`, not grouped per key head; the dense models' MLP is a plain SwiGLU in every layer; the MoE models'
experts are in every layer, their router always renormalises the k chosen probabilities (there is no
`norm_topk_prob`), beside Qwen2-MoE's sigmoid-gated shared expert. The rotary is multimodal (M-RoPE, interleaved
sections), which for a text token is the ordinary rotary (multimodal.mrope_as_rotary).

The multimodal checkpoints nest the text model's config as `text_config` and its tensors under `language_model.`
(multimodal.text_part); their multi-token-prediction weights (`mtp.*`), as transformers does, are left unread."""
from __future__ import annotations

from tritonformer.backend.models import qwen3_next
from tritonformer.backend.models.moe import MoeSpec, num_experts
from tritonformer.backend.models.multimodal import mrope_as_rotary, text_part
from tritonformer.backend.models.qwen3_next import HybridSpec

# model_type of the multimodal checkpoint -> its text model's model_type
TEXT_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    if cfg.get("model_type") in TEXT_TYPES:
        tie = bool(cfg.get("tie_word_embeddings")) or bool((cfg.get("text_config") or {}).get("tie_word_embeddings"))
        cfg, state = text_part(cfg, state, TEXT_TYPES[cfg["model_type"]])
        cfg = {**cfg, "tie_word_embeddings": tie}  # (the outer config's, or the text_config's)
    elif any("language_model." in name for name in state):  # (a text model's config over the multimodal layout)
        state = text_part({"text_config": cfg}, state, cfg.get("model_type"))[1]
    head_dim = cfg.get("head_dim") or 256
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    return mrope_as_rotary(cfg, int(head_dim * partial)), qwen3_next.gate_split(cfg, state)


def from_hf(cfg: dict) -> HybridSpec:
    model_type = cfg.get("model_type")
    if model_type not in ("qwen3_5_text", "qwen3_5_moe_text"):
        raise ValueError(f"unsupported Qwen3.5 text model_type {model_type!r} (supported: qwen3_5_text, "
                         f"qwen3_5_moe_text)")
    if model_type == "qwen3_5_text":
        return qwen3_next.hybrid_spec(cfg, "Qwen3.5", grouped_in_proj=False)
    layers = cfg["num_hidden_layers"]
    expert = cfg.get("moe_intermediate_size", 512)
    moe = MoeSpec(num_experts=num_experts(cfg, 256), top_k=cfg.get("num_experts_per_tok", 8),
                  intermediate_size=expert, normalize=True, round_weights=True, layers=(True,) * layers,
                  shared_intermediate_size=cfg.get("shared_expert_intermediate_size", 512))
    # (no dense MLP: the spec's intermediate_size is the experts')
    return qwen3_next.hybrid_spec({"intermediate_size": expert, **cfg}, "Qwen3.5-MoE", grouped_in_proj=False,
                                  moe=moe)


MODEL = qwen3_next.HybridDecoder
