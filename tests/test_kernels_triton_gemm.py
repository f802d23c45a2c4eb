"""The fused GEMM + bias + GELU kernel (kernels/triton_gemm.py) against
`reference.linear_bias_gelu`, on fresh seeded random inputs.

Without a GPU the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1, which the
conftest sets) with one 16 x 32 x 16 tile, so the shapes are tiny but ragged on every edge
(M=37, N=48, K=40 leaves partial row, column and K tiles), and cover M=1, M=0, no bias, both
GELU forms, a strided A, both store paths. The `gpu` group runs BERT-sized FFN shapes in fp16/bf16 through the
default Hopper tile against an fp32 torch reference.
"""
from __future__ import annotations

import os
import time
import zlib

import pytest
import torch

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels import triton_gemm as tg  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

# In the interpreter numpy reports the saturated tanh-GELU tail (exp overflowing to inf,
# which gives exactly the right limit) as a warning.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def seed_of(*params) -> int:
    """A stable per-test seed (str hashing is randomised per process; crc32 is not)."""
    return zlib.crc32(repr(params).encode())


def make_inputs(m, n, k, dtype, with_bias, seed, x_cols=None):
    """x `[m, k]` (a column slice of a `[m, x_cols]` tensor when x_cols is given), weight
    `[n, k]` and bias `[n]`, scaled like a trained layer so pre-activations are O(1) and both
    GELU tails are exercised."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def rand(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device=DEVICE) * std).to(dtype)

    if x_cols is None:
        x = rand(m, k)
    else:
        wide = rand(m, x_cols)
        x = wide[:, 3 : 3 + k]  # rows x_cols apart, starting mid-row
    weight = rand(n, k, std=1.5 / max(k, 1) ** 0.5)
    bias = rand(n, std=0.5) if with_bias else None
    return x, weight, bias


def fp32_reference(x, weight, bias, approximate):
    """The exact result: everything in fp32 (no rounding of the pre-activation)."""
    h = x.float() @ weight.float().t()
    if bias is not None:
        h = h + bias.float()
    return torch.nn.functional.gelu(h, approximate=approximate)


def test_kernel_is_registered_with_the_dispatcher():
    assert dispatch._KERNELS["linear_bias_gelu"] is tg.linear_bias_gelu
    assert "triton_gemm" in dispatch._KERNEL_MODULES


# (M, N, K): partial tiles on every edge and a K that is not a multiple of BLOCK_K (masked K
# loop); a single row; a K that is (the unmasked loop) with a ragged N.
SHAPES = [(37, 48, 40), (1, 48, 40), (20, 33, 32)]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_fp32_matches_reference(m, n, k, with_bias, approximate):
    x, w, b = make_inputs(m, n, k, torch.float32, with_bias, seed_of("fp32", m, n, k, with_bias, approximate))
    out = tg.linear_bias_gelu(x, w, b, approximate)
    expected = ref.linear_bias_gelu(x, w, b, approximate)
    assert out.dtype == torch.float32 and out.shape == (m, n) and out.is_contiguous()
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_matches_reference(dtype, approximate):
    x, w, b = make_inputs(37, 48, 40, dtype, True, seed_of("half", dtype, approximate))
    out = tg.linear_bias_gelu(x, w, b, approximate)
    expected = ref.linear_bias_gelu(x, w, b, approximate)
    assert out.dtype == dtype and out.shape == (37, 48)
    # The reference rounds the GEMM result to fp16/bf16 before the bias and GELU, the kernel
    # keeps it in fp32: a rounding step or two apart.
    atol, rtol = {torch.float16: (2e-3, 4e-3), torch.bfloat16: (1.6e-2, 3.2e-2)}[dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    # Against the exact fp32 result the kernel is then at least as close as the reference;
    # except for bf16 in the interpreter, whose fp32 -> bf16 cast truncates instead of
    # rounding to nearest (the GPU rounds), which costs up to half a bf16 step more.
    if not (INTERPRETED and dtype == torch.bfloat16):
        exact = fp32_reference(x, w, b, approximate)
        assert (out.float() - exact).norm() <= (expected.float() - exact).norm() * 1.05 + 1e-6


def test_strided_x_is_read_in_place():
    """A column slice of a wider tensor (row stride 70, not K) gives the same result as its
    contiguous copy."""
    x, w, b = make_inputs(37, 48, 40, torch.float32, True, seed_of("strided"), x_cols=70)
    assert not x.is_contiguous() and x.stride() == (70, 1)
    out = tg.linear_bias_gelu(x, w, b)
    torch.testing.assert_close(out, ref.linear_bias_gelu(x, w, b), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(out, tg.linear_bias_gelu(x.contiguous(), w, b), atol=0, rtol=0)


def test_transposed_weight_view():
    """weight given as the transpose of a `[K, N]` tensor (column-major [N, K]) works too."""
    x, w, b = make_inputs(37, 48, 40, torch.float32, True, seed_of("w_t"))
    w_t = w.t().contiguous().t()
    assert w_t.stride() == (1, 48)
    torch.testing.assert_close(tg.linear_bias_gelu(x, w_t, b), ref.linear_bias_gelu(x, w, b), atol=2e-5, rtol=2e-5)


def test_empty_inputs():
    x, w, b = make_inputs(0, 48, 40, torch.float16, True, seed_of("m0"))
    out = tg.linear_bias_gelu(x, w, b)
    assert out.shape == (0, 48) and out.dtype == torch.float16
    # K == 0: the GEMM is an empty sum, the result gelu(bias) on every row.
    x, w, b = make_inputs(5, 48, 0, torch.float32, True, seed_of("k0"))
    torch.testing.assert_close(tg.linear_bias_gelu(x, w, b), ref.linear_bias_gelu(x, w, b))


def test_bad_inputs_are_refused_with_clear_messages():
    x, w, b = make_inputs(4, 48, 40, torch.float32, True, seed_of("bad"))
    with pytest.raises(AssertionError, match="weight must be"):
        tg.linear_bias_gelu(x, w[:, :32], b)
    with pytest.raises(AssertionError, match="bias must be"):
        tg.linear_bias_gelu(x, w, b[:10])
    with pytest.raises(AssertionError, match="dtypes differ"):
        tg.linear_bias_gelu(x, w.half(), b)
    with pytest.raises(AssertionError, match=r"x must be \[M, K\]"):
        tg.linear_bias_gelu(x[None], w, b)
    with pytest.raises(ValueError, match="approximate"):
        tg.linear_bias_gelu(x, w, b, approximate="sigmoid")


def test_store_paths_and_tile_configs_agree():
    """The same product through a TMA store (aligned out) and through pointer stores (an out
    whose rows are 16-byte aligned in neither base nor stride), with the epilogue split in two
    or not, a grouped tile order and more tiles than programs: all equal the reference."""
    x, w, b = make_inputs(70, 96, 48, torch.float32, True, seed_of("paths"))
    expected = ref.linear_bias_gelu(x, w, b)
    wide = torch.empty(70, 101, dtype=torch.float32, device=DEVICE)
    unaligned_out = wide[:, 1:97]
    assert not tg._tma_ready(unaligned_out)
    for config in (tg.INTERPRETER_CONFIG, tg.TileConfig(16, 32, 16, group_m=3, num_warps=1, num_stages=1,
                                                        epilogue_split=1)):
        torch.testing.assert_close(tg.linear_bias_gelu(x, w, b, config=config), expected, atol=2e-5, rtol=2e-5)
        out = tg.linear_bias_gelu(x, w, b, out=unaligned_out, config=config)
        assert out.data_ptr() == unaligned_out.data_ptr()
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_unalignable_k_runs_the_reference():
    """fp16 rows of K = 20 (40 bytes) can never sit on 16-byte boundaries: the reference runs."""
    x, w, b = make_inputs(9, 32, 20, torch.float16, True, seed_of("k20"))
    torch.testing.assert_close(tg.linear_bias_gelu(x, w, b), ref.linear_bias_gelu(x, w, b), atol=0, rtol=0)


# ---- GPU: real FFN shapes through the autotuned tiles ----------------------------------------

@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(3072, 768), (4 * 1024, 1024)])
@pytest.mark.parametrize("m", [1, 32, 4096, 32768])
def test_gpu_ffn_shapes(m, n, k, dtype):
    x, w, b = make_inputs(m, n, k, dtype, True, seed_of("gpu", m, n, k, dtype))
    out = tg.linear_bias_gelu(x, w, b)
    assert out.dtype == dtype and out.shape == (m, n)
    exact = fp32_reference(x, w, b, "none")
    rel = ((out.float() - exact).norm() / exact.norm()).item()
    assert rel < 1e-2, f"relative error {rel:.2e}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gpu_options_and_dispatch(with_bias, approximate):
    """No bias / tanh on a ragged BERT-like shape, through the public dispatched op."""
    x, w, b = make_inputs(1000, 3072, 768, torch.float16, with_bias, seed_of("gpu_opt", with_bias, approximate),
                          x_cols=800)
    from tritonformer import kernels

    out = kernels.linear_bias_gelu(x, w, b, approximate)
    exact = fp32_reference(x, w, b, approximate)
    rel = ((out.float() - exact).norm() / exact.norm()).item()
    assert rel < 1e-2, f"relative error {rel:.2e}"


@pytest.mark.gpu
@gpu
def test_gpu_timing_fused_vs_unfused(capsys):
    """Not a pass/fail benchmark: prints the fused kernel's time next to cuBLAS + the separate
    bias+GELU kernel at bert-base's FFN shape (64 x 512 tokens), for the record (-s shows it)."""
    from tritonformer.kernels import triton_elementwise as te

    x, w, b = make_inputs(64 * 512, 3072, 768, torch.float16, True, seed_of("timing"))

    def timed(fn, reps=50):
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / reps * 1e3

    fused = timed(lambda: tg.linear_bias_gelu(x, w, b))
    gemm = timed(lambda: torch.nn.functional.linear(x, w))
    unfused = timed(lambda: te.bias_gelu(torch.nn.functional.linear(x, w), b))
    with capsys.disabled():
        print(f"\n[linear_bias_gelu 32768x3072x768 fp16] fused {fused:.3f} ms, cuBLAS GEMM alone {gemm:.3f} ms, "
              f"cuBLAS + bias_gelu kernel {unfused:.3f} ms, tile {tg.GPU_CONFIG.label()}")
