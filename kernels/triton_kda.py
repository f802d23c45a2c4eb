"""Kimi Delta Attention at decode (models/kda.py), one launch per op.

- `kda_decode`: one step of the gated delta rule with a decay per key channel for every decoding row: the
  row's state at its slot read, decayed channel by channel, corrected toward v, read by q and written back
  in place. One program per (row, head, block of value columns): it computes the head's q, k and decay (the
  key dim whole) itself, so nothing but the state and the output leave the program.
- `kda_gated_norm`: the output's per-head RMSNorm times its weight times sigmoid(gate), in fp32, rounded once
  (gated DeltaNet's norm kernel with a sigmoid gate, kernels/triton_recurrent.py).

Same semantics and signatures as the references in kernels/reference.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register
from tritonformer.kernels.triton_recurrent import _gated_rms_norm_kernel


@triton.jit
def _l2_normalised(x, eps):
    return x / tl.sqrt(tl.sum(x * x, axis=0) + eps)


@triton.jit
def _kda_decode_kernel(mixed_ptr, f_ptr, b_ptr, neg_a_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
                       stride_m, stride_f, stride_b, stride_slot, stride_out, lower_bound,
                       HEADS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       BOUNDED: tl.constexpr, ROUND_DECAY: tl.constexpr):
    """Row i, head h, value columns v0 .. v0 + BV - 1: its share of the state S `[K, BV]` decayed per key
    channel, corrected toward v by the delta rule, read by q. BOUNDED: the log decay lower_bound *
    sigmoid(-neg_a (f + dt_bias)) (Ling 3.0's); ROUND_DECAY: it rounded to f's dtype first."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kc = tl.arange(0, BK)
    k_ok = kc < K
    row = mixed_ptr + i * stride_m
    q = _l2_normalised(tl.load(row + h * K + kc, mask=k_ok, other=0.0).to(tl.float32), 1e-6) * (K ** -0.5)
    k = _l2_normalised(tl.load(row + HEADS * K + h * K + kc, mask=k_ok, other=0.0).to(tl.float32), 1e-6)
    vc = tl.program_id(2) * BV + tl.arange(0, BV)
    v_ok = vc < V
    v = tl.load(row + 2 * HEADS * K + h * V + vc, mask=v_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + i * stride_b + h).to(tl.float32)
    beta = (1.0 / (1.0 + tl.exp(-b))).to(b_ptr.dtype.element_ty).to(tl.float32)  # (rounded as HF takes it)
    x = (tl.load(f_ptr + i * stride_f + h * K + kc, mask=k_ok, other=0.0).to(tl.float32)
         + tl.load(dt_bias_ptr + h * K + kc, mask=k_ok, other=0.0))
    if BOUNDED:
        g = lower_bound / (1.0 + tl.exp(tl.load(neg_a_ptr + h) * x))  # lower_bound * sigmoid(-neg_a x)
    else:
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))  # (HF's log(1 + exp(x)))
        g = tl.load(neg_a_ptr + h) * softplus
    if ROUND_DECAY:
        g = g.to(f_ptr.dtype.element_ty).to(tl.float32)
    decay = tl.exp(g)  # [BK]: one per key channel
    slot = tl.load(slots_ptr + i).to(tl.int64)
    cell = state_ptr + slot * stride_slot + h * (K * V) + kc[:, None] * V + vc[None, :]
    mask = k_ok[:, None] & v_ok[None, :]
    s = tl.load(cell, mask=mask, other=0.0) * decay[:, None]
    u = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s += k[:, None] * u[None, :]
    tl.store(cell, s, mask=mask)
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(out_ptr + i * stride_out + h * V + vc, o.to(out_ptr.dtype.element_ty), mask=v_ok)


def _check_slot_state(state: torch.Tensor) -> None:
    """A recurrent state `[slots, H, K, V]` as the state cache holds it: fp32, slots at any stride, each
    slot's `[H, K, V]` contiguous."""
    _, _, rows, cols = state.shape
    assert state.dtype == torch.float32 and state.stride(3) == 1 and state.stride(2) == cols
    assert state.stride(1) == rows * cols


@register("kda_decode")
def kda_decode(mixed: torch.Tensor, f: torch.Tensor, b: torch.Tensor, neg_a: torch.Tensor, dt_bias: torch.Tensor,
               state: torch.Tensor, slots: torch.Tensor, lower_bound: float | None = None,
               round_decay: bool = False) -> torch.Tensor:
    """See reference.kda_decode. mixed, f and b may be strided over rows; the state's slots at any stride,
    each slot's `[H, K, V]` contiguous."""
    rows, heads = b.shape
    _, _, k, v = state.shape
    assert state.shape[1] == heads and f.shape[1] == heads * k and mixed.shape[1] == heads * (2 * k + v)
    assert mixed.stride(1) == 1 and f.stride(1) == 1 and b.stride(1) == 1
    _check_slot_state(state)
    assert neg_a.dtype == torch.float32 and dt_bias.dtype == torch.float32 and dt_bias.is_contiguous()
    out = torch.empty((rows, heads, v), dtype=mixed.dtype, device=mixed.device)
    if rows == 0:
        return out
    bk = triton.next_power_of_2(k)
    bv = max(1, min(triton.next_power_of_2(v), 4096 // bk))  # 4,096 fp32 values of state a program
    _kda_decode_kernel[(rows, heads, triton.cdiv(v, bv))](
        mixed, f, b, neg_a, dt_bias, state, slots, out,
        mixed.stride(0), f.stride(0), b.stride(0), state.stride(0), out.stride(0),
        float(lower_bound or 0.0), HEADS=heads, K=k, V=v, BK=bk, BV=bv, BOUNDED=lower_bound is not None,
        ROUND_DECAY=bool(round_decay), num_warps=4,
    )
    return out


@register("kda_gated_norm")
def kda_gated_norm(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """See reference.kda_gated_norm. gate may be strided over rows."""
    rows, heads, v = o.shape
    assert o.is_contiguous() and gate.stride(1) == 1 and gate.shape == (rows, heads * v) and weight.is_contiguous()
    out = torch.empty_like(o)
    if rows:
        _gated_rms_norm_kernel[(rows, heads)](o, gate, weight, out, heads, gate.stride(0), float(eps), V=v,
                                              BV=triton.next_power_of_2(v), SIGMOID=True, num_warps=4)
    return out
