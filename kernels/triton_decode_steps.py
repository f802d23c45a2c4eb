"""Triton-language step from one decode iteration to the next, on the device.

When the engine runs several decode iterations per scheduling round (backend/decoder/engine.py),
the iterations after the first need no new inputs from the host: every row's next token is its
own sample, one position further. This kernel, the last of each decode graph, writes those
inputs in place, so the next replay follows at once instead of after a pack and a copy from
the host. One program: a decode bucket has at most a few hundred rows.

Same signature and result as `reference.advance_decode_inputs`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register


@triton.jit(do_not_specialize=["rows", "table_stride", "block_size", "scratch_slot"])
def _advance_kernel(ids_ptr, pos_ptr, slot_ptr, seqlen_ptr, tables_ptr, steps_ptr,
                    rows, table_stride, block_size, scratch_slot, BLOCK: tl.constexpr):
    row = tl.arange(0, BLOCK)
    mask = row < rows
    left = tl.load(steps_ptr + row, mask=mask, other=0)
    go = left > 0
    pos = tl.where(go, tl.load(pos_ptr + row, mask=mask, other=0) + 1, 0)
    block = tl.load(tables_ptr + row * table_stride + pos // block_size, mask=mask, other=0).to(tl.int64)
    tl.store(ids_ptr + row, tl.where(go, -1 - row.to(tl.int64), 0), mask=mask)
    tl.store(pos_ptr + row, pos, mask=mask)
    tl.store(seqlen_ptr + row, tl.where(go, pos + 1, 0).to(tl.int32), mask=mask)
    tl.store(slot_ptr + row, tl.where(go, block * block_size + pos % block_size, scratch_slot), mask=mask)
    tl.store(steps_ptr + row, left - go.to(tl.int32), mask=mask)


@register("advance_decode_inputs")
def advance_decode_inputs(input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                          seqlens: torch.Tensor, tables: torch.Tensor, steps_left: torch.Tensor,
                          block_size: int, scratch_slot: int) -> None:
    rows = input_ids.numel()
    if rows:
        block = max(16, triton.next_power_of_2(rows))
        _advance_kernel[(1,)](input_ids, positions, slot_mapping, seqlens, tables, steps_left,
                              rows, tables.stride(0), block_size, scratch_slot, BLOCK=block)
