"""Decode-row linears (one or two rows) whose weights load before the previous kernel ends.

Why: a batch-1 decode step is a chain of ~100 dependent kernels. Profiled on the H100
(`tools/gpu/profile_gpu_kernels.py`), each few-row GEMM took 4-6 us for weights
that stream in 1-4 us: the rest is the launch and the round trip to the first weight bytes,
paid once per kernel, one kernel after another. But a linear's weights do not depend on the
kernel before it. With programmatic dependent launch (PDL, Hopper and later) this kernel is
launched while its predecessor still runs, issues the loads of its whole weight slab, and only
then waits (`gdc_wait`) for the predecessor's output; it lets its own successor launch as
soon as it has waited (`gdc_launch_dependents`), so that one prefetches in turn. The weight
round trip overlaps the previous kernel instead of following it.

Each program holds BLOCK_N weight rows over the whole K in registers (K padded to a power of
two; masked lanes move no bytes) and computes its columns for every row as an fp32
multiply-and-sum: no tl.dot, whose tensor-core tiles want 16 rows, and no K loop, so nothing
waits on anything but the one batch of loads. What the model does around the linear is fused
as in triton_small_gemm (same pieces, triton_linear_parts.py):

* prologue (`PreNorm`): x + a bias (+ Gemma's post-norm of x, `x_norm`, rounded as the unfused
  norm stores it) + the residual in fp32, written once as the next residual stream by program
  0, then LayerNorm or RMSNorm (or none: a post-norm block's linear reads the sum), in
  registers: every program reads the whole input row(s), K elements from L2, after its weights
  are already in flight; program 0 writes the normalised rows too where asked (`normed_out`: a
  MoE block's router reads them in its prologue, its experts after);
* epilogues: plain (bias, then GELU or a gated activation) or QKV (bias, rotary, q stored, k and
  v written straight into the paged cache).

Rows longer than four warps' registers hold (K > _MAX_K: AFM-4.5B's down projection has
K = 18,432, Qwen2.5-7B's 18,944, 72B's 29,568) are held by a program of _LONG_WARPS warps, the
same registers a thread: one decode row of a plain linear without a PreNorm (the down
projections), up to MAX_LONG_K; two rows, a gated or QKV linear or a PreNorm would want twice
the registers, and go elsewhere.

FP8 weights (kernels/fp8.py, SCALED): the program loads the E4M3 values (half the bytes of
fp16), converts them in registers, and multiplies each column's fp32 sum by its row scale
before the bias; the input stays 16-bit (weight-only FP8: a decode row is memory-bound).

Everything a program reads before gdc_wait is a constant (weights, biases, norm weights) and
everything it writes comes after it: a kernel that starts early can neither see a stale input
nor overwrite one its predecessor still reads.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritonformer.kernels import triton_pdl
from tritonformer.kernels.triton_linear_parts import column_tile, or_dummy as _or, store_epilogue

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Rows up to which the few-row linears run this kernel (0: never; a benchmark comparing sets it).
MAX_ROWS = 2
# Rows up to which the kernel runs a linear's PreNorm in its prologue; past them (up to MAX_ROWS)
# the norm runs as its own kernel first and this one without a prologue (triton_small_gemm's
# wrappers; a benchmark comparing sets it). Every program recomputes the norm of its rows, and two
# rows halve a program's weight rows, so twice the programs recompute twice the rows. H200, whole
# decode steps, bf16, one machine start (tools/gpu/ab_decode_step.py --knob
# kernels.triton_gemv.MAX_ROWS,kernels.triton_gemv.PRENORM_ROWS), 1 against 2 at batch 2:
# Qwen2.5-7B 5.704 -> 4.046 ms (0.709x), Llama-3.1-8B 0.778x, Phi-3-mini 0.779x, Gemma-2-9B 0.665x,
# AFM-4.5B 0.797x; batch 1 unchanged (0.999-1.010x). 0 (the norm a kernel of its own at batch 1
# too) cost Phi-3-mini 1.057x and Llama-3.1-8B 1.024x there. Two rows in the small GEMM instead
# (MAX_ROWS 1) 0.710-0.881x: the GEMV keeps them. Four rows here (MAX_ROWS 4) lost at batch 3 and 4
# (1.12-1.21x).
PRENORM_ROWS = 1
# Weight bytes a program holds per operand and warp: 4096 is 2048 fp16 elements (64 per thread,
# 32 registers); a decode row is bytes, not elements.
_BYTES_PER_WARP = 4096
_WARPS = 4
# 16-bit weights of at least this many bytes take twice _BYTES_PER_WARP a program (None: none do).
# H200, whole decode step at batch 1, context 128, bf16, one machine start, against none
# (tools/gpu/ab_decode_step.py --knob kernels.triton_gemv._LARGE_WEIGHT_BYTES): Llama-3.1-8B
# 4.088 -> 3.967 ms (0.970x), Phi-3-mini 0.958x, Gemma-2-9B 0.933x, SmolLM3-3B 0.995x,
# Qwen3-30B-A3B 0.999x. Every weight twice the bytes won a little more on the dense shapes
# (0.925-0.994x) but lost 3.9% on Qwen3-30B-A3B, whose 17-21 MB attention linears want the
# smaller slabs. On the H100 the large kinds streamed at the same rate either way (Llama-3.1-8B
# gate/up 3,064 vs 3,048 GB/s, down 2,877 both, head 3,148 vs 3,167: time_family_linears.py).
# A fused QKV projection counts all its heads (one head's bytes were counted before: H200, batch 1,
# same start, Llama-3.1-8B 3.910 -> 3.888 ms (0.994x), Phi-3-mini 0.988x, Gemma-2-9B 0.992x).
_LARGE_WEIGHT_BYTES = 32 << 20
# E4M3 weights: this many times the bytes (they stay packed, four to a register, until each is
# converted for its multiply). H100, one decode row, GB/s at 2x against 1x the bytes
# (tools/gpu/time_family_linears.py --fp8): llama-3.1-8b qkv 2,180 vs 2,068, o 2,275 vs 2,062,
# gate_up 2,901 vs 2,826, down 2,667 vs 2,634, head 3,089 vs 3,112; gemma-2-9b gate_up 2,442 vs
# 2,079, qkv 1,843 vs 1,671. (Counted in elements as fp16, 1,781-2,634 for llama's four.)
_FP8_BYTES_FACTOR = 2
# Two decode rows halve the weight rows a program holds (its registers hold both input rows' products);
# weights of these element sizes take this many times the bytes again at two rows, E4M3 ones thus as many
# weight rows as at one. H200, whole decode steps, bf16 activations, one machine start
# (tools/gpu/ab_decode_step.py --knob kernels.triton_gemv._TWO_ROW_FACTOR): E4M3 2 against 1 at batch 2,
# Llama-3.1-8B 3.836 -> 3.441 ms (0.897x), Qwen3-8B 0.911x; 16-bit 2 against 1 mixed (Llama-3.1-8B 1.010x,
# Phi-3-mini 1.033x, Qwen2.5-7B 0.984x, Gemma-2-9B 0.981x). Twice the E4M3 bytes at one row too lost
# (_FP8_BYTES_FACTOR 4: 1.031-1.060x), and so did eight warps a program (1.035-1.104x).
_TWO_ROW_FACTOR = {1: 2, 2: 1}
# 16-bit weights of _PADDED_K_MIN_BYTES or more whose rows pad to a power of two by _PADDED_K_MIN or more (K = 3,072
# or 6,144 in 4,096 or 8,192 lanes: the masked lanes hold registers but move no bytes) take this many times the bytes
# a program, unless a post-norm prologue holds its two more K-long vectors (1: as any other weight). H200,
# whole decode steps at batch 1, bf16, one machine start. Every weight twice the bytes
# (tools/gpu/ab_decode_step.py --knob kernels.triton_gemv._BYTES_PER_WARP): CWM-32B (K 6,144, every linear padded)
# 16.775 -> 15.876 ms (0.946x), Llama-3.1-8B (K 4,096) 1.073x, Gemma-4-31B (post-norm prologues) 1.37x. Padded rows
# only, 1 against 2 (--knob kernels.triton_gemv._PADDED_K_FACTOR): CWM-32B 0.946x, Gemma-7B 0.972x, Phi-3-mini
# 0.978x, SmolLM3-3B 0.995x, Qwen2.5-7B 0.996x, Llama-3.1-8B 1.001x, Qwen3-8B 1.004x, Gemma-4-31B 1.010x (every
# padded weight of these 18 MB or more). Smaller ones (GPT-2's, at most 5 MB) were not measured and stay as they were.
# Holding such rows in two power-of-two parts instead (5,376 in 4,096 + 2,048 lanes) lost to this, same start:
# CWM-32B 1.091x, Phi-3-mini 1.048x, Gemma-7B 1.036x, Gemma-4-31B and Qwen2.5-7B 1.001x (fewer rows a program).
_PADDED_K_FACTOR = 2
_PADDED_K_MIN = 1.25
_PADDED_K_MIN_BYTES = 8 << 20
# 16-bit weights of _LONG_K_MIN_BYTES or more with rows of _LONG_K_MIN elements or more (up to _MAX_K; not padded
# as above, no post-norm prologue) take this many times the bytes a program: with rows this long a program held one
# or two weight rows (one pair of a gated or QKV projection, whose every program normalises the whole input row
# again). The byte floor keeps smaller weights (Llama-3.2-1B's 34 MB down projection: half the programs) as they
# were: every weight measured below is 58 MB or more, the 70B shape's 67 MB or more a rank. 2 x H200, batch 1, one
# start, 2 against 1 (tools/gpu/knobs: TRITONFORMER_KNOBS=kernels.triton_gemv._LONG_K_FACTOR=1 against none,
# `tritonformer bench tensor-parallel`): Llama-3.1-70B at TP=2 (K 8,192, down 14,336 a rank) 21.139 -> 18.149 ms
# (1.26x -> 1.10x its floor), batch 64 1.001x; Llama-3.1-8B at TP=2 (its down projections only) 1.008x, batch 64
# 0.995x. One GPU, the down projections of K 14,336 (tools/gpu/ab_decode_step.py): Llama-3.1-8B, Gemma-2-9B,
# Mistral-7B 0.998-1.001x at batches 1 and 2. Eight warps a program instead (the same registers a thread): 70B
# 0.982x. (These runs had no byte floor; the floor leaves every measured weight but the 8B shape's 59 MB down
# projections at TP=2 in the rule.)
_LONG_K_FACTOR = 2
_LONG_K_MIN = 8192
_LONG_K_MIN_BYTES = 64 << 20
# A post-norm prologue (Gemma's sandwich norm, `x_norm`) keeps two more K-long vectors live and
# every program recomputes it: this many times the weight rows per program amortise it. H100,
# gemma-2-9b shape, one decode row (tools/gpu/time_family_linears.py): gate_up 2,099 -> 3,015 GB/s,
# qkv 1,846 -> 2,549 GB/s against a copy rate of 2,963.
_POST_NORM_ROWS = 2
# Longest row a program holds (Llama-3-8B's down projection has K = 14,336).
_MAX_K = 16384
# Past _MAX_K (one row of a plain linear, no PreNorm): the longest K a program of _LONG_WARPS holds
# (= _MAX_K: none; cuBLAS runs them). H200, whole decode steps, bf16, one machine start
# (tools/gpu/ab_decode_step.py, against cuBLAS): batch 1 AFM-4.5B 2.671 -> 2.568 ms (0.961x),
# Qwen2.5-7B 0.969x, Jais-2 0.974x; 16 warps 0.968-1.012x. Two rows lost (1.04-1.11x), and so did
# everything else tried: split K (ranges of 4,096-16,384 in programs of their own, the last to
# arrive adding the partials) 1.05-1.28x at batch 1; a K loop (one program walking its rows in
# chunks, the rest asked of L2 before the wait) 1.01-1.10x.
MAX_LONG_K = 32768
_LONG_WARPS = 8


@triton.jit
def _input_rows(x_ptr, xb_ptr, res_ptr, xn, eps, rows, ks, row_ok, k_ok, stride_xm, stride_rm, K: tl.constexpr,
                HAS_XBIAS: tl.constexpr, HAS_RES: tl.constexpr, POST_NORM: tl.constexpr):
    """The linear's input before its norm, fp32 `[rows, ks]`: x + x's bias (POST_NORM: then
    RMS-normalised with weight xn and rounded to x's dtype) + the residual; zero outside row_ok
    and k_ok."""
    mask = row_ok[:, None] & k_ok[None, :]
    s = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_XBIAS:
        s += tl.load(xb_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]
    if POST_NORM:
        s = _normalize(s, k_ok, xn, xn, eps, K, 2).to(x_ptr.dtype.element_ty).to(tl.float32)
    if HAS_RES:
        s += tl.load(res_ptr + rows[:, None] * stride_rm + ks[None, :], mask=mask, other=0.0).to(tl.float32)
    return s


@triton.jit
def _operand(v, w_ptr, out_ptr, SCALED: tl.constexpr):
    """The GEMM operand in fp32, rounded as the unfused path stores it: to the weights' dtype, or
    with FP8 weights (SCALED) to the activations' (out's)."""
    if SCALED:
        return v.to(out_ptr.dtype.element_ty).to(tl.float32)
    return v.to(w_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _scaled(acc, scale, SCALED: tl.constexpr):
    """acc `[R, BLOCK_N]` times its columns' weight scales `[BLOCK_N]` (FP8 weights); acc as it is
    otherwise."""
    if SCALED:
        acc = acc * scale[None, :]
    return acc


@triton.jit
def _normalize(s, k_ok, nw, nb, eps, K: tl.constexpr, NORM: tl.constexpr):
    """LayerNorm (NORM 1, two passes over the registers) or RMSNorm (2) of fp32 rows `[R, KP]`
    whose lanes past K are zero; NORM 3 (a post-norm block's sum) leaves them as they are."""
    if NORM == 3:
        return s
    if NORM == 1:
        mean = tl.sum(s, axis=1) / K
        d = tl.where(k_ok[None, :], s - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / K + eps)
        return d * rstd[:, None] * nw[None, :] + nb[None, :]
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=1) / K + eps)
    return s * rstd[:, None] * nw[None, :]


