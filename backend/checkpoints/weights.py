"""Load a checkpoint folder's weights (safetensors only) and config."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from .mxfp4 import dequantize_mxfp4, mxfp4_pairs

# Prefixes under which Hugging Face heads store the bare encoder/decoder weights.
_STRIP_PREFIXES = ("bert.", "roberta.", "distilbert.", "electra.", "mpnet.", "model.", "transformer.", "gpt_neox.",
                   "biogpt.")


def _special_float(obj: dict):
    """transformers writes a non-finite float as {"__float__": "Infinity"} (JSON has no inf): the float
    (Mamba-2's `time_step_limit` is (0.0, inf) by default)."""
    if obj.keys() == {"__float__"}:
        return float(obj["__float__"])
    return obj


def load_config(checkpoint: Path) -> dict:
    """config.json, with the end-of-sequence ids of generation_config.json added to its own
    (instruction-tuned checkpoints often list their end-of-turn token only there)."""
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint folder {checkpoint} has no config.json")
    config = json.loads(path.read_text(), object_hook=_special_float)
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


class LazyMxfp4Tensor:
    """An MXFP4 parameter not read yet (its `_blocks` and `_scales`, two LazyTensors): its
    dequantised shape `[E, G * 32, R]` and dtype (bfloat16), and reads like a LazyTensor's,
    dequantised (see mxfp4.py). `.to(device=...)` dequantises on that device."""

    def __init__(self, blocks: LazyTensor, scales: LazyTensor):
        self.blocks, self.scales = blocks, scales
        experts, rows, groups, nbytes = blocks.shape
        self.shape, self.dtype = (experts, groups * nbytes * 2, rows), torch.bfloat16

    def __getitem__(self, index) -> torch.Tensor:
        # An index of ints and step-1 slices (experts, input features, output features: a
        # tensor-parallel share of either) reads and dequantises only the stored rows and 32-value
        # blocks it covers; any other index (a step, Ellipsis, a tensor) dequantises the whole
        # tensor first and then indexes it.
        parts = index if isinstance(index, tuple) else (index,)
        if len(parts) > 3 or not all(_is_int(p) or (isinstance(p, slice) and p.step in (None, 1)) for p in parts):
            return self.read()[index]
        parts += (slice(None),) * (3 - len(parts))
        (e0, e1), (c0, c1), (r0, r1) = (_bounds(p, n) for p, n in zip(parts, self.shape))
        per_block = self.blocks.shape[3] * 2
        g0, g1 = c0 // per_block, -(-c1 // per_block)
        out = self._dequantize((slice(e0, e1), slice(r0, r1), slice(g0, g1)))
        out = out[:, c0 - g0 * per_block : c1 - g0 * per_block]
        return out[tuple(0 if _is_int(p) else slice(None) for p in parts)].contiguous()

    def _dequantize(self, stored: tuple[slice, slice, slice], device=None) -> torch.Tensor:
        """The stored [experts, rows, blocks] share `stored`, dequantised on `device` (default the CPU)."""
        blocks, scales = self.blocks[stored], self.scales[stored]
        if device is not None:
            blocks, scales = blocks.to(device), scales.to(device)
        return dequantize_mxfp4(blocks, scales, self.dtype)

    def read(self, device=None) -> torch.Tensor:
        """All of it, dequantised on `device` (default the CPU)."""
        return self._dequantize((slice(None),) * 3, device)

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.read(kwargs.get("device")).to(*args, **kwargs)


def _is_int(index) -> bool:
    return isinstance(index, int) and not isinstance(index, bool)


def _bounds(index: int | slice, size: int) -> tuple[int, int]:
    """[start, stop) of a dimension of `size` that an int or a step-1 slice picks."""
    if isinstance(index, slice):
        start, stop, _ = index.indices(size)
        return start, max(start, stop)
    if not -size <= index < size:
        raise IndexError(f"index {index} is out of range for a dimension of size {size}")
    return index % size, index % size + 1


def lazy_state_dict(checkpoint: Path) -> dict[str, LazyTensor | LazyMxfp4Tensor]:
    """Every tensor of the folder's `*.safetensors` files, unread (see LazyTensor), names
    without the head's prefix; an MXFP4 pair `X_blocks` + `X_scales` is one LazyMxfp4Tensor `X`."""
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
    return strip_prefixes_of(_with_mxfp4_dequantized(state, LazyMxfp4Tensor))


def load_state_dict(checkpoint: Path, strip_prefixes: bool = True, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """All tensors of every `*.safetensors` file in the folder, an MXFP4 pair `X_blocks` +
    `X_scales` dequantised to one bfloat16 tensor `X` (see mxfp4.py).

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
    state = _with_mxfp4_dequantized(state, dequantize_mxfp4)
    return strip_prefixes_of(state) if strip_prefixes else state


def _with_mxfp4_dequantized(state: dict, dequantize) -> dict:
    """`state` with each MXFP4 pair `X_blocks` + `X_scales` replaced by `X` =
    `dequantize(blocks, scales)`, at the blocks' place; `state` itself when it has none.
    Otherwise a new dict, and `state` is emptied on the way: each pair's packed tensors are let
    go as soon as they are converted, not kept until every pair is."""
    pairs = mxfp4_pairs(state)
    if not pairs:
        return state
    plain_of = {blocks: plain for plain, (blocks, _) in pairs.items()}
    scale_names = {scales for _, scales in pairs.values()}
    out = {}
    for name in list(state):
        if name in scale_names:
            continue
        if name in plain_of:
            plain = plain_of[name]
            out[plain] = dequantize(state.pop(name), state.pop(pairs[plain][1]))
        else:
            out[name] = state.pop(name)
    return out


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
