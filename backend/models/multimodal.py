"""The text part of a multimodal checkpoint (Gemma 3, Mistral 3 / Mistral-Small-3.x): its decoder
served on its own, text in and text out, the vision tower and projector left unread."""
from __future__ import annotations


def text_part(cfg: dict, state: dict, text_type: str) -> tuple[dict, dict]:
    """(the text model's config, as model_type `text_type`; its tensors, named as a text-only
    checkpoint names them). The tensors are found under `language_model.` in either layout
    transformers writes (`language_model.model.layers...` and `model.language_model.layers...`),
    and the output head wherever it is (`language_model.lm_head` or a top-level `lm_head`)."""
    if "text_config" not in cfg:
        raise ValueError(f"a model_type {cfg.get('model_type')!r} checkpoint needs a text_config")
    text = {**cfg["text_config"], "model_type": text_type}
    for key in ("bos_token_id", "eos_token_id"):
        if text.get(key) is None and cfg.get(key) is not None:
            text[key] = cfg[key]
    marker = "language_model."
    tensors = {}
    for name, tensor in state.items():
        if marker in name:
            tensors[name.split(marker, 1)[1].removeprefix("model.")] = tensor
        elif name.removeprefix("model.") == "lm_head.weight":
            tensors["lm_head.weight"] = tensor
    return text, tensors
