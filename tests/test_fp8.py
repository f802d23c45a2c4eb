"""FP8 (E4M3) linears (kernels/fp8.py, kernels/triton_fp8.py, backend/quantization.py).

On the CPU: weight quantisation's error bounds on fresh random weights; the GEMV and the small
GEMM reading FP8 weights in Triton's interpreter against reference.fp8_linear (fp32 and fp16
activations, PreNorms, gated activations, the QKV epilogue, split K, the GEMV's long rows); the
per-token activation quantisation kernel, the FFN activation fused into it and the LayerNorm
writing its output's E4M3 copy (fp8.Fp8Activation); the many-row route's wiring (torch._scaled_mm
runs on the CPU too), an FFN handing its activation on quantised, and `route`'s FP8 cases; a
random Llama-family decoder and a random BERT with quantization fp8 against the same models
unquantised, and the BERT's linears taking their inputs quantised; an FP8 checkpoint folder (E4M3 weights
+ weight_scale, per channel and per tensor, with input_scale) loading as FP8 without the
parameter; the load errors. The accuracy targets on the real checkpoints, on the CPU's
reference path: MiniLM's fp8 embeddings against fp32 Hugging Face (cosine >= 0.995) and
SmolLM2's perplexity of tests/data/fp8_eval.txt within 2% of fp32 (slow; the decoder's first
and last layers stay 16-bit, see backend/quantization.py).

The interpreter rounds fp32 -> E4M3 wrongly where a value rounds up into the next binade
(125.1 becomes 64, not 128; Triton 3.9 on the CPU; a GPU converts in hardware), rounds E4M3's
subnormals toward zero and exact ties away from zero: the activation quantisation kernels are
compared exactly on a GPU only, on the CPU up to those. Loading E4M3 values and converting
them to fp32 / fp16 is exact in the interpreter.

On a GPU (marked gpu): the three routes on Llama-3.1-8B's layer shapes against the reference,
bert-base's FFN and encoder with the fused activation quantisation against the unfused path,
and a decoder of real width (Llama-3.1-8B's layer, 2 layers) in fp8 against bf16, eager and in
the decode CUDA graphs.
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: Triton kernels cannot run", allow_module_level=True)

from tritonformer.backend import quantization  # noqa: E402
from tritonformer.backend.models.decoder import load_decoder  # noqa: E402
from tritonformer.client.perplexity import perplexity  # noqa: E402
from tritonformer.kernels import arrival_counters, fp8, triton_fp8, triton_gemv  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels import triton_small_gemm as tsg  # noqa: E402
from tritonformer.kernels.fp8 import Fp8Weight, quantize_weight  # noqa: E402
from tests.test_kernels_prenorm_linear import Rand, make_prenorm, twin  # noqa: E402

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
GATED = sorted(ref.GATED_ACTIVATIONS)
EVAL_TEXT = Path(__file__).parent / "data" / "fp8_eval.txt"


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


# ---- the weight type ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,std", [((48, 96), 1.0), ((7, 33), 1e-3), ((64, 16), 50.0)])
def test_quantize_weight_error_is_within_half_an_e4m3_step(dtype, shape, std):
    """Per output channel: the row's largest magnitude lands on 448 exactly, every element is
    within half a step of E4M3's grid (3 mantissa bits: 2^-4 relative; 2^-10 of the scale
    among the subnormals), zeros stay zero, and the weight serves its own dtype."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, std, dtype)).encode()))
    w = (torch.randn(*shape, generator=g) * std).to(dtype)
    w[1, ::3] = 0.0
    q = quantize_weight(w)
    assert q.dtype == dtype and q.shape == w.shape and q.data.dtype == torch.float8_e4m3fn
    assert q.scale.dtype == torch.float32 and q.scale.shape == (shape[0],)
    wf = w.float()
    torch.testing.assert_close(q.data.float().abs().amax(1), torch.full((shape[0],), 448.0))
    err = (q.data.float() * q.scale[:, None] - wf).abs()
    bound = torch.maximum(wf.abs() * 2.0 ** -4, q.scale[:, None] * 2.0 ** -10) * (1 + 1e-6)
    assert (err <= bound).all(), (err / bound).max()
    assert (q.data.float()[w == 0] == 0).all()
    torch.testing.assert_close(q.dequantize(torch.float32), q.data.float() * q.scale[:, None])
    zero = quantize_weight(torch.zeros(3, 8))
    assert torch.isfinite(zero.scale).all() and (zero.dequantize() == 0).all()


def test_checkpoint_scales_broadcast_and_fused_projections_concatenate():
    g = torch.Generator().manual_seed(11)
    data = (torch.randn(6, 32, generator=g) * 100).clamp(-448, 448).to(fp8.E4M3)
    for scale in (torch.tensor(0.5), torch.tensor([0.5]), torch.full((6,), 0.5), torch.full((6, 1), 0.5)):
        w = fp8.from_checkpoint(data, scale, torch.float16)
        assert w.scale.shape == (6,) and (w.scale == 0.5).all() and w.dtype == torch.float16
    with pytest.raises(ValueError, match="block-wise"):
        fp8.from_checkpoint(data, torch.ones(3, 2), torch.float16)
    a, b = quantize_weight(torch.randn(4, 32, generator=g)), torch.randn(5, 32, generator=g)
    both = fp8.cat_rows([a, b])  # a 16-bit part beside an FP8 one is quantised
    assert isinstance(both, Fp8Weight) and both.shape == (9, 32)
    torch.testing.assert_close(both.dequantize()[:4], a.dequantize())
    torch.testing.assert_close(both.dequantize()[4:], quantize_weight(b).dequantize())
    plain = fp8.cat_rows([b, b])
    assert isinstance(plain, torch.Tensor) and plain.shape == (10, 32)
    moved = a.to(device="cpu", dtype=torch.bfloat16).contiguous()
    assert moved.dtype == torch.bfloat16 and moved.data is a.data and moved.is_contiguous()
    rows = torch.tensor([3, 0, 2, 1])  # (a partial rotary's reordered Q and K rows)
    taken = fp8.take_rows(a, rows)
    assert isinstance(taken, Fp8Weight) and taken.dtype == a.dtype
    torch.testing.assert_close(taken.dequantize(), a.dequantize()[rows])
    torch.testing.assert_close(fp8.take_rows(b, rows), b[rows])
    torch.testing.assert_close(fp8.scaled(a, 0.22).dequantize(), a.dequantize() * 0.22)  # (Granite's muP folds)
    torch.testing.assert_close(fp8.scaled(b, 0.22), b * 0.22)
    assert fp8.scaled(a, None) is a and fp8.scaled(b, 1.0) is b


