"""Flash attention over packed, variable-length sequences with a relative position bias, in the
Triton language (MPNet; the T5 encoders' bias has the same form).

Same semantics and signature as `reference.relative_bias_attention`; registered for CUDA tensors.

* Bidirectional self-attention of each packed sequence (no causal mask, no KV cache, one query
  head per key head): a program owns BLOCK_M query rows of one sequence and one head, streams
  the sequence's keys and values in BLOCK_N blocks and keeps the online-softmax state (row max,
  row sum, output accumulator) in fp32; the `[L, L]` score matrix never exists.
* The bias is a table by distance, `[H, 2R + 1]` fp32: score(i, j) = scale * q_i . k_j +
  bias[h, clamp(j - i, -R, R) + R]. Each score tile gathers its entries from the head's row (a
  few hundred floats, resident in L1 / L2), so the bias costs one load and one add per score, and
  nothing of the size of the sequence is materialised. Scores live in the log2 domain (exp2 in
  place of exp): both terms are multiplied by log2(e).
* Any head_dim in [16, 256]: one that is not a power of two runs in a tile padded to the next
  power of two, its extra lanes masked (D_PADDED, a constexpr: the power-of-two build is
  unchanged).

Grid: (cdiv(max_seqlen, BLOCK_M), num_seqs, H). Programs whose rows start past their sequence's
end exit at once, so the grid can be sized from the longest sequence.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register

_LOG2E = 1.4426950408889634


# The sequence bounds and the reach are read at run time (not specialised): a new batch shape must
# not stall serving on a compile.
@triton.jit(do_not_specialize=["reach"])
def _relative_bias_attention_kernel(
    Q, K, V, Out, Bias, cu_seqlens,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_bh,
    qk_scale, reach,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PADDED: tl.constexpr, PRECISION: tl.constexpr,
):
    block_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(cu_seqlens + seq).to(tl.int64)
    seqlen = (tl.load(cu_seqlens + seq + 1) - start).to(tl.int32)
    m_lo = block_m * BLOCK_M
    if m_lo >= seqlen:
        return

    offs_m = m_lo + tl.arange(0, BLOCK_M)  # query index within the sequence
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = (offs_m < seqlen)[:, None]
    if D_PADDED:
        d_ok = (offs_d < HEAD_DIM)[None, :]
        row_ok = row_ok & d_ok
    q_tok = start + offs_m.to(tl.int64)
    q = tl.load(Q + q_tok[:, None] * stride_qt + head * stride_qh + offs_d[None, :], mask=row_ok, other=0.0)
    k_base = K + start * stride_kt + head * stride_kh
    v_base = V + start * stride_vt + head * stride_vh
    bias_row = Bias + head * stride_bh

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, seqlen, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        in_seq = offs_n < seqlen
        kv_mask = in_seq[:, None]
        if D_PADDED:
            kv_mask = kv_mask & d_ok
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        # The bias of distance j - i, clamped to the table's reach (always a valid index).
        rel = tl.minimum(tl.maximum(offs_n[None, :] - offs_m[:, None], -reach), reach) + reach
        s += tl.load(bias_row + rel) * 1.4426950408889634
        s = tl.where(in_seq[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(Out + q_tok[:, None] * stride_ot + head * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok)


def _launch_config(head_dim: int, dtype: torch.dtype, max_seqlen: int, on_gpu: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). Not tuned: varlen_attention's non-causal rows
    for 16-bit tiles (128 x 64 and 8 warps for long sequences, 64-row blocks for short ones),
    smaller fp32 tiles; 16 x 16 in the CPU interpreter (the smallest tl.dot takes)."""
    if not on_gpu:
        return 16, 16, 4, 1
    if dtype == torch.float32 or head_dim > 128:
        return 64, 32, 4 if head_dim <= 64 else 8, 2
    if max_seqlen > 512:
        return 128, 64, 8, 3
    return min(64, max(16, triton.next_power_of_2(max_seqlen))), 64, 4, 3


@register("relative_bias_attention")
def relative_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bias: torch.Tensor,
    max_seqlen: int | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton flash attention with a relative position bias, `reference.relative_bias_attention`'s
    contract. q, k, v `[T, H, D]` may be strided views along the token and head dims (slices of a
    packed QKV); a tensor whose last dim is not contiguous is copied first. Without `max_seqlen`,
    one device-to-host sync computes it from `cu_seqlens`."""
    assert q.dim() == 3 and q.shape == k.shape == v.shape, "q, k, v must be [tokens, heads, head_dim] of one shape"
    assert q.dtype == k.dtype == v.dtype, f"q/k/v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}"
    num_heads, head_dim = q.shape[1], q.shape[2]
    assert 16 <= head_dim <= 256, f"triton attention needs a head_dim in [16, 256], got {head_dim}"
    if bias.dim() != 2 or bias.shape[0] != num_heads or bias.shape[1] % 2 != 1:
        raise ValueError(f"bias must be [heads {num_heads}, 2R + 1], got {list(bias.shape)}")
    assert cu_seqlens.device == q.device, f"cu_seqlens must be on q's device {q.device}"
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    assert out.shape == q.shape and out.stride(-1) == 1, "out must be shaped like q with a contiguous last dim"
    num_seqs = cu_seqlens.numel() - 1
    if q.shape[0] == 0 or num_seqs <= 0:
        return out
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item())
    if max_seqlen <= 0:
        return out
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    bias = bias.to(device=q.device, dtype=torch.float32).contiguous()  # a no-op for the models' tables
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    block_d = triton.next_power_of_2(head_dim)
    block_m, block_n, num_warps, num_stages = _launch_config(block_d, q.dtype, max_seqlen, q.is_cuda)
    _relative_bias_attention_kernel[(triton.cdiv(max_seqlen, block_m), num_seqs, num_heads)](
        q, k, v, out, bias, cu_seqlens.contiguous(),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        bias.stride(0), scale * _LOG2E, bias.shape[1] // 2,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, HEAD_DIM=head_dim, D_PADDED=block_d != head_dim,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
