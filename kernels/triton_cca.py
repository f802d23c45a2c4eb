"""ZAYA's CCA convolutions at decode (models/zaya.py), one launch a layer.

A decode step of the two causal convolutions that mix each token's q and k rows: a depthwise one of T0 taps, then
one of T1 taps grouped by head (each output channel reads its head's D channels at each tap: a `[D, D]` block per
tap). Written with general ops that is a gather, a concatenation, two convolutions, two roundings and a scatter,
each a launch of its own. Here one program per (row, head) reads the row's K = (T0 - 1) + (T1 - 1) saved inputs
of the head's channels at its slot and the row's own, computes the depthwise outputs (rounded to the activation
dtype, as transformers' first Conv1d in the model's dtype) and, a block of output channels at a time, the grouped
convolution's sums, then shifts the row's input into the state in place. The program owns its head's state: no
other program reads or writes it.

Same semantics and signature as reference.cca_conv_decode.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register


@triton.jit
def _depthwise(x_ptr, state, w1_ptr, b1, cols, ok, stride_c, J: tl.constexpr, T0: tl.constexpr, K: tl.constexpr):
    """The depthwise convolution's output j (window rows j .. j + T0 - 1; row K the current input) on `cols`."""
    y = b1
    for i in tl.static_range(T0):
        if J + i < K:
            v = tl.load(state + cols.to(tl.int64) * stride_c + (J + i), mask=ok, other=0.0)
        else:
            v = tl.load(x_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        y += v * tl.load(w1_ptr + cols * T0 + i, mask=ok, other=0.0)
    return y


@triton.jit
def _cca_conv_decode_kernel(x_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, state_ptr, slots_ptr, out_ptr,
                            stride_x, stride_slot, stride_c, stride_out,
                            D: tl.constexpr, T0: tl.constexpr, T1: tl.constexpr, K: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_O: tl.constexpr):
    """Row i, head g: out[o] = b2[o] + sum_j sum_c w2[o, c, j] dw_j[c] over the head's D channels."""
    i = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    c_local = tl.arange(0, BLOCK_D)
    c_ok = c_local < D
    cols = g * D + c_local
    state = state_ptr + slot * stride_slot
    x_row = x_ptr + i * stride_x
    b1 = tl.load(b1_ptr + cols, mask=c_ok, other=0.0)
    o_local = tl.arange(0, BLOCK_O)
    for o0 in range(0, D, BLOCK_O):
        o = o0 + o_local
        o_ok = o < D
        outs = g * D + o
        acc = tl.load(b2_ptr + outs, mask=o_ok, other=0.0)
        for j in tl.static_range(T1):
            dw = _depthwise(x_row, state, w1_ptr, b1, cols, c_ok, stride_c, j, T0, K)
            dw = dw.to(out_ptr.dtype.element_ty).to(tl.float32)
            w = tl.load(w2_ptr + (outs[:, None] * D + c_local[None, :]) * T1 + j,
                        mask=o_ok[:, None] & c_ok[None, :], other=0.0)
            acc += tl.sum(w * dw[None, :], axis=1)
        tl.store(out_ptr + i * stride_out + outs, acc.to(out_ptr.dtype.element_ty), mask=o_ok)
    # shift: saved input m + 1 becomes input m, the row's input the last (this program's channels only)
    held = state + cols.to(tl.int64) * stride_c
    for m in tl.static_range(K - 1):
        tl.store(held + m, tl.load(held + m + 1, mask=c_ok, other=0.0), mask=c_ok)
    tl.store(held + (K - 1), tl.load(x_row + cols, mask=c_ok, other=0.0).to(tl.float32), mask=c_ok)


@register("cca_conv_decode")
def cca_conv_decode(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                    conv_state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """See reference.cca_conv_decode. conv_state may be a strided view (the state cache's): slots and channels
    at any stride, each channel's K inputs contiguous."""
    rows, channels = x.shape
    d, t1 = w2.shape[1], w2.shape[2]
    t0, k = w1.shape[1], conv_state.shape[2]
    assert k == t0 + t1 - 2 >= 1 and channels % d == 0 and conv_state.shape[1] == channels
    assert conv_state.stride(2) == 1 and conv_state.dtype == torch.float32 and x.stride(1) == 1
    assert all(t.is_contiguous() and t.dtype == torch.float32 for t in (w1, b1, w2, b2))
    out = torch.empty_like(x)
    if rows == 0:
        return out
    block_d = triton.next_power_of_2(d)
    block_o = max(1, min(block_d, 4096 // block_d))
    _cca_conv_decode_kernel[(rows, channels // d)](
        x, w1, b1, w2, b2, conv_state, slots, out, x.stride(0), conv_state.stride(0), conv_state.stride(1),
        out.stride(0), D=d, T0=t0, T1=t1, K=k, BLOCK_D=block_d, BLOCK_O=block_o, num_warps=4,
    )
    return out
