"""Lightning attention at decode (MiniMax's linear-attention layers, models/lightning.py), one launch per op.

- `lightning_decode`: one step S = e^-lambda S + k^T v, o = q S for every decoding row and head: the row's state at
  its slot read, decayed by the head's fixed factor, added the outer product of k and v, read by q and written back
  in place. q, k and v are the SiLU of the row's projection, computed here (rounded to its dtype, as Hugging Face
  applies the activation). One program per (row, head, block of value columns): it loads q and k whole (the key
  dim) and its columns of v, so nothing but the state and the output leave the program.

Same semantics and signature as the reference in kernels/reference.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register


@triton.jit
def _silu_rounded(x):
    """SiLU in fp32, rounded to x's dtype and back (the model's dtype, as the reference rounds it)."""
    xf = x.to(tl.float32)
    return (xf / (1.0 + tl.exp(-xf))).to(x.dtype).to(tl.float32)


@triton.jit
def _lightning_decode_kernel(qkv_ptr, decay_ptr, state_ptr, slots_ptr, out_ptr, stride_m, stride_slot, stride_out,
                             D: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr):
    """Row i, head h, value columns v0 .. v0 + BV - 1: its share `[D, BV]` of the head's state."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kc = tl.arange(0, BD)
    k_ok = kc < D
    head = qkv_ptr + i * stride_m + h * (3 * D)  # the head's [q | k | v]
    q = _silu_rounded(tl.load(head + kc, mask=k_ok, other=0.0))
    k = _silu_rounded(tl.load(head + D + kc, mask=k_ok, other=0.0))
    vc = tl.program_id(2) * BV + tl.arange(0, BV)
    v_ok = vc < D
    v = _silu_rounded(tl.load(head + 2 * D + vc, mask=v_ok, other=0.0))
    decay = tl.load(decay_ptr + h)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    cell = state_ptr + slot * stride_slot + h * (D * D) + kc[:, None] * D + vc[None, :]
    mask = k_ok[:, None] & v_ok[None, :]
    s = tl.load(cell, mask=mask, other=0.0) * decay + k[:, None] * v[None, :]
    tl.store(cell, s, mask=mask)
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(out_ptr + i * stride_out + h * D + vc, o.to(out_ptr.dtype.element_ty), mask=v_ok)


@register("lightning_decode")
def lightning_decode(qkv: torch.Tensor, decay: torch.Tensor, state: torch.Tensor,
                     slots: torch.Tensor) -> torch.Tensor:
    """See reference.lightning_decode. qkv may be strided over rows; the state's slots at any stride, each slot's
    `[H, D, D]` contiguous."""
    rows = qkv.shape[0]
    _, heads, d, d2 = state.shape
    assert d == d2 and qkv.shape[1] == 3 * heads * d and qkv.stride(1) == 1
    assert state.dtype == torch.float32 and state.stride(3) == 1 and state.stride(2) == d and state.stride(1) == d * d
    assert decay.dtype == torch.float32 and decay.is_contiguous() and decay.numel() == heads
    out = torch.empty((rows, heads, d), dtype=qkv.dtype, device=qkv.device)
    if rows == 0:
        return out
    bd = triton.next_power_of_2(d)
    bv = max(1, min(bd, 4096 // bd))  # 4,096 fp32 values of state a program
    _lightning_decode_kernel[(rows, heads, triton.cdiv(d, bv))](
        qkv, decay, state, slots, out, qkv.stride(0), state.stride(0), out.stride(0), D=d, BD=bd, BV=bv,
        num_warps=4,
    )
    return out
