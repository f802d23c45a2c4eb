"""The prefetching decode-row GEMV (kernels/triton_gemv.py) against the reference ops, on fresh
seeded random inputs: fp32 in Triton's CPU interpreter with odd sizes (and long
rows on shrunken limits); the GPT-2, Llama-1B and newer families' layer shapes in fp16 on a
GPU, there also chained inside a CUDA graph with programmatic dependent launch (each kernel
must see its predecessor's writes), and the long-row GEMV timed against cuBLAS."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: Triton kernels cannot run", allow_module_level=True)

from tests.test_kernels_prenorm_linear import Rand, make_prenorm, twin  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels import triton_gemv  # noqa: E402
from tritonformer.kernels import triton_small_gemm as tsg  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

PRENORMS = [  # (norm, x_bias, residual, sum_out, x_norm): GPT-2's MLP input, Llama's, a bare LayerNorm,
    # Gemma's sandwich (the post-norm of x before the residual add), one with no residual, and a
    # post-norm block's (OLMo 2's: the post-norm of x plus the residual, no norm after)
    ("layer", True, True, True, False), ("rms", False, True, True, False), ("layer", False, False, False, False),
    ("rms", True, True, True, True), ("rms", False, False, True, True), ("sum", False, True, True, True),
]
GATED = sorted(ref.GATED_ACTIVATIONS)


@pytest.fixture
def launches(monkeypatch):
    """The row counts the GEMV kernel was launched for."""
    seen = []
    real = triton_gemv.launch

    def spy(x, *args, **kwargs):
        seen.append(x.shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(triton_gemv, "launch", spy)
    return seen


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_tanh", "relu2", "relu", "silu_mul", "gelu_tanh_mul"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_reference(m, activation, with_bias, launches):
    rand = Rand("gemv", m, activation, with_bias)
    k, n = 40, 24  # neither a power of two: masked lanes in K and in the last column tile
    w = rand(2 * n if activation in GATED else n, k, std=k ** -0.5)
    b = rand(w.shape[0]) if with_bias else None
    x = rand(m, k)
    out = tsg.linear_act(x, w, b, activation)
    torch.testing.assert_close(out, ref.linear_act(x, w, b, activation), atol=2e-5, rtol=2e-5)
    assert launches == [m]


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("activation", ["gelu_tanh", "silu_mul", "gelu_tanh_mul"])
@pytest.mark.parametrize("norm,with_bias,with_residual,write_sum,x_norm", PRENORMS)
def test_prenorm_linear_matches_reference(m, activation, norm, with_bias, with_residual, write_sum, x_norm,
                                          launches):
    rand = Rand("gemv-prenorm", m, activation, norm, with_bias, with_residual, x_norm)
    k, n = 48, 20
    w = rand(2 * n if activation in GATED else n, k, std=k ** -0.5)
    b = rand(w.shape[0])
    x = rand(m, k, std=2.0, mean=1.0)
    p = make_prenorm(rand, m, k, norm, with_bias, with_residual, write_sum, x_norm=x_norm)
    p_ref = twin(p)
    out = tsg.linear_act(x, w, b, activation, prenorm=p)
    torch.testing.assert_close(out, ref.linear_act(x, w, b, activation, prenorm=p_ref), atol=2e-5, rtol=2e-5)
    if write_sum:
        torch.testing.assert_close(p.sum_out, p_ref.sum_out, atol=1e-6, rtol=1e-6)
    assert launches == [m]


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("norm,x_norm", [("rms", True), ("rms", False), ("sum", True)])
def test_prenorm_scales_its_sum(m, norm, x_norm, launches):
    """PreNorm.sum_scale (Gemma 4's layer scalar closing the layer before): the sum times the scale is the
    residual stream written and what the norm reads (or, a post-norm block's, the operand itself), in the
    GEMV's prologue (one row) and in the norm kernels before it (two rows), as the reference computes it."""
    rand = Rand("gemv-sum-scale", m, norm, x_norm)
    k, n = 48, 20
    w = rand(n, k, std=k ** -0.5)
    x = rand(m, k, std=2.0, mean=1.0)
    p = replace(make_prenorm(rand, m, k, norm, False, True, True, x_norm=x_norm), sum_scale=rand(1, std=0.1, mean=0.4))
    p_ref = twin(p)
    out = tsg.linear_act(x, w, None, prenorm=p)
    torch.testing.assert_close(out, ref.linear_act(x, w, None, prenorm=p_ref), atol=2e-5, rtol=2e-5)
    h = x if p.x_norm is None else ref.rms_norm(x, p.x_norm, p.eps)[0]
    torch.testing.assert_close(p.sum_out, (h + p.residual) * p.sum_scale, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(p_ref.sum_out, p.sum_out, atol=1e-6, rtol=1e-6)
    assert launches == [m]


@pytest.mark.parametrize("m", [1, 2, triton_gemv.MAX_ROWS + 3])
@pytest.mark.parametrize("norm,with_bias,with_residual,write_sum,x_norm", PRENORMS)
def test_prenorm_writes_the_rows_it_normalised(m, norm, with_bias, with_residual, write_sum, x_norm, launches):
    """PreNorm.normed_out (a MoE block's router linear, whose experts read the rows after it):
    written whole, by the GEMV's program 0 over several column tiles (m <= MAX_ROWS) or by the
    norm kernel of the other routes, as reference.prenormed writes them; the linear unchanged."""
    rand = Rand("gemv-normed-out", m, norm, with_bias, with_residual, x_norm)
    k, n = 48, 40  # in the interpreter 16 columns a program: three column tiles
    w = rand(n, k, std=k ** -0.5)
    x = rand(m, k, std=2.0, mean=1.0)
    p = make_prenorm(rand, m, k, norm, with_bias, with_residual, write_sum, x_norm=x_norm)
    p = replace(p, normed_out=torch.full((m, k), float("nan"), device=DEVICE))
    p_ref = replace(twin(p), normed_out=torch.full((m, k), float("nan"), device=DEVICE))
    out = tsg.linear_act(x, w, None, prenorm=p)
    torch.testing.assert_close(out, ref.linear_act(x, w, None, prenorm=p_ref), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(p.normed_out, p_ref.normed_out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(p.normed_out, ref.prenormed(x, twin(p)), atol=1e-6, rtol=1e-6)
    if write_sum:
        torch.testing.assert_close(p.sum_out, p_ref.sum_out, atol=1e-6, rtol=1e-6)
    assert launches == ([m] if m <= triton_gemv.MAX_ROWS else [])


@pytest.mark.parametrize("prenorm_rows", [0, 1])
def test_rows_past_prenorm_rows_run_the_norm_first(prenorm_rows, monkeypatch):
    """Past triton_gemv.PRENORM_ROWS (up to MAX_ROWS) a PreNorm runs as its own kernel and the GEMV
    without a prologue, for a linear and for the QKV projection: the same results, the residual
    sum written all the same."""
    monkeypatch.setattr(triton_gemv, "PRENORM_ROWS", prenorm_rows)
    norms, real = [], triton_gemv.launch

    def spy(x, *args, **kwargs):
        norms.append((x.shape[0], kwargs["norm_code"]))
        return real(x, *args, **kwargs)

    monkeypatch.setattr(triton_gemv, "launch", spy)
    k, n, heads, kv_heads, d = 48, 24, 2, 1, 16
    for m in (1, 2):
        rand = Rand("gemv-prenorm-rows", prenorm_rows, m)
        x, w = rand(m, k, std=2.0, mean=1.0), rand(2 * n, k, std=k ** -0.5)
        p = make_prenorm(rand, m, k, "layer", True, True, True)
        p_ref = twin(p)
        out = tsg.linear_act(x, w, None, "silu_mul", prenorm=p)
        torch.testing.assert_close(out, ref.linear_act(x, w, None, "silu_mul", prenorm=p_ref), atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(p.sum_out, p_ref.sum_out, atol=1e-6, rtol=1e-6)
        w_qkv, table = rand((heads + 2 * kv_heads) * d, k, std=k ** -0.5), rand(m, 2, d // 2)
        kc, vc = rand(2, 8, kv_heads, d), rand(2, 8, kv_heads, d)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        slots = torch.arange(m, device=DEVICE) + 3
        p = make_prenorm(rand, m, k, "rms", False, True, True)
        p_ref = twin(p)
        q = tsg.prenorm_qkv_to_cache(x, p, w_qkv, None, heads, kv_heads, d, table[:, 0], table[:, 1], kc, vc, slots)
        q_ref = ref.prenorm_qkv_to_cache(x, p_ref, w_qkv, None, heads, kv_heads, d, table[:, 0], table[:, 1], kc_ref,
                                         vc_ref, slots)
        for got, want in ((q, q_ref), (kc, kc_ref), (vc, vc_ref), (p.sum_out, p_ref.sum_out)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    fused = {m: m <= prenorm_rows for m in (1, 2)}
    assert norms == [(m, code) for m in (1, 2) for code in ((1, 2) if fused[m] else (0, 0))]


def test_more_rows_than_max_rows_run_the_other_kernels(monkeypatch, launches):
    """Past MAX_ROWS: the norm kernel, then the small GEMM (an activation) or torch's GEMM."""
    monkeypatch.setattr(tsg, "MAX_ROWS", 64)
    rand = Rand("gemv-past-rows")
    m, k, n = triton_gemv.MAX_ROWS + 1, 32, 16
    x, w, b = rand(m, k), rand(n, k), rand(n)
    p = make_prenorm(rand, m, k, "layer", True, True, True)
    p_ref = twin(p)
    out = tsg.linear_act(x, w, b, "gelu_tanh", prenorm=p)
    torch.testing.assert_close(out, ref.linear_act(x, w, b, "gelu_tanh", prenorm=p_ref), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(p.sum_out, p_ref.sum_out)
    torch.testing.assert_close(tsg.linear_act(x, w), ref.linear_act(x, w), atol=2e-5, rtol=2e-5)
    assert launches == []


@pytest.mark.parametrize("half,k,rows,paired,expected", [
    (768, 768, 1, False, 8), (768, 3072, 1, False, 2), (2048, 2048, 1, True, 2), (32, 768, 2, True, 2),
    (2, 768, 1, False, 2), (768, 2 ** 15, 1, False, 1),
])
def test_block_n_keeps_the_weight_slab_in_the_register_budget(half, k, rows, paired, expected):
    assert triton_gemv.block_n(half, k, rows, paired) == expected


def test_block_n_counts_bytes_and_doubles_under_a_post_norm():
    """FP8 weights hold four times the rows of fp16 ones (twice the bytes); a post-norm prologue
    (recomputed by every program) gets twice the rows to amortise it."""
    assert triton_gemv.block_n(2048, 4096, 1, False) == 2
    assert triton_gemv.block_n(2048, 4096, 1, False, element_size=1) == 8
    assert triton_gemv.block_n(1024, 4096, 1, True) == 1
    assert triton_gemv.block_n(1024, 4096, 1, True, post_norm=True) == 2
    assert triton_gemv.block_n(1024, 4096, 2, True, post_norm=True) == 1
    # two rows: E4M3 weights hold as many weight rows as at one (_TWO_ROW_FACTOR), 16-bit ones half
    assert triton_gemv.block_n(2048, 4096, 2, False, element_size=1) == 8
    assert triton_gemv.block_n(2048, 4096, 2, False) == 1


def test_block_n_gives_large_16_bit_weights_twice_the_bytes():
    """From _LARGE_WEIGHT_BYTES of 16-bit weights (counted over both halves of a paired weight,
    over every head of a QKV projection and over the whole row) a program holds twice the rows;
    FP8 weights keep their own factor."""
    large = triton_gemv._LARGE_WEIGHT_BYTES
    assert large is not None
    k = 4096
    half = large // (2 * k)  # exactly large bytes
    assert triton_gemv.block_n(half, k, 1, False) == 2 * triton_gemv.block_n(half - 1, k, 1, False) == 4
    assert triton_gemv.block_n(half // 2, k, 1, True) == 2 * triton_gemv.block_n(half // 2 - 1, k, 1, True)
    assert triton_gemv.block_n(half, k, 1, False, element_size=1) == 8
    assert triton_gemv.block_n(half // 8, k, 1, False, weight_k=8 * k) == 4
    # a QKV projection's `half` is half of one head: its heads count too (Llama-3-8B's 48 heads of 128)
    assert triton_gemv.block_n(64, k, 1, True, halves=48) == 2 * triton_gemv.block_n(64, k, 1, True) == 2


def test_block_n_gives_padded_16_bit_rows_twice_the_bytes(monkeypatch):
    """Weights of _PADDED_K_MIN_BYTES or more whose rows pad to the next power of two by _PADDED_K_MIN or more
    (K 6,144 in 8,192 lanes) hold twice the bytes a program, unless a post-norm prologue runs; FP8 weights, rows
    padded less (K 7,168) and smaller weights (GPT-2's down projection, K 3,072) as before. (Long rows' own
    factor set aside: the next test.)"""
    monkeypatch.setattr(triton_gemv, "_LONG_K_FACTOR", 1)
    assert 1024 * 6144 * 2 >= triton_gemv._PADDED_K_MIN_BYTES > 768 * 3072 * 2

    def rows(k, **kw):
        return triton_gemv.block_n(1024, 8192, 1, False, weight_k=k, **kw)

    assert rows(6144) == 2 * rows(8192) == 2
    assert rows(7168) == rows(8192)
    assert rows(6144, post_norm=True) == rows(8192, post_norm=True)
    assert rows(6144, element_size=1) == rows(8192, element_size=1)
    assert triton_gemv.block_n(768, 4096, 1, False, weight_k=3072) == triton_gemv.block_n(768, 4096, 1, False)


def test_block_n_gives_long_16_bit_rows_twice_the_bytes(monkeypatch):
    """16-bit weights of _LONG_K_MIN_BYTES or more with rows of _LONG_K_MIN elements or more (Llama-3-70B's 8,192 a
    rank at TP=2, a down projection's 14,336), up to _MAX_K and not padded, hold twice the bytes a program (padded
    ones have their own factor, not both); smaller weights, FP8 weights, post-norm prologues, shorter rows and the
    long program's rows past _MAX_K as before."""
    assert triton_gemv._LONG_K_MIN == 8192 and triton_gemv._LONG_K_FACTOR == 2
    assert 4096 * 8192 * 2 >= triton_gemv._LONG_K_MIN_BYTES > 2048 * 8192 * 2

    def rows(k, half=4096, **kw):
        return triton_gemv.block_n(half, triton.next_power_of_2(k), 1, False, weight_k=k, **kw)

    long_k, small, fp8_long, post_long, short, padded, past = (
        rows(8192), rows(8192, half=2048), rows(8192, element_size=1), rows(8192, post_norm=True), rows(4096),
        rows(6144), triton_gemv.block_n(1024, 32768, 1, False, 8))
    assert (long_k, rows(14336), small) == (4, 2, 2)
    monkeypatch.setattr(triton_gemv, "_LONG_K_FACTOR", 1)
    assert rows(8192) == long_k // 2 and rows(14336) == 1
    assert (small, fp8_long, post_long, short, padded, past) == (
        rows(8192, half=2048), rows(8192, element_size=1), rows(8192, post_norm=True), rows(4096), rows(6144),
        triton_gemv.block_n(1024, 32768, 1, False, 8))


@pytest.fixture
def long_rows(monkeypatch):
    """Long rows on interpreter-sized limits: past 32 elements only one row of a plain linear
    without a PreNorm runs the GEMV, up to MAX_LONG_K = 128. Records each GEMV launch's padded
    row width (KP) in the returned list."""
    monkeypatch.setattr(triton_gemv, "_MAX_K", 32)
    monkeypatch.setattr(triton_gemv, "MAX_LONG_K", 128)
    widths, real = [], triton_gemv._gemv_kernel

    class Spy:
        def __getitem__(self, grid):
            def call(*args, **kwargs):
                widths.append(kwargs["KP"])
                return real[grid](*args, **kwargs)
            return call

    monkeypatch.setattr(triton_gemv, "_gemv_kernel", Spy())
    return widths


@pytest.mark.parametrize("activation,with_bias", [("none", True), ("none", False), ("gelu", True), ("relu2", False)])
@pytest.mark.parametrize("k", [72, 64, 20])  # past the limit, ragged; past it, a power of two; within it
def test_one_long_row_matches_reference(long_rows, activation, with_bias, k, launches):
    """One decode row of a plain linear past _MAX_K: one program holds its whole padded row."""
    rand = Rand("gemv-long-row", activation, with_bias, k)
    n = 40  # three column tiles of 16 in the interpreter, the last one ragged
    w = rand(n, k, std=k ** -0.5)
    b = rand(n) if with_bias else None
    x = rand(1, k)
    out = tsg.linear_act(x, w, b, activation)
    torch.testing.assert_close(out, ref.linear_act(x, w, b, activation), atol=2e-5, rtol=2e-5)
    assert launches == [1] and long_rows == [triton.next_power_of_2(k)]


@pytest.mark.parametrize("head_norms", [False, True])
def test_long_qkv_rows_without_a_prenorm(long_rows, head_norms, launches):
    """A QKV projection of a long row and no PreNorm: its fused epilogue would hold two halves
    of a head, so it leaves the GEMV for the small GEMM; with head norms the projection is a
    plain linear (in the GEMV) before the qkv_to_cache kernel."""
    rand = Rand("gemv-long-qkv", head_norms)
    k, heads, kv_heads, d = 56, 2, 1, 16
    n = (heads + 2 * kv_heads) * d
    x, w, b = rand(1, k), rand(n, k, std=k ** -0.5), rand(n, std=0.3)
    table = rand(1, 2, d // 2)
    kc, vc = rand(2, 4, kv_heads, d), rand(2, 4, kv_heads, d)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.tensor([5], device=DEVICE)
    norms = (rand(d, mean=1.0), rand(d, mean=1.0)) if head_norms else (None, None)
    q = tsg.prenorm_qkv_to_cache(x, None, w, b, heads, kv_heads, d, table[:, 0], table[:, 1], kc, vc, slots, *norms)
    q_ref = ref.prenorm_qkv_to_cache(x, None, w, b, heads, kv_heads, d, table[:, 0], table[:, 1], kc_ref, vc_ref,
                                     slots, *norms)
    for got, want in ((q, q_ref), (kc, kc_ref), (vc, vc_ref)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert (launches, long_rows) == (([1], [64]) if head_norms else ([], []))


def test_long_rows_that_leave_the_gemv(long_rows, monkeypatch, launches):
    """Past _MAX_K the GEMV takes only what fits its long program: not a PreNorm (the norm
    kernel first, then the small GEMM for an activation), not a gated activation, not two rows
    (each wants twice the registers), not a row past MAX_LONG_K. Each still matches."""
    rand = Rand("gemv-long-leave")
    k = 48
    x, w, b = rand(1, k), rand(16, k, std=k ** -0.5), rand(16)
    p = make_prenorm(rand, 1, k, "rms", False, True, True)
    assert not triton_gemv.supported(1, x, p) and triton_gemv.supported(1, x)
    assert not triton_gemv.supported(1, x, plain=False) and not triton_gemv.supported(2, rand(2, k))
    assert tsg.route(x, w, "gelu_tanh", p) == tsg.SMALL_GEMM
    p_ref = twin(p)
    out = tsg.linear_act(x, w, b, "gelu_tanh", prenorm=p)
    torch.testing.assert_close(out, ref.linear_act(x, w, b, "gelu_tanh", prenorm=p_ref), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(p.sum_out, p_ref.sum_out)
    gate_up, x2 = rand(32, k, std=k ** -0.5), rand(2, k)
    for rows, weight, act in ((x, gate_up, "silu_mul"), (x2, w, "none")):
        torch.testing.assert_close(tsg.linear_act(rows, weight, None, act), ref.linear_act(rows, weight, None, act),
                                   atol=2e-5, rtol=2e-5)
    assert launches == []
    monkeypatch.setattr(triton_gemv, "MAX_LONG_K", 40)
    assert not triton_gemv.supported(1, x)


def _layer_shapes():
    """(name, N, K, activation, norm): one decoder layer's linears, GPT-2 and Llama-1B; Gemma-2-2B's
    GeGLU with its sandwich norm; the down projections past four warps' registers (a long program)
    of AFM-4.5B (K = 18,432), Qwen2.5-7B (K = 18,944) and Qwen2.5-72B (K = 29,568)."""
    return [("gpt2 o", 768, 768, "none", None), ("gpt2 fc", 3072, 768, "gelu_tanh", "layer"),
            ("gpt2 proj", 768, 3072, "none", None), ("llama o", 2048, 2048, "none", None),
            ("llama gate_up", 8192, 2048, "silu_mul", "rms"), ("llama down", 2048, 8192, "none", None),
            ("gemma2 gate_up", 9216, 2304, "gelu_tanh_mul", "rms+x_norm"),
            ("afm-4.5b down", 4096, 18432, "none", None), ("qwen2.5-7b down", 3584, 18944, "none", None),
            ("qwen2.5-72b down", 8192, 29568, "none", None)]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("name,n,k,activation,norm", _layer_shapes())
def test_gpu_layer_shapes(m, name, n, k, activation, norm):
    rand = Rand("gemv-gpu", name, m, dtype=torch.float16)
    w = rand(2 * n if activation in GATED else n, k, std=k ** -0.5)
    b = rand(w.shape[0], std=0.1) if name.startswith("gpt2") else None
    x = rand(m, k)
    p = None
    if norm:
        p = make_prenorm(rand, m, k, norm.split("+")[0], norm == "layer", True, True, x_norm="x_norm" in norm,
                         norm_dtype=torch.float32 if "x_norm" in norm else None)
    p_ref = twin(p) if p else None
    out = tsg.linear_act(x, w, b, activation, prenorm=p)
    expected = ref.linear_act(x, w, b, activation, prenorm=p_ref)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    if p is not None:
        torch.testing.assert_close(p.sum_out, p_ref.sum_out)


@pytest.mark.gpu
@gpu
def test_gpu_chain_in_a_cuda_graph_sees_every_predecessor():
    """Twelve GPT-2 MLPs chained through one residual stream, replayed in a CUDA graph (PDL on
    where the GPU has it): equal to the same ops run eagerly, and to the reference."""
    from tritonformer.backend.cuda_graphs import capture_graph

    rand = Rand("gemv-chain", dtype=torch.float16)
    k, n = 768, 3072
    layers = [(rand(k, std=0.1, mean=1.0), rand(k, std=0.1), rand(n, k, std=k ** -0.5), rand(n, std=0.1),
               rand(k, n, std=n ** -0.5), rand(k, std=0.1)) for _ in range(12)]
    x0, res0 = rand(1, k), rand(1, k)

    def run(ops, x, res):
        for ln_w, ln_b, fc_w, fc_b, proj_w, proj_b in layers:
            p = ref.PreNorm(ln_w, ln_b, 1e-5, None, res, torch.empty_like(res))
            x = ops.linear_act(ops.linear_act(x, fc_w, fc_b, "gelu_tanh", prenorm=p), proj_w, proj_b)
            res = p.sum_out
        return x + res

    eager = run(tsg, x0, res0)
    graph, out = capture_graph(lambda: run(tsg, x0, res0))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
    torch.testing.assert_close(out, run(ref, x0, res0), atol=5e-2, rtol=5e-2)


def _graph_us(fn, calls=20, reps=20):
    """Microseconds per call of `fn`, `calls` of them replayed in one CUDA graph (no launch
    gaps; with PDL each kernel overlaps the one before, as in a decode step)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * calls)


@pytest.mark.gpu
@gpu
def test_gpu_timing_long_row_gemv_vs_cublas(capsys):
    """Not a pass/fail benchmark: the decode-row GEMV against cuBLAS (triton_gemv.MAX_ROWS = 0
    sends the rows to the small GEMM / cuBLAS route) on long down projections, the long program's
    (Qwen2.5-7B K = 18,944, 72B K = 29,568) next to the single-tile path's (Llama-3-8B K =
    14,336), fp16, 1 and 2 rows; GB/s of weights streamed. -s shows it."""
    lines = []
    for name, n, k in (("llama3-8b down", 4096, 14336), ("qwen2.5-7b down", 3584, 18944),
                       ("qwen2.5-72b down", 8192, 29568)):
        rand = Rand("gemv-timing", name, dtype=torch.float16)
        w = rand(n, k, std=k ** -0.5)
        for m in (1, 2):
            x = rand(m, k)
            out = torch.empty(m, n, dtype=torch.float16, device=DEVICE)
            saved_long = triton_gemv.MAX_LONG_K
            try:
                triton_gemv.MAX_LONG_K = 1 << 15  # long rows on, whatever the default
                ours = _graph_us(lambda: tsg.linear_act(x, w, out=out))
            finally:
                triton_gemv.MAX_LONG_K = saved_long
            saved = triton_gemv.MAX_ROWS
            try:
                triton_gemv.MAX_ROWS = 0
                other = _graph_us(lambda: tsg.linear_act(x, w, out=out))
            finally:
                triton_gemv.MAX_ROWS = saved
            cublas = _graph_us(lambda: torch.mm(x, w.t(), out=out))
            gbs = w.numel() * 2 / ours / 1e3
            lines.append(f"{name:17s} m={m} K={k:6d}: GEMV{' (long row)' if k > triton_gemv._MAX_K else ''} "
                         f"{ours:7.1f} us ({gbs:5.0f} GB/s), without the GEMV {other:7.1f} us, "
                         f"cuBLAS mm {cublas:7.1f} us, cuBLAS / GEMV {cublas / ours:.2f}x")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
