"""Llama 3.2 Vision (Llama-3.2-11B-Vision(-Instruct), Llama-3.2-90B-Vision) served text-only: the multimodal
`mllama` checkpoint's text model (multimodal.text_part; the vision tower and projector left unread) and a bare text
model's checkpoint (`mllama_text_model`, which transformers writes for MllamaForCausalLM).

The text model is Llama's (RMSNorm, SwiGLU, grouped-query attention, the llama3 rope scaling) with gated
cross-attention layers at the indices `cross_attention_layers` (transformers' default where a config leaves it out:
[3, 8, 13, 18, 23, 28, 33, 38]). Without an image (no cross-attention states, none cached) transformers skips those
layers altogether, their MLPs included; so for text the model is a Llama over the self-attention layers alone. `adapt`
drops the cross-attention layers' tensors, numbers the others consecutively and counts only them in
`num_hidden_layers`; the rest is the Llama family's (llama.from_hf). A checkpoint that holds no layer numbered at or
past that count is taken as already so numbered (what model_shapes.random_decoder builds from from_hf's spec).

The embedding has `vocab_size + 8` rows, the head `vocab_size`: the rows past the vocabulary are the image tokens'
(`<|image|>` is 128256, `image_token_index`), which text-only serving never reads. They are left out (the embedding
read as its first `vocab_size` rows, lazily), so the model's vocabulary is the head's and a request's `input_ids` at
or past it is refused as outside the vocabulary. Images, and the image tokens with them, are outside text-only
serving. The head is never tied to the embedding (transformers ties neither class's). Refused by name: an activation
other than silu; a config whose layers are all cross-attention ones."""
from __future__ import annotations

import re

import torch

from tritonformer.backend.models import llama
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder

TEXT_TYPE = "mllama_text_model"
# transformers' MllamaTextConfig defaults, where a config.json leaves a key out
DEFAULTS = {"vocab_size": 128256, "hidden_size": 4096, "hidden_act": "silu", "num_hidden_layers": 40,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072, "bos_token_id": 128000, "eos_token_id": 128001}
CROSS_ATTENTION_LAYERS = [3, 8, 13, 18, 23, 28, 33, 38]
_LAYER = re.compile(r"layers\.(\d+)\.(.*)")


def _cross_layers(cfg: dict) -> list[int]:
    """The indices of the cross-attention layers among the config's layers (as transformers reads them: an index
    past the last layer names none)."""
    listed = cfg.get("cross_attention_layers")
    listed = CROSS_ATTENTION_LAYERS if listed is None else listed
    return sorted({int(i) for i in listed if 0 <= int(i) < cfg["num_hidden_layers"]})


def _text_config(cfg: dict) -> dict:
    """The text model's config with transformers' defaults filled in, the self-attention layers alone counted."""
    cfg = {**DEFAULTS, **cfg, "model_type": TEXT_TYPE}
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"unsupported {TEXT_TYPE} hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    cross = _cross_layers(cfg)
    layers = cfg["num_hidden_layers"] - len(cross)
    if layers < 1:
        raise ValueError(f"{TEXT_TYPE} with cross_attention_layers {cross}, every layer, is not supported "
                         f"(supported: cross_attention_layers leaving a self-attention layer, text-only serving)")
    params = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" not in params:
        cfg["rope_theta"] = 500000.0  # (MllamaTextConfig's default_theta)
    return {**cfg, "num_hidden_layers": layers, "cross_attention_layers": [], "tie_word_embeddings": False}


class _FirstRows:
    """A lazily read checkpoint tensor's first `rows` rows (the embedding without the image tokens' rows): reads of
    it, or of a slice of its rows, read only those rows."""

    def __init__(self, source, rows: int):
        self.source, self.rows = source, rows
        self.shape, self.dtype = (rows, *tuple(source.shape)[1:]), getattr(source, "dtype", None)

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        if index and isinstance(index[0], slice) and index[0].step in (None, 1):
            start, stop, _ = index[0].indices(self.rows)
            return self.source[(slice(start, max(start, stop)), *index[1:])]
        return self.source[: self.rows][index]

    def to(self, *args, **kwargs):
        return self[:].to(*args, **kwargs)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The text model's config and tensors as a Llama's: the multimodal checkpoint's text part, the cross-attention
    layers left out and the others numbered consecutively, the embedding's rows past the vocabulary left out."""
    if cfg.get("model_type") == "mllama":
        cfg, state = text_part(cfg, state, TEXT_TYPE)
    full = {**DEFAULTS, **cfg}
    text = _text_config(cfg)
    cross, layers = _cross_layers(full), text["num_hidden_layers"]
    numbered = [int(m.group(1)) for m in map(_LAYER.match, state) if m]
    renumber = bool(cross) and any(i >= layers for i in numbered)  # (else: the self-attention layers alone)
    kept = [i for i in range(full["num_hidden_layers"]) if i not in cross]
    new_index = {old: new for new, old in enumerate(kept)}
    tensors = {}
    for name, tensor in state.items():
        m = _LAYER.match(name)
        if m and renumber:
            old = int(m.group(1))
            if old not in new_index:
                continue  # (a cross-attention layer's, or a layer past the config's: unread)
            name = f"layers.{new_index[old]}.{m.group(2)}"
        if name == "embed_tokens.weight" and tensor.shape[0] > text["vocab_size"]:
            rows = text["vocab_size"]
            tensor = tensor[:rows] if isinstance(tensor, torch.Tensor) else _FirstRows(tensor, rows)
        tensors[name] = tensor
    return text, tensors


def from_hf(cfg: dict) -> DecoderSpec:
    return llama.from_hf(_text_config(cfg))


MODEL = TransformerDecoder
