"""Load a checkpoint folder's weights (safetensors only) and config."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

# Prefixes under which Hugging Face heads store the bare encoder/decoder weights.
_STRIP_PREFIXES = ("bert.", "roberta.", "model.", "transformer.")


def load_config(checkpoint: Path) -> dict:
    """config.json, with the end-of-sequence ids of generation_config.json added to its own
    (instruction-tuned checkpoints often list their end-of-turn token only there)."""
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint folder {checkpoint} has no config.json")
    config = json.loads(path.read_text())
    generation = Path(checkpoint) / "generation_config.json"
    if generation.is_file():
        extra = _ids(json.loads(generation.read_text()).get("eos_token_id"))
        ids = _ids(config.get("eos_token_id"))
        merged = ids + [i for i in extra if i not in ids]
        if merged:
            config["eos_token_id"] = merged if len(merged) > 1 else merged[0]
    return config


def _ids(value) -> list[int]:
    return list(value) if isinstance(value, list) else ([] if value is None else [value])


# safetensors' dtype names -> torch's (what LazyTensor.dtype reports; None for another)
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class LazyTensor:
    """A checkpoint tensor not read yet: its shape, and reads of all of it or of a slice
    (safetensors reads only the bytes asked for). A tensor-parallel rank reads only its share,
    so no process ever holds the whole model."""

    def __init__(self, path: str, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None):
        self.path, self.name, self.shape, self.dtype = path, name, shape, dtype

    def __getitem__(self, index) -> torch.Tensor:
        with safe_open(self.path, "pt") as f:
            return f.get_slice(self.name)[index]

    def read(self) -> torch.Tensor:
        """All of it (a 0-dim tensor too, which a slice cannot index)."""
        with safe_open(self.path, "pt") as f:
            return f.get_tensor(self.name)

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.read().to(*args, **kwargs)


def lazy_state_dict(checkpoint: Path) -> dict[str, LazyTensor]:
    """Every tensor of the folder's `*.safetensors` files, unread (see LazyTensor), names
    without the head's prefix."""
    files = sorted(Path(checkpoint).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint folder {checkpoint} has no *.safetensors weights (tensor parallelism "
                                f"reads slices of safetensors files)")
    state = {}
    for path in files:
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                part = f.get_slice(name)
                state[name] = LazyTensor(str(path), name, tuple(part.get_shape()), _DTYPES.get(part.get_dtype()))
    return strip_prefixes_of(state)


def load_state_dict(checkpoint: Path, strip_prefixes: bool = True, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """All tensors of every `*.safetensors` file in the folder.

    Pickle-based `.bin` checkpoints can run arbitrary code when loaded: they are refused unless
    `allow_pickle` (config parameter `allow_pickle_checkpoint`), and even then load with
    `weights_only=True`, which only rebuilds tensors and plain containers.
    """
    files = sorted(Path(checkpoint).glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        for f in files:
            state.update(load_file(str(f)))
    else:
        pickles = sorted(Path(checkpoint).glob("*.bin"))
        if not pickles:
            raise FileNotFoundError(f"checkpoint folder {checkpoint} has no *.safetensors (or *.bin) weights")
        if not allow_pickle:
            raise PermissionError(
                f"checkpoint folder {checkpoint} has only pickle .bin weights, which can run code when "
                'loaded; convert them to safetensors, or set the parameter allow_pickle_checkpoint to "true"'
            )
        for f in pickles:
            state.update(torch.load(str(f), map_location="cpu", weights_only=True))
    return strip_prefixes_of(state) if strip_prefixes else state


def strip_prefixes_of(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Names without the head's prefix (`model.`, `transformer.`, ...): what the models expect."""
    return {_strip(k): v for k, v in state.items()}


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
