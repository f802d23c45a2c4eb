"""ModernBERT's GeGLU ("gelu_mul": the exact, erf GELU on the gate half times the up half): the
reference against its definition, and the Triton kernels that compute it (the gated-activation
kernel, and linear_act's fused routes) against the reference on fresh random inputs."""
from __future__ import annotations

import math
import os

import pytest
import torch

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _erf_gelu(x):
    return 0.5 * x * (1.0 + torch.special.erf(x / math.sqrt(2.0)))


def test_reference_is_erf_gelu_of_the_first_half_times_the_second():
    gate_up = _rand(7, 40, seed=0).double()
    expected = _erf_gelu(gate_up[:, :20]) * gate_up[:, 20:]
    torch.testing.assert_close(ref.gated_act(gate_up, "gelu_mul"), expected, atol=1e-6, rtol=1e-6)  # fp32 inside
    assert "gelu_mul" in ref.GATED_ACTIVATIONS and "gelu_mul" in ref.LINEAR_ACTIVATIONS
    # linear_act with [gate; up] weights is the same thing after the GEMM
    x, gate_w, up_w = _rand(5, 16, seed=1), _rand(12, 16, seed=2), _rand(12, 16, seed=3)
    got = ref.linear_act(x, torch.cat([gate_w, up_w]), None, "gelu_mul")
    torch.testing.assert_close(got, _erf_gelu(x @ gate_w.T) * (x @ up_w.T), atol=1e-5, rtol=1e-5)


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import triton_elementwise as te  # noqa: E402
from tritonformer.kernels import triton_small_gemm as tsg  # noqa: E402


@pytest.mark.parametrize("rows,inner", [(1, 8), (13, 96), (3, 1152)])
def test_gated_act_kernel(rows, inner):
    gate_up = _rand(rows, 2 * inner, seed=rows) * 3
    torch.testing.assert_close(te.gated_act(gate_up, "gelu_mul"), ref.gated_act(gate_up, "gelu_mul"),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 9])
def test_linear_act_fused_routes(rows):
    """A decode-like row count (the GEMV) and a few rows (the small fused GEMM): the GeGLU runs
    on the GEMM's fp32 accumulator."""
    x, w = _rand(rows, 64, seed=10 + rows), _rand(2 * 48, 64, seed=20 + rows) * 0.3
    bias = _rand(2 * 48, seed=30 + rows)
    got = tsg.linear_act(x, w, bias, "gelu_mul")
    torch.testing.assert_close(got, ref.linear_act(x, w, bias, "gelu_mul"), atol=1e-4, rtol=1e-4)
