"""Triton-language pieces shared by the few-row linear kernels (triton_small_gemm, triton_gemv):
which output columns a program owns, what a decoder linear does to its fp32 accumulator after
the GEMM, and the codes that select it."""
from __future__ import annotations

import triton
import triton.language as tl

from tritonformer.kernels.triton_elementwise import ACT_CODE, apply_act  # noqa: F401 (ACT_CODE: for the wrappers)

# The prologue's norm: none (no prologue), LayerNorm, RMSNorm, or the residual sum itself (a
# post-norm block's PreNorm, weight None: x_norm's output plus the residual, not normalised again).
NORM_NONE, NORM_LAYER, NORM_RMS, NORM_SUM = 0, 1, 2, 3
OUT_PLAIN, OUT_QKV = 0, 1


def or_dummy(t, fallback):
    """An unused pointer argument still needs a tensor: any will do."""
    return fallback if t is None else t


@triton.jit
def column_tile(HALF: tl.constexpr, BLOCK_N: tl.constexpr, PAIRED: tl.constexpr):
    """(head, j, cols, col_ok) of this program's BLOCK_N columns. Columns come in halves of
    HALF: tile t covers columns j of half `head = t // tiles per half`, weight rows `cols`; a
    paired tile (a gated activation, QKV) also owns the partner rows HALF further on (gated:
    HALF = N, the up rows after the gate rows; QKV: HALF = head_dim / 2, a head's second half).
    Plain: HALF = N, one half."""
    tiles_per_half = tl.cdiv(HALF, BLOCK_N)
    head = tl.program_id(0) // tiles_per_half
    j = (tl.program_id(0) % tiles_per_half) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = j
    if PAIRED:
        cols = head * 2 * HALF + j
    return head, j, cols, j < HALF


@triton.jit
def store_epilogue(acc, acc_b, head, j, rows, row_ok, col_ok, out_ptr, stride_om, cos_ptr, sin_ptr, slot_ptr,
                   k_cache_ptr, v_cache_ptr, stride_cos, HALF: tl.constexpr, HEADS_Q: tl.constexpr,
                   HEADS_KV: tl.constexpr, ACT: tl.constexpr, OUT: tl.constexpr, ROTARY: tl.constexpr):
    """The end of a linear on its fp32 accumulators `[rows, j]` (biases already added): the QKV
    epilogue (OUT 1) or the activation and the store of `[rows, j]` to out."""
    store_ok = row_ok[:, None] & col_ok[None, :]
    if OUT == 1:  # OUT_QKV
        qkv_epilogue(acc, acc_b, head, j, rows, row_ok, store_ok, out_ptr, cos_ptr, sin_ptr, slot_ptr, k_cache_ptr,
                     v_cache_ptr, stride_cos, HALF, HEADS_Q, HEADS_KV, ROTARY)
    else:
        acc = apply_act(acc, acc_b, ACT)
        tl.store(out_ptr + rows[:, None] * stride_om + j[None, :], acc.to(out_ptr.dtype.element_ty), mask=store_ok)


@triton.jit
def qkv_epilogue(a, b, head, j, rows, row_ok, store_ok, q_ptr, cos_ptr, sin_ptr, slot_ptr, k_cache_ptr, v_cache_ptr,
                  stride_cos, HALF: tl.constexpr, HEADS_Q: tl.constexpr, HEADS_KV: tl.constexpr,
                  ROTARY: tl.constexpr):
    """Columns j and j + HALF of one head (a, b: its two halves) for every row: rotary on q and k
    heads, then q to `[rows, HEADS_Q, D]`, k and v to their rows' slots of the paged cache."""
    dtype = q_ptr.dtype.element_ty
    # The unfused path stores qkv + bias in the activation dtype before rotating: round alike.
    a = a.to(dtype).to(tl.float32)
    b = b.to(dtype).to(tl.float32)
    head_dim: tl.constexpr = 2 * HALF
    if ROTARY:
        if head < HEADS_Q + HEADS_KV:
            c = tl.load(cos_ptr + rows[:, None] * stride_cos + j[None, :], mask=store_ok, other=0.0).to(tl.float32)
            s = tl.load(sin_ptr + rows[:, None] * stride_cos + j[None, :], mask=store_ok, other=0.0).to(tl.float32)
            a, b = a * c - b * s, b * c + a * s
    if head < HEADS_Q:
        dst = q_ptr + rows[:, None] * (HEADS_Q * head_dim) + head * head_dim + j[None, :]
    else:
        slot = tl.load(slot_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        kv_head = head - HEADS_Q
        cache = k_cache_ptr
        if head >= HEADS_Q + HEADS_KV:
            kv_head -= HEADS_KV
            cache = v_cache_ptr
        dst = cache + slot[:, None] * (HEADS_KV * head_dim) + kv_head * head_dim + j[None, :]
    tl.store(dst, a.to(dtype), mask=store_ok)
    tl.store(dst + HALF, b.to(dtype), mask=store_ok)
