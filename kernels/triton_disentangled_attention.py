"""DeBERTa's disentangled attention over packed, variable-length sequences in the Triton language.

Same semantics and signature as `reference.disentangled_attention`; registered for CUDA tensors.

The position terms are not a mask or a bias tensor: a `[L, L]` bias per head and sequence
would be the very matrix flash attention avoids. The caller computes, with two batched GEMMs,
each token's scores against every relative-position column, c2p[t, h, r] = q_t . pos_k[h, r]
and p2c[t, h, r] = k_t . pos_q[h, r] (`[T, H, R]`, R = 2 * the attention span, 512 for
DeBERTa-v3), and this kernel gathers what each (query i, key j) pair needs while it streams the
keys: the column idx(i - j), read from `rel_index` (the log-bucketed, clamped relative position,
a table built once on the host so that the bucket rounding is exactly the host's), then
c2p[i, h, idx] and p2c[j, h, idx]. The distance is clamped to the table's reach, past which the
column saturates, so sequences of any length run. c2p and p2c may hold only the columns a batch's
distances reach, from `first_column` on (short sequences need few).

Otherwise the flash-attention forward: a program owns BLOCK_M queries of one sequence and one
head, streams the sequence's keys in BLOCK_N blocks with an online softmax (running max, sum and
fp32 accumulator; scores scaled by scale * log2(e) for exp2), and reads its sequence's bounds
from `cu_seqlens`: no padding, no mask tensor. Head dims that are not a power of two run in a
padded tile, their extra lanes masked.

Grid: (cdiv(max_seqlen, BLOCK_M), num_seqs, H). Programs whose rows start past their sequence's
end exit at once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register

_LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["reach", "first_column"])
def _disentangled_attention_kernel(
    Q, K, V, C2P, P2C, RelIndex, Out, cu_seqlens,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ct, stride_ch, stride_pt, stride_ph, stride_ot, stride_oh,
    reach, first_column, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    block_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(cu_seqlens + seq).to(tl.int64)
    seqlen = (tl.load(cu_seqlens + seq + 1) - start).to(tl.int32)
    if block_m * BLOCK_M >= seqlen:
        return
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < seqlen
    d_ok = offs_d < HEAD_DIM
    q_tok = start + offs_m.to(tl.int64)
    q = tl.load(Q + q_tok[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    c2p_rows = C2P + q_tok[:, None] * stride_ct + head * stride_ch  # query i's row of position scores
    p2c_base = P2C + start * stride_pt + head * stride_ph

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, seqlen, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < seqlen
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k_tok = start + offs_n.to(tl.int64)
        k = tl.load(K + k_tok[:, None] * stride_kt + head * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        # the relative-position column of each (i, j): one table lookup, the distance clamped to its reach
        dist = offs_m[:, None] - offs_n[None, :]
        dist = tl.minimum(tl.maximum(dist, -reach), reach)
        col = tl.load(RelIndex + dist + reach) - first_column
        both = m_ok[:, None] & n_ok[None, :]
        c2p = tl.load(c2p_rows + col, mask=both, other=0.0)
        p2c = tl.load(p2c_base + offs_n.to(tl.int64)[None, :] * stride_pt + col, mask=both, other=0.0)
        s = (s + c2p.to(tl.float32) + p2c.to(tl.float32)) * qk_scale
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + k_tok[:, None] * stride_vt + head * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(Out + q_tok[:, None] * stride_ot + head * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=m_ok[:, None] & d_ok[None, :])


def _launch_config(dtype: torch.dtype, on_gpu: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). Not tuned yet: the plain flash-attention
    tiles for head dim 64 (64 x 64, 4 warps), smaller for fp32; 16 x 16 in the CPU interpreter."""
    if not on_gpu:
        return 16, 16, 4, 1
    if dtype == torch.float32:
        return 32, 32, 4, 2
    return 64, 64, 4, 2


@register("disentangled_attention")
def disentangled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    c2p: torch.Tensor,
    p2c: torch.Tensor,
    rel_index: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    max_seqlen: int | None = None,
    out: torch.Tensor | None = None,
    first_column: int = 0,
) -> torch.Tensor:
    total, heads, head_dim = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k and v must have one shape, got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if c2p.shape[:2] != (total, heads) or p2c.shape != c2p.shape:
        raise ValueError(f"c2p and p2c must be [T, H, R] = [{total}, {heads}, R], got {list(c2p.shape)}, "
                         f"{list(p2c.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("c2p", c2p), ("p2c", p2c)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous")
    if rel_index.dtype != torch.int32 or rel_index.dim() != 1 or rel_index.shape[0] % 2 == 0:
        raise ValueError("rel_index must be an int32 vector of odd length 2 * reach + 1")
    out = torch.empty_like(q) if out is None else out
    num_seqs = cu_seqlens.shape[0] - 1
    if total == 0 or num_seqs == 0:
        return out
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    block_m, block_n, num_warps, num_stages = _launch_config(q.dtype, q.is_cuda)
    grid = (triton.cdiv(max_seqlen, block_m), num_seqs, heads)
    _disentangled_attention_kernel[grid](
        q, k, v, c2p, p2c, rel_index, out, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        c2p.stride(0), c2p.stride(1), p2c.stride(0), p2c.stride(1), out.stride(0), out.stride(1),
        (rel_index.shape[0] - 1) // 2, first_column, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