# ---- the kernels in the interpreter ------------------------------------------------------------

@pytest.fixture
def launches(monkeypatch):
    """Which kernel each linear ran: 'gemv' or 'small' per launch."""
    seen = []
    real_gemv, real_small = triton_gemv.launch, tsg._small_linear_kernel

    def gemv_spy(x, *args, **kwargs):
        seen.append("gemv")
        return real_gemv(x, *args, **kwargs)

    class SmallSpy:
        def __getitem__(self, grid):
            def call(*args, **kwargs):
                seen.append("small")
                assert kwargs["SCALED"]
                return real_small[grid](*args, **kwargs)
            return call

    monkeypatch.setattr(triton_gemv, "launch", gemv_spy)
    monkeypatch.setattr(tsg, "_small_linear_kernel", SmallSpy())
    return seen


def _fp8_inputs(rand, m, n, k, activation, with_bias):
    w = quantize_weight(rand(2 * n if activation in GATED else n, k, std=k ** -0.5))
    return rand(m, k), w, (rand(w.shape[0], std=0.3) if with_bias else None)


@pytest.mark.parametrize("m", [1, 2, 5, 16])
@pytest.mark.parametrize("activation", ["none", "gelu_tanh", "relu2", "relu", "silu_mul", "gelu_mul"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_few_row_kernels_read_fp8_weights(m, activation, with_bias, launches):
    """1-2 rows: the GEMV; up to fp8.WEIGHT_ONLY_MAX_ROWS: the small GEMM (whatever PDL says for
    16-bit plain linears); both weight-only, against reference.fp8_linear."""
    rand = Rand("fp8-few", m, activation, with_bias)
    x, w, b = _fp8_inputs(rand, m, 24, 40, activation, with_bias)
    out = tsg.linear_act(x, w, b, activation)
    torch.testing.assert_close(out, ref.linear_act(x, w, b, activation), atol=2e-5, rtol=2e-5)
    assert launches == ["gemv" if m <= 2 else "small"]


@pytest.mark.parametrize("m", [1, 2, 9])
@pytest.mark.parametrize("norm,with_bias,with_residual,write_sum,x_norm",
                         [("rms", False, True, True, False), ("layer", True, True, True, False),
                          ("rms", True, True, True, True), ("sum", False, True, True, True)])
def test_fp8_linears_after_a_prenorm(m, norm, with_bias, with_residual, write_sum, x_norm, launches):
    """The GEMV's PreNorm prologue with FP8 weights: the normalised row is rounded to the
    activations' dtype (not the weights'), as the reference stores it."""
    rand = Rand("fp8-prenorm", m, norm, with_bias, x_norm)
    k = 48
    x, w, b = _fp8_inputs(rand, m, 20, k, "silu_mul", True)
    x = rand(m, k, std=2.0, mean=1.0)
    p = make_prenorm(rand, m, k, norm, with_bias, with_residual, write_sum, x_norm=x_norm)
    p_ref = twin(p)
    out = tsg.linear_act(x, w, b, "silu_mul", prenorm=p)
    torch.testing.assert_close(out, ref.linear_act(x, w, b, "silu_mul", prenorm=p_ref), atol=3e-5, rtol=3e-5)
    torch.testing.assert_close(p.sum_out, p_ref.sum_out, atol=1e-6, rtol=1e-6)
    assert launches == ["gemv" if m <= 2 else "small"]


@pytest.mark.parametrize("m", [1, 6])
@pytest.mark.parametrize("head_norms", [False, True])
def test_fp8_qkv_to_cache(m, head_norms, launches):
    """The QKV projection with FP8 weights: fused epilogue (bias, rotary, cache write) at 1 and 6
    rows; with head norms, the plain projection then the qkv_to_cache kernel."""
    rand = Rand("fp8-qkv", m, head_norms)
    k, heads, kv_heads, d = 48, 2, 1, 16
    n = (heads + 2 * kv_heads) * d
    x, w, b = rand(m, k), quantize_weight(rand(n, k, std=k ** -0.5)), rand(n, std=0.3)
    p = make_prenorm(rand, m, k, "rms", False, True, True)
    p_ref = twin(p)
    table = rand(m, 2, d // 2)
    kc, vc = rand(3, 4, kv_heads, d), rand(3, 4, kv_heads, d)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.arange(m, device=DEVICE) * 2 + 1
    norms = (rand(d, mean=1.0), rand(d, mean=1.0)) if head_norms else (None, None)
    q = tsg.prenorm_qkv_to_cache(x, p, w, b, heads, kv_heads, d, table[:, 0], table[:, 1], kc, vc, slots, *norms)
    q_ref = ref.prenorm_qkv_to_cache(x, p_ref, w, b, heads, kv_heads, d, table[:, 0], table[:, 1], kc_ref, vc_ref,
                                     slots, *norms)
    for got, want in ((q, q_ref), (kc, kc_ref), (vc, vc_ref)):
        torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5)
    assert launches == ["gemv" if m == 1 else "small"]


def test_fp8_split_k_and_a_long_gemv_row(monkeypatch, launches):
    """Long rows, thresholds scaled to the interpreter: the small GEMM's split K (the row scales
    after the partials' sum) and one long row in the GEMV."""
    monkeypatch.setattr(tsg, "PREFETCH_MAX_K", 16)
    monkeypatch.setattr(tsg, "SPLIT_K_MIN_K", 16)
    monkeypatch.setattr(triton_gemv, "_MAX_K", 32)
    monkeypatch.setattr(triton_gemv, "MAX_LONG_K", 1 << 20)
    rand = Rand("fp8-long")
    for m in (1, 7):
        x, w, b = _fp8_inputs(rand, m, 40, 72, "none", True)
        torch.testing.assert_close(tsg.linear_act(x, w, b), ref.linear_act(x, w, b), atol=2e-5, rtol=2e-5)
    assert launches == ["gemv", "small"]
    assert not any(c[0].any() for c in arrival_counters.HELD.values())


def test_fp8_small_gemm_with_half_activations(launches):
    """fp16 rows: the E4M3 tile is converted to fp16 for a 16-bit dot; closer to the exact
    product than a half step of E4M3."""
    rand = Rand("fp8-half", dtype=torch.float16)
    x, w, b = rand(12, 64), quantize_weight(rand(32, 64, std=0.125)), rand(32, std=0.3)
    out = tsg.linear_act(x, w, b, "gelu_tanh")
    want = ref.linear_act(x, w, b, "gelu_tanh")
    torch.testing.assert_close(out, want, atol=1e-2, rtol=1e-2)
    assert out.dtype == torch.float16 and launches == ["small"]


def _binade_slips(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Elements where the interpreter's E4M3 rounding gave half a power of two instead of it
    (see the module docstring); none on a GPU."""
    g, w = got.float(), want.float()
    power_of_two = w != 0
    power_of_two &= torch.frexp(w.abs())[0] == 0.5
    return (g != w) & (g * 2 == w) & power_of_two


@pytest.mark.parametrize("m,k", [(5, 100), (3, 72)])
def test_quantize_rows_kernel_matches_reference(monkeypatch, m, k):
    rand = Rand("fp8-rows", m, k)
    x = rand(m, k, std=3.0)
    x[1] = 0.0  # an all-zero row: a finite scale, zeros
    if k == 72:  # the two-pass loop over a long row
        monkeypatch.setattr(triton_fp8, "_ONE_PASS_K", 32)
        monkeypatch.setattr(triton_fp8, "_CHUNK_K", 16)
    q, scale = triton_fp8.quantize_rows_fp8(x[:, : k - 1])  # a strided view
    q_ref, scale_ref = ref.quantize_rows_fp8(x[:, : k - 1])
    torch.testing.assert_close(scale, scale_ref, atol=0, rtol=1e-6)
    assert q.dtype == fp8.E4M3 and q.is_contiguous() and (q[1].float() == 0).all()
    mismatch = q.float() != q_ref.float()
    if DEVICE == "cpu":
        mismatch &= ~_binade_slips(q, q_ref)
    assert not mismatch.any()


@pytest.mark.parametrize("activation,with_out", [("none", False), ("gelu", True), ("silu_mul", False)])
def test_many_rows_run_the_scaled_mm_route(monkeypatch, activation, with_out):
    """Past fp8.WEIGHT_ONLY_MAX_ROWS, where the GPU has a row-wise FP8 GEMM: the activations
    quantised per token, torch._scaled_mm (on the CPU here, fp32 out), then bias and activation,
    into `out` when given. The quantisation kernel is the reference's here (the interpreter's
    rounding, see the module docstring); it is checked on its own above."""
    monkeypatch.setattr(fp8, "scaled_mm_dtype", lambda device, dtype: torch.float32)
    monkeypatch.setattr(triton_fp8, "quantize_rows_fp8", ref.quantize_rows_fp8)
    rand = Rand("fp8-many", activation)
    m = fp8.WEIGHT_ONLY_MAX_ROWS + 6
    x, w, b = _fp8_inputs(rand, m, 32, 48, activation, True)
    assert tsg.route(x, w, activation) == tsg.SCALED_MM
    out = torch.full((m, 32), float("nan")) if with_out else None
    got = tsg.linear_act(x, w, b, activation, out=out)
    torch.testing.assert_close(got, ref.linear_act(x, w, b, activation), atol=2e-5, rtol=2e-5)
    if with_out:
        assert got.data_ptr() == out.data_ptr()


def _interpreter_slips(got: torch.Tensor, want: torch.Tensor, scaled: torch.Tensor | None = None) -> torch.Tensor:
    """_binade_slips, E4M3's subnormals (below 2^-6), which the interpreter rounds toward zero (one
    subnormal step, 2^-9, short of the right value), and with `scaled` (the fp32 values converted)
    exact ties, which it rounds away from zero, not to the even neighbour. None on a GPU."""
    g, w = got.float(), want.float()
    short = (g != w) & (w.abs() <= 2.0 ** -6) & (w.abs() - g.abs() == 2.0 ** -9) & (g * w >= 0)
    tie = (g != w) & (scaled == (g + w) / 2) if scaled is not None else torch.zeros_like(short)
    return _binade_slips(got, want) | short | tie


@pytest.mark.parametrize("activation", ref.FP8_OUT_ACTIVATIONS)
@pytest.mark.parametrize("dtype,m,k", [(torch.float32, 5, 100), (torch.float16, 4, 72)])
def test_act_quantize_kernel_matches_the_unfused_path(monkeypatch, activation, dtype, m, k):
    """The fused activation + per-token quantisation (triton_fp8.act_quantize_rows_fp8) against
    its reference, which is what the unfused path computes (the activation's pass over h in fp32,
    rounded to h's dtype, then quantize_rows_fp8: checked here on the unfused path's own ops):
    scales exact, values up to the interpreter's E4M3 rounding. A zero row, a strided h, the
    two-pass loop (k = 72); fp16 h, where the rounding to h's dtype moves the amax."""
    rand = Rand("fp8-act-rows", activation, dtype, dtype=dtype)
    h = rand(m, k, std=1.5)  # the amax where GELU(h) is not h: rounded or not, its scale differs
    h[1] = 0.0
    if k == 72:
        monkeypatch.setattr(triton_fp8, "_ONE_PASS_K", 32)
        monkeypatch.setattr(triton_fp8, "_CHUNK_K", 16)
    got = triton_fp8.act_quantize_rows_fp8(h[:, : k - 1], activation)
    want = ref.act_quantize_rows_fp8(h[:, : k - 1], activation)
    activated = tsg._fp8_epilogue(h[:, : k - 1].clone(), activation, None)
    unfused = ref.quantize_rows_fp8(activated)
    assert torch.equal(want.scale, unfused[1]) and torch.equal(want.q.float(), unfused[0].float())
    assert isinstance(got, fp8.Fp8Activation) and got.dtype == dtype and got.q.is_contiguous()
    torch.testing.assert_close(got.scale, want.scale, atol=0, rtol=1e-6)
    assert (got.q[1].float() == 0).all()
    g, w = got.q.float(), want.q.float()
    mismatch = g != w
    # Triton's erf / exp and torch's differ by an ulp or two of fp32 (of 1 + erf(h / sqrt 2), ~h ulp
    # in GELU(h)): where the scaled value sits that close to a rounding tie between two E4M3
    # values, either is right.
    slack = 2.0 ** -21 * h[:, : k - 1].float().abs() / want.scale
    tie = ((activated.float() / want.scale) - (g + w) / 2).abs() <= slack
    mismatch &= ~tie
    if DEVICE == "cpu":
        mismatch &= ~_interpreter_slips(got.q, want.q)
    assert not mismatch.any(), (g[mismatch], w[mismatch])


@pytest.mark.parametrize("activation,dtype", [("gelu", torch.float16), ("relu", torch.float32)])
def test_fp8_ffn_hands_the_quantised_activation_on(monkeypatch, activation, dtype):
    """An FP8 FFN past fp8.WEIGHT_ONLY_MAX_ROWS with `fp8_out` (the encoder's): the up projection
    returns an Fp8Activation (its GEMM with the bias, then act + quantise in one pass), which the
    down projection takes without quantising again (one quantisation pass in all: the up
    projection's input), and every number is the unfused path's: the up projection's 16-bit
    output through the activation's pass, quantised by the down projection. torch._scaled_mm runs
    on the CPU (fp32 out, rounded to x's dtype); the fused kernel is the reference's here (the
    interpreter's rounding, see the module docstring), checked on its own above."""
    monkeypatch.setattr(fp8, "scaled_mm_dtype", lambda device, dtype: torch.float32)
    quantised = []

    def counted(x):
        quantised.append(tuple(x.shape))
        return ref.quantize_rows_fp8(x)

    monkeypatch.setattr(triton_fp8, "quantize_rows_fp8", counted)
    monkeypatch.setattr(triton_fp8, "act_quantize_rows_fp8", ref.act_quantize_rows_fp8)
    rand = Rand("fp8-ffn", activation, dtype, dtype=dtype)
    m = fp8.WEIGHT_ONLY_MAX_ROWS + 6
    x, w_up, b_up = _fp8_inputs(rand, m, 64, 32, activation, True)
    w_down = quantize_weight(rand(32, 64, std=64 ** -0.5))
    act = tsg.linear_act(x, w_up, b_up, activation, fp8_out=True)
    assert isinstance(act, fp8.Fp8Activation) and act.shape == (m, 64) and act.dtype == dtype
    assert tsg.route(act, w_down) == tsg.SCALED_MM
    got = tsg.linear_act(act, w_down)
    assert quantised == [(m, 32)]  # x's, for the up projection; none for the down projection
    unfused = tsg.linear_act(x, w_up, b_up, activation)
    q, scale = ref.quantize_rows_fp8(unfused)
    assert torch.equal(act.scale, scale) and torch.equal(act.q.float(), q.float())
    assert torch.equal(got, tsg.linear_act(unfused, w_down))
    # the references chain the same way
    chained = ref.linear_act(ref.linear_act(x, w_up, b_up, activation, fp8_out=True), w_down)
    assert torch.equal(chained, ref.linear_act(ref.linear_act(x, w_up, b_up, activation), w_down))
    torch.testing.assert_close(got, chained, atol=2e-3, rtol=2e-3)


def test_fp8_out_changes_nothing_elsewhere(monkeypatch):
    """`fp8_out` is a request: up to fp8.WEIGHT_ONLY_MAX_ROWS (weight-only rows), for a gated
    activation or a 16-bit weight, the linear returns what it returns without it. An
    Fp8Activation goes to an FP8 weight's linear on many rows only."""
    monkeypatch.setattr(fp8, "scaled_mm_dtype", lambda device, dtype: torch.float32)
    monkeypatch.setattr(triton_fp8, "quantize_rows_fp8", ref.quantize_rows_fp8)
    rand = Rand("fp8-out-not")
    few, many = fp8.WEIGHT_ONLY_MAX_ROWS, fp8.WEIGHT_ONLY_MAX_ROWS + 1
    x, w, b = _fp8_inputs(rand, many, 32, 48, "gelu", True)
    for op in (tsg.linear_act, ref.linear_act):
        assert torch.equal(op(x[:few], w, b, "gelu", fp8_out=True), op(x[:few], w, b, "gelu"))
        assert torch.equal(op(x, w.dequantize(), b, "gelu", fp8_out=True), op(x, w.dequantize(), b, "gelu"))
    _, wg, bg = _fp8_inputs(rand, many, 32, 48, "gelu_mul", True)
    assert torch.equal(ref.linear_act(x, wg, bg, "gelu_mul", fp8_out=True), ref.linear_act(x, wg, bg, "gelu_mul"))
    act = ref.act_quantize_rows_fp8(x, "gelu")
    with pytest.raises(ValueError, match="WEIGHT_ONLY_MAX_ROWS"):
        ref.fp8_linear(fp8.Fp8Activation(act.q[:few], act.scale[:few], x.dtype), w)
    with pytest.raises(ValueError, match="FP8 weight"):
        ref.linear_act(act, w.dequantize().t().contiguous())
    with pytest.raises(ValueError, match="activation must be one of"):
        ref.act_quantize_rows_fp8(x, "silu_mul")


@pytest.mark.parametrize("dtype,one_tile", [(torch.float32, True), (torch.float16, True), (torch.float16, False)])
def test_layer_norm_writes_the_fp8_copy(monkeypatch, dtype, one_tile):
    """add_bias_residual_layer_norm with `fp8_out`: the output unchanged, and its E4M3 copy and row
    scales those of quantize_rows_fp8 on the output as stored (in the LayerNorm kernel's own
    tile; for rows past one tile, _MAX_ONE_TILE made small here, by the quantisation kernel after
    it); the reference fills it the same way. 37 rows: a partial last tile of rows."""
    from tritonformer.kernels import triton_norms

    if not one_tile:
        monkeypatch.setattr(triton_norms, "_MAX_ONE_TILE", 32)
        monkeypatch.setattr(triton_norms, "_LOOP_BLOCK", 32)
    rand = Rand("fp8-ln", dtype, one_tile, dtype=dtype)
    m, k = 37, 80
    x, bias, res = rand(m, k), rand(k, std=0.1), rand(m, k, std=2.0)
    w, b = rand(k, std=0.2, mean=1.0), rand(k, std=0.1)
    copy = fp8.Fp8Activation.empty(m, k, dtype, x.device)
    out = triton_norms.add_bias_residual_layer_norm(x, bias, res, w, b, 1e-5, fp8_out=copy)
    assert torch.equal(out, triton_norms.add_bias_residual_layer_norm(x, bias, res, w, b, 1e-5))
    q, scale = ref.quantize_rows_fp8(out)
    torch.testing.assert_close(copy.scale, scale, atol=0, rtol=1e-6)
    mismatch = copy.q.float() != q.float()
    if DEVICE == "cpu":  # fp16 rows over their amax / 448 make exact ties
        mismatch &= ~_interpreter_slips(copy.q, q, out.float() / scale)
    assert not mismatch.any(), (copy.q.float()[mismatch], q.float()[mismatch])
    ref_copy = fp8.Fp8Activation.empty(m, k, dtype, x.device)
    want = ref.add_bias_residual_layer_norm(x, bias, res, w, b, 1e-5, fp8_out=ref_copy)
    q, scale = ref.quantize_rows_fp8(want)
    assert torch.equal(ref_copy.scale, scale) and torch.equal(ref_copy.q.float(), q.float())


def test_route_table_for_fp8_weights(monkeypatch):
    """FP8 weights: the GEMV for 1-2 rows, the small GEMM up to fp8.WEIGHT_ONLY_MAX_ROWS (also
    plain linears, which 16-bit leave to cuBLAS), SCALED_MM past it where supported (K and N
    multiples of 16), the dequantising reference (TORCH) otherwise."""
    from tritonformer.kernels import triton_pdl

    monkeypatch.setattr(triton_pdl, "enabled", lambda device: False)
    monkeypatch.setattr(tsg.triton_gemv, "_INTERPRETED", True)  # meta tensors stand for CUDA ones
    monkeypatch.setattr(fp8, "scaled_mm_dtype", lambda device, dtype: torch.bfloat16)

    def weight(n, k):
        return Fp8Weight(torch.empty(n, k, dtype=fp8.E4M3, device="meta"), torch.empty(n, device="meta"),
                         torch.bfloat16)

    def x(m, k):
        return torch.empty(m, k, device="meta")

    many = fp8.WEIGHT_ONLY_MAX_ROWS + 1
    assert tsg.route(x(1, 4096), weight(6144, 4096), prenorm=ref.PreNorm(x(1, 4096)[0], None, 1e-5)) == tsg.GEMV
    assert tsg.route(x(2, 4096), weight(8192, 4096), "silu_mul") == tsg.GEMV
    assert tsg.route(x(3, 4096), weight(4096, 4096)) == tsg.SMALL_GEMM
    assert tsg.route(x(fp8.WEIGHT_ONLY_MAX_ROWS, 14336), weight(4096, 14336)) == tsg.SMALL_GEMM
    assert tsg.route(x(many, 4096), weight(4096, 4096)) == tsg.SCALED_MM
    assert tsg.route(x(many, 4096), weight(4096, 4096), "gelu") == tsg.SCALED_MM  # not the 16-bit GELU GEMM
    assert tsg.route(x(many, 40), weight(4096, 40)) == tsg.TORCH  # K not a multiple of 16
    quantised = fp8.Fp8Activation(torch.empty(many, 4096, dtype=fp8.E4M3, device="meta"),
                                  torch.empty(many, 1, device="meta"), torch.bfloat16)
    assert tsg.route(quantised, weight(4096, 4096)) == tsg.SCALED_MM  # an activation quantised already
    monkeypatch.setattr(fp8, "scaled_mm_dtype", lambda device, dtype: None)
    assert tsg.route(x(many, 4096), weight(4096, 4096)) == tsg.TORCH
    assert tsg.route(quantised, weight(4096, 4096)) == tsg.TORCH
    assert tsg.route(x(0, 4096), weight(4096, 4096)) == tsg.TORCH


# ---- models ------------------------------------------------------------------------------------

def _random_llama(seed: int = 3, layers: int = 2):
    cfg = transformers.LlamaConfig(
        vocab_size=320, hidden_size=128, intermediate_size=288, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rope_theta=500.0, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    return cfg.to_dict(), {k.removeprefix("model."): v for k, v in hf.state_dict().items()}


def _logits(model, prompt: list[int], decode: list[int]) -> torch.Tensor:
    """Every prompt row's logits (the many-row path), then one decode row's (the few-row path)."""
    from tritonformer.backend.decoder.batch import BatchEntry, build_batch

    cache = model.new_kv_cache(64, 4)
    table = list(range(64))
    batch = build_batch([BatchEntry(prompt, 0, table, True)], 4, model.device)
    batch.logits_index = torch.arange(len(prompt), device=model.device)
    rows = [model.forward(batch, cache)]
    for i, t in enumerate(decode):
        rows.append(model.forward(build_batch([BatchEntry([t], len(prompt) + i, table, True)], 4, model.device),
                                  cache))
    return torch.cat(rows)


def _quantize_every_layer(model):
    """Every layer's linears FP8, the first and last ones' too (which quantization fp8 keeps
    16-bit)."""
    return quantization.quantize_model(model, keep_edge_layers=False)


def test_random_llama_fp8_is_close_to_unquantised():
    """quantization fp8: every layer's linears but the first and last layers' (kept 16-bit:
    measured on SmolLM2, see backend/quantization.py); embeddings and the output head 16-bit."""
    config, state = _random_llama(layers=4)
    plain = load_decoder(config, state, CPU, torch.float32)
    quant = load_decoder(config, state, CPU, torch.float32, quantization="fp8")
    for i, layer in enumerate(quant.layers):
        kinds = {type(getattr(layer, n)) for n in quant.LINEAR_WEIGHTS}
        assert kinds == ({torch.Tensor} if i in (0, 3) else {Fp8Weight}), (i, kinds)
    assert isinstance(quant.output_head, torch.Tensor) and isinstance(quant.embed, torch.Tensor)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 320, (fp8.WEIGHT_ONLY_MAX_ROWS + 40,), generator=g).tolist()
    a, b = _logits(plain, prompt, [7, 9, 11]), _logits(quant, prompt, [7, 9, 11])
    assert cosine(a, b).min() > 0.99, cosine(a, b).min()
    c = _logits(_quantize_every_layer(quant), prompt, [7, 9, 11])
    assert cosine(a, c).min() > 0.99, cosine(a, c).min()
    # fp32 weights here: an FP8 layer is a quarter of the bytes (plus its scales)
    assert quantization.linear_bytes(quant) < (2 * 0.26 + 2) / 4 * quantization.linear_bytes(plain)


def _write_fp8_checkpoint(folder: Path, config: dict, state: dict, per_tensor: bool) -> dict:
    """A folder in the common FP8 format: every layer linear as E4M3 + weight_scale (per output
    channel `[N, 1]`, or one per tensor with an input_scale beside it, as llm-compressor and
    FBGEMM write them); embeddings, norms and the head in bf16. Returns the dequantised weights
    (what the FP8 values stand for)."""
    from safetensors.torch import save_file

    tensors, dequantised = {}, {}
    for name, t in state.items():
        if t.dim() == 2 and ".layers." in f".{name}" and "proj" in name:
            if per_tensor:
                scale = t.float().abs().amax().clamp(min=1e-12) / 448.0
                data = (t.float() / scale).clamp(-448, 448).to(fp8.E4M3)
                tensors[f"model.{name}_scale"] = scale.reshape(())
                tensors[f"model.{name[:-len('.weight')]}.input_scale"] = torch.tensor(0.02)
                dequantised[name] = data.float() * scale
            else:
                q = quantize_weight(t)
                data = q.data
                tensors[f"model.{name}_scale"] = q.scale[:, None].clone()
                dequantised[name] = q.dequantize(torch.float32)
            tensors[f"model.{name}"] = data
        else:
            tensors[f"model.{name}"] = t.to(torch.bfloat16)
            dequantised[name] = t.to(torch.bfloat16).float()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    return dequantised


@pytest.mark.parametrize("per_tensor", [False, True])
def test_fp8_checkpoint_loads_as_fp8_without_the_parameter(tmp_path, per_tensor):
    """The folder's E4M3 weights load as they are (the edge layers' too), scales concatenated
    with the q/k/v and gate/up parts they belong to. Per channel: the same model as quantising
    every layer's dequantised weights. Per tensor (scales broadcast per channel, input_scale ignored): with few
    rows (weight-only) the unquantised model on the dequantised weights."""
    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict

    config, state = _random_llama(seed=4)
    dequantised = _write_fp8_checkpoint(tmp_path / "fp8", config, state, per_tensor)
    model = load_decoder(load_config(tmp_path / "fp8"), load_state_dict(tmp_path / "fp8"), CPU, torch.float32)
    layer = model.layers[0]
    assert all(isinstance(getattr(layer, n), Fp8Weight) for n in model.LINEAR_WEIGHTS)
    assert layer.qkv_w.scale.shape == (layer.qkv_w.shape[0],)
    g = torch.Generator().manual_seed(6)
    rows = fp8.WEIGHT_ONLY_MAX_ROWS - 20 if per_tensor else fp8.WEIGHT_ONLY_MAX_ROWS + 10
    prompt = torch.randint(0, 320, (rows,), generator=g).tolist()
    got = _logits(model, prompt, [3, 5])
    if per_tensor:
        stored = load_state_dict(tmp_path / "fp8")["layers.0.self_attn.q_proj.weight_scale"]
        torch.testing.assert_close(layer.qkv_w.scale[:128], stored.float().expand(128))
        plain = load_decoder(config, dequantised, CPU, torch.float32)
        torch.testing.assert_close(got, _logits(plain, prompt, [3, 5]), atol=1e-4, rtol=1e-4)
    else:
        requantised = _quantize_every_layer(load_decoder(config, dequantised, CPU, torch.float32))
        torch.testing.assert_close(got, _logits(requantised, prompt, [3, 5]), atol=1e-5, rtol=1e-5)


def test_bad_values_and_unsupported_combinations_are_load_errors(tmp_path, monkeypatch):
    config, state = _random_llama(layers=1)
    with pytest.raises(ValueError, match="quantization must be one of none, fp8"):
        load_decoder(config, state, CPU, torch.float32, quantization="int8")
    with pytest.raises(ValueError, match="quantization must be one of"):
        quantization.load_encoder({"model_type": "bert"}, {}, CPU, torch.float32, "fp16")
    gpt2 = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32).to_dict()
    with pytest.raises(ValueError, match="not supported for model_type 'gpt2'"):
        load_decoder(gpt2, {}, CPU, torch.float32, quantization="fp8")
    kept, quantize = quantization.prepare(state, "fp8", CPU, torch.float32, tensor_parallel=True)
    assert kept is state and quantize  # quantization fp8 with tensor parallelism: each rank quantises its slices
    fp8_state = {"layers.0.mlp.down_proj.weight": torch.zeros(4, 4).to(fp8.E4M3),
                 "layers.0.mlp.down_proj.weight_scale": torch.ones(())}
    sliced, _ = quantization.prepare(fp8_state, "none", CPU, torch.float32, tensor_parallel=True)
    assert isinstance(sliced["layers.0.mlp.down_proj.weight"], quantization.Fp8Slices)  # read in part by each rank
    with pytest.raises(ValueError, match="block-wise"):
        quantization.prepare({"a.weight": torch.zeros(4, 4).to(fp8.E4M3), "a.weight_scale_inv": torch.ones(1, 1)},
                             "none", CPU, torch.float32)
    with pytest.raises(ValueError, match="has no weight_scale"):
        quantization.prepare({**fp8_state, "b.weight": torch.zeros(2, 2).to(fp8.E4M3)}, "none", CPU, torch.float32)
    # A GPU without FP8 arithmetic (an A100, compute capability 8.0): a clear error at load.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(RuntimeError, match=r"compute capability >= 8\.9.*A100-SXM4-80GB is 8\.0"):
        quantization.prepare(state, "fp8", torch.device("cuda", 0), torch.float16)


