"""Validation of request inputs, independent of Triton (numpy arrays in, clean values out).

Everything here raises `InvalidRequest` with a message that tells the client what to fix;
such a request is answered at once and never queued.
"""
from __future__ import annotations

import numpy as np

from tritonformer.backend.errors import InvalidRequest


def exactly_one(inputs: dict[str, np.ndarray | None], names: tuple[str, str]) -> str:
    present = [n for n in names if inputs.get(n) is not None]
    if len(present) != 1:
        which = "both" if len(present) == 2 else "neither"
        raise InvalidRequest(f"send exactly one of the inputs {names[0]} or {names[1]} (got {which})")
    return present[0]


def decode_texts(arr: np.ndarray, name: str, max_count: int, max_bytes: int) -> list[str]:
    """A BYTES tensor -> non-empty UTF-8 strings."""
    flat = arr.reshape(-1)
    if flat.size == 0:
        raise InvalidRequest(f"{name} is empty: send at least one text")
    if flat.size > max_count:
        raise InvalidRequest(f"{name} has {flat.size} texts; at most {max_count} per request")
    texts = []
    for i, item in enumerate(flat):
        raw = item if isinstance(item, (bytes, bytearray)) else str(item).encode()
        if len(raw) > max_bytes:
            raise InvalidRequest(f"{name}[{i}] is {len(raw)} bytes; at most {max_bytes} per text")
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidRequest(f"{name}[{i}] is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        if not text.strip():
            raise InvalidRequest(f"{name}[{i}] is an empty string")
        texts.append(text)
    return texts


def token_ids(arr: np.ndarray, name: str, vocab_size: int) -> list[int]:
    """An INT32 tensor -> one non-empty sequence of ids inside the vocabulary."""
    flat = arr.reshape(-1)
    if flat.size == 0:
        raise InvalidRequest(f"{name} is empty: send at least one token id")
    if flat.min() < 0 or flat.max() >= vocab_size:
        raise InvalidRequest(f"{name} holds ids outside the vocabulary [0, {vocab_size})")
    return flat.astype(np.int64).tolist()


def text_ids_in_vocabulary(ids: list[int], vocab_size: int) -> None:
    """A text prompt's ids as its tokenizer wrote them, inside the model's vocabulary: a tokenizer
    may know tokens the model has no embedding for (a multimodal checkpoint served text-only: Llama
    3.2 Vision's `<|image|>` is id 128,256 of a 128,256-row text vocabulary)."""
    if ids and max(ids) >= vocab_size:
        outside = sorted({i for i in ids if i >= vocab_size})
        raise InvalidRequest(f"the prompt's text holds tokens outside the model's vocabulary [0, {vocab_size}): "
                             f"ids {outside[:4]} (a multimodal checkpoint's image tokens have no text embedding)")


def fit_length(ids: list[int], max_len: int, truncate: bool, what: str) -> list[int]:
    """Bound a sequence to the model's maximum: error, or truncation when asked for (the last
    token, the closing special token of an encoder input, is kept)."""
    if len(ids) <= max_len:
        return ids
    if not truncate:
        raise InvalidRequest(
            f"{what} is {len(ids)} tokens, longer than the model's maximum of {max_len}; "
            'shorten it or send the request parameter "truncate": true'
        )
    return ids[: max_len - 1] + ids[-1:]


def single_bool(arr: np.ndarray | None, name: str, default: bool) -> bool:
    if arr is None:
        return default
    flat = arr.reshape(-1)
    if flat.size != 1:
        raise InvalidRequest(f"{name} must hold exactly one boolean")
    return bool(flat[0])


def single_text(arr: np.ndarray | None, name: str, max_bytes: int) -> str | None:
    if arr is None:
        return None
    flat = arr.reshape(-1)
    if flat.size != 1:
        raise InvalidRequest(f"{name} must hold exactly one string, got {flat.size}")
    return decode_texts(flat, name, 1, max_bytes)[0]
