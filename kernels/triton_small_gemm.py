"""A Triton-language GEMM for a few rows, with the layer's epilogue fused: decode and tiny batches.

Why: with a handful of tokens (a decode step, a short request) a linear layer is a read of its
weight matrix and nothing else, and what follows it (bias, GELU, SwiGLU) is one more tiny
kernel launch. Profiled on the H100 (docs/benchmarks.md, "kernel profile"), cuBLAS runs these
shapes at 4-6 us per GEMM (split-K ones add a 1.6 us reduction kernel) for 1-12 MB of weights
that take 0.5-4 us to read, and a GPT-2 decode step is 48 such GEMMs plus 12 bias + GELU
launches; a BERT request of 32 tokens likewise.

Here one program owns BLOCK_N output columns for all (<= BLOCK_M) rows and streams those
columns' weight rows over the whole K: every weight byte is read once, with nothing to reduce
across programs, and the epilogue (bias, erf or tanh GELU, or SwiGLU's silu(gate) * up, whose
gate and up rows the program reads side by side) runs on the fp32 accumulator before the only
store. Rows past M are masked (no memory traffic); tl.dot wants 16 rows at least, so a single
row still computes a 16-row tile, which costs nothing on a memory-bound kernel.

Where it runs (`tools/time_small_gemm.py`, H100, fp16, inside CUDA graphs): with an
activation to fuse it beats cuBLAS + the separate epilogue kernel at 1-64 rows (GPT-2's and
BERT's FFN up-projection + GELU 5.5-6.5 -> 4.1-4.9 us, 1.33-1.46x; Llama-1B's gate_up + SwiGLU
29-35 -> 24-27 us, 1.18-1.32x, 2.7 TB/s). Without one it does not: cuBLAS's split-K kernels
read long-K weights faster (Llama's down projection 10.4 vs 16.6 us, GPT-2's 6.3 vs 7.5) and
the short-K ones tie. So plain linears go to torch's GEMM. Over `MAX_ROWS` rows a GELU layer
runs the fused many-row GEMM of `triton_gemm` from `LARGE_ROWS` rows on (where it has TMA), and
anything else torch's GEMM followed by the activation's own kernel.
The wrapper has the signature and result of `reference.linear_act`.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritonformer.kernels import dispatch, reference, triton_gemm
from tritonformer.kernels.dispatch import register
from tritonformer.kernels.triton_elementwise import _erf_gelu, _tanh_gelu

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Rows up to which the Triton kernel runs (0: never). Settable for A/B runs of the benchmarks.
MAX_ROWS = int(os.environ.get("TRITONFORMER_SMALL_GEMM_ROWS", "64"))
# Plain linears run the Triton kernel too only when this is set (tests of the kernel itself).
FUSE_PLAIN = False
# Rows from which a GELU layer runs triton_gemm's fused many-row GEMM (0: never; it needs TMA,
# i.e. Hopper). Between MAX_ROWS and this, cuBLAS + the bias_gelu kernel: on the H100 the two
# tie at 4,096 rows and the fused GEMM wins by 3-12% from 8,192 (tools/time_ffn_gemm.py).
LARGE_ROWS = int(os.environ.get("TRITONFORMER_FUSED_GEMM_ROWS", "4096"))
_ACT_CODE = {"none": 0, "gelu": 1, "gelu_tanh": 2, "silu_mul": 3}


def _configs() -> list[triton.Config]:
    """Column tiles of 16-64 weight rows, K streamed in 128-256 wide pipelined steps. Narrow
    tiles make more programs (N / BLOCK_N of them), which is what fills 132 SMs when N is 768;
    wide ones waste less per program on big matrices. The interpreter gets one small tile."""
    if _INTERPRETED:
        return [triton.Config({"BLOCK_N": 16, "BLOCK_K": 16}, num_warps=1, num_stages=1)]
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages)
        for bn, bk, warps, stages in (
            (16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3),
            (64, 128, 4, 3), (64, 256, 8, 3), (16, 512, 4, 2), (32, 512, 8, 2),
        )
    ]


@triton.autotune(configs=_configs(), key=["BLOCK_M", "N", "K", "ACT"])
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M"])
def _small_linear_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    """out[:, cols] = act(x @ W[cols]^T + bias[cols]) for this program's BLOCK_N columns.
    Grid: (column tiles,). With ACT == 3 (SwiGLU) W has 2N rows, gate rows first: the program
    also accumulates up = x @ W[N + cols]^T."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    w_rows = tl.minimum(cols, N - 1).to(tl.int64)  # past the edge: a valid row, never stored
    x_tile = x_ptr + rows[:, None] * stride_xm + ks[None, :]      # [BLOCK_M, BLOCK_K]
    w_tile = w_ptr + w_rows[:, None] * stride_wn + ks[None, :]    # [BLOCK_N, BLOCK_K]
    up_offset = N.to(tl.int64) * stride_wn
    row_ok = rows[:, None] < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_tile, mask=row_ok, other=0.0)
            w = tl.load(w_tile)
        else:
            k_ok = ks < K - k0
            x = tl.load(x_tile, mask=row_ok & k_ok[None, :], other=0.0)
            w = tl.load(w_tile, mask=k_ok[None, :], other=0.0)
        if DOT_FP32:
            x = x.to(tl.float32)
        acc = _dot(x, w, acc, DOT_FP32)
        if ACT == 3:
            if EVEN_K:
                u = tl.load(w_tile + up_offset)
            else:
                u = tl.load(w_tile + up_offset, mask=k_ok[None, :], other=0.0)
            acc_up = _dot(x, u, acc_up, DOT_FP32)
        x_tile += BLOCK_K
        w_tile += BLOCK_K

    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if ACT == 3:
            acc_up += tl.load(bias_ptr + N + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        acc = _erf_gelu(acc)
    elif ACT == 2:
        acc = _tanh_gelu(acc)
    elif ACT == 3:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    out = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok & (cols[None, :] < N))


