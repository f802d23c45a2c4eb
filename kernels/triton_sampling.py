"""Triton-language sampling ops: greedy argmax, and the penalties of penalized sequences.

A greedy decode iteration ends with an argmax over the vocabulary of every row, inside its
CUDA graph. torch's argmax took 13 us on an H100 for GPT-2's 50,257 logits at batch 1 and 64
(its reduction launches too few threads per row for a short batch), and it needed the logits
as a contiguous fp32 copy first (10 us at batch 64). This reads the model's fp16 (or bf16 /
fp32) logits in place, row stride and all, once: one program per row, `_BLOCK` logits per
step, every lane keeping its own best so far, and one reduction at the end.

A program reading a whole row alone is latency-bound: 19 us on an H200 for Llama 3's 128,256
logits at batch 1, one SM busy. So a row is split into `_BLOCK`-wide parts, one program each
(one load step, no loop): each packs its part's best logit and column into one int64 key that
orders like (logit, -column), takes the row's atomic max of the keys, and counts itself in; the
last program to arrive decodes the row's key into the column and sets the row's two words of
scratch back to zero (kernels/arrival_counters.py). Rows past the scratch's `_SPLIT_MAX_ROWS`,
and vocabularies of one part, keep one program a row.

Same signature and result as `reference.argmax_rows` (ties go to the first index), except
that NaN logits are skipped rather than chosen.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels import arrival_counters
from tritonformer.kernels.dispatch import register

_BLOCK = 8192  # logits per step: 32 per thread at 8 warps, four 16-byte loads in flight each
# Rows up to which a row is split over programs (0: never); each row holds two int64 words of scratch.
# H200, whole decode steps, bf16, context 128, one machine start, against 0 (tools/gpu/ab_decode_step.py
# --knob kernels.triton_sampling._SPLIT_MAX_ROWS): batch 1 BLOOM-560m (250,880 logits) 0.949x,
# ERNIE-4.5-0.3B 0.974x, Gemma-3-1B 0.988x, Llama-3.1-8B 0.995x; batch 64 0.985-0.999x.
_SPLIT_MAX_ROWS = 1024
_LOW = 1 << 31  # a key's low part holds _LOW - 1 - column (the parts kernel's LOW)


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


@triton.jit(do_not_specialize=["n_cols", "stride_row"])
def _argmax_parts_kernel(x_ptr, out_ptr, scratch_ptr, n_cols, stride_row, PARTS: tl.constexpr, BLOCK: tl.constexpr,
                         LOW: tl.constexpr):
    """Program (row, part): the part's best logit and its first column, packed into a key
    (the logit's bits mapped to an unsigned order, times LOW = 2^31, plus LOW - 1 - column: a
    larger key is a larger logit, or the same one at an earlier column; every key of a real part
    is positive) and maxed into scratch[2 row]; scratch[2 row + 1] counts the parts in."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row.to(tl.int64) * stride_row + cols, mask=cols < n_cols, other=float("-inf"))
    v = v.to(tl.float32)
    v = tl.where(v == v, v, float("-inf"))  # NaN skipped
    top = tl.max(v, axis=0)
    first = tl.min(tl.where(v == top, cols, n_cols), axis=0)
    top = tl.where(top == 0.0, 0.0, top)  # -0.0 equals 0.0: one key for both
    bits = top.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    order = tl.where(bits >= 0x80000000, 0xFFFFFFFF - bits, bits + 0x80000000)  # monotone in the logit
    key = order * LOW + (LOW - 1 - first.to(tl.int64))
    slot = scratch_ptr + 2 * row
    tl.atomic_max(slot, key, sem="acq_rel")
    if tl.atomic_add(slot + 1, 1, sem="acq_rel") == PARTS - 1:  # the last part in: every key is there
        best = tl.atomic_xchg(slot, 0, sem="acq_rel")
        tl.atomic_xchg(slot + 1, 0, sem="relaxed")
        tl.store(out_ptr + row, LOW - 1 - best % LOW)


@register("argmax_rows")
def argmax_rows(logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    rows, n_cols = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if not rows:
        return out
    block = min(_BLOCK, max(16, triton.next_power_of_2(n_cols)))
    parts = triton.cdiv(n_cols, block)
    if parts > 1 and rows <= _SPLIT_MAX_ROWS and n_cols < _LOW:
        scratch = arrival_counters.zeroed(logits.device, 2 * _SPLIT_MAX_ROWS, torch.int64)
        _argmax_parts_kernel[(rows, parts)](logits, out, scratch, n_cols, logits.stride(0), PARTS=parts, BLOCK=block,
                                            LOW=_LOW, num_warps=8)
    else:
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
