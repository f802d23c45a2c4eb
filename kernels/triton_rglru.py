"""RecurrentGemma's RG-LRU decode step (models/recurrent_gemma.py), one launch for every decoding row.

A program takes one row, one head and a block of that head's channels: it multiplies the row's head inputs by
the block's columns of both block-diagonal gate weights (the head's `[B, B]` matrices read in tiles of
BLOCK_K rows), applies the gates, reads the channels' fp32 state at the row's slot, writes the new state back
in place, and stores the state (rounded) times the GELU branch. Every intermediate before the state is rounded
to the model's dtype where Hugging Face's computation rounds (each op's result in that dtype).

Same semantics and signature as reference.rglru_decode.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register

BLOCK_J = 64  # channels of a head per program
BLOCK_K = 32  # rows of the gate weights per step of the product


@triton.jit
def _rglru_decode_kernel(x_ptr, y_ptr, wi_ptr, bi_ptr, wa_ptr, ba_ptr, rate_ptr, state_ptr, slots_ptr, pos_ptr,
                         out_ptr, stride_x, stride_y, stride_slot, stride_out,
                         B: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr):
    """Row i, head h, its channels j0 .. j0 + BJ - 1."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    js = tl.program_id(2) * BJ + tl.arange(0, BJ)
    j_ok = js < B
    dt = x_ptr.dtype.element_ty
    head_x = x_ptr + i * stride_x + h * B
    acc_i = tl.zeros([BJ], dtype=tl.float32)
    acc_a = tl.zeros([BJ], dtype=tl.float32)
    w_head = h.to(tl.int64) * B * B
    for k0 in range(0, B, BK):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < B
        xk = tl.load(head_x + ks, mask=k_ok, other=0.0).to(tl.float32)
        tile = w_head + ks[:, None] * B + js[None, :]
        ok = k_ok[:, None] & j_ok[None, :]
        acc_i += tl.sum(xk[:, None] * tl.load(wi_ptr + tile, mask=ok, other=0.0).to(tl.float32), axis=0)
        acc_a += tl.sum(xk[:, None] * tl.load(wa_ptr + tile, mask=ok, other=0.0).to(tl.float32), axis=0)
    gi = (acc_i + tl.load(bi_ptr + h * B + js, mask=j_ok, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
    gi = (1.0 / (1.0 + tl.exp(-gi))).to(dt).to(tl.float32)
    ga = (acc_a + tl.load(ba_ptr + h * B + js, mask=j_ok, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
    ga = (1.0 / (1.0 + tl.exp(-ga))).to(dt).to(tl.float32)
    cols = h * B + js
    rate = tl.load(rate_ptr + cols, mask=j_ok, other=0.0).to(tl.float32)
    log_a = (-8.0 * ga * rate).to(dt).to(tl.float32)
    a = tl.exp(log_a).to(dt).to(tl.float32)
    a2 = tl.exp(2.0 * log_a).to(dt).to(tl.float32)
    multiplier = tl.sqrt((1.0 - a2).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    reset = tl.load(pos_ptr + i) == 0  # a sequence's first token: no decay, no normalisation
    multiplier = tl.where(reset, 1.0, multiplier)
    a = tl.where(reset, 0.0, a)
    x = tl.load(x_ptr + i * stride_x + cols, mask=j_ok, other=0.0).to(tl.float32)
    normed = ((x * gi).to(dt).to(tl.float32) * multiplier).to(dt).to(tl.float32)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    cell = state_ptr + slot * stride_slot + cols
    new = a * tl.load(cell, mask=j_ok, other=0.0) + normed
    tl.store(cell, new, mask=j_ok)
    y = tl.load(y_ptr + i * stride_y + cols, mask=j_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + i * stride_out + cols, (new.to(dt).to(tl.float32) * y).to(out_ptr.dtype.element_ty), mask=j_ok)


@register("rglru_decode")
def rglru_decode(x: torch.Tensor, y: torch.Tensor, input_gate_w: torch.Tensor, input_gate_b: torch.Tensor,
                 a_gate_w: torch.Tensor, a_gate_b: torch.Tensor, a_rate: torch.Tensor, state: torch.Tensor,
                 slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """See reference.rglru_decode. x and y may be strided over rows; the state's slots at any stride, each
    slot's `[W]` contiguous."""
    rows, width = x.shape
    heads, block = input_gate_w.shape[:2]
    assert x.stride(1) == 1 and y.stride(1) == 1 and y.shape == (rows, width) and heads * block == width
    assert input_gate_w.is_contiguous() and a_gate_w.is_contiguous() and input_gate_b.is_contiguous()
    assert a_gate_b.is_contiguous() and a_rate.is_contiguous() and a_rate.shape == (width,)
    assert state.dtype == torch.float32 and state.stride(1) == 1 and state.shape[1] == width
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    bj = min(BLOCK_J, triton.next_power_of_2(block))
    bk = min(BLOCK_K, triton.next_power_of_2(block))
    _rglru_decode_kernel[(rows, heads, triton.cdiv(block, bj))](
        x, y, input_gate_w, input_gate_b, a_gate_w, a_gate_b, a_rate, state, slots, positions, out,
        x.stride(0), y.stride(0), state.stride(0), out.stride(0), B=block, BJ=bj, BK=bk, num_warps=4,
    )
    return out
