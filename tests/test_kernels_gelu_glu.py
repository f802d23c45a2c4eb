"""ModernBERT's GeGLU ("gelu_mul": the exact, erf GELU on the gate half times the up half) and
gpt-oss's clamped SwiGLU ("swiglu_oai"): the reference against each definition, and the Triton
kernels that compute them (the gated-activation kernel, and linear_act's fused routes) against
the reference on fresh random inputs."""
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


def _swiglu_oai(gate, up):
    """gpt-oss's activation as Hugging Face's GptOssExperts writes it (alpha 1.702, limit 7)."""
    gate, up = gate.clamp(max=7.0), up.clamp(min=-7.0, max=7.0)
    return (up + 1) * (gate * torch.sigmoid(gate * 1.702))


def test_reference_swiglu_oai_is_the_clamped_swiglu():
    gate_up = (_rand(9, 64, seed=4) * 6).double()  # past +-7 in both halves: the clamps act
    gate, up = gate_up[:, :32], gate_up[:, 32:]
    assert (gate > 7).any() and (gate < -7).any() and (up > 7).any() and (up < -7).any()
    torch.testing.assert_close(ref.gated_act(gate_up, "swiglu_oai"), _swiglu_oai(gate, up), atol=1e-5, rtol=1e-6)
    assert "swiglu_oai" in ref.GATED_ACTIVATIONS and "swiglu_oai" in ref.LINEAR_ACTIVATIONS
    x, gate_w, up_w, bias = _rand(5, 16, seed=5), _rand(12, 16, seed=6), _rand(12, 16, seed=7), _rand(24, seed=8) * 4
    got = ref.linear_act(x, torch.cat([gate_w, up_w]), bias, "swiglu_oai")
    torch.testing.assert_close(got, _swiglu_oai(x @ gate_w.T + bias[:12], x @ up_w.T + bias[12:]), atol=1e-5, rtol=1e-5)


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

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


@pytest.mark.parametrize("rows,inner", [(1, 8), (13, 96), (3, 1152)])
def test_gated_act_kernel_swiglu_oai(rows, inner):
    gate_up = _rand(rows, 2 * inner, seed=40 + rows) * 6
    torch.testing.assert_close(te.gated_act(gate_up, "swiglu_oai"), ref.gated_act(gate_up, "swiglu_oai"),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows,path", [(1, tsg.GEMV), (2, tsg.GEMV), (9, tsg.SMALL_GEMM), (33, tsg.SMALL_GEMM)])
def test_linear_act_swiglu_oai_fused_routes(rows, path):
    """gpt-oss's activation on the GEMM's fp32 accumulator, in the GEMV's decode rows and the
    small GEMM's; a bias pushes the pre-activations past the clamps."""
    x, w = _rand(rows, 64, seed=50 + rows), _rand(2 * 48, 64, seed=60 + rows) * 0.3
    bias = _rand(2 * 48, seed=70 + rows) * 4
    assert tsg.route(x, w, "swiglu_oai") == path
    h = x @ w.T + bias
    assert (h[:, :48] > 7).any() and (h[:, 48:].abs() > 7).any()
    got = tsg.linear_act(x, w, bias, "swiglu_oai")
    torch.testing.assert_close(got, ref.linear_act(x, w, bias, "swiglu_oai"), atol=1e-4, rtol=1e-4)


@triton.jit
def _erf_gelu_of(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, te._erf_gelu(x), mask=offs < n)


def test_branch_free_erf_gelu_against_the_exact_gelu():
    """The kernels' exact GELU (h * Phi(h) from a branch-free erfc, triton_elementwise._erf_gelu)
    against float64's GELU: relatively within 1e-5 where h > -5.6 (3.1e-6 in the interpreter;
    the GPU's approximate reciprocal and exp2 add a few fp32 ulps), the far negative tail within
    1e-12 absolutely (values ~1e-9 and less), zeros and infinities where they belong; a fresh
    random draw in the middle."""
    grid = torch.linspace(-12.0, 12.0, 24001)
    drawn = torch.randn(4096, generator=torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))) * 3
    x = torch.cat([grid, drawn, torch.tensor([0.0, -0.0, 1e-30, -1e-30, 60.0, -60.0])]).to(DEVICE)
    y = torch.empty_like(x)
    _erf_gelu_of[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    want = _erf_gelu(x.double())
    err = (y.double() - want).abs()
    near = x > -5.6
    bound = 1e-5 * want[near].abs()
    assert (err[near] <= bound + 1e-30).all(), x[near][err[near] > bound]
    assert (err[~near] <= 1e-12).all()
    tail = y[-6:].cpu()
    assert tail[0] == 0 and tail[1] == 0 and tail[4] == 60.0 and tail[5] == 0
    assert tail[2].item() == pytest.approx(5e-31, rel=1e-6) and tail[3].item() == pytest.approx(-5e-31, rel=1e-6)
