"""Mamba-1's selective-scan decode step (kernels.selective_scan_decode, models/mamba1.py): the reference against
the plain recurrence, and the Triton kernel against the reference on fresh random inputs, with the inputs as
strided slices of the projections' outputs and the state at strided slots as the state cache holds it."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _case(rows, channels, n, dtype, seed=0):
    """x and z as strided halves of one projection's rows, dt as a slice of a wider one, B and C as slices of
    x_proj's rows; dt_bias, A `[I, N]` < 0, D; a state at strided slots (a view into wider rows), distinct slots
    out of 6."""
    xz = _rand(rows, 2 * channels + 3, seed=seed, dtype=dtype)
    x, z = xz[:, 1 : 1 + channels], xz[:, 1 + channels : 1 + 2 * channels]
    dt = _rand(rows, channels + 2, seed=seed + 1, dtype=dtype)[:, 2:] - 1.0
    dbc = _rand(rows, 5 + 2 * n, seed=seed + 2, dtype=dtype)
    b, c = dbc[:, 5 : 5 + n], dbc[:, 5 + n :]
    dt_bias = _rand(channels, seed=seed + 3, dtype=dtype) * 0.5
    A = -torch.rand(channels, n, generator=torch.Generator().manual_seed(seed)).to(DEVICE) * 8
    D = _rand(channels, seed=seed + 4)
    data = _rand(7, channels * n + 3, seed=seed + 5) * 0.3
    state = data[:, 3:].view(7, channels, n)
    slots = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:rows].to(DEVICE)
    return x, dt, b, c, z, dt_bias, A, D, state, slots


def test_reference_is_the_selective_scan_recurrence_one_step():
    x, dt, b, c, z, dt_bias, A, D, state, slots = _case(3, 5, 4, torch.float32)
    before = state.clone()
    got = ref.selective_scan_decode(x, dt, b, c, z, dt_bias, A, D, state, slots)
    for i, s in enumerate(slots.tolist()):
        delta = F.softplus(dt[i] + dt_bias)  # [I]
        h = torch.exp(delta[:, None] * A) * before[s] + delta[:, None] * x[i][:, None] * b[i][None, :]
        torch.testing.assert_close(state[s], h)
        torch.testing.assert_close(got[i], (h @ c[i] + D * x[i]) * F.silu(z[i]))
    others = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(state[others], before[others])


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_recurrent as tr  # noqa: E402


@pytest.mark.parametrize("rows,channels,n,dtype", [
    (1, 8, 16, torch.float32), (3, 37, 16, torch.float32), (2, 300, 24, torch.float32),
    (4, 512, 16, torch.bfloat16), (2, 96, 8, torch.float16), (0, 8, 16, torch.float32),
])
def test_selective_scan_decode_kernel(rows, channels, n, dtype):
    x, dt, b, c, z, dt_bias, A, D, state, slots = _case(rows, channels, n, dtype, seed=rows + channels)
    mine, theirs = state.clone(), state.clone()
    got = tr.selective_scan_decode(x, dt, b, c, z, dt_bias, A, D, mine, slots)
    expected = ref.selective_scan_decode(x, dt, b, c, z, dt_bias, A, D, theirs, slots)
    # the state is fp32 both ways; the output passes through two roundings to the model's dtype (h before the
    # product with C, the product), one step apart where the interpreter truncates
    tol = {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (3e-2, 3e-2)}[dtype]
    torch.testing.assert_close(got, expected, atol=tol[0], rtol=tol[1])
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)
    untouched = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(mine[untouched], state[untouched])
    assert dispatch._KERNELS["selective_scan_decode"] is tr.selective_scan_decode