def _random_bert(layers: int = 2):
    cfg = transformers.BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=128)
    torch.manual_seed(8)
    hf = transformers.BertModel(cfg).eval()
    return cfg.to_dict(), {k: v for k, v in hf.state_dict().items()}


def test_bert_fp8_keeps_its_first_and_last_layers_16_bit():
    config, state = _random_bert(layers=4)
    quant = quantization.load_encoder(config, state, CPU, torch.float32, "fp8")
    kinds = [[isinstance(layer[n], Fp8Weight) for n in quant.LINEAR_WEIGHTS] for layer in quant.layers]
    assert kinds == [[False] * 4, [True] * 4, [True] * 4, [False] * 4]


def test_random_bert_fp8_is_close_to_unquantised():
    """Every encoder layer's linears FP8 (two layers: none kept 16-bit); decode-sized (few rows)
    and many-row batches."""
    config, state = _random_bert()
    plain = quantization.load_encoder(config, state, CPU, torch.float32)
    quant = quantization.load_encoder(config, state, CPU, torch.float32, "fp8")
    assert all(isinstance(layer[n], Fp8Weight) for layer in quant.layers for n in quant.LINEAR_WEIGHTS)
    g = torch.Generator().manual_seed(9)
    for lengths in ((2,), (5, 9), (40, 33, 17)):
        ids = torch.randint(5, 200, (sum(lengths),), generator=g)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        assert cosine(plain.forward(ids, cu), quant.forward(ids, cu)).min() > 0.99