@triton.jit
def _dot(x, w, acc, DOT_FP32: tl.constexpr):
    """acc + x @ w^T. DOT_FP32: fp32 operands at full precision (fp32 inputs in the tests, and
    bf16 in the CPU interpreter, whose numpy dot has no bf16; the upcast is exact)."""
    if DOT_FP32:
        return tl.dot(x, tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@register("linear_act")
def linear_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """activation(x @ weight^T + bias); see reference.linear_act. An activation and few rows
    (<= MAX_ROWS): one fused Triton kernel; otherwise torch's GEMM, then the activation's own
    kernel (see the module docstring for the measurements behind this)."""
    if activation not in _ACT_CODE:
        raise ValueError(f"activation must be one of {tuple(_ACT_CODE)}, got {activation!r}")
    assert x.dim() == 2 and weight.dim() == 2, f"x [M, K] and weight [N, K], got {list(x.shape)}, {list(weight.shape)}"
    m, k = x.shape
    n = weight.shape[0] // 2 if activation == "silu_mul" else weight.shape[0]
    assert weight.shape[1] == k, f"x is [M, K={k}] but weight is {list(weight.shape)}"
    assert weight.dtype == x.dtype, f"x and weight dtypes differ: {x.dtype} vs {weight.dtype}"
    if activation == "none" and not FUSE_PLAIN or m > MAX_ROWS or m == 0 or k == 0:
        return _unfused(x, weight, bias, activation, out)
    if x.stride(1) != 1:
        x = x.contiguous()
    weight = weight if weight.stride(1) == 1 else weight.contiguous()
    if bias is not None:
        assert bias.shape == (weight.shape[0],), f"bias must be [{weight.shape[0]}], got {list(bias.shape)}"
        bias = bias if bias.stride(0) == 1 else bias.contiguous()
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1, f"out must be [M, N] = [{m}, {n}] with contiguous rows"

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_N"]),)

    _small_linear_kernel[grid](
        x, weight, bias if bias is not None else x, out,
        m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, ACT=_ACT_CODE[activation],
        DOT_FP32=x.dtype == torch.float32 or (_INTERPRETED and x.dtype == torch.bfloat16),
        BLOCK_M=max(16, triton.next_power_of_2(m)),
    )
    return out


def _unfused(x, weight, bias, activation, out):
    """Many rows: a GELU layer from LARGE_ROWS rows in the fused many-row GEMM where TMA is
    there; otherwise torch's GEMM, then the activation's own kernel."""
    gelu = reference.GELU_APPROXIMATE.get(activation)
    if gelu is not None:
        if 0 < LARGE_ROWS <= x.shape[0] and triton_gemm.supported(x.device):
            return triton_gemm.linear_bias_gelu(x, weight, bias, gelu, out=out)
        # the bias goes to the GELU kernel's pass, in place, not to the GEMM
        h = torch.nn.functional.linear(x, weight) if out is None else torch.mm(x, weight.t(), out=out)
        return dispatch.bias_gelu(h, bias, gelu, out=h)
    if activation == "silu_mul":
        h = dispatch.silu_and_mul(torch.nn.functional.linear(x, weight, bias))
        return h if out is None else out.copy_(h)
    if out is None:
        return torch.nn.functional.linear(x, weight, bias)
    return torch.mm(x, weight.t(), out=out) if bias is None else torch.addmm(bias, x, weight.t(), out=out)
