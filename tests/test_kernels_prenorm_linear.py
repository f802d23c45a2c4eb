"""A decoder's QKV op, `prenorm_qkv_to_cache` (the residual add + norm, the projection, bias,
rotary and the paged-cache write), against its reference on fresh seeded random inputs: at one
or two rows the prefetching GEMV (kernels/triton_gemv.py) runs all of it; past that the small
GEMM's QKV epilogue (kernels/triton_small_gemm.py) or the separate kernels. fp32 in Triton's CPU
interpreter; the GPT-2 and Llama-1B layer shapes in fp16 on a GPU."""
from __future__ import annotations

import os
import zlib

import pytest
import torch

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels import triton_small_gemm as tsg  # noqa: E402
from tritonformer.kernels.reference import PreNorm  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


class Rand:
    def __init__(self, *params, dtype=torch.float32):
        self.gen = torch.Generator(device=DEVICE).manual_seed(zlib.crc32(repr(params).encode()))
        self.dtype = dtype

    def __call__(self, *shape, std=1.0, mean=0.0, dtype=None):
        return (torch.randn(*shape, generator=self.gen, device=DEVICE) * std + mean).to(dtype or self.dtype)


def make_prenorm(rand, m, k, kind, with_bias, with_residual, write_sum):
    """A PreNorm whose input sits off zero (mean 3) so LayerNorm's centring matters."""
    return PreNorm(
        weight=rand(k, std=0.3, mean=1.0), bias=rand(k, std=0.2) if kind == "layer" else None, eps=1e-5,
        x_bias=rand(k, std=0.5) if with_bias else None,
        residual=rand(m, k, std=2.0, mean=3.0) if with_residual else None,
        sum_out=torch.full((m, k), float("nan"), device=DEVICE, dtype=rand.dtype) if write_sum else None,
    )


def twin(p: PreNorm) -> PreNorm:
    """The same PreNorm with its own sum_out, for the reference."""
    return PreNorm(p.weight, p.bias, p.eps, p.x_bias, p.residual,
                   None if p.sum_out is None else torch.full_like(p.sum_out, float("nan")))


def cache_pair(rand, blocks, block_size, hkv, d):
    return rand(blocks, block_size, hkv, d), rand(blocks, block_size, hkv, d)


