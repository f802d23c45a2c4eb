"""Hybrid models' recurrent layers at decode (models/mixers.py), one launch each.

A decode step of a recurrent layer touches a few kilobytes of state per sequence and channel
block; written with general ops it is a gather, a concatenation, a product, a sum, an activation
and a scatter, each a launch of its own. Here each is one program per (row, block of channels)
that reads the row's state at its slot, computes, and writes the state back in place.

- `conv1d_decode`: a depthwise causal convolution's step (LFM2's short convolutions, the
  convolutions before Mamba-2's and gated DeltaNet's recurrences).
- `selective_scan_decode`: Mamba-1's selective scan step (per-channel decay of an `[I, N]` state), its
  D skip and silu(z) gate.

Same semantics and signatures as the references in kernels/reference.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register


@triton.jit(do_not_specialize=["n_channels"])
def _conv1d_decode_kernel(x_ptr, w_ptr, b_ptr, state_ptr, slots_ptr, out_ptr, n_channels,
                          stride_x, stride_slot, stride_c, stride_out,
                          K: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_C: tl.constexpr):
    """Row i, channels c0 .. c0 + BLOCK_C - 1: y = sum_k window[k] w[k] (+ b), window = [state; x]."""
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = cols < n_channels
    slot = tl.load(slots_ptr + i).to(tl.int64)
    state = state_ptr + slot * stride_slot + cols.to(tl.int64) * stride_c
    x = tl.load(x_ptr + i * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    y = x * tl.load(w_ptr + cols * K + (K - 1), mask=ok, other=0.0).to(tl.float32)
    prev = tl.load(state, mask=ok, other=0.0)  # the oldest input, tap 0
    for k in tl.static_range(K - 1):
        y += prev * tl.load(w_ptr + cols * K + k, mask=ok, other=0.0).to(tl.float32)
        if k + 1 < K - 1:
            nxt = tl.load(state + k + 1, mask=ok, other=0.0)
            tl.store(state + k, nxt, mask=ok)  # shift: input k + 1 becomes input k
            prev = nxt
    tl.store(state + (K - 2), x, mask=ok)
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if SILU:
        y = y / (1.0 + tl.exp(-y))
    tl.store(out_ptr + i * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


@register("conv1d_decode")
def conv1d_decode(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_state: torch.Tensor,
                  slots: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """See reference.conv1d_decode. conv_state may be a strided view (the state cache's): slots
    and channels at any stride, each channel's K - 1 inputs contiguous."""
    if activation not in (None, "silu"):
        raise ValueError(f"unsupported convolution activation {activation!r} (supported: silu)")
    rows, channels = x.shape
    k = weight.shape[1]
    assert k >= 2 and conv_state.shape[1:] == (channels, k - 1) and conv_state.stride(2) == 1
    assert x.stride(1) == 1 and weight.is_contiguous() and conv_state.dtype == torch.float32
    out = torch.empty_like(x)
    if rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(channels))
    _conv1d_decode_kernel[(rows, triton.cdiv(channels, block))](
        x, weight, bias if bias is not None else weight, conv_state, slots, out, channels,
        x.stride(0), conv_state.stride(0), conv_state.stride(1), out.stride(0),
        K=k, HAS_BIAS=bias is not None, SILU=activation == "silu", BLOCK_C=block, num_warps=4,
    )
    return out


def _check_slot_state(state: torch.Tensor) -> None:
    """A recurrent state `[slots, H, A, B]` as the state cache holds it: fp32, slots at any stride, each
    slot's `[H, A, B]` contiguous."""
    _, _, rows, cols = state.shape
    assert state.dtype == torch.float32 and state.stride(3) == 1 and state.stride(2) == cols
    assert state.stride(1) == rows * cols


