"""RWKV-4's WKV (models/rwkv.py): every sequence of a forward in one launch, decode rows and prompt chunks alike.

A program takes one sequence and a block of channels: it reads the channels' fp32 state (num, den, the largest
exponent) at the sequence's slot, walks the sequence's rows in order carrying it in registers (each channel's
recurrence is its own), stores each row's wkv and writes the state back. A prompt chunk of n tokens is one loop of
n steps instead of n launches of small PyTorch ops.

Same semantics and signature as reference.wkv4.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register
from tritonformer.kernels.reference import WKV4_FRESH_MAX

BLOCK = 128  # channels per program


@triton.jit
def _wkv4_kernel(k_ptr, v_ptr, out_ptr, u_ptr, w_ptr, num_ptr, den_ptr, top_ptr, slots_ptr, starts_ptr, lens_ptr,
                 H, stride_k, stride_v, stride_out, stride_num, stride_den, stride_top,
                 FRESH: tl.constexpr, PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
    s = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    if PER_ROW:
        start = s.to(tl.int64)
        n = 1
    else:
        start = tl.load(starts_ptr + s).to(tl.int64)
        n = tl.load(lens_ptr + s)
    slot = tl.load(slots_ptr + s).to(tl.int64)
    u = tl.load(u_ptr + cols, mask=ok, other=0.0)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    num = tl.load(num_ptr + slot * stride_num + cols, mask=ok, other=0.0)
    den = tl.load(den_ptr + slot * stride_den + cols, mask=ok, other=0.0)
    top = tl.load(top_ptr + slot * stride_top + cols, mask=ok, other=0.0)
    top = tl.where(den == 0, FRESH, top)
    for t in range(n):
        row = start + t
        k = tl.load(k_ptr + row * stride_k + cols, mask=ok, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + row * stride_v + cols, mask=ok, other=0.0).to(tl.float32)
        m = tl.maximum(top, k + u)
        e1 = tl.exp(top - m)
        e2 = tl.exp(k + u - m)
        tl.store(out_ptr + row * stride_out + cols, (e1 * num + e2 * v) / (e1 * den + e2), mask=ok)
        m = tl.maximum(top + w, k)
        e1 = tl.exp(top + w - m)
        e2 = tl.exp(k - m)
        num = e1 * num + e2 * v
        den = e1 * den + e2
        top = m
    tl.store(num_ptr + slot * stride_num + cols, num, mask=ok)
    tl.store(den_ptr + slot * stride_den + cols, den, mask=ok)
    tl.store(top_ptr + slot * stride_top + cols, top, mask=ok)


@register("wkv4")
def wkv4(k: torch.Tensor, v: torch.Tensor, u: torch.Tensor, w: torch.Tensor, num: torch.Tensor, den: torch.Tensor,
         top: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor | None = None) -> torch.Tensor:
    """See reference.wkv4. k and v may be strided over rows; the states' slots at any stride, each slot's `[H]`
    contiguous; lens an int tensor on the device (no host sync: its starts are a cumulative sum there)."""
    rows, width = k.shape
    assert k.dtype == torch.float32 and k.stride(1) == 1 and v.stride(1) == 1 and v.shape == (rows, width)
    assert u.is_contiguous() and w.is_contiguous() and u.dtype == w.dtype == torch.float32
    for state in (num, den, top):
        assert state.dtype == torch.float32 and state.stride(1) == 1 and state.shape[1] == width
    out = torch.empty((rows, width), dtype=torch.float32, device=k.device)
    sequences = rows if lens is None else lens.shape[0]
    if rows == 0 or sequences == 0:
        return out
    starts = slots if lens is None else torch.cumsum(lens, 0) - lens  # (unused where each row is a sequence)
    block = min(BLOCK, triton.next_power_of_2(width))
    _wkv4_kernel[(sequences, triton.cdiv(width, block))](
        k, v, out, u, w, num, den, top, slots, starts, slots if lens is None else lens,
        width, k.stride(0), v.stride(0), out.stride(0), num.stride(0), den.stride(0), top.stride(0),
        FRESH=WKV4_FRESH_MAX, PER_ROW=lens is None, BLOCK=block, num_warps=4,
    )
    return out