def test_random_bert_fp8_linears_take_their_activations_quantised(monkeypatch):
    """The encoder's FP8 linears on many rows read their inputs quantised by the op before them:
    the FFN down projection an Fp8Activation from the up projection (linear_act's fp8_out: act +
    quantise in one pass), the QKV (but the first layer's, after the embeddings) and FFN up
    projections one from the LayerNorm before them (its fp8_out); the attention output
    projection quantises its input itself. The forward is the unfused path's bit for bit (on
    the CPU's reference ops: each of those is the rounded output, quantised as the linear did);
    a decode-sized batch (weight-only rows) builds none."""
    config, state = _random_bert()
    quant = quantization.load_encoder(config, state, CPU, torch.float32, "fp8")
    taken = []
    linear = ref.fp8_linear
    monkeypatch.setattr(ref, "fp8_linear", lambda x, w, b=None: taken.append(isinstance(x, fp8.Fp8Activation))
                        or linear(x, w, b))
    g = torch.Generator().manual_seed(10)
    ids = torch.randint(5, 200, (73,), generator=g)
    cu = torch.tensor([0, 40, 73], dtype=torch.int32)
    fused = quant.forward(ids, cu)
    # per layer: QKV, attention output, FFN up, FFN down
    assert taken == [False, False, True, True] + [True, False, True, True]
    taken.clear()
    quant.forward(ids[:5], torch.tensor([0, 5], dtype=torch.int32))
    assert taken == [False] * 8
    monkeypatch.setattr(fp8, "quantizes_activations", lambda weight, rows: False)
    assert torch.equal(fused, quant.forward(ids, cu))


