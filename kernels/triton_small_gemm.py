"""A Triton-language GEMM for a few rows, with what surrounds a decoder's linears fused in.

Why: with a handful of tokens (a decode step, a short request) a linear layer is a read of its
weight matrix and nothing else, and the ops around it (bias and GELU or GLU after an MLP
linear; the residual add and norm before the QKV projection, its split, rotary and cache write
after) are each one more tiny launch. Profiled on the H100 (`tools/gpu/profile_gpu_kernels.py`),
cuBLAS runs these shapes at 4-6 us per GEMM for 1-12 MB of weights that take
0.5-4 us to read, and every other launch of a decode step costs 2-3 us however little it does.

One program owns BLOCK_N output columns for all (<= BLOCK_M) rows and streams those columns'
weight rows over the whole K; tl.dot wants 16 rows at least, so a single row still computes a
16-row tile (rows past M are masked: no memory traffic). Around that:

* epilogues, on the fp32 accumulator before the only store:
  - plain (`linear_act`): bias, then erf or tanh GELU, or a gated activation's act(gate) * up
    (SwiGLU, GeGLU: the program reads the gate and up weight rows side by side, two
    accumulators);
  - QKV (`prenorm_qkv_to_cache`): bias, rotary (the program holds both halves of a head's
    columns, two accumulators) and the store of q to its tensor and of k and v straight into
    the paged KV cache.

* split K (plain linears with a long K, `split_k`): a tile's K is cut into SPLIT_K ranges run
  by separate programs, so a long weight row is streamed by several SMs at once (one program
  streaming a whole 3,072-element row was slower than cuBLAS, which splits K too). Each
  program stores its fp32 partial sum in a workspace and counts itself in on the tile's
  counter; the last one to arrive adds the partials in split order (the result does not depend
  on who came last) and runs the epilogue. cuBLAS does the same in two kernels, the second a
  reduce launched without PDL.

A decode row or two never reaches this kernel: triton_gemv.py runs those, with the residual
add and norm before a linear (`PreNorm`) fused in as its prologue. Here a PreNorm runs as its
own norm kernel first (`_unfused_prenorm`).

The op wrappers have the signatures and results of their references. Which kernel serves a
linear is decided in one place, `route` (its cases are enumerated by the tests); past MAX_ROWS
rows the unfused kernels run (`_unfused`, `_unfused_prenorm`).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritonformer.kernels import (arrival_counters, dispatch, fp8, reference, triton_fp8, triton_gemm, triton_gemv,
                                  triton_pdl)
from tritonformer.kernels.dispatch import register
from tritonformer.kernels.fp8 import Fp8Activation, Fp8Weight
from tritonformer.kernels.reference import GATED_ACTIVATIONS, PreNorm
from tritonformer.kernels.triton_linear_parts import (ACT_CODE, NORM_LAYER, NORM_NONE, NORM_RMS, NORM_SUM, OUT_PLAIN,
                                                        OUT_QKV, column_tile, store_epilogue)
from tritonformer.kernels.triton_linear_parts import or_dummy as _or

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# The routing's thresholds are module constants, the measured best; a benchmark that compares
# sets them (they are read at every call).
# Rows up to which the Triton kernel runs (0: never).
MAX_ROWS = 64
# Plain linears run the Triton kernel too only when this is set (tests of the kernel itself).
FUSE_PLAIN = False
# Rows from which a GELU layer runs triton_gemm's fused many-row GEMM (0: never; it needs TMA,
# i.e. Hopper). Between MAX_ROWS and this, cuBLAS + the bias_gelu kernel: on the H100 the two
# tie at 4,096 rows and the fused GEMM wins by 3-12% from 8,192 (tools/gpu/time_ffn_gemm.py).
LARGE_ROWS = 4096
# Longest K for which a linear without an activation runs this kernel when PDL is on (`_prefetched`).
PREFETCH_MAX_K = 1024
# Split K for plain linears longer than PREFETCH_MAX_K (False: never, the column before in the
# benchmarks). Each split streams at least SPLIT_K_MIN_K weight columns; at most SPLIT_K_MAX.
SPLIT_LONG_K = True
SPLIT_K_MIN_K, SPLIT_K_MAX = 768, 8
# Largest weight matrix that the routing sends to split K (`_split`). Measured on the H100
# (tools/gpu/time_decode_linears.py): GPT-2's layers at 64 rows 291 -> 277 us
# with its 4.7 MB down projections split, Llama-1B's 1,043 -> 1,151 us with its 8 and 32 MB
# output and down projections split as well; cuBLAS keeps those.
SPLIT_MAX_BYTES = 6 << 20
# Largest weight matrix whose tiles are pulled into L2 before the wait: bigger ones (Llama-1B's
# 12-67 MB) would evict each other from the 50 MB L2 before use, and read HBM twice (measured:
# Llama-1B's layers at 16 and 64 rows 0.93x with every weight prefetched).
PREFETCH_MAX_BYTES = 8 << 20


# (BLOCK_N, BLOCK_K, warps, stages) candidates. Plain: column tiles of 16-64 weight rows, K
# streamed in 128-512 wide pipelined steps; narrow tiles make more programs (N / BLOCK_N of
# them), which is what fills 132 SMs when N is 768, wide ones waste less per program on big
# matrices. QKV (tiles inside half a head): shallower pipelines won there on the H100
# (`tools/gpu/time_small_gemm.py`).
_PLAIN_TILES = ((16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3),
                (64, 128, 4, 3), (64, 256, 8, 3), (16, 512, 4, 2), (32, 512, 8, 2))
_QKV_TILES = ((16, 128, 4, 4), (32, 256, 4, 3), (16, 512, 4, 2), (16, 128, 4, 2), (32, 128, 4, 2), (16, 64, 4, 3))
# What split K's host side sizes for, whichever plain tile the autotuner picks (the interpreter's
# 16 x 16 tile lies within): the most column tiles, the widest grid, the longest K range.
_PLAIN_MIN_N, _PLAIN_MAX_N = min(t[0] for t in _PLAIN_TILES), max(t[0] for t in _PLAIN_TILES)
_PLAIN_MAX_K = max(t[1] for t in _PLAIN_TILES)


def _tile(c: triton.Config) -> tuple[int, int, int, int]:
    return c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages


def _configs() -> list[triton.Config]:
    """Every candidate tile; `_candidates` picks a launch's. The interpreter gets one small tile."""
    if _INTERPRETED:
        return [triton.Config({"BLOCK_N": 16, "BLOCK_K": 16}, num_warps=1, num_stages=1)]
    tiles = dict.fromkeys(_PLAIN_TILES + _QKV_TILES)
    return [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st) for bn, bk, w, st in tiles]


