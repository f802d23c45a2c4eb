"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE checkpoints served text in, text out by their text
model (multimodal.text_part), the vision tower left unread.

For text the text models are Qwen's decoders: Qwen2-VL's and Qwen2.5-VL's Qwen2's block (biases on
Q, K, V), Qwen3-VL's Qwen3's (per-head q / k norms), Qwen3-VL-MoE's Qwen3-MoE's. Their multimodal
rotary is the ordinary one for text tokens (multimodal.mrope_as_rotary); Qwen3-VL's deepstack adds
visual features to the first layers' hidden states at image tokens only, so text is untouched.

Where they differ from the text-only families' defaults: Qwen3-VL-MoE's head_dim defaults to
hidden / heads (Qwen3's to 128), and its router always renormalises the k chosen probabilities
(whatever `norm_topk_prob` says). Its published checkpoints store the stacked experts as x @ W
(gate_up `[E, H, 2I]`, [gate | up] columns; down `[E, I, H]`): they are read transposed, as
transformers reads them where a tensor is not already `[E, 2I, H]` / `[E, H, I]`.

Qwen2-VL and Qwen2.5-VL were first published flat: the text model's config at the top level of
config.json (no `text_config`) and its tensors as a text-only checkpoint's (`model.layers...`) beside
`visual.` (the tensors' layout transformers still saves them in); either layout loads. The `*_text`
model types are the text models' own configs."""
from __future__ import annotations

import importlib

import torch

from tritonformer.backend.models.moe import num_experts
from tritonformer.backend.models.multimodal import mrope_as_rotary, text_part
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder

# model_type of the multimodal checkpoint -> its text model's model_type
TEXT_TYPES = {"qwen2_vl": "qwen2_vl_text", "qwen2_5_vl": "qwen2_5_vl_text", "qwen3_vl": "qwen3_vl_text",
              "qwen3_vl_moe": "qwen3_vl_moe_text"}
# text model_type -> the family module that serves its block
BLOCKS = {"qwen2_vl_text": "qwen2", "qwen2_5_vl_text": "qwen2", "qwen3_vl_text": "qwen3",
          "qwen3_vl_moe_text": "qwen3_moe"}


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    model_type = cfg.get("model_type")
    if model_type in TEXT_TYPES:
        tie = bool(cfg.get("tie_word_embeddings")) or bool((cfg.get("text_config") or {}).get("tie_word_embeddings"))
        cfg, state = text_part(*_nested(cfg, state), TEXT_TYPES[model_type])
        cfg = {**cfg, "tie_word_embeddings": tie}  # (the outer config's, or an older text_config's)
        model_type = cfg["model_type"]
    if model_type == "qwen3_vl_moe_text":
        cfg = {**cfg, "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
               "norm_topk_prob": True}
        state = _experts_as_rows(cfg, state)
    head_dim = cfg.get("head_dim") or (128 if model_type == "qwen3_vl_text" else
                                       cfg["hidden_size"] // cfg["num_attention_heads"])
    return mrope_as_rotary(cfg, head_dim), state


def from_hf(cfg: dict) -> DecoderSpec:
    model_type = cfg.get("model_type")
    if model_type not in BLOCKS:
        raise ValueError(f"unsupported Qwen-VL text model_type {model_type!r} (supported: {', '.join(BLOCKS)})")
    return importlib.import_module(f"tritonformer.backend.models.{BLOCKS[model_type]}").from_hf(cfg)


def _nested(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A flat checkpoint (Qwen2-VL's and Qwen2.5-VL's first layout, which transformers still saves
    their tensors in) as a nested one: its text model's config as `text_config`, its tensors but
    the vision tower's (`visual.`) under `language_model.`."""
    if "text_config" not in cfg:
        cfg = {**cfg, "text_config": {k: v for k, v in cfg.items() if k != "vision_config"}}
    if not any("language_model." in name for name in state):
        state = {(name if name == "lm_head.weight" else "language_model." + name): t for name, t in state.items()
                 if not name.startswith("visual.")}
    return cfg, state


def _experts_as_rows(cfg: dict, state: dict) -> dict:
    """Qwen3-VL-MoE's stacked experts as the MoE layers read them (`[E, 2I, H]`, `[E, H, I]`):
    those stored as x @ W transposed (lazily where the checkpoint is read lazily)."""
    experts, hidden, inter = num_experts(cfg), cfg["hidden_size"], cfg["moe_intermediate_size"]
    rows = {"experts.gate_up_proj": (experts, 2 * inter, hidden), "experts.down_proj": (experts, hidden, inter)}
    out = {}
    for name, t in state.items():
        shape = next((s for suffix, s in rows.items() if name.removesuffix(".weight").endswith(suffix)), None)
        if shape is not None and tuple(t.shape) != shape:
            t = t.transpose(1, 2) if isinstance(t, torch.Tensor) else _Transposed(t)
        out[name] = t
    return out


class _Transposed:
    """A lazily read `[E, A, B]` checkpoint tensor seen as `[E, B, A]`: a read of all of it, or of a
    part (slices of each dim), reads the stored tensor's matching part and transposes it."""

    def __init__(self, stored):
        self.stored = stored
        e, a, b = stored.shape
        self.shape, self.dtype = (e, b, a), getattr(stored, "dtype", None)

    def __getitem__(self, index) -> torch.Tensor:
        index = (index if isinstance(index, tuple) else (index,)) + (slice(None),) * 3
        e, b, a = index[:3]
        return self.stored[(e, a, b)].transpose(1, 2)

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.stored.to(*args, **kwargs).transpose(1, 2)


MODEL = TransformerDecoder