def _block(split: int, whole_block: int) -> int:
    """The tile's block over a dim of `split` elements beside a dim taken whole in `whole_block`: 4,096
    fp32 values a program (32 a thread at 4 warps)."""
    return max(1, min(triton.next_power_of_2(split), 4096 // whole_block))


@triton.jit
def _l2_normalised(x, eps):
    return x / tl.sqrt(tl.sum(x * x, axis=0) + eps)


@triton.jit(do_not_specialize=["group"])
def _gated_delta_decode_kernel(mixed_ptr, b_ptr, a_ptr, neg_a_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
                               group, beta_scale, stride_m, stride_b, stride_a, stride_slot, stride_out,
                               KEY_DIM: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                               BV: tl.constexpr):
    """Row i, value head h, value columns v0 .. v0 + BV - 1: its share of the state S `[K, BV]`
    decayed, corrected toward v by the delta rule, read by q."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kh = h // group  # the key head serving value head h
    kc = tl.arange(0, BK)
    k_ok = kc < K
    row = mixed_ptr + i * stride_m
    q = _l2_normalised(tl.load(row + kh * K + kc, mask=k_ok, other=0.0).to(tl.float32), 1e-6) * (K ** -0.5)
    k = _l2_normalised(tl.load(row + KEY_DIM + kh * K + kc, mask=k_ok, other=0.0).to(tl.float32), 1e-6)
    vc = tl.program_id(2) * BV + tl.arange(0, BV)
    v_ok = vc < V
    v = tl.load(row + 2 * KEY_DIM + h * V + vc, mask=v_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + i * stride_b + h).to(tl.float32)
    beta = (1.0 / (1.0 + tl.exp(-b))).to(b_ptr.dtype.element_ty).to(tl.float32) * beta_scale  # (rounded as HF)
    x = tl.load(a_ptr + i * stride_a + h).to(tl.float32) + tl.load(dt_bias_ptr + h)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))  # (torch's threshold)
    decay = tl.exp(tl.load(neg_a_ptr + h) * softplus)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    cell = state_ptr + slot * stride_slot + h * (K * V) + kc[:, None] * V + vc[None, :]
    mask = k_ok[:, None] & v_ok[None, :]
    s = tl.load(cell, mask=mask, other=0.0) * decay
    u = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s += k[:, None] * u[None, :]
    tl.store(cell, s, mask=mask)
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(out_ptr + i * stride_out + h * V + vc, o.to(out_ptr.dtype.element_ty), mask=v_ok)


@register("gated_delta_decode")
def gated_delta_decode(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, neg_a: torch.Tensor,
                       dt_bias: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                       num_k_heads: int, beta_scale: float = 1.0) -> torch.Tensor:
    """See reference.gated_delta_decode. b and a may be strided over rows (slices of a projection's
    output); the state's slots at any stride, each slot's `[Hv, K, V]` contiguous."""
    rows, nv = b.shape
    _, _, k, v = state.shape
    key_dim = num_k_heads * k
    assert mixed.stride(1) == 1 and b.stride(1) == 1 and a.stride(1) == 1 and mixed.shape[1] == 2 * key_dim + nv * v
    _check_slot_state(state)
    assert neg_a.dtype == torch.float32 and dt_bias.dtype == torch.float32 and nv % num_k_heads == 0
    out = torch.empty((rows, nv, v), dtype=mixed.dtype, device=mixed.device)
    if rows == 0:
        return out
    bk = triton.next_power_of_2(k)
    bv = _block(v, bk)
    _gated_delta_decode_kernel[(rows, nv, triton.cdiv(v, bv))](
        mixed, b, a, neg_a, dt_bias, state, slots, out, nv // num_k_heads, float(beta_scale),
        mixed.stride(0), b.stride(0), a.stride(0), state.stride(0), out.stride(0),
        KEY_DIM=key_dim, K=k, V=v, BK=bk, BV=bv, num_warps=4,
    )
    return out


@triton.jit(do_not_specialize=["n_heads"])
def _gated_rms_norm_kernel(o_ptr, z_ptr, w_ptr, out_ptr, n_heads, stride_z, eps, V: tl.constexpr,
                           BV: tl.constexpr, SIGMOID: tl.constexpr = False):
    """Row t, head h: RMSNorm(o) times w times the gate, rounded once to the output's dtype: silu(z), the norm
    and the weighted norm rounded first (gated DeltaNet's, Hugging Face's order); or, SIGMOID, sigmoid(z) with
    nothing rounded in between (KDA's)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    c = tl.arange(0, BV)
    ok = c < V
    base = (t * n_heads + h) * V
    o = tl.load(o_ptr + base + c, mask=ok, other=0.0).to(tl.float32)
    normed = o / tl.sqrt(tl.sum(o * o, axis=0) / V + eps)
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + t * stride_z + h * V + c, mask=ok, other=0.0).to(tl.float32)
    if SIGMOID:
        gated = normed * w / (1.0 + tl.exp(-z))
    else:
        normed = normed.to(out_ptr.dtype.element_ty).to(tl.float32)
        gated = (normed * w).to(out_ptr.dtype.element_ty).to(tl.float32) * (z / (1.0 + tl.exp(-z)))
    tl.store(out_ptr + base + c, gated.to(out_ptr.dtype.element_ty), mask=ok)


@register("gated_rms_norm")
def gated_rms_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """See reference.gated_rms_norm. z may be strided over rows."""
    rows, heads, v = o.shape
    assert o.is_contiguous() and z.stride(1) == 1 and z.shape == (rows, heads * v) and weight.dtype == o.dtype
    out = torch.empty_like(o)
    if rows:
        _gated_rms_norm_kernel[(rows, heads)](o, z, weight, out, heads, z.stride(0), float(eps), V=v,
                                             BV=triton.next_power_of_2(v), num_warps=4)
    return out


@triton.jit(do_not_specialize=["group"])
def _ssd_decode_kernel(xbc_ptr, dt_ptr, dt_bias_ptr, a_ptr, d_ptr, state_ptr, slots_ptr, y_ptr, group,
                       stride_x, stride_dt, stride_slot, dt_min, dt_max,
                       HEADS: tl.constexpr, P: tl.constexpr, N: tl.constexpr, GROUPS: tl.constexpr,
                       BP: tl.constexpr, BN: tl.constexpr):
    """Row i, head h, head dims p0 .. p0 + BP - 1: S `[BP, N]` decayed by exp(dt A) plus dt x B^T,
    read by C, plus D x."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pc = tl.program_id(2) * BP + tl.arange(0, BP)
    nc = tl.arange(0, BN)
    p_ok, n_ok = pc < P, nc < N
    row = xbc_ptr + i * stride_x
    # dt + dt_bias and its softplus each rounded to the model's dtype, as Hugging Face's ops in that dtype are
    raw = (tl.load(dt_ptr + i * stride_dt + h).to(tl.float32)
           + tl.load(dt_bias_ptr + h).to(tl.float32)).to(dt_ptr.dtype.element_ty).to(tl.float32)
    soft = tl.where(raw > 20.0, raw, tl.log(1.0 + tl.exp(tl.minimum(raw, 20.0))))
    dt = tl.minimum(tl.maximum(soft.to(dt_ptr.dtype.element_ty).to(tl.float32), dt_min), dt_max)
    x = tl.load(row + h * P + pc, mask=p_ok, other=0.0).to(tl.float32)
    g = h // group  # the heads' shared B and C
    b = tl.load(row + HEADS * P + g * N + nc, mask=n_ok, other=0.0).to(tl.float32)
    c = tl.load(row + HEADS * P + GROUPS * N + g * N + nc, mask=n_ok, other=0.0).to(tl.float32)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    cell = state_ptr + slot * stride_slot + h * (P * N) + pc[:, None] * N + nc[None, :]
    mask = p_ok[:, None] & n_ok[None, :]
    s = tl.load(cell, mask=mask, other=0.0) * tl.exp(dt * tl.load(a_ptr + h)) + (dt * x)[:, None] * b[None, :]
    tl.store(cell, s, mask=mask)
    y = tl.sum(s * c[None, :], axis=1) + tl.load(d_ptr + h) * x
    tl.store(y_ptr + (i * HEADS + h) * P + pc, y, mask=p_ok)


@register("ssd_decode")
def ssd_decode(xbc: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor,
               state: torch.Tensor, slots: torch.Tensor, num_groups: int,
               dt_limit: tuple[float, float] = (0.0, float("inf"))) -> torch.Tensor:
    """See reference.ssd_decode. xbc and dt may be strided over rows; the state's slots at any
    stride, each slot's `[H, P, N]` contiguous."""
    rows, heads = dt.shape
    _, _, p, n = state.shape
    assert xbc.stride(1) == 1 and dt.stride(1) == 1 and xbc.shape[1] == heads * p + 2 * num_groups * n
    _check_slot_state(state)
    assert A.dtype == torch.float32 and D.dtype == torch.float32 and heads % num_groups == 0
    y = torch.empty((rows, heads, p), dtype=torch.float32, device=xbc.device)
    if rows == 0:
        return y
    bn = triton.next_power_of_2(n)
    bp = _block(p, bn)
    _ssd_decode_kernel[(rows, heads, triton.cdiv(p, bp))](
        xbc, dt, dt_bias, A, D, state, slots, y, heads // num_groups,
        xbc.stride(0), dt.stride(0), state.stride(0), float(dt_limit[0]), float(dt_limit[1]),
        HEADS=heads, P=p, N=n, GROUPS=num_groups, BP=bp, BN=bn, num_warps=4,
    )
    return y


@triton.jit
def _mamba_gated_norm_kernel(y_ptr, z_ptr, w_ptr, out_ptr, sq_ptr, stride_z, eps, group_size, WIDTH: tl.constexpr,
                             GROUP: tl.constexpr, GROUPS: tl.constexpr, ORDER: tl.constexpr, SQUARES: tl.constexpr,
                             BLOCK: tl.constexpr):
    """Row t, group g: ORDER 0 ("gated") RMSNorm(y silu(z)) w, 1 ("before_gate") RMSNorm(y) w silu(z),
    2 ("none") y silu(z); fp32, rounded once. SQUARES 0: the group's mean square from its values; 1: only its
    sum of squares, written to sq_ptr `[T, GROUPS]`; 2: the mean square sq_ptr's sum / group_size."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * GROUP + tl.arange(0, BLOCK)
    ok = tl.arange(0, BLOCK) < GROUP
    y = tl.load(y_ptr + t * WIDTH + cols, mask=ok, other=0.0)
    z = tl.load(z_ptr + t * stride_z + cols, mask=ok, other=0.0).to(tl.float32)
    gate = z / (1.0 + tl.exp(-z))
    if ORDER == 2:
        tl.store(out_ptr + t * WIDTH + cols, (y * gate).to(out_ptr.dtype.element_ty), mask=ok)
    else:
        v = y * gate if ORDER == 0 else y
        sq_at = sq_ptr + t * GROUPS + tl.program_id(1)
        if SQUARES == 1:
            tl.store(sq_at, tl.sum(v * v, axis=0))
        else:
            if SQUARES == 2:
                mean_square = tl.load(sq_at) / group_size
            else:
                mean_square = tl.sum(v * v, axis=0) / GROUP
            v = v / tl.sqrt(mean_square + eps) * tl.load(w_ptr + cols, mask=ok, other=0.0)
            out = v if ORDER == 0 else v * gate
            tl.store(out_ptr + t * WIDTH + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


_ORDERS = {"gated": 0, "before_gate": 1, "none": 2}


def _gated_norm_launch(y: torch.Tensor, z: torch.Tensor, weight, out: torch.Tensor, squares, num_groups: int,
                       eps: float, order: str, mode: int, group_size: int) -> None:
    if order not in _ORDERS:
        raise ValueError(f"unsupported gated norm order {order!r} (supported: {', '.join(_ORDERS)})")
    rows, width = y.shape
    assert y.is_contiguous() and y.dtype == torch.float32 and z.stride(1) == 1 and width % num_groups == 0
    assert weight is not None or order == "none" or mode == 1
    assert squares is None or (squares.is_contiguous() and squares.shape == (rows, num_groups)
                               and squares.dtype == torch.float32)
    if rows:
        group = width // num_groups
        block = triton.next_power_of_2(group)
        _mamba_gated_norm_kernel[(rows, num_groups)](
            y, z, weight if weight is not None else y, out, squares if squares is not None else y, z.stride(0),
            float(eps), float(group_size), WIDTH=width, GROUP=group, GROUPS=num_groups, ORDER=_ORDERS[order],
            SQUARES=mode, BLOCK=block, num_warps=max(1, min(8, block // 512)),
        )


@register("mamba_gated_norm")
def mamba_gated_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor | None, num_groups: int, eps: float,
                     order: str = "gated", squares: torch.Tensor | None = None,
                     group_size: int | None = None) -> torch.Tensor:
    """See reference.mamba_gated_norm. z may be strided over rows."""
    out = torch.empty(y.shape, dtype=z.dtype, device=z.device)
    given = squares is not None and order != "none"
    _gated_norm_launch(y, z, weight, out, squares if given else None, num_groups, eps, order, 2 if given else 0,
                       group_size or 1)
    return out


@register("mamba_gated_squares")
def mamba_gated_squares(y: torch.Tensor, z: torch.Tensor, num_groups: int, order: str = "gated") -> torch.Tensor:
    """See reference.mamba_gated_squares. z may be strided over rows."""
    if order == "none":
        raise ValueError("the gated norm of order 'none' takes no squares")
    squares = torch.empty(y.shape[0], num_groups, dtype=torch.float32, device=y.device)
    _gated_norm_launch(y, z, None, y, squares, num_groups, 0.0, order, 1, 1)
    return squares


@triton.jit(do_not_specialize=["n_channels"])
def _selective_scan_decode_kernel(x_ptr, dt_ptr, b_ptr, c_ptr, z_ptr, dt_bias_ptr, a_ptr, d_ptr, state_ptr, slots_ptr,
                                  out_ptr, n_channels, stride_x, stride_dt, stride_b, stride_c, stride_z, stride_slot,
                                  stride_out, N: tl.constexpr, BC: tl.constexpr, BN: tl.constexpr):
    """Row i, channels c0 .. c0 + BC - 1: h `[BC, N]` decayed by exp(dt A) plus dt x B, read by C, plus D x,
    gated by silu(z)."""
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    nc = tl.arange(0, BN)
    c_ok, n_ok = cols < n_channels, nc < N
    mask = c_ok[:, None] & n_ok[None, :]
    x = tl.load(x_ptr + i * stride_x + cols, mask=c_ok, other=0.0).to(tl.float32)
    raw = (tl.load(dt_ptr + i * stride_dt + cols, mask=c_ok, other=0.0).to(tl.float32)
           + tl.load(dt_bias_ptr + cols, mask=c_ok, other=0.0).to(tl.float32))
    dt = tl.where(raw > 20.0, raw, tl.log(1.0 + tl.exp(tl.minimum(raw, 20.0))))  # softplus (torch's threshold)
    b = tl.load(b_ptr + i * stride_b + nc, mask=n_ok, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + i * stride_c + nc, mask=n_ok, other=0.0).to(tl.float32)
    c = c.to(out_ptr.dtype.element_ty).to(tl.float32)
    a = tl.load(a_ptr + cols[:, None] * N + nc[None, :], mask=mask, other=0.0)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    cell = state_ptr + slot * stride_slot + cols[:, None].to(tl.int64) * N + nc[None, :]
    h = tl.load(cell, mask=mask, other=0.0) * tl.exp(dt[:, None] * a) + (dt * x)[:, None] * b[None, :]
    tl.store(cell, h, mask=mask)
    # h C in the model's dtype (h rounded, the sum rounded), as Hugging Face's scan computes it
    y = tl.sum(h.to(out_ptr.dtype.element_ty).to(tl.float32) * c[None, :], axis=1)
    y = y.to(out_ptr.dtype.element_ty).to(tl.float32) + tl.load(d_ptr + cols, mask=c_ok, other=0.0) * x
    z = tl.load(z_ptr + i * stride_z + cols, mask=c_ok, other=0.0).to(tl.float32)
    gate = (z / (1.0 + tl.exp(-z))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + i * stride_out + cols, (y * gate).to(out_ptr.dtype.element_ty), mask=c_ok)


@register("selective_scan_decode")
def selective_scan_decode(x: torch.Tensor, dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor, z: torch.Tensor,
                          dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
                          slots: torch.Tensor) -> torch.Tensor:
    """See reference.selective_scan_decode. x, dt, B, C and z may be strided over rows (slices of the
    projections' outputs); the state's slots at any stride, each slot's `[I, N]` contiguous."""
    rows, channels = x.shape
    _, _, n = state.shape
    assert x.stride(1) == 1 and dt.stride(1) == 1 and b.stride(1) == 1 and c.stride(1) == 1 and z.stride(1) == 1
    assert dt.shape == z.shape == (rows, channels) and b.shape == c.shape == (rows, n)
    assert state.dtype == torch.float32 and state.stride(2) == 1 and state.stride(1) == n
    assert A.dtype == torch.float32 and A.is_contiguous() and A.shape == (channels, n) and D.dtype == torch.float32
    out = torch.empty((rows, channels), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    bn = triton.next_power_of_2(n)
    bc = _block(channels, bn)
    _selective_scan_decode_kernel[(rows, triton.cdiv(channels, bc))](
        x, dt, b, c, z, dt_bias, A, D, state, slots, out, channels,
        x.stride(0), dt.stride(0), b.stride(0), c.stride(0), z.stride(0), state.stride(0), out.stride(0),
        N=n, BC=bc, BN=bn, num_warps=4,
    )
    return out