QKV_CASES = [  # (norm, x_bias, residual, sum_out): GPT-2's, Llama's, and the optional parts left out
    ("layer", True, True, True), ("rms", False, True, True), ("layer", False, False, False), (None, False, False, False),
]


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2)])
@pytest.mark.parametrize("m", [1, 2, 5])
@pytest.mark.parametrize("norm,with_bias,with_residual,write_sum", QKV_CASES)
def test_prenorm_qkv_to_cache_matches_reference(norm, with_bias, with_residual, write_sum, m, heads, kv_heads,
                                                rotary):
    rand = Rand("qkv", norm, with_bias, with_residual, write_sum, m, heads, kv_heads, rotary)
    k_dim, d = 48, 32
    x = rand(m, k_dim, mean=1.0)
    p = make_prenorm(rand, m, k_dim, norm, with_bias, with_residual, write_sum) if norm else None
    w, b = rand((heads + 2 * kv_heads) * d, k_dim, std=k_dim ** -0.5), rand((heads + 2 * kv_heads) * d, std=0.3)
    table = rand(m, 2, d // 2)  # cos and sin side by side, as the Llama model gathers them
    cos, sin = (table[:, 0], table[:, 1]) if rotary else (None, None)
    kc, vc = cache_pair(rand, 3, 4, kv_heads, d)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.randperm(12, generator=rand.gen, device=DEVICE)[:m]
    q = tsg.prenorm_qkv_to_cache(x, p, w, b, heads, kv_heads, d, cos, sin, kc, vc, slots)
    pr = twin(p) if p else None
    q_ref = ref.prenorm_qkv_to_cache(x, pr, w, b, heads, kv_heads, d, cos, sin, kc_ref, vc_ref, slots)
    assert q.shape == (m, heads, d)
    torch.testing.assert_close(q, q_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kc, kc_ref, atol=1e-4, rtol=1e-4)  # written slots and untouched ones
    torch.testing.assert_close(vc, vc_ref, atol=1e-4, rtol=1e-4)
    if write_sum:
        torch.testing.assert_close(p.sum_out, pr.sum_out, atol=1e-5, rtol=1e-5)


def test_more_rows_than_the_gemv_takes_run_the_unfused_kernels():
    """Past the GEMV's rows the separate norm, GEMM and split kernels give the reference's result."""
    rand = Rand("many")
    x, w, b = rand(4, 32), rand(64, 32, std=0.2), rand(64)
    slots = torch.tensor([5, 0, 7, 2], device=DEVICE)
    for norm in ("layer", "rms"):
        p = make_prenorm(rand, 4, 32, norm, with_bias=True, with_residual=True, write_sum=True)
        pr = twin(p)
        kc, vc = cache_pair(rand, 2, 4, 1, 16)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        q = tsg.prenorm_qkv_to_cache(x, p, w, b, 2, 1, 16, None, None, kc, vc, slots)
        q_ref = ref.prenorm_qkv_to_cache(x, pr, w, b, 2, 1, 16, None, None, kc_ref, vc_ref, slots)
        for got, want in ((q, q_ref), (kc, kc_ref), (vc, vc_ref), (p.sum_out, pr.sum_out)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_sum_out_may_not_alias_what_other_programs_read():
    rand = Rand("alias")
    p = make_prenorm(rand, 2, 32, "rms", with_bias=False, with_residual=True, write_sum=False)
    aliased = PreNorm(p.weight, None, p.eps, residual=p.residual, sum_out=p.residual)
    kc, vc = cache_pair(rand, 2, 4, 1, 16)
    with pytest.raises(AssertionError, match="must not overlap"):
        tsg.prenorm_qkv_to_cache(rand(2, 32), aliased, rand(64, 32), None, 2, 1, 16, None, None, kc, vc,
                                 torch.tensor([0, 1], device=DEVICE))


def test_ops_are_registered_with_the_dispatcher():
    assert dispatch._KERNELS["prenorm_qkv_to_cache"] is tsg.prenorm_qkv_to_cache


# ---- GPU: a decode step's real shapes, fp16/bf16 against fp32 torch ------------------------------

@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("heads,kv_heads,d,k,rotary", [(12, 12, 64, 768, False), (32, 8, 64, 2048, True)])
def test_gpu_qkv_to_cache(m, heads, kv_heads, d, k, rotary):
    rand = Rand("gpu-qkv", m, heads, rotary, dtype=torch.float16)
    x = rand(m, k, dtype=torch.float32)
    p = make_prenorm(rand, m, k, "rms" if rotary else "layer", with_bias=True, with_residual=True, write_sum=True)
    n = (heads + 2 * kv_heads) * d
    w, b = rand(n, k, std=k ** -0.5), rand(n, std=0.3)
    table = rand(m, 2, d // 2, dtype=torch.float32)
    cos, sin = (table[:, 0], table[:, 1]) if rotary else (None, None)
    kc, vc = cache_pair(rand, 16, 16, kv_heads, d)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.randperm(256, device=DEVICE)[:m]
    q = dispatch.prenorm_qkv_to_cache(x, p, w, b, heads, kv_heads, d, cos, sin, kc, vc, slots)
    pr = twin(p)
    q_ref = ref.prenorm_qkv_to_cache(x, pr, w, b, heads, kv_heads, d, cos, sin, kc_ref, vc_ref, slots)
    for got, want in ((q, q_ref), (kc, kc_ref), (vc, vc_ref)):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)


def test_rms_norm_writes_its_sum_where_asked():
    """rms_norm's `sum_out` (the unfused prenorm path's residual stream) in kernel and reference."""
    from tritonformer.kernels import triton_norms
    rand = Rand("rms-sum")
    x, res, w = rand(3, 40), rand(3, 40), rand(40)
    for residual in (res, None):
        got, want = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        normed, summed = triton_norms.rms_norm(x, w, 1e-6, residual, sum_out=got)
        normed_ref, summed_ref = ref.rms_norm(x, w, 1e-6, residual, sum_out=want)
        assert summed is got and summed_ref is want
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(normed, normed_ref, atol=1e-5, rtol=1e-5)
