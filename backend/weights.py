"""Load a checkpoint folder's weights (safetensors only) and config."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

# Prefixes under which Hugging Face heads store the bare encoder/decoder weights.
_STRIP_PREFIXES = ("bert.", "roberta.", "model.")


def load_config(checkpoint: Path) -> dict:
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint folder {checkpoint} has no config.json")
    return json.loads(path.read_text())


def load_state_dict(checkpoint: Path, strip_prefixes: bool = True) -> dict[str, torch.Tensor]:
    """All tensors of every `*.safetensors` file in the folder.

    Pickle-based `.bin` checkpoints are refused on purpose: loading them can run arbitrary code.
    """
    files = sorted(Path(checkpoint).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"checkpoint folder {checkpoint} has no *.safetensors file "
            "(pickle .bin checkpoints are not loaded; convert them to safetensors)"
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if strip_prefixes:
        state = {_strip(k): v for k, v in state.items()}
    return state


def _strip(name: str) -> str:
    for p in _STRIP_PREFIXES:
        if name.startswith(p):
            return name[len(p) :]
    return name


def weight_getter(state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype):
    """`w(name)`: the named tensor on `device` in `dtype`, contiguous; a clear error if missing."""

    def w(name: str) -> torch.Tensor:
        if name not in state:
            raise KeyError(f"checkpoint is missing weight {name!r}")
        return state[name].to(device=device, dtype=dtype).contiguous()

    return w
