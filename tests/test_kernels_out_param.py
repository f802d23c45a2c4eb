"""`out=`: kernels and references write into a given buffer (an activation-arena view)."""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.kernels import reference as ref

pytestmark = pytest.mark.cuda_ok  # runs on the GPU machine too (with the real kernels)

triton = pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from tritonformer.kernels import triton_attention, triton_elementwise, triton_norms  # noqa: E402


def _rand(*shape, gen):
    return torch.randn(*shape, generator=gen).to(DEVICE)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_out_buffers_receive_the_results(impl):
    gen = torch.Generator().manual_seed(0)
    ln = triton_norms.add_bias_residual_layer_norm if impl == "kernel" else ref.add_bias_residual_layer_norm
    gelu = triton_elementwise.bias_gelu if impl == "kernel" else ref.bias_gelu
    attn = triton_attention.varlen_attention if impl == "kernel" else ref.varlen_attention

    x, res, b, w, lb = _rand(6, 32, gen=gen), _rand(6, 32, gen=gen), _rand(32, gen=gen), _rand(32, gen=gen), _rand(32, gen=gen)
    arena = torch.full((4 * 6 * 32,), float("nan"), device=DEVICE)  # poisoned: every element must be written
    out = arena[6 * 32 : 2 * 6 * 32].view(6, 32)
    assert ln(x, b, res, w, lb, 1e-6, out=out) is out
    torch.testing.assert_close(out, ref.add_bias_residual_layer_norm(x, b, res, w, lb, 1e-6), atol=1e-5, rtol=1e-5)

    y = x.clone()
    expected = ref.bias_gelu(x, b)
    assert gelu(y, b, "none", out=y) is y  # in place
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)

    q, k, v = _rand(9, 2, 16, gen=gen), _rand(9, 2, 16, gen=gen), _rand(9, 2, 16, gen=gen)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    out = arena[: 9 * 2 * 16].view(9, 2, 16)
    assert attn(q, k, v, cu, cu, False, None, 5, out=out) is out
    torch.testing.assert_close(out, ref.varlen_attention(q, k, v, cu, cu, False), atol=1e-4, rtol=1e-4)
