"""MXFP4 expert weights, as OpenAI's gpt-oss checkpoints publish them, dequantised to 16 bits.

A quantised parameter `X` (e.g. `mlp.experts.gate_up_proj`) is stored as two uint8 tensors:
- `X_blocks` `[E, R, G, 16]`: FP4 E2M1 values, two per byte, the low nibble first (value 2k is
  byte k's low 4 bits, value 2k+1 its high 4 bits). A nibble is a sign bit then 3 magnitude bits,
  the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
- `X_scales` `[E, R, G]`: one E8M0 exponent per block of 32 values (16 bytes): the block's values
  are multiplied by 2 ** (scale - 127).
R is the projection's output features and G * 32 its input features, so a stored row is one
output feature of one expert. The model holds the dequantised parameter transposed to
`[E, G * 32, R]` (input features first: `x @ W`), which is what `dequantize_mxfp4` returns:
gate_up_proj `[E, hidden, 2 * intermediate]`, down_proj `[E, intermediate, hidden]`.
"""
from __future__ import annotations

from typing import Iterable

import torch

BLOCKS, SCALES = "_blocks", "_scales"

# E2M1 nibble -> value: bit 3 the sign, bits 0-2 the magnitude's index
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_SCALE_BIAS = 127


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16, *,
                     rows_per_chunk: int = 2048) -> torch.Tensor:
    """The `[E, G * 32, R]` tensor in `dtype`, on `blocks`' device, of MXFP4 `blocks` `[E, R, G, 16]`
    and their `scales` `[E, R, G]` (see the module docstring). Works `rows_per_chunk` stored rows of
    one expert at a time, so beside the result it holds only one chunk's temporaries."""
    if blocks.dim() != 4 or tuple(scales.shape) != tuple(blocks.shape[:-1]):
        raise ValueError(f"MXFP4 blocks must be [experts, rows, groups, bytes] with scales [experts, rows, groups]; "
                         f"got blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)}")
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    experts, rows, groups, nbytes = blocks.shape
    cols = groups * nbytes * 2
    device = blocks.device
    out = torch.empty(experts, cols, rows, dtype=dtype, device=device)
    # float32 values times float32 powers of two are exact (a scale of 255 gives inf), rounded to `dtype` once
    table = torch.tensor(_E2M1, dtype=torch.float32, device=device)
    step = max(1, rows_per_chunk)
    for e in range(experts):
        for r0 in range(0, rows, step):
            packed = blocks[e, r0 : r0 + step]  # [n, G, 16]
            exponent = scales[e, r0 : r0 + step].to(device=device, dtype=torch.int32) - _SCALE_BIAS  # [n, G]
            nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=-1)  # [n, G, 16, 2]: low nibble first
            values = torch.ldexp(table[nibbles.int()], exponent[:, :, None, None])
            del nibbles
            out[e, :, r0 : r0 + packed.shape[0]] = values.reshape(packed.shape[0], cols).T
            del values
    return out


def mxfp4_pairs(names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """{`X`: (`X_blocks`, `X_scales`)} for every `X_blocks` among `names` with its `X_scales`
    beside it (a pair whose plain `X` is there too is left alone), in the order of `names`."""
    names = list(names)
    present = set(names)
    pairs = {}
    for name in names:
        if name.endswith(BLOCKS):
            plain = name[: -len(BLOCKS)]
            if plain + SCALES in present and plain not in present:
                pairs[plain] = (name, plain + SCALES)
    return pairs
