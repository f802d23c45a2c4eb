"""Hybrid models' recurrent decode steps (kernels/triton_recurrent.py): the references against
the plain definitions, and the Triton kernels against the references on fresh random inputs,
with states at strided slots as the state cache holds them."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _conv_case(rows, channels, k, dtype, seed=0):
    """x, weight, bias, a conv state at strided slots (a view into wider rows, as the state cache's),
    and distinct slots out of 6."""
    x, w = _rand(rows, channels, seed=seed, dtype=dtype), _rand(channels, k, seed=seed + 1, dtype=dtype)
    b = _rand(channels, seed=seed + 2, dtype=dtype)
    data = _rand(7, channels * (k - 1) + 5, seed=seed + 3)
    state = data[:, 3 : 3 + channels * (k - 1)].view(7, channels, k - 1)
    slots = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:rows].to(DEVICE)
    return x, w, b, state, slots


@pytest.mark.parametrize("activation", [None, "silu"])
def test_reference_conv_step_is_the_convolution_over_state_then_input(activation):
    x, w, b, state, slots = _conv_case(3, 5, 4, torch.float32)
    before = state.clone()
    got = ref.conv1d_decode(x, w, b, state, slots, activation)
    for i, s in enumerate(slots.tolist()):
        seq = torch.cat([before[s], x[i][:, None]], dim=1)  # [C, K]: the whole window
        y = F.conv1d(seq[None], w[:, None, :], b, groups=5)[0, :, -1]
        torch.testing.assert_close(got[i], F.silu(y) if activation else y)
        assert torch.equal(state[s], seq[:, 1:])
    others = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(state[others], before[others])


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_recurrent as tr  # noqa: E402

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3),
       torch.bfloat16: (0.0, 2.0 ** -6) if DEVICE == "cpu" else (1e-2, 1e-2)}
# Outputs that pass through sums of many products (near zero, a relative tolerance alone fails) or through
# three roundings to bf16 (the gated norm: a few bf16 steps apart where the interpreter truncates).
SUM_TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-3, 2.0 ** -6)}
NORM_TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (5e-2, 3e-2)}


@pytest.mark.parametrize("rows,channels,k,bias,activation,dtype", [
    (1, 8, 4, True, "silu", torch.float32), (3, 37, 3, False, None, torch.float32),
    (4, 130, 2, True, None, torch.float32), (2, 2048, 4, True, "silu", torch.bfloat16),
    (5, 64, 4, False, "silu", torch.float16), (0, 8, 4, True, None, torch.float32),
])
def test_conv1d_decode_kernel(rows, channels, k, bias, activation, dtype):
    x, w, b, state, slots = _conv_case(rows, channels, k, dtype, seed=rows + k)
    b = b if bias else None
    mine, theirs = state.clone(), state.clone()
    got = tr.conv1d_decode(x, w, b, mine, slots, activation)
    expected = ref.conv1d_decode(x, w, b, theirs, slots, activation)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    torch.testing.assert_close(mine, theirs, atol=0, rtol=0)  # (inputs shifted, never rounded)
    assert dispatch._KERNELS["conv1d_decode"] is tr.conv1d_decode


def _delta_case(rows, nk, group, kd, vd, dtype, seed=0):
    """Convolved rows [q; k; v], the gate logits b and a as strided slices of one projection, the
    per-head rates, and a recurrent state at strided slots (a view into wider rows) with distinct slots."""
    nv = nk * group
    width = 2 * nk * kd + nv * vd
    mixed = _rand(rows, width, seed=seed, dtype=dtype)
    proj = _rand(rows, 2 * nv + 3, seed=seed + 1, dtype=dtype) * 2
    b, a = proj[:, 1 : 1 + nv], proj[:, 1 + nv : 1 + 2 * nv]
    neg_a = -torch.rand(nv, generator=torch.Generator().manual_seed(seed)).to(DEVICE) * 2
    dt_bias = _rand(nv, seed=seed + 2)
    data = _rand(7, nv * kd * vd + 4, seed=seed + 3) * 0.3
    state = data[:, 4:].view(7, nv, kd, vd)
    slots = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:rows].to(DEVICE)
    return mixed, b, a, neg_a, dt_bias, state, slots


@pytest.mark.parametrize("rows,nk,group,kd,vd,dtype,beta_scale", [
    (1, 1, 1, 16, 16, torch.float32, 1.0), (3, 2, 2, 32, 24, torch.float32, 1.0),
    (2, 2, 3, 64, 128, torch.float32, 1.0), (4, 2, 2, 128, 128, torch.bfloat16, 1.0),
    (0, 1, 2, 16, 16, torch.float32, 1.0),
    # OLMo hybrid's: beta in [0, 2] (linear_allow_neg_eigval), key heads 96 wide and value heads 192, one per key head
    (3, 3, 1, 96, 192, torch.float32, 2.0), (2, 2, 1, 96, 192, torch.bfloat16, 2.0),
])
def test_gated_delta_decode_kernel(rows, nk, group, kd, vd, dtype, beta_scale):
    mixed, b, a, neg_a, dt_bias, state, slots = _delta_case(rows, nk, group, kd, vd, dtype, seed=rows + kd)
    mine, theirs = state.clone(), state.clone()
    got = tr.gated_delta_decode(mixed, b, a, neg_a, dt_bias, mine, slots, nk, beta_scale)
    expected = ref.gated_delta_decode(mixed, b, a, neg_a, dt_bias, theirs, slots, nk, beta_scale)
    atol, rtol = SUM_TOL[dtype]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    # The state is fp32 both ways; with bf16 inputs beta is rounded to bf16 first, which the interpreter's
    # truncating cast may round one step off (0.4%).
    state_tol = (1e-5, 1e-4) if dtype == torch.float32 else (5e-3, 1e-2)
    torch.testing.assert_close(mine, theirs, atol=state_tol[0], rtol=state_tol[1])
    untouched = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(mine[untouched], state[untouched])
    assert dispatch._KERNELS["gated_delta_decode"] is tr.gated_delta_decode


@pytest.mark.parametrize("rows,heads,vd,dtype", [(1, 2, 16, torch.float32), (5, 3, 24, torch.float32),
                                                  (3, 4, 128, torch.bfloat16), (0, 2, 16, torch.float32)])
def test_gated_rms_norm_kernel(rows, heads, vd, dtype):
    o = _rand(rows, heads, vd, seed=rows, dtype=dtype)
    z = _rand(rows, heads * vd + 6, seed=rows + 1, dtype=dtype)[:, 2 : 2 + heads * vd]  # (strided rows)
    w = _rand(vd, seed=3, dtype=dtype)
    atol, rtol = NORM_TOL[dtype]
    torch.testing.assert_close(tr.gated_rms_norm(o, z, w, 1e-6), ref.gated_rms_norm(o, z, w, 1e-6), atol=atol,
                               rtol=rtol)
    assert dispatch._KERNELS["gated_rms_norm"] is tr.gated_rms_norm


def _ssd_case(rows, heads, groups, p, n, dtype, seed=0):
    """Convolved rows [x; B; C] and raw dt as strided slices of one projection, rates, and an SSM state at
    strided slots (a view into wider rows) with distinct slots."""
    width = heads * p + 2 * groups * n
    proj = _rand(rows, width + heads + 5, seed=seed, dtype=dtype)
    xbc, dt = proj[:, 2 : 2 + width], proj[:, 2 + width : 2 + width + heads]
    dt_bias = _rand(heads, seed=seed + 1, dtype=dtype)
    A = -torch.rand(heads, generator=torch.Generator().manual_seed(seed)).to(DEVICE) * 4
    D = _rand(heads, seed=seed + 2)
    data = _rand(7, heads * p * n + 3, seed=seed + 3) * 0.3
    state = data[:, 3:].view(7, heads, p, n)
    slots = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:rows].to(DEVICE)
    return xbc, dt, dt_bias, A, D, state, slots


@pytest.mark.parametrize("rows,heads,groups,p,n,limit,dtype", [
    (1, 2, 1, 8, 16, (0.0, float("inf")), torch.float32), (3, 4, 2, 16, 24, (0.0, float("inf")), torch.float32),
    (2, 6, 3, 64, 128, (0.05, 0.5), torch.float32), (4, 8, 1, 64, 128, (0.0, float("inf")), torch.bfloat16),
    (0, 2, 1, 8, 16, (0.0, float("inf")), torch.float32),
])
def test_ssd_decode_kernel(rows, heads, groups, p, n, limit, dtype):
    xbc, dt, dt_bias, A, D, state, slots = _ssd_case(rows, heads, groups, p, n, dtype, seed=rows + p)
    mine, theirs = state.clone(), state.clone()
    got = tr.ssd_decode(xbc, dt, dt_bias, A, D, mine, slots, groups, limit)
    expected = ref.ssd_decode(xbc, dt, dt_bias, A, D, theirs, slots, groups, limit)
    # fp32 out; with bf16 inputs dt is rounded to bf16 twice, one step apart where the interpreter truncates
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (5e-2, 5e-2)
    torch.testing.assert_close(got, expected, atol=tol[0], rtol=tol[1])
    torch.testing.assert_close(mine, theirs, atol=tol[0], rtol=tol[1])
    untouched = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(mine[untouched], state[untouched])
    assert dispatch._KERNELS["ssd_decode"] is tr.ssd_decode


@pytest.mark.parametrize("order", ["gated", "before_gate", "none"])
@pytest.mark.parametrize("rows,width,groups,dtype", [(1, 16, 1, torch.float32), (3, 96, 4, torch.float32),
                                                     (2, 8192, 1, torch.bfloat16), (0, 16, 2, torch.float32)])
def test_mamba_gated_norm_kernel(order, rows, width, groups, dtype):
    y = _rand(rows, width, seed=rows)
    z = _rand(rows, width + 4, seed=rows + 1, dtype=dtype)[:, 1 : 1 + width]  # (strided rows)
    w = _rand(width, seed=2) if order != "none" else None
    atol, rtol = TOL[dtype] if dtype == torch.float32 else (1e-2, 2.0 ** -6)
    torch.testing.assert_close(tr.mamba_gated_norm(y, z, w, groups, 1e-5, order),
                               ref.mamba_gated_norm(y, z, w, groups, 1e-5, order), atol=atol, rtol=rtol)
    assert dispatch._KERNELS["mamba_gated_norm"] is tr.mamba_gated_norm


@pytest.mark.parametrize("order", ["gated", "before_gate"])
@pytest.mark.parametrize("rows,width,groups", [(1, 16, 1), (3, 96, 4), (2, 4096, 1), (0, 16, 2)])
def test_mamba_gated_norm_over_split_groups(order, rows, width, groups):
    """Tensor parallelism's form: each rank's sums of squares (mamba_gated_squares), summed, give every rank its
    half of the whole norm (the halves of each group)."""
    y = _rand(rows, 2 * width, seed=rows + 5)
    z = _rand(rows, 2 * width + 2, seed=rows + 6, dtype=torch.bfloat16)[:, 1 : 1 + 2 * width]
    w = _rand(2 * width, seed=7)
    group = width // groups

    def half(t, r):  # rank r's half of every group
        return t.reshape(*t.shape[:-1], groups, 2, group)[..., r, :].reshape(*t.shape[:-1], width)

    parts = [tr.mamba_gated_squares(half(y, r).contiguous(), half(z, r), groups, order) for r in (0, 1)]
    for r in (0, 1):
        torch.testing.assert_close(parts[r], ref.mamba_gated_squares(half(y, r).contiguous(), half(z, r), groups, order))
    squares = parts[0] + parts[1]
    whole = ref.mamba_gated_norm(y, z, w, groups, 1e-5, order)
    for r in (0, 1):
        got = tr.mamba_gated_norm(half(y, r).contiguous(), half(z, r), half(w, r), groups, 1e-5, order,
                                  squares=squares, group_size=2 * group)
        torch.testing.assert_close(got, half(whole, r), atol=1e-2, rtol=2.0 ** -6)
    assert dispatch._KERNELS["mamba_gated_squares"] is tr.mamba_gated_squares