def _candidates(configs, named_args, **kwargs):
    """The plain or the QKV candidates; the QKV epilogue needs a column tile inside one half of
    one head."""
    if _INTERPRETED:
        return configs
    args = {**named_args, **kwargs}  # constexprs passed by keyword arrive in kwargs
    if args["OUT"] != OUT_QKV:
        return [c for c in configs if _tile(c) in _PLAIN_TILES]
    qkv = [c for c in configs if _tile(c) in _QKV_TILES]
    return [c for c in qkv if c.kwargs["BLOCK_N"] <= args["HALF"]] or qkv[:1]  # a tiny head: masked columns


@triton.jit
def _dot(x, w, acc, DOT_FP32: tl.constexpr):
    """acc + x @ w^T. DOT_FP32: fp32 operands at full precision (fp32 inputs in the tests, and
    bf16 in the CPU interpreter, whose numpy dot has no bf16; the upcast is exact)."""
    if DOT_FP32:
        return tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _sum_splits(acc, partial_ptr, counter_ptr, rows, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """Split K's meeting point. Stores this program's partial `acc` in the workspace (laid out
    [SPLIT_K, BLOCK_M, tiles * BLOCK_N], fp32) and counts it in on its tile's counter. Returns
    (the tile's whole sum, whether this program arrived last, as a row mask); only the last
    one's sum is complete, and it resets the counter to 0 for the tile's next use."""
    tile = tl.program_id(0)
    width = tl.num_programs(0) * BLOCK_N
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    slab = partial_ptr + rows[:, None] * width + cols[None, :]
    tl.store(slab + tl.program_id(1) * BLOCK_M * width, acc)
    tl.debug_barrier()  # every thread's partial is written before the count says so (release)
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
    last = (tl.zeros((BLOCK_M,), dtype=tl.int32) + arrived) == SPLIT_K - 1  # per row, all alike
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):  # in split order, whoever came last: deterministic
        # .cg: from L2, where the other SMs' stores are, never a stale line of this SM's L1
        total += tl.load(slab + split * BLOCK_M * width, mask=last[:, None], other=0.0, cache_modifier=".cg")
    tl.atomic_xchg(counter_ptr + tile, 0, mask=arrived == SPLIT_K - 1)
    return total, last


