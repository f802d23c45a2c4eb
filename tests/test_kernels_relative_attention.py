"""The Triton relative-position-bias attention kernel (MPNet's) against
`reference.relative_bias_attention`, on fresh random inputs of variable lengths.

Without a GPU the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1, set before triton
is imported), so those shapes are tiny; the `gpu` group runs all-mpnet-base-v2's shapes on CUDA.
"""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernel cannot run", allow_module_level=True)

from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels.triton_relative_attention import relative_bias_attention  # noqa: E402

TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (2e-3, 2e-3)}


def make(lengths, heads, head_dim, reach, dtype):
    """A packed QKV `[T, 3, H, D]` (q, k, v are strided views of it, as the models pass them), its
    cu_seqlens, and a bias table of order one; fresh values every call (the seed is printed on
    failure by the assertion's message)."""
    seed = int(torch.randint(0, 2**31 - 1, ()))
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(sum(lengths), 3, heads, head_dim, generator=gen).to(DEVICE, dtype)
    bias = torch.randn(heads, 2 * reach + 1, generator=gen).to(DEVICE)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    return qkv, cu, bias, seed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 24])
def test_matches_reference_on_variable_lengths(dtype, head_dim):
    """Lengths below, at and past the 16-row tiles and the reach of 5 (clamped distances), an
    empty sequence, strided q/k/v and an `out` view; head dim 24 runs in a padded 32 tile."""
    lengths = [1, 16, 0, 37, 5]
    qkv, cu, bias, seed = make(lengths, 2, head_dim, 5, dtype)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    expected = ref.relative_bias_attention(q, k, v, cu, bias)
    out = torch.full((sum(lengths), 2, head_dim), float("nan"), device=DEVICE, dtype=dtype)
    got = relative_bias_attention(q, k, v, cu, bias, max_seqlen=max(lengths), out=out)
    assert got.data_ptr() == out.data_ptr()
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=rtol, msg=f"seed {seed}")


def test_bias_and_scale_change_the_result_as_the_reference_does():
    """The bias is not a no-op (zeroing it moves the output), the scale is honoured, and the
    grid's size from cu_seqlens (no max_seqlen) gives the same result."""
    lengths = [9, 30]
    qkv, cu, bias, seed = make(lengths, 3, 16, 40, torch.float32)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    got = relative_bias_attention(q, k, v, cu, bias, scale=0.5)
    torch.testing.assert_close(got, ref.relative_bias_attention(q, k, v, cu, bias, scale=0.5), atol=2e-5, rtol=1e-4,
                               msg=f"seed {seed}")
    flat = relative_bias_attention(q, k, v, cu, torch.zeros_like(bias), scale=0.5)
    assert (flat - got).abs().max() > 1e-2
    bias.mul_(-2.0)  # written in place: its tiles are made again, not read from the first call's
    torch.testing.assert_close(relative_bias_attention(q, k, v, cu, bias, scale=0.5),
                               ref.relative_bias_attention(q, k, v, cu, bias, scale=0.5), atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="bias must be"):
        relative_bias_attention(q, k, v, cu, bias[:, :-1])



def test_registered_for_cuda_tensors():
    """kernels.relative_bias_attention dispatches here on CUDA (the module is loaded with the others)."""
    from tritonformer.kernels import dispatch

    assert dispatch._KERNELS["relative_bias_attention"] is relative_bias_attention
    assert "triton_relative_attention" in dispatch._KERNEL_MODULES


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("lengths", [[512] * 8, [3, 77, 128, 300, 511, 1]])
def test_gpu_mpnet_shapes_fp16(lengths):
    """all-mpnet-base-v2's attention: 12 heads of 64, reach 128, fp16."""
    qkv, cu, bias, seed = make(lengths, 12, 64, 128, torch.float16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    got = relative_bias_attention(q, k, v, cu, bias, max_seqlen=max(lengths))
    torch.testing.assert_close(got.float(), ref.relative_bias_attention(q, k, v, cu, bias).float(), atol=2e-3,
                               rtol=2e-3, msg=f"seed {seed}")
