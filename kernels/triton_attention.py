"""Flash attention over packed, variable-length sequences in the Triton language.

Same semantics and signature as `reference.varlen_attention`; registered for CUDA tensors.

* Packed, mask-free. A batch is one `[tokens, heads, head_dim]` tensor plus `cu_seqlens`; there is
  no padding and no mask tensor (EET's idea). Each program reads its sequence's bounds from
  `cu_seqlens` and compares positions in registers, so nothing per batch is materialised.
* Online softmax. A program owns BLOCK_M queries of one sequence and one head. It streams the
  sequence's keys and values in BLOCK_N blocks, keeping a running row max, row sum and output
  accumulator in fp32; the `[Lq, Lk]` score matrix never exists. Scores are scaled by
  `scale * log2(e)` so that `exp2` can replace `exp`.
* Causal alignment to the end. Query j of a sequence with Lq queries and Lk keys sits at
  position Lk - Lq + j and sees keys 0 .. Lk - Lq + j. That one rule covers prefill (Lq == Lk),
  chunked prefill and decode against a KV cache (Lq < Lk, Lq == 1 included). Key blocks wholly
  above a query block's diagonal are never visited; blocks wholly below it run unmasked; only
  the few blocks that straddle the diagonal (and the ragged last key block) pay for the
  position comparison.
* Grouped-query heads: query head h reads kv head h // (H // Hkv).

Grid: (cdiv(max_seqlen_q, BLOCK_M), num_seqs, H). Programs whose query block starts past their
sequence's end exit at once, so the grid can be sized from the longest sequence.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_blocks(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kt, stride_vt,
    offs_m, offs_d, q_shift, seqlen_k, qk_scale,
    start, end,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    """Fold key/value blocks [start, end) of one sequence into the online-softmax state.

    With MASKED, keys past the sequence's end and (if CAUSAL) keys after a query's position
    `q_shift + offs_m` get a score of -inf; without it every key in the range is visible.
    """
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n.to(tl.int64)[:, None] * stride_kt + offs_d[None, :]
        v_ptrs = v_base + offs_n.to(tl.int64)[:, None] * stride_vt + offs_d[None, :]
        if MASKED:
            in_seq = offs_n < seqlen_k
            k = tl.load(k_ptrs, mask=in_seq[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASKED:
            visible = in_seq[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= (q_shift + offs_m)[:, None])
            s = tl.where(visible, s, float("-inf"))
        # m_i starts finite (-1e30), so a row that has seen only masked keys keeps alpha = 1
        # and p = 0 instead of producing inf - inf.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=in_seq[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _varlen_attention_kernel(
    Q, K, V, Out, cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    qk_scale,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    block_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)

    q_start = tl.load(cu_seqlens_q + seq).to(tl.int64)
    seqlen_q = (tl.load(cu_seqlens_q + seq + 1) - q_start).to(tl.int32)
    m_lo = block_m * BLOCK_M
    if m_lo >= seqlen_q:
        return
    k_start = tl.load(cu_seqlens_k + seq).to(tl.int64)
    seqlen_k = (tl.load(cu_seqlens_k + seq + 1) - k_start).to(tl.int32)
    kv_head = head // GROUP

    offs_m = m_lo + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_rows = q_start + offs_m.to(tl.int64)
    q_ptrs = Q + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=(offs_m < seqlen_q)[:, None], other=0.0)

    k_base = K + k_start * stride_kt + kv_head * stride_kh
    v_base = V + k_start * stride_vt + kv_head * stride_vh

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Query j sits at key position q_shift + j (causal queries are aligned to the end).
    q_shift = seqlen_k - seqlen_q
    if CAUSAL:
        # Keys < full_end are visible to every query of this block (its first query sees
        # keys 0 .. q_shift + m_lo); keys >= end are visible to none of them.
        m_hi = tl.minimum(m_lo + BLOCK_M, seqlen_q)
        end = tl.maximum(tl.minimum(seqlen_k, q_shift + m_hi), 0)
        full_end = (tl.maximum(q_shift + m_lo + 1, 0) // BLOCK_N) * BLOCK_N
        full_end = tl.minimum(full_end, end)
    else:
        end = seqlen_k
        full_end = (seqlen_k // BLOCK_N) * BLOCK_N

    acc, l_i, m_i = _attend_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
        offs_m, offs_d, q_shift, seqlen_k, qk_scale, 0, full_end,
        BLOCK_N, False, CAUSAL, PRECISION,
    )
    acc, l_i, m_i = _attend_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
        offs_m, offs_d, q_shift, seqlen_k, qk_scale, full_end, end,
        BLOCK_N, True, CAUSAL, PRECISION,
    )

    # A query that sees no key at all (only possible when Lk < Lq, or Lk == 0) gets zeros.
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_i[:, None]
    o_ptrs = Out + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m < seqlen_q)[:, None])


def _launch_config(head_dim: int, dtype: torch.dtype, max_seqlen_q: int, on_gpu: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for this problem.

    On the GPU: 128-query blocks for prefill (BLOCK_N 64; 8 warps at head dim 128 to keep the
    fp32 accumulator in registers), down to 16 when every sequence has few queries (decode),
    so a one-query program does not compute 127 dead rows. fp32 tiles are twice the bytes,
    so they get smaller blocks. In the CPU interpreter: 16x16 tiles, the smallest tl.dot takes.
    """
    if not on_gpu:
        return 16, 16, 4, 1
    big = dtype == torch.float32 or head_dim > 128
    block_m = 64 if big else 128
    block_m = min(block_m, max(16, triton.next_power_of_2(max_seqlen_q)))
    block_n = 32 if big else 64
    num_warps = 8 if (block_m >= 128 and head_dim >= 128) or head_dim > 128 else 4
    num_stages = 2 if big else 3
    return block_m, block_n, num_warps, num_stages


@register("varlen_attention")
def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool,
    scale: float | None = None,
    max_seqlen_q: int | None = None,
) -> torch.Tensor:
    """Triton flash attention with exactly `reference.varlen_attention`'s contract.

    q `[Tq, H, D]`, k/v `[Tk, Hkv, D]` may be strided views along the token and head dims
    (slices of a packed QKV, say); a tensor whose last dim is not contiguous is copied first.
    Without `max_seqlen_q`, one device-to-host sync computes it from `cu_seqlens_q`.
    """
    assert q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "q, k, v must be [tokens, heads, head_dim]"
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[1]
    assert k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape"
    assert k.shape[2] == head_dim, f"q head_dim {head_dim} != k/v head_dim {k.shape[2]}"
    assert num_kv_heads > 0 and num_heads % num_kv_heads == 0, (
        f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}"
    )
    assert 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0, (
        f"triton varlen_attention needs a power-of-two head_dim in [16, 256], got {head_dim}"
    )
    assert q.dtype == k.dtype == v.dtype, f"q/k/v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}"
    assert cu_seqlens_q.numel() == cu_seqlens_k.numel(), "cu_seqlens_q and cu_seqlens_k differ in length"

    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    num_seqs = cu_seqlens_q.numel() - 1
    if q.shape[0] == 0 or num_seqs <= 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())
    if max_seqlen_q <= 0:
        return out

    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    block_m, block_n, num_warps, num_stages = _launch_config(head_dim, q.dtype, max_seqlen_q, q.is_cuda)
    grid = (triton.cdiv(max_seqlen_q, block_m), num_seqs, num_heads)
    _varlen_attention_kernel[grid](
        q, k, v, out, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        float(scale) * _LOG2E,
        GROUP=num_heads // num_kv_heads,
        CAUSAL=bool(causal),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=head_dim,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
