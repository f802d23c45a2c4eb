"""Triton-language GEMM with a fused bias + GELU epilogue: BERT's FFN up-projection.

Why fuse: the FFN's first GEMM writes a `[tokens, 4 * hidden]` activation (3072 columns for
bert-base), the widest tensor of the layer. Unfused, that tensor goes to memory once from the
GEMM, is read back and written again by the bias + GELU kernel, and read once more by the
down-projection: the bias + GELU pass alone is a full extra read and write of the layer's
biggest activation and costs ~2 ms of a 15 ms bert-base forward at 64 x 512 tokens on an
H100. Here the bias and GELU are applied to the fp32 accumulator tile while it is still in
registers, so the output is written exactly once, already activated (TurboTransformers'
rule of fusing the element-wise work that follows a GEMM into it). As a side benefit the
pre-activation is never rounded to fp16/bf16, so the result is slightly closer to the exact
value than the unfused reference.

Layout: C[M, N] = gelu(A[M, K] @ W[N, K]^T + bias[N]). W is nn.Linear's weight as stored; the
kernel reads it as the transposed operand through its strides, no copy. Programs are ordered
in groups of GROUP_M row tiles (see `_tile_of_program`) so that consecutive programs share
both A row tiles and W column tiles in L2.

The wrapper has the signature and result of `reference.linear_bias_gelu`.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritonformer.kernels import reference
from tritonformer.kernels.dispatch import register

# The exact (erf) and tanh GELU definitions are shared with the unfused bias_gelu kernel, so
# the fused and unfused paths use the same formulas.
from tritonformer.kernels.triton_elementwise import _erf_gelu, _tanh_gelu

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Tokens above this share one autotuning bucket (the best tile no longer changes with M).
_MAX_M_BUCKET = 8192


def _configs() -> list[triton.Config]:
    """Tile configurations to autotune over.

    On the GPU: a few Hopper-sensible tiles (wgmma wants BLOCK_M of 64 or 128 and a BLOCK_K of
    64 halves per stage; 3-4 stages of shared-memory pipelining). Large tiles win on the big
    prefill GEMMs, the 64-row ones on small batches where the big tiles would leave most SMs
    idle; the narrow 64 x 32 tile (tried for a handful of tokens only) spreads the weight
    read, which is all the work at M ~ 1, over more SMs. In the CPU interpreter tiles cost
    time per element, so one small tile.
    """
    if _INTERPRETED:
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}, num_warps=1, num_stages=1)]

    def cfg(bm, bn, bk, warps, stages):
        return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                             num_warps=warps, num_stages=stages)

    return [
        cfg(128, 256, 64, 8, 3),
        cfg(128, 128, 64, 4, 4),
        cfg(128, 128, 64, 8, 4),
        cfg(64, 128, 64, 4, 4),
        cfg(128, 64, 64, 4, 4),
        cfg(64, 64, 64, 4, 4),
        cfg(64, 32, 128, 4, 4),
    ]


def _prune_configs(configs, named_args, **kwargs):
    """Skip tiles that cannot win, so tuning a new (M bucket, N, K) is quick: tiles with far
    more rows than there are tokens, the narrow tile beyond a handful of tokens, and for fp32
    inputs (tests only) the tiles whose pipeline stages do not fit in shared memory at 4 bytes
    per element."""
    m_bucket = named_args["M_BUCKET"]
    fp32 = named_args["a_ptr"].dtype == torch.float32
    kept = [
        c for c in configs
        if c.kwargs["BLOCK_M"] <= max(64, m_bucket)
        and (c.kwargs["BLOCK_N"] >= 64 or m_bucket <= 64)
        and not (fp32 and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] > 128 * 64)
    ]
    return kept or configs[-1:]


@triton.jit
def _tile_of_program(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map a linear program id to its (row tile, column tile), grouped for L2 reuse.

    Row-major order (all column tiles of row tile 0, then row tile 1, ...) streams the whole
    of W through L2 for every row tile. Instead programs walk down a group of GROUP_M row tiles
    first and then move one column tile right: a wave of programs then touches only GROUP_M row
    tiles of A and a few column tiles of W, which stay in L2 while the wave reuses them.
    """
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    programs_per_group = GROUP_M * tiles_n
    group = pid // programs_per_group
    first_m = group * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)  # the last group may be short
    within = pid % programs_per_group
    tile_m = first_m + within % rows_in_group
    tile_n = within // rows_in_group
    return tile_m, tile_n


