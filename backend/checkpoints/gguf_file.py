"""Reading a GGUF file: its metadata as plain Python values and its tensors as raw numpy views.

The layout (GGUF versions 2 and 3, little-endian): the magic "GGUF", a uint32 version, uint64
tensor and key-value counts; the key-value pairs (a string key, a uint32 value type, the value);
one entry per tensor (name, dims fastest-first, ggml type, offset); then, aligned to
`general.alignment` (32 by default), the tensor data, each tensor at its offset from there.
Strings are a uint64 byte length and UTF-8 bytes; an array is an element type, a uint64 count
and the elements.

`gguf.GGUFReader` reads the same, but wraps every element of every array in numpy objects:
on Gemma's 262,144-token vocabulary that takes ~15 s of CPU where this takes well under one.
The tensor data is handed to `gguf.quants.dequantize` as GGUFReader would hand it over.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MISSING: Any = object()

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
# GGUF value type -> struct format of a scalar
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first (ne0 = columns)
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # float32 / float16 values, or the raw bytes of a quantized tensor, one row per row


class GGUFFile:
    """`fields`: {key: value} of the metadata; `tensors`: the tensors in file order."""

    def __init__(self, path: str | Path):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self._map[:4] != _MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        self._pos = len(_MAGIC)
        version = self._scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are; big-endian files are not)")
        n_tensors, n_fields = self._scalar("<Q"), self._scalar("<Q")
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = tuple(self._scalar("<Q") for _ in range(self._scalar("<I")))
            infos.append((name, dims, GGMLQuantizationType(self._scalar("<I")), self._scalar("<Q")))
        alignment = int(self.fields.get("general.alignment", _DEFAULT_ALIGNMENT))
        start = -(-self._pos // alignment) * alignment

        self.tensors: list[GGUFTensor] = []
        for name, dims, qtype, offset in infos:
            rows = tuple(reversed(dims))  # numpy order
            if qtype == GGMLQuantizationType.F32 or qtype == GGMLQuantizationType.F16:
                dtype, shape = (np.float32 if qtype == GGMLQuantizationType.F32 else np.float16), rows
            else:
                block, block_bytes = GGML_QUANT_SIZES[qtype]
                if rows[-1] % block:
                    raise ValueError(f"GGUF tensor {name}: row of {rows[-1]} is not whole {qtype.name} blocks")
                dtype, shape = np.uint8, (*rows[:-1], rows[-1] // block * block_bytes)
            count = int(np.prod(shape))
            data = np.frombuffer(self._map, dtype=dtype, count=count, offset=start + offset).reshape(shape)
            self.tensors.append(GGUFTensor(name, dims, qtype, data))

    def _scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        size = self._scalar("<Q")
        text = self._map[self._pos : self._pos + size].decode("utf-8", errors="replace")
        self._pos += size
        return text

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            return self._scalar(_SCALARS[kind])
        kind, count = self._scalar("<I"), self._scalar("<Q")
        if kind in (_STRING, _ARRAY):
            return [self._value(kind) for _ in range(count)]
        fmt = _SCALARS[kind]
        values = np.frombuffer(self._map, dtype=np.dtype(fmt), count=count, offset=self._pos).tolist()
        self._pos += count * struct.calcsize(fmt)
        return values


def field(reader: GGUFFile, key: str, default: Any = MISSING) -> Any:
    """Metadata value as a plain Python value (str, int, float, bool or list)."""
    if key not in reader.fields:
        if default is MISSING:
            raise KeyError(f"GGUF metadata has no {key!r}")
        return default
    return reader.fields[key]


def f32(value: float) -> float:
    # GGUF stores these as float32; 9.999999747378752e-06 reads better (and is the same float32) as 1e-05.
    return float(str(np.float32(value)))  # str, not repr: numpy 2's repr is "np.float32(...)"


def tensor_names(reader: GGUFFile) -> set[str]:
    return {t.name for t in reader.tensors}


def tensor_shape(reader: GGUFFile, name: str) -> tuple[int, ...]:
    """A tensor's shape in numpy / torch order (GGUF lists dims fastest-first)."""
    tensor = next((t for t in reader.tensors if t.name == name), None)
    if tensor is None:
        raise KeyError(f"GGUF file has no tensor {name!r}")
    return tuple(int(d) for d in reversed(tensor.shape))


# Tensors every llama.cpp decoder names alike: GGUF name -> Hugging Face name, per layer (inside
# `model.layers.{i}.`) and for the whole model.
COMMON_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def hf_tensor_name(gguf_name: str, layer_names: dict[str, str], arch: str) -> str:
    """"blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight", with `layer_names` the
    architecture's per-layer table (GGUF name -> Hugging Face name inside `model.layers.{i}.`)."""
    stem, _, suffix = gguf_name.rpartition(".")  # suffix: "weight" (or "bias")
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{suffix}"
    if len(parts) == 1 and parts[0] in _TOP_TENSORS:
        return f"{_TOP_TENSORS[parts[0]]}.{suffix}"
    raise NotImplementedError(f"GGUF tensor {gguf_name!r} has no {arch} counterpart this converter knows")
