"""The prefetching decode-row GEMV (kernels/triton_gemv.py) against the reference ops, on fresh
seeded random inputs: fp32 in Triton's CPU interpreter with odd sizes; the GPT-2 and Llama-1B
layer shapes in fp16 on a GPU, there also chained inside a CUDA graph with programmatic
dependent launch (each kernel must see its predecessor's writes)."""
from __future__ import annotations

import os

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

PRENORMS = [  # (norm, x_bias, residual, sum_out): GPT-2's MLP input, Llama's, a bare LayerNorm
    ("layer", True, True, True), ("rms", False, True, True), ("layer", False, False, False),
]


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
@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_tanh", "silu_mul"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_reference(m, activation, with_bias, launches):
    rand = Rand("gemv", m, activation, with_bias)
    k, n = 40, 24  # neither a power of two: masked lanes in K and in the last column tile
    w = rand(2 * n if activation == "silu_mul" else n, k, std=k ** -0.5)
    b = rand(w.shape[0]) if with_bias else None
    x = rand(m, k)
    out = tsg.linear_act(x, w, b, activation)
    torch.testing.assert_close(out, ref.linear_act(x, w, b, activation), atol=2e-5, rtol=2e-5)
    assert launches == [m]


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("activation", ["gelu_tanh", "silu_mul"])
@pytest.mark.parametrize("norm,with_bias,with_residual,write_sum", PRENORMS)
def test_prenorm_linear_matches_reference(m, activation, norm, with_bias, with_residual, write_sum, launches):
    rand = Rand("gemv-prenorm", m, activation, norm, with_bias, with_residual)
    k, n = 48, 20
    w = rand(2 * n if activation == "silu_mul" else n, k, std=k ** -0.5)
    b = rand(w.shape[0])
    x = rand(m, k, std=2.0, mean=1.0)
    p = make_prenorm(rand, m, k, norm, with_bias, with_residual, write_sum)
    p_ref = twin(p)
    out = tsg.linear_act(x, w, b, activation, prenorm=p)
    torch.testing.assert_close(out, ref.linear_act(x, w, b, activation, prenorm=p_ref), atol=2e-5, rtol=2e-5)
    if write_sum:
        torch.testing.assert_close(p.sum_out, p_ref.sum_out, atol=1e-6, rtol=1e-6)
    assert launches == [m]


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
    (768, 768, 1, False, 8), (768, 3072, 1, False, 2), (8192, 2048, 1, True, 2), (32, 768, 2, True, 2),
    (2, 768, 1, False, 2), (768, 2 ** 15, 1, False, 1),
])
def test_block_n_keeps_the_weight_slab_in_the_register_budget(half, k, rows, paired, expected):
    assert triton_gemv.block_n(half, k, rows, paired) == expected


def _layer_shapes():
    """(name, N, K, activation, norm): one decoder layer's linears, GPT-2 and Llama-1B."""
    return [("gpt2 o", 768, 768, "none", None), ("gpt2 fc", 3072, 768, "gelu_tanh", "layer"),
            ("gpt2 proj", 768, 3072, "none", None), ("llama o", 2048, 2048, "none", None),
            ("llama gate_up", 8192, 2048, "silu_mul", "rms"), ("llama down", 2048, 8192, "none", None)]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("name,n,k,activation,norm", _layer_shapes())
def test_gpu_layer_shapes(m, name, n, k, activation, norm):
    rand = Rand("gemv-gpu", name, m, dtype=torch.float16)
    w = rand(2 * n if activation == "silu_mul" else n, k, std=k ** -0.5)
    b = rand(w.shape[0], std=0.1) if name.startswith("gpt2") else None
    x = rand(m, k)
    p = make_prenorm(rand, m, k, norm, norm == "layer", True, True) if norm else None
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