@triton.autotune(configs=_configs(), key=["M_BUCKET", "N", "K"],
                 prune_configs_by=None if _INTERPRETED else {"early_config_prune": _prune_configs})
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M_BUCKET"])
def _linear_bias_gelu_kernel(
    a_ptr, w_ptr, bias_ptr, c_ptr,
    M, N, K, M_BUCKET,
    stride_am, stride_ak, stride_wn, stride_wk, stride_cm,
    HAS_BIAS: tl.constexpr, APPROX_TANH: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile of C = gelu(A @ W^T + bias). Grid: (tiles of M * tiles of N,).

    M_BUCKET is only the autotuning key (a power of two >= M). Rows and columns past the edges
    are clamped to the last valid one for the loads (they compute garbage that is never
    stored), so the K loop needs masks only when K is not a multiple of BLOCK_K. DOT_FP32 runs
    the dot on fp32 operands at full ("ieee") precision: for fp32 inputs (tests), and for bf16
    in the CPU interpreter, whose numpy dot has no bf16 (the upcast is exact, and so are the
    bf16 products in fp32, so the result is what the tensor cores give up to summation order).
    """
    tile_m, tile_n = _tile_of_program(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # int64 row / column offsets: M * stride may pass 2**31 for long packed batches.
    a_rows = tl.minimum(rows, M - 1).to(tl.int64)
    w_cols = tl.minimum(cols, N - 1).to(tl.int64)
    a_tile = a_ptr + a_rows[:, None] * stride_am + ks[None, :] * stride_ak   # [BLOCK_M, BLOCK_K]
    w_tile = w_ptr + ks[:, None] * stride_wk + w_cols[None, :] * stride_wn   # [BLOCK_K, BLOCK_N] = W^T

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_tile)
            w = tl.load(w_tile)
        else:
            k_left = K - k0
            a = tl.load(a_tile, mask=ks[None, :] < k_left, other=0.0)
            w = tl.load(w_tile, mask=ks[:, None] < k_left, other=0.0)
        if DOT_FP32:
            acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
        a_tile += BLOCK_K * stride_ak
        w_tile += BLOCK_K * stride_wk

    # Epilogue on the fp32 accumulator: this is the pass the fusion saves.
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if APPROX_TANH:
        y = _tanh_gelu(acc)
    else:
        y = _erf_gelu(acc)
    c_tile = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_tile, y.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def _m_bucket(m: int) -> int:
    """Autotuning bucket for M tokens: the next power of two, capped. New batch sizes (and CUDA
    graph capture of a bucket already seen eagerly) reuse the tuned tile instead of
    re-benchmarking."""
    return min(triton.next_power_of_2(max(m, 1)), _MAX_M_BUCKET)


@register("linear_bias_gelu")
def linear_bias_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    approximate: str = "none",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """GELU(x @ weight^T + bias) in one GEMM kernel; see reference.linear_bias_gelu.

    x: `[M, K]` (rows may be strided, e.g. a column slice of a wider tensor); weight: `[N, K]`
    (nn.Linear layout, read in place); bias: `[N]` or None. Returns a contiguous `[M, N]` in
    x's dtype (in `out` when given: an activation-arena view, say).
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    assert x.dim() == 2, f"x must be [M, K], got shape {list(x.shape)}"
    assert weight.dim() == 2, f"weight must be [N, K] (nn.Linear layout), got shape {list(weight.shape)}"
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k, (
        f"x is [M, K] = {list(x.shape)} but weight is {list(weight.shape)}: weight must be [N, K={k}]"
    )
    assert x.dtype in _DTYPES, f"x must be float16, bfloat16 or float32, got {x.dtype}"
    assert weight.dtype == x.dtype, f"x and weight dtypes differ: {x.dtype} vs {weight.dtype}"
    assert weight.device == x.device, f"x and weight devices differ: {x.device} vs {weight.device}"
    if bias is not None:
        assert bias.shape == (n,), f"bias must be [N] = [{n}], got shape {list(bias.shape)}"
        assert bias.is_floating_point(), f"bias must be a float tensor, got {bias.dtype}"
        assert bias.device == x.device, f"x and bias devices differ: {x.device} vs {bias.device}"
        bias = bias if bias.stride(0) == 1 else bias.contiguous()

    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1, f"out must be [M, N] = [{m}, {n}] with contiguous rows"
    if m == 0 or n == 0:
        return out
    if k == 0:  # an empty sum: nothing for a GEMM to do, gelu(bias) broadcast over the rows
        return reference.linear_bias_gelu(x, weight, bias, approximate, out=out)
    if x.stride(1) != 1:  # rows may be strided; within a row, elements must be adjacent
        x = x.contiguous()

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    _linear_bias_gelu_kernel[grid](
        x, weight, bias if bias is not None else x, out,
        m, n, k, _m_bucket(m),
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), out.stride(0),
        HAS_BIAS=bias is not None, APPROX_TANH=approximate == "tanh",
        DOT_FP32=x.dtype == torch.float32 or (_INTERPRETED and x.dtype == torch.bfloat16),
    )
    return out
