"""A decoder's QKV op, `prenorm_qkv_to_cache` (the residual add + norm, the projection, bias,
rotary and the paged-cache write), against its reference on fresh seeded random inputs: at one
or two rows the prefetching GEMV (kernels/triton_gemv.py) runs all of it; past that the small
GEMM's QKV epilogue (kernels/triton_small_gemm.py) or the separate kernels. fp32 in Triton's CPU
interpreter; the GPT-2 and Llama-1B layer shapes in fp16 on a GPU."""
from __future__ import annotations

import os
import zlib
from dataclasses import replace

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


def make_prenorm(rand, m, k, kind, with_bias, with_residual, write_sum, x_norm=False, norm_dtype=None):
    """A PreNorm whose input sits off zero (mean 3) so LayerNorm's centring matters; `x_norm`:
    with Gemma's post-norm of x (RMSNorm only); norm weights in `norm_dtype` (default rand's).
    kind "sum": a post-norm block's (OLMo 2's), x_norm's output plus the residual, no norm after."""
    x_norm = x_norm or kind == "sum"
    return PreNorm(
        weight=None if kind == "sum" else rand(k, std=0.3, mean=1.0, dtype=norm_dtype),
        bias=rand(k, std=0.2) if kind == "layer" else None,
        eps=1e-5, x_bias=rand(k, std=0.5) if with_bias else None,
        residual=rand(m, k, std=2.0, mean=3.0) if with_residual else None,
        sum_out=torch.full((m, k), float("nan"), device=DEVICE, dtype=rand.dtype) if write_sum else None,
        x_norm=rand(k, std=0.3, mean=1.0, dtype=norm_dtype) if x_norm else None,
    )


def twin(p: PreNorm) -> PreNorm:
    """The same PreNorm with its own sum_out (and no normed_out), for the reference."""
    return replace(p, sum_out=None if p.sum_out is None else torch.full_like(p.sum_out, float("nan")), normed_out=None)


def cache_pair(rand, blocks, block_size, hkv, d):
    return rand(blocks, block_size, hkv, d), rand(blocks, block_size, hkv, d)


