"""Typed access to a model's config.pbtxt `parameters` (Triton gives them as strings)."""
from __future__ import annotations

import json


class ModelParameters:
    def __init__(self, model_config: dict, known: dict[str, str]):
        """`known` maps every accepted key to its default; an unknown key is a load error so
        that a typo in config.pbtxt does not silently fall back to a default."""
        raw = {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}
        # Keys the Python backend itself interprets.
        passthrough = {"EXECUTION_ENV_PATH", "FORCE_CPU_ONLY_INPUT_TENSORS"}
        unknown = sorted(set(raw) - set(known) - passthrough)
        if unknown:
            raise ValueError(f"unknown config.pbtxt parameter(s) {unknown}; known: {sorted(known)}")
        self._values = {**known, **{k: v for k, v in raw.items() if k in known}}

    @classmethod
    def from_args(cls, args: dict, known: dict[str, str]) -> "ModelParameters":
        return cls(json.loads(args["model_config"]), known)

    def str(self, key: str) -> str:
        return self._values[key].strip()

    def int(self, key: str, minimum: int = 1) -> int:
        try:
            value = int(self._values[key])
        except ValueError:
            raise ValueError(f"parameter {key} must be an integer, got {self._values[key]!r}") from None
        if value < minimum:
            raise ValueError(f"parameter {key} must be >= {minimum}, got {value}")
        return value

    def float(self, key: str) -> float:
        try:
            return float(self._values[key])
        except ValueError:
            raise ValueError(f"parameter {key} must be a number, got {self._values[key]!r}") from None

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.str(key).lower()
        if value not in choices:
            raise ValueError(f"parameter {key} must be one of {choices}, got {value!r}")
        return value