@triton.jit
def _gemv_kernel(
    x_ptr, xb_ptr, res_ptr, sum_ptr, normed_ptr, nw_ptr, nb_ptr, xn_ptr, ss_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    cos_ptr, sin_ptr, slot_ptr, k_cache_ptr, v_cache_ptr,
    eps, stride_xm, stride_om, stride_cos,
    M: tl.constexpr, K: tl.constexpr, HALF: tl.constexpr, HEADS_Q: tl.constexpr, HEADS_KV: tl.constexpr,
    HAS_XBIAS: tl.constexpr, HAS_RES: tl.constexpr, WRITE_SUM: tl.constexpr, NORM: tl.constexpr,
    POST_NORM: tl.constexpr, WRITE_NORMED: tl.constexpr, SUM_SCALE: tl.constexpr,
    PAIRED: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, OUT: tl.constexpr, ROTARY: tl.constexpr,
    SCALED: tl.constexpr, ROWS: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    """One column tile of out = epilogue(prologue(x) @ W^T) for the M (<= ROWS) rows. Grid:
    (column tiles,), see column_tile. SCALED: FP8 weights, each column's sum times its weight
    row's scale (scale_ptr) before the bias. WRITE_NORMED: program 0 also stores the normalised
    rows (normed_ptr, rounded to its dtype; PreNorm.normed_out). SUM_SCALE: the prologue's sum,
    rounded to x's dtype, times ss_ptr[0], rounded again (PreNorm.sum_scale)."""
    head, j, cols, col_ok = column_tile(HALF, BLOCK_N, PAIRED)
    ks = tl.arange(0, KP)
    k_ok = ks < K

    # The constants first: weights `[1, BLOCK_N, KP]` (broadcast against the rows later),
    # biases, FP8 weights' scales, norm weights. Their loads are in flight while the previous
    # kernel finishes.
    w_off = tl.where(col_ok, cols, 0).to(tl.int64)[None, :, None] * K + ks[None, None, :]
    w_mask = col_ok[None, :, None] & k_ok[None, None, :]
    w = tl.load(w_ptr + w_off, mask=w_mask, other=0.0)
    w_b = w
    if PAIRED:
        w_b = tl.load(w_ptr + HALF * K + w_off, mask=w_mask, other=0.0)
    bias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    bias_b = bias
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if PAIRED:
            bias_b = tl.load(bias_ptr + cols + HALF, mask=col_ok, other=0.0).to(tl.float32)
    w_scale = bias  # FP8 weights' row scales; unused unless SCALED
    w_scale_b = bias
    if SCALED:
        w_scale = tl.load(scale_ptr + cols, mask=col_ok, other=0.0)
        if PAIRED:
            w_scale_b = tl.load(scale_ptr + cols + HALF, mask=col_ok, other=0.0)
    xn = bias  # unused unless POST_NORM
    if NORM != 0:
        if NORM == 3:  # the sum itself is the operand: no norm weights
            nw = tl.zeros((KP,), dtype=tl.float32)
        else:
            nw = tl.load(nw_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        nb = nw
        if NORM == 1:
            nb = tl.load(nb_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        if POST_NORM:
            xn = tl.load(xn_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
    sum_scale = 1.0
    if SUM_SCALE:
        sum_scale = tl.load(ss_ptr).to(tl.float32)
    triton_pdl.wait_for_predecessor(PDL)  # from here on the previous kernel's writes are visible

    rows = tl.arange(0, ROWS)
    row_ok = rows < M
    s = _input_rows(x_ptr, xb_ptr, res_ptr, xn, eps, rows, ks, row_ok, k_ok, stride_xm, K, K, HAS_XBIAS,
                    HAS_RES, POST_NORM)
    if NORM != 0:
        if SUM_SCALE:
            s = (s.to(x_ptr.dtype.element_ty).to(tl.float32) * sum_scale).to(x_ptr.dtype.element_ty)
            s = s.to(tl.float32)
        if WRITE_SUM:
            sum_rows = tl.where(tl.program_id(0) == 0, rows, M)  # one program writes the residual stream
            tl.store(sum_ptr + rows[:, None] * K + ks[None, :], s.to(sum_ptr.dtype.element_ty),
                     mask=(sum_rows < M)[:, None] & k_ok[None, :])
        s = _normalize(s, k_ok, nw, nb, eps, K, NORM)
        if WRITE_NORMED:
            normed_rows = tl.where(tl.program_id(0) == 0, rows, M)
            tl.store(normed_ptr + rows[:, None] * K + ks[None, :], s.to(normed_ptr.dtype.element_ty),
                     mask=(normed_rows < M)[:, None] & k_ok[None, :])
    # The GEMM operand as the unfused path stores it (in the weights' dtype; FP8: the activations').
    xw = _operand(s, w_ptr, out_ptr, SCALED)[:, None, :]  # [ROWS, 1, KP]
    acc = _scaled(tl.sum(xw * w.to(tl.float32), axis=2), w_scale, SCALED) + bias[None, :]
    acc_b = acc
    if PAIRED:
        acc_b = _scaled(tl.sum(xw * w_b.to(tl.float32), axis=2), w_scale_b, SCALED) + bias_b[None, :]

    store_epilogue(acc, acc_b, head, j, rows, row_ok, col_ok, out_ptr, stride_om, cos_ptr, sin_ptr, slot_ptr,
                   k_cache_ptr, v_cache_ptr, stride_cos, HALF, HEADS_Q, HEADS_KV, ACT, OUT, ROTARY)


def supported(m: int, x: torch.Tensor, prenorm=None, plain: bool = True) -> bool:
    """Whether `m` rows of x `[M, K]` run this kernel: K <= _MAX_K, or up to MAX_LONG_K one row
    of a `plain` linear (no gated activation, no QKV epilogue) without a PreNorm."""
    k = x.shape[1]
    fits = k <= _MAX_K or (m == 1 and prenorm is None and plain and k <= MAX_LONG_K)
    return 0 < m <= MAX_ROWS and fits and (x.is_cuda or _INTERPRETED)


def block_n(half: int, k: int, rows: int, paired: bool, warps: int = _WARPS, *, element_size: int = 2,
            post_norm: bool = False, weight_k: int | None = None, halves: int = 1) -> int:
    """Weight rows per program: as many as keep each operand slab (`k` elements a row) within
    the register budget (in bytes of `element_size`-byte weights, more for E4M3 ones, for 16-bit
    weights of _LARGE_WEIGHT_BYTES or more and for 16-bit rows padded by _PADDED_K_MIN or more,
    `weight_k` elements a row, default k, and for large 16-bit weights of rows of _LONG_K_MIN
    or more; more rows with a post-norm prologue to amortise it; more bytes at two `rows` by
    _TWO_ROW_FACTOR), at most the half's width (a power of two). The weight's bytes count all
    its `halves` (a QKV projection's are its heads: `half` is half of one head)."""
    kp = triton.next_power_of_2(k)
    row = weight_k or k
    nbytes = _BYTES_PER_WARP * (_FP8_BYTES_FACTOR if element_size == 1 else 1)
    if rows >= 2:
        nbytes *= _TWO_ROW_FACTOR.get(element_size, 1)
    weight_bytes = halves * (2 if paired else 1) * half * row * element_size
    if element_size > 1 and _LARGE_WEIGHT_BYTES is not None and weight_bytes >= _LARGE_WEIGHT_BYTES:
        nbytes *= 2
    if element_size > 1 and not post_norm:  # 16-bit rows, padded or long (one factor, not both)
        if weight_bytes >= _PADDED_K_MIN_BYTES and kp >= _PADDED_K_MIN * row:
            nbytes *= _PADDED_K_FACTOR
        elif weight_bytes >= _LONG_K_MIN_BYTES and _LONG_K_MIN <= kp <= _MAX_K:
            nbytes *= _LONG_K_FACTOR
    elements = nbytes // element_size * (_POST_NORM_ROWS if post_norm else 1)
    budget = elements * warps // (rows * (2 if paired else 1))
    return max(1, min(triton.next_power_of_2(half), budget // kp))


def program_warps(k: int) -> int:
    """Warps of a program holding rows of K elements (on a GPU; the interpreter runs one)."""
    return _LONG_WARPS if k > _MAX_K else _WARPS


def launch(x, weight, bias, out, *, paired, half, act_code, norm_code, prenorm, out_mode, qkv, scale=None):
    """Run _gemv_kernel; the arguments as triton_small_gemm._launch resolves them (`weight` the
    E4M3 values of an FP8 weight, with its row scales `scale`)."""
    m, k = x.shape
    p = prenorm
    residual = p.residual if p is not None else None
    sum_out = p.sum_out if p is not None else None
    x_norm = p.x_norm if p is not None else None
    sum_scale = p.sum_scale if p is not None else None
    normed = p.normed_out if p is not None else None
    assert normed is None or (normed.shape == x.shape and normed.is_contiguous()), "normed_out must be [M, K], contiguous"
    heads_q, heads_kv, _, cos, sin, k_cache, v_cache, slots = qkv or (0, 0, 0, None, None, None, None, None)
    long = k > _MAX_K
    assert not (long and (m > 1 or p is not None or paired or qkv)), \
        f"past K = {_MAX_K} only one row of a plain linear without a PreNorm, got {m} rows of K = {k}"
    kp = triton.next_power_of_2(k)
    rows = triton.next_power_of_2(m)
    warps = 1 if _INTERPRETED else program_warps(k)
    halves = weight.shape[0] // (2 * half) if paired else 1
    bn = block_n(half, kp, rows, paired, warps, element_size=weight.element_size(), post_norm=x_norm is not None,
                 weight_k=k, halves=halves)
    pdl = triton_pdl.enabled(x.device)
    _gemv_kernel[(halves * triton.cdiv(half, bn),)](
        x, _or(p.x_bias if p else None, x), _or(residual, x), _or(sum_out, x), _or(normed, x),
        _or(p.weight if p else None, x), _or(p.bias if p else None, x), _or(x_norm, x), _or(sum_scale, x), weight,
        _or(scale, x), _or(bias, x), out,
        _or(cos, x), _or(sin, x), _or(slots, x), _or(k_cache, x), _or(v_cache, x),
        p.eps if p else 0.0, x.stride(0), out.stride(0) if out.dim() == 2 else 0, cos.stride(0) if cos is not None else 0,
        M=m, K=k, HALF=half, HEADS_Q=heads_q, HEADS_KV=heads_kv,
        HAS_XBIAS=p is not None and p.x_bias is not None, HAS_RES=residual is not None,
        WRITE_SUM=sum_out is not None, NORM=norm_code, POST_NORM=x_norm is not None, WRITE_NORMED=normed is not None,
        SUM_SCALE=sum_scale is not None, PAIRED=paired, HAS_BIAS=bias is not None, ACT=act_code, OUT=out_mode,
        ROTARY=cos is not None,
        SCALED=scale is not None, ROWS=rows, KP=kp, BLOCK_N=bn, PDL=pdl, num_warps=warps,
        **triton_pdl.launch_options(pdl),
    )
    return out