@triton.jit
def _in_dtype_of(w, x, SCALED: tl.constexpr):
    """A weight tile as the dot takes it: FP8 weights (SCALED) converted to x's dtype in
    registers (their row scales are applied to the accumulator later); others as loaded."""
    if SCALED:  # (one return: the compiler wants every return of one type, even in a pruned branch)
        w = w.to(x.dtype)
    return w


@triton.autotune(configs=_configs(), key=["BLOCK_M", "N", "K", "ACT", "OUT", "SPLIT_K", "SCALED"],
                 prune_configs_by={"early_config_prune": _candidates})
@triton.jit(do_not_specialize=["M"])
def _small_linear_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, cos_ptr, sin_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, partial_ptr,
    counter_ptr, M, N, stride_xm, stride_wn, stride_om, stride_cos,
    K: tl.constexpr, HALF: tl.constexpr, HEADS_Q: tl.constexpr, HEADS_KV: tl.constexpr,
    PAIRED: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, OUT: tl.constexpr, ROTARY: tl.constexpr,
    SCALED: tl.constexpr, DOT_FP32: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr, LINES: tl.constexpr,
    PER_LINE: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One column tile of out = epilogue(x @ W^T), or with SPLIT_K > 1 one K range of it.
    Grid: (column tiles, SPLIT_K), see column_tile. SCALED: FP8 weights (E4M3 values, row scales
    at scale_ptr), weight-only: the tiles are converted to x's dtype for the dot and the row
    scales multiply the whole sum, before the bias."""
    head, j, cols, col_ok = column_tile(HALF, BLOCK_N, PAIRED)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    # This program's K range: [k_lo, k_lo + K_RANGE), a whole number of BLOCK_K steps.
    K_RANGE: tl.constexpr = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = tl.program_id(1) * K_RANGE
    w_rows = tl.where(col_ok, cols, 0).to(tl.int64)  # past the edge: a valid row, never stored
    w_tile = w_ptr + w_rows[:, None] * stride_wn + (k_lo + tl.arange(0, BLOCK_K))[None, :]  # [BLOCK_N, BLOCK_K]
    partner = HALF * stride_wn
    if PREFETCH:
        # Launched while the previous kernel runs: pull this tile's weight rows into L2 (the
        # LINES 128-byte lines of each, PER_LINE elements apiece) before waiting for its output.
        line = tl.minimum(k_lo + tl.arange(0, LINES) * PER_LINE, tl.minimum(k_lo + K_RANGE, K) - 1)
        lines = w_ptr + w_rows[:, None] * stride_wn + line[None, :]
        triton_pdl.prefetch_l2(lines)
        if PAIRED:
            triton_pdl.prefetch_l2(lines + partner)
    triton_pdl.wait_for_predecessor(PDL)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_RANGE, BLOCK_K):
        ks = k_lo + k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _dot(x, _in_dtype_of(tl.load(w_tile, mask=k_ok[None, :], other=0.0), x, SCALED), acc, DOT_FP32)
        if PAIRED:
            acc_b = _dot(x, _in_dtype_of(tl.load(w_tile + partner, mask=k_ok[None, :], other=0.0), x, SCALED), acc_b,
                         DOT_FP32)
        w_tile += BLOCK_K
    if SPLIT_K > 1:  # plain linears only (`split_k`): acc_b is unused
        acc, last = _sum_splits(acc, partial_ptr, counter_ptr, rows, SPLIT_K, BLOCK_M, BLOCK_N)
        row_ok = row_ok & last  # the others store nothing

    if SCALED:
        acc *= tl.load(scale_ptr + cols, mask=col_ok, other=0.0)[None, :]
        if PAIRED:
            acc_b *= tl.load(scale_ptr + cols + HALF, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if PAIRED:
            acc_b += tl.load(bias_ptr + cols + HALF, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    store_epilogue(acc, acc_b, head, j, rows, row_ok, col_ok, out_ptr, stride_om, cos_ptr, sin_ptr, slot_ptr,
                   k_cache_ptr, v_cache_ptr, stride_cos, HALF, HEADS_Q, HEADS_KV, ACT, OUT, ROTARY)


def _launch(x, weight, bias, out, *, gemv, act="none", prenorm=None, out_mode=OUT_PLAIN, qkv=None):
    """Run triton_gemv's kernel (gemv: the route GEMV) or _small_linear_kernel. x: `[M, K]`;
    out: `[M, N]` (plain) or q `[M, H, D]` (QKV, with qkv = (H, Hkv, D, cos, sin, k_cache,
    v_cache, slots)). An Fp8Weight runs weight-only: its E4M3 values and row scales."""
    m, k = x.shape
    scale = None
    if isinstance(weight, Fp8Weight):
        weight, scale = weight.data, weight.scale
        operand_dtype = x.dtype
    else:
        operand_dtype = weight.dtype
    x = x if x.stride(1) == 1 else x.contiguous()
    paired = act in GATED_ACTIVATIONS or out_mode == OUT_QKV
    half = qkv[2] // 2 if out_mode == OUT_QKV else (weight.shape[0] // 2 if paired else weight.shape[0])
    halves = weight.shape[0] // (2 * half) if paired else 1
    p = prenorm
    residual = p.residual if p is not None else None
    sum_out = p.sum_out if p is not None else None
    for t in (residual, sum_out):
        assert t is None or (t.shape == (m, k) and t.is_contiguous()), "residual and sum_out must be contiguous [M, K]"
    if sum_out is not None:
        assert sum_out.data_ptr() not in (x.data_ptr(), residual.data_ptr() if residual is not None else -1), \
            "sum_out must not overlap the input or the residual: other programs still read them"
    if gemv:
        return triton_gemv.launch(x, weight, bias, out, paired=paired, half=half, act_code=ACT_CODE[act],
                                  norm_code=_norm_code(p), prenorm=p, out_mode=out_mode, qkv=qkv, scale=scale)
    assert p is None, "past the GEMV's rows a PreNorm runs as its own kernel (_unfused_prenorm)"
    heads_q, heads_kv, _, cos, sin, k_cache, v_cache, slots = qkv or (0, 0, 0, None, None, None, None, None)
    rotary = cos is not None
    pdl = triton_pdl.enabled(x.device)
    per_line = 128 // weight.element_size()
    block_m = max(16, triton.next_power_of_2(m))
    splits = split_k(k) if out_mode == OUT_PLAIN and not paired else 1
    partial = counters = x  # unused without splits
    if splits > 1:
        partial = torch.empty((splits, block_m, half + _PLAIN_MAX_N), dtype=torch.float32, device=x.device)
        counters = arrival_counters.zeroed(x.device, triton.cdiv(half, _PLAIN_MIN_N))

    def grid(meta):
        return (halves * triton.cdiv(half, meta["BLOCK_N"]), splits)

    _small_linear_kernel[grid](
        x, weight, _or(scale, x), _or(bias, x), out, _or(cos, x), _or(sin, x), _or(slots, x), _or(k_cache, x),
        _or(v_cache, x), partial, counters,
        m, weight.shape[0], x.stride(0), weight.stride(0), out.stride(0) if out_mode == OUT_PLAIN else 0,
        cos.stride(0) if rotary else 0,
        K=k, HALF=half, HEADS_Q=heads_q, HEADS_KV=heads_kv,
        PAIRED=paired, HAS_BIAS=bias is not None, ACT=ACT_CODE[act], OUT=out_mode, ROTARY=rotary,
        SCALED=scale is not None,
        DOT_FP32=operand_dtype == torch.float32 or (_INTERPRETED and operand_dtype == torch.bfloat16),
        PDL=pdl, PREFETCH=pdl and weight.numel() * weight.element_size() <= PREFETCH_MAX_BYTES,
        # lines of one split's K range (the longest, at the largest BLOCK_K)
        LINES=triton.next_power_of_2(triton.cdiv(triton.cdiv(triton.cdiv(k, splits), _PLAIN_MAX_K) * _PLAIN_MAX_K,
                                                 per_line)),
        PER_LINE=per_line, SPLIT_K=splits, BLOCK_M=block_m, **triton_pdl.launch_options(pdl),
    )
    return out


def split_k(k: int) -> int:
    """K splits of a plain linear: 1 up to PREFETCH_MAX_K (a tile's row is short enough for one
    program), then a power of two giving each split at least SPLIT_K_MIN_K columns, at most
    SPLIT_K_MAX. GPT-2's down projection (K = 3,072): 4; Llama-1B's output projection: 2, its
    down projection: 8."""
    if not SPLIT_LONG_K or k <= PREFETCH_MAX_K:
        return 1
    splits = 1
    while splits < SPLIT_K_MAX and k >= 2 * splits * SPLIT_K_MIN_K:
        splits *= 2
    return splits


def _norm_code(prenorm: PreNorm | None) -> int:
    if prenorm is None:
        return NORM_NONE
    if prenorm.weight is None:
        return NORM_SUM
    return NORM_RMS if prenorm.bias is None else NORM_LAYER


def _check_linear(x, weight, bias, activation):
    """Validated (M, N): x `[M, K]`, weight `[N, K]` (`[2N, K]` for a gated activation)."""
    if activation not in ACT_CODE:
        raise ValueError(f"activation must be one of {tuple(ACT_CODE)}, got {activation!r}")
    assert x.dim() == 2 and weight.dim() == 2, f"x [M, K] and weight [N, K], got {list(x.shape)}, {list(weight.shape)}"
    m, k = x.shape
    assert weight.shape[1] == k, f"x is [M, K={k}] but weight is {list(weight.shape)}"
    if bias is not None:
        assert bias.shape == (weight.shape[0],), f"bias must be [{weight.shape[0]}], got {list(bias.shape)}"
    return m, weight.shape[0] // 2 if activation in GATED_ACTIVATIONS else weight.shape[0]


# The kernels a linear can run on (`route`).
GEMV = "gemv"  # triton_gemv: PreNorm prologue and epilogue fused
SMALL_GEMM = "small_gemm"  # this module's kernel: epilogue fused (PreNorm: its own kernel first)
MANY_ROW_GEMM = "many_row_gemm"  # triton_gemm's fused bias + GELU GEMM (PreNorm: its own kernel first)
TORCH = "torch"  # torch's GEMM (cuBLAS); PreNorm, activation and QKV epilogue in kernels of their own
# FP8 weights past fp8.WEIGHT_ONLY_MAX_ROWS: per-token activation quantisation and the FP8
# tensor-core GEMM (triton_fp8.scaled_mm); PreNorm, bias and activation as TORCH runs them.
SCALED_MM = "scaled_mm"


def route(x: torch.Tensor, weight: torch.Tensor, activation: str = "none", prenorm: PreNorm | None = None,
          qkv_epilogue: bool = False) -> str:
    """Which kernel serves a linear of x `[M, K]` (one of GEMV, SMALL_GEMM, MANY_ROW_GEMM,
    SCALED_MM, TORCH): the one place that decides. `qkv_epilogue`: the QKV projection wants its bias,
    rotary and cache write fused. prenorm_qkv_to_cache with q/k head norms asks without it: a
    fused epilogue's program holds a few columns of one head half (its column tile), never the
    whole head a norm needs, so that projection routes as a plain linear (the GEMV keeping the
    PreNorm prologue) and the qkv_to_cache kernel, which holds whole heads, follows it: one
    launch more.

    * GEMV: a decode row or two (<= triton_gemv.MAX_ROWS), any linear, its PreNorm included
      (K <= 16,384; one row of a plain linear without a PreNorm up to triton_gemv.MAX_LONG_K).
    * SMALL_GEMM: up to MAX_ROWS rows, a linear with an epilogue to fuse (an activation, or the
      QKV epilogue without a PreNorm, or after one where `_prefetched`); a plain linear only
      where PDL lets it prefetch (`_prefetched`, `_split`): elsewhere cuBLAS runs these shapes
      as fast or faster (see the module docstring).
    * MANY_ROW_GEMM: a GELU linear from LARGE_ROWS rows where TMA is there (Hopper).
    * TORCH: everything else.

    An FP8 weight (kernels/fp8.py) reads its E4M3 values where the rows are few: the GEMV as
    above, then the small GEMM up to fp8.WEIGHT_ONLY_MAX_ROWS (weight-only: a decode batch is
    memory-bound and cuBLAS has no GEMM of fp16 rows by FP8 weights); past that SCALED_MM where
    the GPU has a row-wise FP8 GEMM and K, N are multiples of 16, else TORCH, which for an FP8
    weight is its reference (the weight dequantised: correct, slow). An activation that comes
    quantised already (an fp8.Fp8Activation: many rows) goes the same way, SCALED_MM or TORCH.
    """
    m, k = x.shape
    if m == 0 or k == 0:
        return TORCH
    if isinstance(x, Fp8Activation):
        return SCALED_MM if triton_fp8.supported(x, weight) else TORCH
    if triton_gemv.supported(m, x, prenorm, plain=activation not in GATED_ACTIVATIONS and not qkv_epilogue):
        return GEMV
    if isinstance(weight, Fp8Weight):
        if m <= fp8.WEIGHT_ONLY_MAX_ROWS:
            return SMALL_GEMM
        return SCALED_MM if triton_fp8.supported(x, weight) else TORCH
    if m <= MAX_ROWS:
        if qkv_epilogue:
            if prenorm is None or _prefetched(x):
                return SMALL_GEMM
        elif activation != "none" or FUSE_PLAIN or _prefetched(x) or _split(x, weight):
            return SMALL_GEMM
    if activation in reference.GELU_APPROXIMATE and 0 < LARGE_ROWS <= m and triton_gemm.supported(x.device):
        return MANY_ROW_GEMM
    return TORCH


def _prefetched(x: torch.Tensor) -> bool:
    """Whether a linear without an activation runs the small GEMM anyway: with PDL, which lets
    it pull its weights into L2 while the previous kernel runs, and a short K. Measured on the
    H100 with tools/gpu/time_decode_linears.py: GPT-2's layers (K = 768) at 16 and 64 rows gained;
    Llama-1B's (K >= 2048), whose long weight rows one program streams alone where cuBLAS
    splits K, lost."""
    return triton_pdl.enabled(x.device) and x.shape[1] <= PREFETCH_MAX_K


def _split(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a linear without an activation runs the small GEMM with split K: with PDL, a K
    past PREFETCH_MAX_K and a weight of at most SPLIT_MAX_BYTES (it replaces cuBLAS's split-K
    GEMM and its reduce kernel, neither launched with PDL)."""
    return (triton_pdl.enabled(x.device) and split_k(x.shape[1]) > 1
            and weight.numel() * weight.element_size() <= SPLIT_MAX_BYTES)