QKV_CASES = [  # (norm, x_bias, residual, sum_out): GPT-2's, Llama's, EXAONE 4's post-norm block, and the
    # optional parts left out
    ("layer", True, True, True), ("rms", False, True, True), ("sum", False, True, True), ("layer", False, False, False),
    (None, False, False, False),
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
    for norm in ("layer", "rms", "sum"):
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
    p = make_prenorm(rand, 1, 32, "rms", with_bias=False, with_residual=True, write_sum=False)  # (a GEMV prologue)
    aliased = PreNorm(p.weight, None, p.eps, residual=p.residual, sum_out=p.residual)
    kc, vc = cache_pair(rand, 2, 4, 1, 16)
    with pytest.raises(AssertionError, match="must not overlap"):
        tsg.prenorm_qkv_to_cache(rand(1, 32), aliased, rand(64, 32), None, 2, 1, 16, None, None, kc, vc,
                                 torch.tensor([0], device=DEVICE))


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


# ---- the newer decoder families' pieces, through every route -------------------------------------
# Gemma 2/3's post-norm of x (`PreNorm.x_norm`), Qwen3/Gemma 3's per-head q/k norms, head dims of
# Phi-3 (96) and Gemma (256), norm weights kept in fp32 beside fp16 activations.

ROUTES = ["gemv-1", "gemv-2", "small", "torch"]  # rows 1 and 2: the GEMV; 5 rows: the small GEMM or torch


@pytest.fixture
def on_route(monkeypatch):
    """setup(name) -> rows for that route; the routes `tsg.route` picked are in `.seen`. The
    unfused pieces (norm kernels, qkv_to_cache) run their Triton kernels here too, not the
    dispatcher's CPU reference; "small" lets the small GEMM take what it takes with PDL, "torch"
    keeps it from taking it (on a GPU with PDL the small GEMM would take those rows too)."""
    dispatch.load_kernels()
    for name in ("rms_norm", "add_bias_residual_layer_norm", "qkv_to_cache", "gated_act", "bias_gelu"):
        monkeypatch.setattr(dispatch, name, dispatch._KERNELS[name])
    seen = []
    real = tsg.route

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(tsg, "route", spy)

    def setup(name):
        if name in ("small", "torch"):
            monkeypatch.setattr(tsg, "_prefetched", lambda x: name == "small")
        return {"gemv-1": 1, "gemv-2": 2}.get(name, 5)

    setup.seen = seen
    return setup


EXPECTED_ROUTE = {"gemv-1": tsg.GEMV, "gemv-2": tsg.GEMV, "small": tsg.SMALL_GEMM, "torch": tsg.TORCH}


def _qkv_both(rand, m, x, p, w, b, heads, kv_heads, d, rotary, q_norm, k_norm, atol=1e-4, rtol=1e-4):
    """prenorm_qkv_to_cache by the kernels and by the reference on equal inputs: q, both caches
    (written slots and untouched ones) and the residual stream agree."""
    table = rand(m, 2, d // 2, dtype=torch.float32)
    cos, sin = (table[:, 0], table[:, 1]) if rotary else (None, None)
    kc, vc = cache_pair(rand, 3, 4, kv_heads, d)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.randperm(12, generator=rand.gen, device=DEVICE)[:m]
    pr = twin(p) if p is not None else None
    q = tsg.prenorm_qkv_to_cache(x, p, w, b, heads, kv_heads, d, cos, sin, kc, vc, slots, q_norm, k_norm, 1e-6)
    q_ref = ref.prenorm_qkv_to_cache(x, pr, w, b, heads, kv_heads, d, cos, sin, kc_ref, vc_ref, slots,
                                     q_norm, k_norm, 1e-6)
    assert q.shape == (m, heads, d)
    for got, want in ((q, q_ref), (kc, kc_ref), (vc, vc_ref)):
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    if p is not None and p.sum_out is not None:
        torch.testing.assert_close(p.sum_out, pr.sum_out, atol=atol / 10, rtol=rtol / 10)


HEAD_NORM_CASES = [  # (heads, kv_heads, d, rotary, bias, norms, prenorm)
    (4, 2, 32, True, False, "qk", "rms+x_norm"),  # Gemma 3: GQA, the sandwich norm before, rotary
    (2, 2, 32, False, True, "qk", "rms"),  # no rotary, a QKV bias
    (4, 2, 96, True, True, "q", None),  # q's norm alone, Phi-3's head_dim, no PreNorm
    (2, 1, 256, True, False, "k", "rms+x_norm-no-residual"),  # k's alone, Gemma's head_dim 256
    (4, 4, 32, True, False, "qk-whole", "sum"),  # OLMo 2: whole-width norms after a post-norm block
]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("heads,kv_heads,d,rotary,with_bias,norms,prenorm", HEAD_NORM_CASES)
def test_qkv_head_norms_through_every_route(on_route, route, heads, kv_heads, d, rotary, with_bias, norms, prenorm):
    """q/k RMSNorm per head before rotary: the projection runs on its plain route (the GEMV with
    the PreNorm in its prologue; the small GEMM; torch) and the qkv_to_cache kernel does the rest."""
    m = on_route(route)
    rand = Rand("head-norms", route, heads, kv_heads, d, rotary, with_bias, norms, prenorm)
    k_dim = 48
    x = rand(m, k_dim, mean=1.0)
    p = None
    if prenorm:
        p = make_prenorm(rand, m, k_dim, prenorm.split("+")[0], False, "no-residual" not in prenorm, True,
                         x_norm="x_norm" in prenorm)
    n = (heads + 2 * kv_heads) * d
    w, b = rand(n, k_dim, std=k_dim ** -0.5), rand(n, std=0.3) if with_bias else None
    whole = "whole" in norms  # one norm over all of a token's q (k) heads: weights [H * D] ([Hkv * D])
    q_norm = rand(d * (heads if whole else 1), std=0.3, mean=1.0) if "q" in norms else None
    k_norm = rand(d * (kv_heads if whole else 1), std=0.3, mean=1.0) if "k" in norms else None
    _qkv_both(rand, m, x, p, w, b, heads, kv_heads, d, rotary, q_norm, k_norm)
    assert on_route.seen[0] == EXPECTED_ROUTE[route]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("with_residual", [True, False])
def test_qkv_post_norm_prenorm_through_every_route(on_route, route, with_residual):
    """Gemma's sandwich: RMSNorm(x + x_bias) * x_norm rounded, + the residual, written as the
    next residual stream, then the pre-norm: fused in the GEMV's prologue, two norm kernels
    before the other routes; the fused QKV epilogue after (no head norms)."""
    m = on_route(route)
    rand = Rand("post-norm-qkv", route, with_residual)
    k_dim, heads, kv_heads, d = 40, 4, 2, 16
    x = rand(m, k_dim, mean=1.0, std=2.0)
    p = make_prenorm(rand, m, k_dim, "rms", True, with_residual, True, x_norm=True)
    n = (heads + 2 * kv_heads) * d
    w, b = rand(n, k_dim, std=k_dim ** -0.5), rand(n, std=0.3)
    _qkv_both(rand, m, x, p, w, b, heads, kv_heads, d, True, None, None)
    assert on_route.seen[0] == EXPECTED_ROUTE[route]


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("heads,kv_heads,d", [(4, 2, 96), (2, 1, 256)])
def test_fused_qkv_epilogue_at_phi3_and_gemma_head_dims(on_route, m, heads, kv_heads, d):
    """Head dims whose half is no power of two (96: tiles with masked columns) and the widest
    (256), GQA, rotary and a bias, in the GEMV's and the small GEMM's QKV epilogue."""
    rand = Rand("head-dims", m, heads, d)
    k_dim = 32
    n = (heads + 2 * kv_heads) * d
    x, w, b = rand(m, k_dim), rand(n, k_dim, std=k_dim ** -0.5), rand(n, std=0.3)
    p = make_prenorm(rand, m, k_dim, "rms", False, True, True) if m == 1 else None
    _qkv_both(rand, m, x, p, w, b, heads, kv_heads, d, True, None, None)
    assert on_route.seen[0] == (tsg.GEMV if m == 1 else tsg.SMALL_GEMM)


@pytest.mark.parametrize("route", ROUTES)
def test_fp32_norm_weights_with_half_activations(on_route, route):
    """Gemma keeps its norm weights (1 + w) in fp32 beside fp16/bf16 activations: the PreNorm's
    weight and x_norm, and the q/k norms, are read as they are by every route's kernels."""
    m = on_route(route)
    rand = Rand("fp32-norms", route, dtype=torch.float16)
    k_dim, heads, kv_heads, d = 48, 2, 1, 32
    x = rand(m, k_dim)
    p = make_prenorm(rand, m, k_dim, "rms", False, True, True, x_norm=True, norm_dtype=torch.float32)
    n = (heads + 2 * kv_heads) * d
    w = rand(n, k_dim, std=k_dim ** -0.5)
    q_norm, k_norm = rand(d, mean=1.0, std=0.3, dtype=torch.float32), rand(d, mean=1.0, std=0.3, dtype=torch.float32)
    _qkv_both(rand, m, x, p, w, None, heads, kv_heads, d, True, q_norm, k_norm, atol=2e-2, rtol=1e-2)
    assert on_route.seen[0] == EXPECTED_ROUTE[route]


def test_post_norm_needs_an_rms_prenorm():
    w = torch.ones(8)
    with pytest.raises(ValueError, match="x_norm"):
        PreNorm(w, torch.zeros(8), 1e-6, x_norm=w)


# ---- GPU: the new families' QKV shapes -------------------------------------------------------------

@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 2, 16, 64, 300])
@pytest.mark.parametrize("name,heads,kv_heads,d,k,norms,post", [
    ("qwen3-8b", 32, 8, 128, 4096, True, False), ("gemma3-4b", 8, 4, 256, 2560, True, True),
    ("gemma2-2b", 8, 4, 256, 2304, False, True), ("phi3-mini", 32, 32, 96, 3072, False, False)])
