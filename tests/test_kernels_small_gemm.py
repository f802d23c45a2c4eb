"""The few-rows GEMM with fused epilogues (kernels/triton_small_gemm.py) against
`reference.linear_act`, on fresh seeded random inputs.

Without a GPU it runs in Triton's CPU interpreter (the conftest sets TRITON_INTERPRET=1) with
16 x 16 tiles: ragged N and K edges, one row and several, every activation, with and without
a bias. The `gpu` group runs the decoder's and BERT's real layer shapes in fp16/bf16 against
an fp32 torch result, and the many-rows fallback.
"""
from __future__ import annotations

import os
import zlib

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import arrival_counters, dispatch  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels import triton_small_gemm as tsg  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ACTIVATIONS = ["none", "gelu", "gelu_tanh", "relu2", "relu", "silu_mul", "gelu_tanh_mul"]
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def make_inputs(m, n, k, dtype, with_bias, activation, seed):
    """x `[m, k]`, weight `[n, k]` (`[2n, k]` for a gated activation) and bias, scaled like a
    trained layer so pre-activations are O(1)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    rows = 2 * n if activation in ref.GATED_ACTIVATIONS else n

    def rand(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device=DEVICE) * std).to(dtype)

    return rand(m, k), rand(rows, k, std=1.5 / k ** 0.5), rand(rows, std=0.5) if with_bias else None


def exact(x, w, b, activation):
    """Everything in fp32, the pre-activation never rounded."""
    h = F.linear(x.float(), w.float(), None if b is None else b.float())
    if activation in ref.GATED_ACTIVATIONS:
        gate, up = h.chunk(2, dim=-1)
        return (F.silu(gate) if activation == "silu_mul" else F.gelu(gate, approximate="tanh")) * up
    if activation == "none":
        return h
    if activation == "relu2":
        return F.relu(h).square()
    if activation == "relu":
        return F.relu(h)
    return F.gelu(h, approximate="tanh" if activation == "gelu_tanh" else "none")


def seed_of(*params) -> int:
    return zlib.crc32(repr(params).encode())


@pytest.fixture(autouse=True)
def plain_linears_too(monkeypatch):
    """The wrapper hands plain linears to cuBLAS; the kernel's own tests run them through it."""
    monkeypatch.setattr(tsg, "FUSE_PLAIN", True)


