"""A generation request's sampling parameters, parsed and validated from its JSON."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from tritonformer.backend.errors import InvalidRequest


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy, the default: same prompt, same answer
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    apply_chat_template: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def parse_sampling_parameters(raw: str | None, max_tokens_limit: int, vocab_size: int) -> SamplingParams:
    """Parse the `sampling_parameters` JSON object; every bad value is an InvalidRequest."""
    params = SamplingParams()
    if raw is None or raw.strip() == "":
        return params
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"sampling_parameters is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise InvalidRequest("sampling_parameters must be a JSON object")
    known = set(SamplingParams.__dataclass_fields__)
    unknown = sorted(set(obj) - known)
    if unknown:
        raise InvalidRequest(f"unknown key(s) in sampling_parameters: {unknown}; known keys: {sorted(known)}")

    if "max_tokens" in obj:
        v = obj["max_tokens"]
        if not _is_int(v) or not 1 <= v <= max_tokens_limit:
            raise InvalidRequest(f"max_tokens must be an integer in [1, {max_tokens_limit}], got {v!r}")
        params.max_tokens = v
    if "temperature" in obj:
        v = obj["temperature"]
        if not _is_number(v) or not 0.0 <= v <= 100.0:
            raise InvalidRequest(f"temperature must be a number in [0, 100], got {v!r}")
        params.temperature = float(v)
    if "top_k" in obj:
        v = obj["top_k"]
        if not _is_int(v) or v < 0:
            raise InvalidRequest(f"top_k must be a non-negative integer (0 = off), got {v!r}")
        params.top_k = v
    if "top_p" in obj:
        v = obj["top_p"]
        if not _is_number(v) or not 0.0 < v <= 1.0:
            raise InvalidRequest(f"top_p must be a number in (0, 1], got {v!r}")
        params.top_p = float(v)
    if "seed" in obj:
        v = obj["seed"]
        if v is not None and (not _is_int(v) or not 0 <= v < 2**63):
            raise InvalidRequest(f"seed must be a non-negative integer, got {v!r}")
        params.seed = v
    if "stop" in obj:
        v = obj["stop"]
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v) or len(v) > 16:
            raise InvalidRequest("stop must be a non-empty string or a list of at most 16 non-empty strings")
        params.stop = v
    if "stop_token_ids" in obj:
        v = obj["stop_token_ids"]
        if not isinstance(v, list) or not all(_is_int(t) and 0 <= t < vocab_size for t in v):
            raise InvalidRequest(f"stop_token_ids must be a list of token ids in [0, {vocab_size})")
        params.stop_token_ids = v
    for key in ("ignore_eos", "apply_chat_template"):
        if key in obj:
            if not isinstance(obj[key], bool):
                raise InvalidRequest(f"{key} must be true or false, got {obj[key]!r}")
            setattr(params, key, obj[key])
    return params