def test_real_minilm_fp8_embeddings_against_fp32_hf(minilm_dir):
    """The accuracy target for encoders on the real all-MiniLM-L6-v2: cosine of our fp8 pooled
    embeddings (fp32 activations on the CPU) to fp32 Hugging Face >= 0.995 over the embedder
    tests' texts."""
    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
    from tritonformer.kernels import pool_sequences
    from test_integration_embedder import TEXTS

    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    hf = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    ours = quantization.load_encoder(load_config(minilm_dir), load_state_dict(minilm_dir), CPU, torch.float32, "fp8")
    seqs = [tok(t)["input_ids"] for t in TEXTS]
    ids = torch.tensor([i for s in seqs for i in s])
    cu = torch.tensor([0, *torch.tensor([len(s) for s in seqs]).cumsum(0).tolist()], dtype=torch.int32)
    got = pool_sequences(ours.forward(ids, cu), cu, "mean", True)
    with torch.no_grad():
        want = torch.stack([torch.nn.functional.normalize(hf(torch.tensor([s])).last_hidden_state[0].mean(0), dim=0)
                            for s in seqs])
    assert cosine(got, want).min() >= 0.995, cosine(got, want)


@pytest.mark.slow
def test_real_smollm2_perplexity_within_two_percent(smollm2_dir):
    """The accuracy target for decoders on the real SmolLM2-135M-Instruct: perplexity of
    tests/data/fp8_eval.txt (~4,300 tokens of the Python standard library's module docstrings)
    with fp8 linears within 2% of the unquantised model's (fp32 activations, CPU)."""
    from tokenizers import Tokenizer

    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict

    ids = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json")).encode(EVAL_TEXT.read_text()).ids
    assert len(ids) > 3000
    config, state = load_config(smollm2_dir), load_state_dict(smollm2_dir)
    base = perplexity(load_decoder(config, state, CPU, torch.float32), ids)
    quant = perplexity(load_decoder(config, state, CPU, torch.float32, quantization="fp8"), ids)
    print(f"SmolLM2 perplexity fp32 {base:.3f}, fp8 {quant:.3f} ({quant / base - 1:+.2%})")
    assert quant <= 1.02 * base, (base, quant)