def _fp8_matmul(x: torch.Tensor | Fp8Activation, weight: Fp8Weight, r: str,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W^T + bias of an FP8 weight past the few-row kernels, in its activation dtype: the FP8
    tensor-core GEMM (route SCALED_MM, the bias in its epilogue) or the reference (TORCH); x
    quantised per token there, unless it comes so (an Fp8Activation)."""
    if r == SCALED_MM:
        return triton_fp8.scaled_mm(x, weight, bias=bias)
    return reference.fp8_linear(x, weight, bias)


@register("linear_act")
def linear_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    out: torch.Tensor | None = None,
    prenorm: PreNorm | None = None,
    fp8_out: bool = False,
) -> torch.Tensor | Fp8Activation:
    """activation(PreNorm(x) @ weight^T + bias); see reference.linear_act. The kernel is
    `route`'s: the GEMV runs the PreNorm in its prologue; every other route runs it as its own
    kernel first, then the small fused GEMM, the many-row fused GELU GEMM, or torch's GEMM and
    the activation's own kernel. FP8 chains: x may be an Fp8Activation (its GEMM skips the
    quantisation); with `fp8_out` where reference.fp8_out_applies, the GEMM writes its output with
    the bias, and the activation and the per-token quantisation run in one kernel
    (triton_fp8.act_quantize_rows_fp8) whose Fp8Activation is returned (`out` unused)."""
    m, n = _check_linear(x, weight, bias, activation)
    assert weight.dtype == x.dtype, f"x and weight dtypes differ: {x.dtype} vs {weight.dtype}"
    if isinstance(x, Fp8Activation):
        assert fp8.quantizes_activations(weight, m) and prenorm is None, \
            "an Fp8Activation is the operand of an FP8 weight's linear on many rows, without a prenorm"
    x, prenorm = _gemv_prenorm(x, prenorm)
    r = route(x, weight, activation, prenorm)
    if r != GEMV:
        x, prenorm = _unfused_prenorm(x, prenorm), None
    if fp8_out and reference.fp8_out_applies(weight, m, activation):
        assert r in (SCALED_MM, TORCH), r  # an FP8 weight past the weight-only rows
        return triton_fp8.act_quantize_rows_fp8(_fp8_matmul(x, weight, r, bias), activation)
    if r in (TORCH, MANY_ROW_GEMM, SCALED_MM):
        return _unfused(x, weight, bias, activation, out, many_rows=r == MANY_ROW_GEMM, fp8_route=r)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1, f"out must be [M, N] = [{m}, {n}] with contiguous rows"
    return _launch(x, _contig(weight), _contig(bias), out, gemv=r == GEMV, act=activation, prenorm=prenorm)


@register("prenorm_qkv_to_cache")
def prenorm_qkv_to_cache(
    x: torch.Tensor,
    prenorm: PreNorm | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """PreNorm, the QKV projection, bias, the q/k head norms, rotary and the cache write; see
    reference.prenorm_qkv_to_cache. On `route`'s kernel: a decode row or two, all of it in the
    prefetching GEMV; up to MAX_ROWS rows, the small GEMM with the QKV epilogue (after the
    PreNorm's own kernel); otherwise the norm kernel, torch's GEMM and the qkv_to_cache kernel.

    With q/k head norms (Qwen3, Gemma 3) the QKV epilogue is never fused: a fused linear's
    program holds a few columns of one head half (its column tile), never a whole head, whose
    statistics the norm needs. The projection then runs as a plain linear on its own route (the
    GEMV still with the PreNorm in its prologue), writes plain qkv, and the qkv_to_cache kernel
    (which holds whole heads) adds the bias, normalises, rotates and writes the cache: one
    launch more than without the norms."""
    m, n = _check_linear(x, weight, bias, "none")
    if n != (num_heads + 2 * num_kv_heads) * head_dim or head_dim % 2:
        raise ValueError(f"weight must be [(H + 2*Hkv) * D, K] with an even D, got {list(weight.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k_cache.shape[-2:] != (num_kv_heads, head_dim):
        raise ValueError("k/v caches must be contiguous [blocks, block_size, Hkv, D]")
    head_norms = q_norm is not None or k_norm is not None
    x, prenorm = _gemv_prenorm(x, prenorm)
    r = route(x, weight, "none", prenorm, qkv_epilogue=not head_norms)
    weight = _contig(weight)
    if r != GEMV:
        x, prenorm = _unfused_prenorm(x, prenorm), None
        x = x.to(weight.dtype)
    if r in (TORCH, SCALED_MM) or head_norms:
        if isinstance(weight, Fp8Weight) and r in (TORCH, SCALED_MM):
            qkv = _fp8_matmul(x, weight, r)
        elif r == TORCH:
            qkv = torch.nn.functional.linear(x, weight)
        else:  # the fused projection, plain: bias and all after it in the qkv_to_cache kernel
            qkv = torch.empty((m, n), dtype=weight.dtype, device=x.device)
            _launch(x, weight, None, qkv, gemv=r == GEMV, prenorm=prenorm)
        return dispatch.qkv_to_cache(qkv, bias, num_heads, num_kv_heads, head_dim, cos, sin, k_cache, v_cache,
                                     slot_mapping, q_norm, k_norm, norm_eps)
    if cos is not None:
        assert cos.stride(-1) == 1 and sin.stride(-1) == 1 and cos.stride(0) == sin.stride(0), \
            "cos and sin: rows of one stride, contiguous within a row"
    q = torch.empty((m, num_heads, head_dim), dtype=weight.dtype, device=x.device)
    qkv = (num_heads, num_kv_heads, head_dim, cos, sin, k_cache, v_cache, slot_mapping.contiguous())
    return _launch(x, weight, _contig(bias), q, gemv=r == GEMV, prenorm=prenorm, out_mode=OUT_QKV, qkv=qkv)


def _gemv_prenorm(x: torch.Tensor, prenorm: PreNorm | None) -> tuple[torch.Tensor, PreNorm | None]:
    """(x, prenorm) as the wrappers route them: decode rows past triton_gemv.PRENORM_ROWS (up to
    its MAX_ROWS) get the norm from its own kernel here, and the GEMV runs without a prologue."""
    if prenorm is not None and triton_gemv.PRENORM_ROWS < x.shape[0] <= triton_gemv.MAX_ROWS:
        return _unfused_prenorm(x, prenorm), None
    return x, prenorm


@register("prenormed")
def _unfused_prenorm(x, prenorm):
    """The GEMM operand of a PreNorm'd input by the separate residual add + norm kernel(s) (a
    post-norm `x_norm`: an RMSNorm kernel of its own first), written to its `normed_out` where
    given; reference.prenormed."""
    p = prenorm
    if p is None:
        return x
    if p.bias is not None:
        return dispatch.add_bias_residual_layer_norm(x, p.x_bias, p.residual, p.weight, p.bias, p.eps,
                                                     out=p.normed_out, sum_out=p.sum_out)
    h = x if p.x_bias is None else x + p.x_bias
    if p.x_norm is not None:
        h = dispatch.rms_norm(h, p.x_norm, p.eps)[0].to(x.dtype)
    if p.sum_scale is not None:  # the sum, rounded, times the scale, rounded: the residual stream and the input
        total = h if p.residual is None else h + p.residual
        total = total * p.sum_scale if p.sum_out is None else torch.mul(total, p.sum_scale, out=p.sum_out)
        if p.weight is not None:
            return dispatch.rms_norm(total, p.weight, p.eps, out=p.normed_out)[0]
        return total if p.normed_out is None else p.normed_out.copy_(total)
    if p.weight is not None:
        return dispatch.rms_norm(h, p.weight, p.eps, p.residual, p.sum_out, out=p.normed_out)[0]
    # a post-norm block's: the residual stream is the operand (reference.add_residual)
    if p.residual is not None:
        total = torch.add(h, p.residual, out=p.sum_out)
    else:
        total = h if p.sum_out is None else p.sum_out.copy_(h)
    return total if p.normed_out is None else p.normed_out.copy_(total)


def _contig(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.is_contiguous() else t.contiguous()  # an Fp8Weight is contiguous


def _unfused(x, weight, bias, activation, out, many_rows=False, fp8_route=TORCH):
    """Torch's GEMM, then the activation's own kernel; a GELU layer with `many_rows` (the route
    MANY_ROW_GEMM) in the fused many-row GEMM instead. An FP8 weight: `_fp8_matmul` on
    `fp8_route`, then the bias and the activation as below."""
    if isinstance(weight, Fp8Weight):
        return _fp8_epilogue(_fp8_matmul(x, weight, fp8_route, bias), activation, out)
    gelu = reference.GELU_APPROXIMATE.get(activation)
    if gelu is not None:
        if many_rows:
            return triton_gemm.linear_bias_gelu(x, weight, bias, gelu, out=out)
        # the bias goes to the GELU kernel's pass, in place, not to the GEMM
        h = torch.nn.functional.linear(x, weight) if out is None else torch.mm(x, weight.t(), out=out)
        return dispatch.bias_gelu(h, bias, gelu, out=h)
    if activation in GATED_ACTIVATIONS:
        h = dispatch.gated_act(torch.nn.functional.linear(x, weight, bias), activation)
        return h if out is None else out.copy_(h)
    if activation in _RELUS:
        h = _relu_(torch.nn.functional.linear(x, weight, bias), activation)
        return h if out is None else out.copy_(h)
    if out is None:
        return torch.nn.functional.linear(x, weight, bias)
    return torch.mm(x, weight.t(), out=out) if bias is None else torch.addmm(bias, x, weight.t(), out=out)


_RELUS = ("relu2", "relu")


def _relu_(h: torch.Tensor, activation: str) -> torch.Tensor:
    """ReLU or the squared ReLU of h, in place, in torch's passes (no kernel of their own)."""
    h = h.relu_()
    return h.square_() if activation == "relu2" else h


def _fp8_epilogue(h: torch.Tensor, activation, out):
    """The activation after an FP8 GEMM's `[M, N]` output h, its bias already added (in place where
    it can be): the GELUs in the bias_gelu kernel, a gated activation, a ReLU."""
    gelu = reference.GELU_APPROXIMATE.get(activation)
    if gelu is not None:
        h = dispatch.bias_gelu(h, None, gelu, out=h)
    elif activation in GATED_ACTIVATIONS:
        h = dispatch.gated_act(h, activation)
    elif activation in _RELUS:
        h = _relu_(h, activation)
    return h if out is None else out.copy_(h)
