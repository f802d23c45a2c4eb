"""Triton-language sampling ops: greedy argmax, and the penalties of penalized sequences.

A greedy decode iteration ends with an argmax over the vocabulary of every row, inside its
CUDA graph. torch's argmax took 13 us on an H100 for GPT-2's 50,257 logits at batch 1 and 64
(its reduction launches too few threads per row for a short batch), and it needed the logits
as a contiguous fp32 copy first (10 us at batch 64). This reads the model's fp16 (or bf16 /
fp32) logits in place, row stride and all, once: one program per row, `_BLOCK` logits per
step, every lane keeping its own best so far, and one reduction at the end.

Same signature and result as `reference.argmax_rows` (ties go to the first index), except
that NaN logits are skipped rather than chosen.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register

_BLOCK = 8192  # logits per step: 32 per thread at 8 warps, four 16-byte loads in flight each


@triton.jit(do_not_specialize=["n_cols", "stride_row"])
def _argmax_rows_kernel(x_ptr, out_ptr, n_cols, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride_row
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_col = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_cols, BLOCK):
        cols = start + lanes
        v = tl.load(base + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        better = v > best  # strictly: a lane keeps its earliest column on ties
        best = tl.where(better, v, best)
        best_col = tl.where(better, cols, best_col)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, best_col, n_cols), axis=0)  # earliest lane holding it
    tl.store(out_ptr + row, first.to(tl.int64))


@register("argmax_rows")
def argmax_rows(logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    rows, n_cols = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if rows:
        block = min(_BLOCK, max(16, triton.next_power_of_2(n_cols)))
        _argmax_rows_kernel[(rows,)](logits, out, n_cols, logits.stride(0), BLOCK=block, num_warps=8)
    return out


# ---- penalties ----------------------------------------------------------------------------
# The reference gathers each row's pool rows ([S, V] copies of the counts and the prompt mask)
# and makes about eight [S, V] passes; this reads the pools in place through `slots` and the
# logits once, and writes them once: one program per (row, block of the vocabulary).

_PENALTY_BLOCK = 2048


@triton.jit(do_not_specialize=["n_cols", "stride_logits", "stride_pool"])
def _apply_penalties_kernel(logits_ptr, counts_ptr, prompt_ptr, slots_ptr, freq_ptr, pres_ptr, rep_ptr, n_cols,
                            stride_logits, stride_pool, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    slot = tl.load(slots_ptr + row).to(tl.int64)
    x_ptrs = logits_ptr + row.to(tl.int64) * stride_logits + cols
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    count = tl.load(counts_ptr + slot * stride_pool + cols, mask=mask, other=0)
    in_prompt = tl.load(prompt_ptr + slot * stride_pool + cols, mask=mask, other=0)
    rep = tl.load(rep_ptr + row)
    generated = count > 0
    seen = (in_prompt != 0) | generated
    x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
    x = x - (tl.load(freq_ptr + row) * count.to(tl.float32) + tl.load(pres_ptr + row) * generated.to(tl.float32))
    tl.store(x_ptrs, x, mask=mask)


@register("apply_penalties")
def apply_penalties(logits: torch.Tensor, output_counts: torch.Tensor, in_prompt: torch.Tensor, slots: torch.Tensor,
                    frequency: torch.Tensor, presence: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    rows, n_cols = logits.shape
    if logits.stride(1) != 1 or output_counts.stride() != in_prompt.stride() or output_counts.stride(1) != 1:
        raise ValueError("apply_penalties wants unit-stride rows and pools of one layout")
    if rows:
        block = min(_PENALTY_BLOCK, max(16, triton.next_power_of_2(n_cols)))
        grid = (rows, triton.cdiv(n_cols, block))
        _apply_penalties_kernel[grid](logits, output_counts, in_prompt.view(torch.uint8), slots, frequency, presence,
                                      repetition, n_cols, logits.stride(0), output_counts.stride(0), BLOCK=block,
                                      num_warps=4)
    return logits