# ---- on a GPU ----------------------------------------------------------------------------------

LLAMA_8B_LINEARS = [  # (name, N, K, activation): Llama-3.1-8B's layer
    ("qkv", 6144, 4096, "none"), ("o", 4096, 4096, "none"), ("gate_up", 2 * 14336, 4096, "silu_mul"),
    ("down", 4096, 14336, "none"),
]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 16, 64, 65, 300])
@pytest.mark.parametrize("name,n,k,activation", LLAMA_8B_LINEARS)
def test_gpu_fp8_routes_on_llama_8b_shapes(dtype, m, name, n, k, activation):
    """Each route (GEMV, small GEMM, FP8 tensor cores) against reference.fp8_linear on the GPU,
    and against the exact product of the dequantised weight: within the output's rounding where
    the activations stay 16-bit, within E4M3's (~3%) where they are quantised too."""
    fp8.check_device(torch.device("cuda"))
    rand = Rand("fp8-gpu", dtype, m, name, dtype=dtype)
    x = rand(m, k)
    w = quantize_weight(rand(n, k, std=k ** -0.5))
    b = rand(n, std=0.1) if name == "qkv" else None
    out = tsg.linear_act(x, w, b, activation)
    want = ref.linear_act(x, w, b, activation)
    # Past WEIGHT_ONLY_MAX_ROWS, _scaled_mm sums in another order than the reference and rounds
    # to 16 bits: a pre-activation one ulp apart (fp16: 0.004 at 4) moves silu(gate) * up by
    # up to ulp * |up| (~0.03, seen on 3 of 6.1M elements on the H100); and the per-token
    # activation quantisation can round an element the other way at a tie (an E4M3 step is an
    # eighth of the value: 0.029 on 1 of 1.8M outputs, bf16 qkv at 300 rows, H100), hence a
    # wider atol there.
    atol = 5e-2 if m > fp8.WEIGHT_ONLY_MAX_ROWS else 2e-2
    torch.testing.assert_close(out.float(), want.float(), atol=atol, rtol=2e-2)
    exact = ref.linear_act(x.float(), w.dequantize(torch.float32), b.float() if b is not None else None, activation)
    rel = ((out.float() - exact).norm() / exact.norm()).item()
    assert rel < (5e-2 if m > fp8.WEIGHT_ONLY_MAX_ROWS else 1e-2), rel


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_gpu_fused_ffn_act_quantize_against_unfused(monkeypatch, activation):
    """bert-base's FFN (768 -> 3072 -> 768) at 4,096 rows, bf16, FP8 weights, on the FP8 tensor
    cores: the fused path (the up projection with fp8_out: _scaled_mm with the bias, then the act +
    quantise kernel; the down projection on its Fp8Activation) against the unfused one (the same
    GEMM, the activation's own pass writing bf16, the down projection's quantisation pass): the
    same E4M3 values and scales (the two kernels' fp32 activations may differ by an ulp, moving a
    value at a rounding tie), the same output within the FP8 tolerances above; the LayerNorm's
    E4M3 copy of its output exactly quantize_rows_fp8's; and a random bert-base of 2 layers,
    every layer FP8, fused (the LayerNorms' copies, act + quantise) against unfused."""
    dev = torch.device("cuda")
    fp8.check_device(dev)
    if fp8.scaled_mm_dtype(dev, torch.bfloat16) is None:
        pytest.skip("no row-wise torch._scaled_mm on this GPU")
    rand = Rand("fp8-ffn-gpu", activation, dtype=torch.bfloat16)
    m = 4096
    x, w_up, b_up = rand(m, 768), quantize_weight(rand(3072, 768, std=768 ** -0.5)), rand(3072, std=0.1)
    w_down = quantize_weight(rand(768, 3072, std=3072 ** -0.5))
    assert tsg.route(x, w_up, activation) == tsg.SCALED_MM
    act = tsg.linear_act(x, w_up, b_up, activation, fp8_out=True)
    assert isinstance(act, fp8.Fp8Activation) and tsg.route(act, w_down) == tsg.SCALED_MM
    unfused = tsg.linear_act(x, w_up, b_up, activation)  # bf16, the activation's own pass
    q, scale = triton_fp8.quantize_rows_fp8(unfused)
    torch.testing.assert_close(act.scale, scale, atol=0, rtol=2 ** -7)  # a bf16 ulp of the amax, at most
    same = act.scale[:, 0] == scale[:, 0]
    assert same.float().mean().item() > 0.99
    assert (act.q[same].float() != q[same].float()).float().mean().item() < 1e-4
    # against the reference (torch's erf / tanh, not the kernels' formulas: more ulps apart in
    # GELU's negative tail)
    want = ref.act_quantize_rows_fp8(tsg.linear_act(x, w_up, b_up), activation)
    assert (act.q.float() != want.q.float()).float().mean().item() < 1e-2
    got = tsg.linear_act(act, w_down)
    torch.testing.assert_close(got.float(), tsg.linear_act(unfused, w_down).float(), atol=5e-2, rtol=2e-2)

    from tritonformer import kernels

    copy = fp8.Fp8Activation.empty(m, 768, torch.bfloat16, dev)
    normed = kernels.add_bias_residual_layer_norm(got, rand(768, std=0.1), x, rand(768, std=0.2, mean=1.0),
                                                  rand(768, std=0.1), 1e-12, fp8_out=copy)
    q, scale = triton_fp8.quantize_rows_fp8(normed)
    assert torch.equal(copy.scale, scale) and torch.equal(copy.q.float(), q.float())

    hidden_act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[activation]
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_act=hidden_act)  # bert-base's widths
    torch.manual_seed(0)
    state = dict(transformers.BertModel(cfg).eval().state_dict())
    model = quantization.load_encoder(cfg.to_dict(), state, dev, torch.bfloat16, "fp8")  # 2 layers: both FP8
    ids = torch.randint(1000, 30000, (8 * 256,), device=dev)
    cu = torch.arange(0, 8 * 256 + 1, 256, dtype=torch.int32, device=dev)
    fused = model.forward(ids, cu, max_seqlen=256).float()
    monkeypatch.setattr(fp8, "quantizes_activations", lambda weight, rows: False)
    plain = model.forward(ids, cu, max_seqlen=256).float()
    assert cosine(fused, plain).min() > 0.999, cosine(fused, plain).min()


