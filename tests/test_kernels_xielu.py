"""xIELU (Apertus's plain-MLP activation): the reference against transformers' XIELUActivation (its
Python path) on learnt parameters away from their initial values, and the Triton kernel against the
reference on fresh random inputs, out of place and in place, with values on both sides of 0 and eps."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _params(a_p: float, a_n: float, beta: float = 0.5, eps: float = -1e-6) -> torch.Tensor:
    """(alpha_p, alpha_n, beta, eps) as applied, from a checkpoint's raw a_p / a_n (their softplus)."""
    a_p, a_n = torch.tensor(a_p), torch.tensor(a_n)
    return torch.stack([F.softplus(a_p), beta + F.softplus(a_n), torch.tensor(beta), torch.tensor(eps)]).to(DEVICE)


def _inputs(*shape, seed, dtype=torch.float32):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3
    x.view(-1)[:6] = torch.tensor([0.0, -1e-7, -1e-6, -2e-6, 1e-7, -0.01])[: x.numel()]  # around 0 and eps
    return x.to(DEVICE, dtype)


def test_reference_is_transformers_xielu():
    transformers = pytest.importorskip("transformers")
    act = transformers.activations.XIELUActivation(dtype=torch.float32)
    with torch.no_grad():
        act.alpha_p.fill_(-0.7)
        act.alpha_n.fill_(1.3)
        act.beta.fill_(0.3)
    x = _inputs(7, 64, seed=0).cpu()
    expected = act._xielu_python(x)
    got = ref.xielu(x, _params(-0.7, 1.3, beta=0.3).cpu())
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="4 parameters"):
        ref.xielu(x, torch.zeros(3))


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_elementwise as te  # noqa: E402

# (the interpreter's fp32 -> bf16 cast truncates where the GPU rounds to nearest)
TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 1e-3),
       torch.bfloat16: (0.0, 2.0 ** -6) if DEVICE == "cpu" else (1e-2, 1e-2)}


@pytest.mark.parametrize("rows,cols,dtype", [(1, 64, torch.float32), (13, 200, torch.float32),
                                             (3, 4160, torch.float16), (2, 96, torch.bfloat16),
                                             (0, 64, torch.float32)])
def test_xielu_kernel(rows, cols, dtype):
    x, params = _inputs(rows, cols, seed=rows, dtype=dtype), _params(0.4, -0.9, beta=0.6)
    expected = ref.xielu(x, params)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(te.xielu(x, params), expected, atol=atol, rtol=rtol)
    te.xielu(x, params, out=x)  # in place
    torch.testing.assert_close(x, expected, atol=atol, rtol=rtol)
    assert dispatch._KERNELS["xielu"] is te.xielu


def test_xielu_kernel_reads_its_scalars_from_the_device():
    """Other scalars in the same tensor change the result with no new launch parameters (what a graph replays)."""
    x, params = _inputs(4, 128, seed=3), _params(0.4, -0.9)
    first = te.xielu(x, params)
    params.copy_(_params(1.5, 0.2, beta=0.1, eps=-1e-3))
    torch.testing.assert_close(te.xielu(x, params), ref.xielu(x, params), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(first, te.xielu(x, params))