def test_kernel_is_registered_with_the_dispatcher():
    assert dispatch._KERNELS["linear_act"] is tsg.linear_act
    assert "triton_small_gemm" in dispatch._KERNEL_MODULES


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("m,n,k", [(1, 40, 48), (5, 33, 40), (16, 48, 32)])
def test_fp32_matches_reference(m, n, k, with_bias, activation):
    x, w, b = make_inputs(m, n, k, torch.float32, with_bias, activation, seed_of(m, n, k, with_bias, activation))
    out = tsg.linear_act(x, w, b, activation)
    assert out.shape == (m, n) and out.dtype == torch.float32 and out.is_contiguous()
    torch.testing.assert_close(out, ref.linear_act(x, w, b, activation), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_is_closer_to_exact_than_the_unfused_reference(dtype, activation):
    """The reference rounds the GEMM's output before the activation, the kernel does not."""
    x, w, b = make_inputs(3, 40, 48, dtype, True, activation, seed_of("half", dtype, activation))
    out = tsg.linear_act(x, w, b, activation)
    expected = ref.linear_act(x, w, b, activation)
    atol, rtol = {torch.float16: (2e-3, 4e-3), torch.bfloat16: (1.6e-2, 3.2e-2)}[dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    if not (INTERPRETED and dtype == torch.bfloat16):  # the interpreter truncates to bf16
        truth = exact(x, w, b, activation)
        assert (out.float() - truth).norm() <= (expected.float() - truth).norm() * 1.05 + 1e-6


def test_out_and_many_rows_fallback(monkeypatch):
    """`out` receives the result; above MAX_ROWS the unfused ops give the reference's result."""
    for activation in ACTIVATIONS:
        x, w, b = make_inputs(6, 24, 32, torch.float32, True, activation, seed_of("out", activation))
        out = torch.full((6, 24), float("nan"))
        assert tsg.linear_act(x, w, b, activation, out=out) is out
        torch.testing.assert_close(out, ref.linear_act(x, w, b, activation), atol=2e-5, rtol=2e-5)
        monkeypatch.setattr(tsg, "MAX_ROWS", 4)
        fallback = torch.full((6, 24), float("nan"))
        tsg.linear_act(x, w, b, activation, out=fallback)
        torch.testing.assert_close(fallback, ref.linear_act(x, w, b, activation), atol=2e-5, rtol=2e-5)
        monkeypatch.setattr(tsg, "MAX_ROWS", 64)


def test_many_gelu_rows_run_the_fused_many_row_gemm(monkeypatch):
    """From LARGE_ROWS rows a GELU layer goes to triton_gemm's fused GEMM (the interpreter has
    its TMA), which keeps the pre-activation in fp32: the reference's result within rounding;
    with LARGE_ROWS = 0 the separate ops run instead, exactly the reference."""
    calls = []
    fused = tsg.triton_gemm.linear_bias_gelu
    monkeypatch.setattr(tsg.triton_gemm, "linear_bias_gelu", lambda *a, **k: calls.append(1) or fused(*a, **k))
    monkeypatch.setattr(tsg, "MAX_ROWS", 4)
    for activation in ("gelu", "gelu_tanh"):
        x, w, b = make_inputs(21, 32, 48, torch.float32, True, activation, seed_of("large", activation))
        monkeypatch.setattr(tsg, "LARGE_ROWS", 16)
        out = torch.full((21, 32), float("nan"))
        assert tsg.linear_act(x, w, b, activation, out=out) is out
        torch.testing.assert_close(out, ref.linear_act(x, w, b, activation), atol=2e-5, rtol=2e-5)
        monkeypatch.setattr(tsg, "LARGE_ROWS", 0)
        torch.testing.assert_close(tsg.linear_act(x, w, b, activation), ref.linear_act(x, w, b, activation))
    assert len(calls) == 2


@pytest.mark.parametrize("activation", sorted(ref.GATED_ACTIVATIONS))
def test_many_rows_gated_activations_run_the_gated_kernel(monkeypatch, activation):
    """Past MAX_ROWS: torch's GEMM, then the gated-activation kernel (not the dispatcher's CPU
    reference here) on its output."""
    from tritonformer.kernels import triton_elementwise as te
    calls = []
    monkeypatch.setattr(dispatch, "gated_act", lambda gate_up, act: calls.append(act) or te.gated_act(gate_up, act))
    monkeypatch.setattr(tsg, "MAX_ROWS", 4)
    x, w, b = make_inputs(9, 24, 40, torch.float32, True, activation, seed_of("many-gated", activation))
    torch.testing.assert_close(tsg.linear_act(x, w, b, activation), ref.linear_act(x, w, b, activation),
                               atol=2e-5, rtol=2e-5)
    assert calls == [activation]


def test_plain_linears_are_left_to_torch(monkeypatch):
    """Without an activation cuBLAS measured faster: the wrapper returns torch's own result."""
    monkeypatch.setattr(tsg, "FUSE_PLAIN", False)
    x, w, b = make_inputs(3, 40, 48, torch.float32, True, "none", seed_of("plain"))
    torch.testing.assert_close(tsg.linear_act(x, w, b), F.linear(x, w, b), atol=0, rtol=0)


@pytest.mark.parametrize("k,splits", [(64, 4), (56, 2), (130, 8)])
def test_split_k_matches_reference_and_is_deterministic(monkeypatch, k, splits):
    """A long K cut into ranges run by separate programs (thresholds scaled down to the
    interpreter's 16-wide tiles; ragged last ranges, an empty one at K = 130): the last program
    of each tile adds the partials, so the result is the reference's, the same on every call,
    and every tile's counter is back to zero after."""
    monkeypatch.setattr(tsg, "PREFETCH_MAX_K", 16)
    monkeypatch.setattr(tsg, "SPLIT_K_MIN_K", 16)
    assert tsg.split_k(k) == splits
    x, w, b = make_inputs(5, 40, k, torch.float32, True, "none", seed_of("split", k))
    out = tsg.linear_act(x, w, b)
    torch.testing.assert_close(out, ref.linear_act(x, w, b), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(tsg.linear_act(x, w, b), out, atol=0, rtol=0)
    assert not any(c[0].any() for c in arrival_counters.HELD.values())


def test_split_k_only_past_the_prefetch_limit():
    assert tsg.split_k(tsg.PREFETCH_MAX_K) == 1
    assert tsg.split_k(3072) == 4 and tsg.split_k(2048) == 2 and tsg.split_k(8192) == tsg.SPLIT_K_MAX == 8


def test_bad_inputs_are_refused_with_clear_messages():
    x, w, b = make_inputs(2, 16, 32, torch.float32, True, "none", seed_of("bad"))
    with pytest.raises(ValueError, match="activation must be one of"):
        tsg.linear_act(x, w, b, "tanh")
    with pytest.raises(ValueError, match="activation must be one of"):
        ref.linear_act(x, w, b, "tanh")
    with pytest.raises(AssertionError, match="weight is"):
        tsg.linear_act(x, w[:, :16], b)
    with pytest.raises(AssertionError, match="bias must be"):
        tsg.linear_act(x, w, b[:3])


# ---- GPU: the real layer shapes ---------------------------------------------------------------

# (N, K, activation): GPT-2's qkv / out / fc / proj, BERT's ffn in with erf GELU, Llama-1B's
# gate_up (SwiGLU) and down, Gemma-2-2B's gate_up (GeGLU).
LAYERS = [(2304, 768, "none"), (768, 768, "none"), (3072, 768, "gelu_tanh"), (768, 3072, "none"),
          (3072, 768, "gelu"), (8192, 2048, "silu_mul"), (2048, 8192, "none"), (9216, 2304, "gelu_tanh_mul")]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,k,activation", LAYERS)
@pytest.mark.parametrize("m", [1, 7, 32, 64, 300])
def test_gpu_layer_shapes(m, n, k, activation, dtype):
    x, w, b = make_inputs(m, n, k, dtype, True, activation, seed_of("gpu", m, n, k, activation, dtype))
    out = dispatch.linear_act(x, w, b, activation)
    assert out.shape == (m, n) and out.dtype == dtype
    truth = exact(x, w, b, activation)
    rel = ((out.float() - truth).norm() / truth.norm()).item()
    assert rel < 1e-2, f"relative error {rel:.2e}"


def _route_cases():
    """(what, rows, K, weight [N, K] or None, activation, prenorm?, QKV epilogue?, PDL?, expected):
    the routing table's cases, PDL on (Hopper) and off."""
    gpt2_down, llama_down = (768, 3072), (2048, 8192)
    return [
        ("decode row, any linear", 1, 768, None, "none", False, False, False, tsg.GEMV),
        ("decode rows with a PreNorm", 2, 2048, None, "silu_mul", True, False, True, tsg.GEMV),
        ("decode QKV with its PreNorm", 1, 2048, None, "none", True, True, False, tsg.GEMV),
        ("a decode row past four warps: the long program", 1, 18944, (3584, 18944), "none", False, False, True,
         tsg.GEMV),
        ("two decode rows past four warps: cuBLAS", 2, 18944, (3584, 18944), "none", False, False, True, tsg.TORCH),
        ("a long decode row + PreNorm: no", 1, 18944, None, "gelu_tanh_mul", True, False, False, tsg.SMALL_GEMM),
        ("a decode row past the long program's reach", 1, 1 << 17, None, "none", False, False, False, tsg.TORCH),
        ("rows, an activation", 16, 2048, None, "gelu_tanh_mul", False, False, False, tsg.SMALL_GEMM),
        ("rows, an activation after its PreNorm", 64, 2048, None, "silu_mul", True, False, False, tsg.SMALL_GEMM),
        ("rows, plain, short K, PDL", 16, 1024, None, "none", False, False, True, tsg.SMALL_GEMM),
        ("rows, plain, short K, no PDL", 16, 1024, None, "none", False, False, False, tsg.TORCH),
        ("rows, plain, split K", 16, 3072, gpt2_down, "none", False, False, True, tsg.SMALL_GEMM),
        ("rows, plain, too big to split", 16, 8192, llama_down, "none", False, False, True, tsg.TORCH),
        ("rows, QKV", 16, 2048, None, "none", False, True, False, tsg.SMALL_GEMM),
        ("rows, QKV after its PreNorm, short K, PDL", 16, 768, None, "none", True, True, True, tsg.SMALL_GEMM),
        ("rows, QKV after its PreNorm, long K", 16, 2048, None, "none", True, True, True, tsg.TORCH),
        ("many rows, GELU, no TMA", 8192, 768, None, "gelu", False, False, False, tsg.TORCH),
        ("many rows, SwiGLU", 8192, 768, None, "silu_mul", False, False, True, tsg.TORCH),
        ("no rows", 0, 768, None, "gelu", False, False, False, tsg.TORCH),
    ]


@pytest.mark.parametrize("what,m,k,w_shape,activation,prenorm,qkv,pdl,expected", _route_cases())
def test_route_table(monkeypatch, what, m, k, w_shape, activation, prenorm, qkv, pdl, expected):
    """`route`, the one place that picks a linear's kernel, case by case (shapes only: no kernel
    runs). With PDL the small GEMM also takes plain linears it can prefetch (short K) or split
    (long K, small weight); past the GEMV's rows a PreNorm is always its own kernel."""
    from tritonformer.kernels import triton_pdl
    monkeypatch.setattr(triton_pdl, "enabled", lambda device: pdl)
    monkeypatch.setattr(tsg, "FUSE_PLAIN", False)
    monkeypatch.setattr(tsg.triton_gemm, "supported", lambda device: False)
    x = torch.empty(m, k, device="meta")
    w = torch.empty(*(w_shape or (64, k)), dtype=torch.half, device="meta")
    p = ref.PreNorm(torch.empty(k, device="meta"), None, 1e-6) if prenorm else None
    monkeypatch.setattr(tsg.triton_gemv, "_INTERPRETED", True)  # meta tensors stand for CUDA ones
    assert tsg.route(x, w, activation, p, qkv_epilogue=qkv) == expected, what


def test_route_sends_many_gelu_rows_to_the_many_row_gemm_where_tma_is(monkeypatch):
    monkeypatch.setattr(tsg.triton_gemm, "supported", lambda device: True)
    x, w = torch.empty(tsg.LARGE_ROWS, 768, device="meta"), torch.empty(3072, 768, device="meta")
    assert tsg.route(x, w, "gelu") == tsg.route(x, w, "gelu_tanh") == tsg.MANY_ROW_GEMM
    assert tsg.route(x, w, "silu_mul") == tsg.route(x[:-1], w, "gelu") == tsg.TORCH
    monkeypatch.setattr(tsg, "SPLIT_LONG_K", False)
    assert tsg.split_k(3072) == 1


@pytest.mark.gpu
@gpu
def test_gpu_split_k_chain_in_a_cuda_graph():
    """Twelve GPT-2 MLPs at 64 rows, the down projection (K = 3,072) split four ways, replayed
    twice in a CUDA graph (PDL on where the GPU has it): the tile counters are reset by every
    launch, each replay equals the eager run bit for bit (the partials are added in split
    order), and the result is the fp32 reference's."""
    from tritonformer.backend.cuda_graphs import capture_graph

    assert tsg.split_k(3072) == 4
    gen = torch.Generator(device=DEVICE).manual_seed(seed_of("split-chain"))

    def rand(*shape, std):
        return (torch.randn(*shape, generator=gen, device=DEVICE) * std).half()

    layers = [(rand(3072, 768, std=768 ** -0.5), rand(3072, std=0.1), rand(768, 3072, std=3072 ** -0.5))
              for _ in range(12)]
    x0 = rand(64, 768, std=1.0)

    def run(ops, x, layers):
        for fc_w, fc_b, proj_w in layers:
            x = x + ops.linear_act(ops.linear_act(x, fc_w, fc_b, "gelu_tanh"), proj_w)
        return x

    eager = run(tsg, x0, layers)
    graph, out = capture_graph(lambda: run(tsg, x0, layers))
    for _ in range(2):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, eager, atol=0, rtol=0)
    assert not any(c[0].any() for c in arrival_counters.HELD.values())
    exact_run = run(ref, x0.float(), [tuple(t.float() for t in layer) for layer in layers])
    torch.testing.assert_close(out.float(), exact_run, atol=5e-2, rtol=5e-2)