@pytest.mark.gpu
@gpu
def test_gpu_quantize_rows_kernel_is_exact():
    rand = Rand("fp8-rows-gpu", dtype=torch.bfloat16)
    for m, k in ((1, 4096), (300, 14336), (33, 20000)):
        x = rand(m, k, std=2.0)
        q, s = triton_fp8.quantize_rows_fp8(x)
        q_ref, s_ref = ref.quantize_rows_fp8(x)
        torch.testing.assert_close(s, s_ref, atol=0, rtol=1e-6)
        assert (q.float() != q_ref.float()).float().mean().item() < 1e-5  # division rounding, at most


@pytest.mark.gpu
@gpu
def test_gpu_decoder_of_real_width_fp8_vs_bf16():
    """Llama-3.1-8B's layer (4 layers, the first and last 16-bit; random weights at its init
    scale): fp8 logits against bf16's for a 100-token prefill and decode steps, eager and replayed from
    the decode CUDA graphs (batches 1, 16 and 80: the GEMV, the small GEMM and the FP8 tensor
    cores captured)."""
    from tritonformer.backend.decoder.batch import BatchEntry
    from tritonformer.backend.decoder.runner import DecoderRunner
    from tritonformer.client.model_shapes import LLAMA_3_1_8B, random_decoder

    cfg = {**LLAMA_3_1_8B, "num_hidden_layers": 4, "vocab_size": 32000}
    dev = torch.device("cuda")
    base = random_decoder(cfg, dev, torch.bfloat16, max_model_len=512)
    quant = random_decoder(cfg, dev, torch.bfloat16, max_model_len=512)
    quantization.prepare({}, "fp8", dev, torch.bfloat16)
    quantization.quantize_model(quant)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 32000, (100,), generator=g).tolist()
    a, b = _logits(base, prompt, [5, 6, 7]), _logits(quant, prompt, [5, 6, 7])
    assert cosine(a, b).min() > 0.99, cosine(a, b)
    for batch in (1, 16, 80):
        # two blocks per decoding row (context 20)
        caches = [m.new_kv_cache(2 * batch, 16) for m in (base, quant)]
        outs = []
        for model, cache in zip((base, quant), caches):
            cache.data.zero_()  # keys never written are zeros, not whatever the memory held
            runner = DecoderRunner(model, cache, batch)  # its first run captures the batch's bucket
            entries = [BatchEntry([3 + r], 20, [2 * r, 2 * r + 1], True) for r in range(batch)]
            graph = runner.run(entries).logits[:batch].float().clone()  # past `batch`: the bucket's padding
            runner.graphs = None
            eager = runner.run(entries).logits.float()
            torch.testing.assert_close(graph, eager, atol=2e-2, rtol=2e-2)
            outs.append(graph)
        assert cosine(outs[0], outs[1]).min() > 0.98, (batch, cosine(outs[0], outs[1]).min())