def test_gpu_new_family_qkv(m, name, heads, kv_heads, d, k, norms, post):
    rand = Rand("gpu-families-qkv", name, m, dtype=torch.bfloat16)
    x = rand(m, k)
    p = make_prenorm(rand, m, k, "rms", False, True, True, x_norm=post, norm_dtype=torch.float32)
    n = (heads + 2 * kv_heads) * d
    w = rand(n, k, std=k ** -0.5)
    table = rand(m, 2, d // 2, dtype=torch.float32)
    q_norm = rand(d, mean=1.0, std=0.3, dtype=torch.float32) if norms else None
    k_norm = rand(d, mean=1.0, std=0.3, dtype=torch.float32) if norms else None
    kc, vc = cache_pair(rand, 32, 16, kv_heads, d)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.randperm(512, device=DEVICE)[:m]
    pr = twin(p)
    q = dispatch.prenorm_qkv_to_cache(x, p, w, None, heads, kv_heads, d, table[:, 0], table[:, 1], kc, vc, slots,
                                      q_norm, k_norm, 1e-6)
    q_ref = ref.prenorm_qkv_to_cache(x, pr, w, None, heads, kv_heads, d, table[:, 0], table[:, 1], kc_ref, vc_ref,
                                     slots, q_norm, k_norm, 1e-6)
    for got, want in ((q, q_ref), (kc, kc_ref), (vc, vc_ref), (p.sum_out, pr.sum_out)):
        torch.testing.assert_close(got.float(), want.float(), atol=6e-2, rtol=2e-2)


@pytest.mark.gpu
@gpu
def test_gpu_timing_head_norm_route(capsys):
    """Not a pass/fail benchmark: what the q/k head norms cost a decode row of Qwen3-8B's QKV op
    (the GEMV writes plain qkv, then the qkv_to_cache kernel: one launch more) next to the same op
    without them (all in the GEMV), both replayed in a CUDA graph of 20 calls. -s shows it."""
    from tests.test_kernels_gemv import _graph_us

    heads, kv_heads, d, k = 32, 8, 128, 4096
    lines = []
    for m in (1, 2):
        rand = Rand("gpu-head-norm-timing", m, dtype=torch.bfloat16)
        x, w = rand(m, k), rand((heads + 2 * kv_heads) * d, k, std=k ** -0.5)
        p = make_prenorm(rand, m, k, "rms", False, True, True, norm_dtype=torch.float32)
        table = rand(m, 2, d // 2, dtype=torch.float32)
        kc, vc = cache_pair(rand, 64, 16, kv_heads, d)
        slots = torch.arange(m, device=DEVICE)
        norms = rand(d, mean=1.0, dtype=torch.float32), rand(d, mean=1.0, dtype=torch.float32)

        def op(q_norm, k_norm):
            return lambda: dispatch.prenorm_qkv_to_cache(x, p, w, None, heads, kv_heads, d, table[:, 0],
                                                         table[:, 1], kc, vc, slots, q_norm, k_norm, 1e-6)

        fused, normed = _graph_us(op(None, None)), _graph_us(op(*norms))
        lines.append(f"qwen3-8b QKV m={m}: fused in the GEMV {fused:6.1f} us, with q/k norms (GEMV + "
                     f"qkv_to_cache) {normed:6.1f} us, +{normed - fused:.1f} us")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
