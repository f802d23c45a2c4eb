"""The text part of a multimodal checkpoint (Gemma 3, Mistral 3 / Mistral-Small-3.x): its decoder
served on its own, text in and text out, the vision tower and projector left unread."""
from __future__ import annotations


def text_part(cfg: dict, state: dict, text_type: str, marker: str = "language_model.") -> tuple[dict, dict]:
    """(the text model's config, as model_type `text_type`; its tensors, named as a text-only
    checkpoint names them). The tensors are found under `marker` (`language_model.`; Emu3's
    `text_model.`) in either layout transformers writes (`language_model.model.layers...` and
    `model.language_model.layers...`), and the output head wherever it is
    (`language_model.lm_head` or a top-level `lm_head`)."""
    if "text_config" not in cfg:
        raise ValueError(f"a model_type {cfg.get('model_type')!r} checkpoint needs a text_config")
    text = {**cfg["text_config"], "model_type": text_type}
    for key in ("bos_token_id", "eos_token_id"):
        if text.get(key) is None and cfg.get(key) is not None:
            text[key] = cfg[key]
    tensors = {}
    for name, tensor in state.items():
        if marker in name:
            tensors[name.split(marker, 1)[1].removeprefix("model.")] = tensor
        elif name.removeprefix("model.") == "lm_head.weight":
            tensors["lm_head.weight"] = tensor
    return text, tensors


def mrope_as_rotary(cfg: dict, rotary_dims: int) -> dict:
    """`cfg` (a text model's config) with its multimodal rotary (M-RoPE: Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL, GLM-4V) written as the ordinary rotary it is for text.

    M-RoPE gives a token three positions (time, height, width) and hands each of the rotary's
    rotary_dims / 2 frequencies to one of them: frequency i turns by p_axis(i) * inv_freq[i], the
    axis by `mrope_section` (contiguous sections t | h | w; Qwen3-VL's `mrope_interleaved`: h and w
    take every third frequency from the second and third on, t the rest). A text token has
    p_t = p_h = p_w = p, so every frequency turns by p * inv_freq[i] whichever axis holds it: the
    ordinary table of the same inv_freq (theta, scaling and partial rotary unchanged). Only the
    sections go, and the type 'mrope' (older configs' name for the default)."""
    out = dict(cfg)
    for key in ("rope_scaling", "rope_parameters"):
        params = cfg.get(key)
        if not isinstance(params, dict):
            continue
        sections = params.get("mrope_section")
        if sections and not params.get("mrope_interleaved") and 2 * sum(sections) != rotary_dims:
            raise ValueError(f"mrope_section {list(sections)} must share the {rotary_dims // 2} rotary frequencies "
                             f"of each head ({rotary_dims} rotating dims)")
        params = {k: v for k, v in params.items() if k not in ("mrope_section", "mrope_interleaved")}
        for name in ("rope_type", "type"):
            if params.get(name) == "mrope":
                params[name] = "default"
        out[key] = params
    return out
