"""The gated attention output (x * sigmoid(gate): AFMoE's gate_proj, Qwen3-Next's gate half of
q_proj, per element; Dots3's and LFM3's g_proj, per head): the reference against transformers' two
ops, and the Triton kernel against the reference on fresh random inputs, out of place and in place."""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_transformers_gate_with_its_roundings(dtype):
    x, gate = _rand(5, 4, 16, seed=0, dtype=dtype), _rand(5, 64, seed=1, dtype=dtype)
    expected = x.reshape(5, 64) * torch.sigmoid(gate)  # (transformers: both ops in x's dtype)
    assert torch.equal(ref.sigmoid_mul(x, gate).reshape(5, 64), expected)
    with pytest.raises(ValueError, match="63 elements"):
        ref.sigmoid_mul(x, gate[:, :63].contiguous().view(-1)[:63])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_gates_per_head_as_transformers(dtype):
    x, gate = _rand(5, 4, 16, seed=2, dtype=dtype), _rand(5, 4, seed=3, dtype=dtype)
    expected = x * torch.sigmoid(gate).unsqueeze(-1)  # (transformers: one value per head over its columns)
    assert torch.equal(ref.sigmoid_mul(x, gate), expected)
    with pytest.raises(ValueError, match="3 elements"):
        ref.sigmoid_mul(x, gate.view(-1)[:3])


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_elementwise as te  # noqa: E402


# (the interpreter's fp32 -> bf16 cast truncates where the GPU rounds to nearest: two casts, two bf16 steps apart)
TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 1e-3),
       torch.bfloat16: (0.0, 2.0 ** -6) if DEVICE == "cpu" else (1e-2, 1e-2)}


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("rows,heads,dim,dtype", [(1, 4, 16, torch.float32), (13, 6, 24, torch.float32),
                                                  (3, 32, 128, torch.float16), (2, 8, 64, torch.bfloat16),
                                                  (0, 4, 16, torch.float32)])
def test_sigmoid_mul_kernel(rows, heads, dim, dtype, per_head):
    gate_width = heads if per_head else heads * dim
    x, gate = _rand(rows, heads, dim, seed=rows, dtype=dtype), _rand(rows, gate_width, seed=50 + rows, dtype=dtype)
    expected = ref.sigmoid_mul(x, gate)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(te.sigmoid_mul(x, gate), expected, atol=atol, rtol=rtol)
    te.sigmoid_mul(x, gate, out=x)  # in place
    torch.testing.assert_close(x, expected, atol=atol, rtol=rtol)
    assert dispatch._KERNELS["sigmoid_mul"] is te.sigmoid_mul
