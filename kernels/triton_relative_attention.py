"""Flash attention over packed, variable-length sequences with a relative position bias, in the
Triton language (MPNet; the T5 encoders' bias has the same form).

Same semantics and signature as `reference.relative_bias_attention`; registered for CUDA tensors.

* Bidirectional self-attention of each packed sequence (no causal mask, no KV cache, one query
  head per key head): a program owns BLOCK_M query rows of one sequence and one head, streams
  the sequence's keys and values in BLOCK_N blocks and keeps the online-softmax state (row max,
  row sum, output accumulator) in fp32; the `[L, L]` score matrix never exists.
* The bias is a table by distance, `[H, 2R + 1]` fp32: score(i, j) = scale * q_i . k_j +
  bias[h, clamp(j - i, -R, R) + R]. With square tiles (BLOCK query rows, BLOCK keys) a score tile's
  bias depends only on its offset n0 - m0 = t * BLOCK: it is a Toeplitz tile, and past |t| = T =
  ceil((R + BLOCK - 1) / BLOCK) every distance in it is clamped, so 2T + 1 tiles per head hold every
  tile's bias (`_bias_tiles`, made once per table and block, 7 x 64 x 64 per head for MPNet's R =
  128). The kernel loads its tile whole, contiguous, like a key block, where gathering each score's
  entry from the table by index ran 5.3x BERT's attention at MPNet's (64, 512) (0.893 against 0.167
  ms, H200, tools/gpu/tune_relative_attention.py). Scores live in the log2 domain (exp2 in place of
  exp): both terms are multiplied by log2(e), the tiles when they are made.
* Any head_dim in [16, 256]: one that is not a power of two runs in a tile padded to the next
  power of two, its extra lanes masked (D_PADDED, a constexpr: the power-of-two build is
  unchanged).

Grid: (cdiv(max_seqlen, BLOCK), num_seqs, H). Programs whose rows start past their sequence's
end exit at once, so the grid can be sized from the longest sequence.
"""
from __future__ import annotations

import math
import weakref

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register

_LOG2E = 1.4426950408889634


# The sequence bounds and the tiles' reach are read at run time (not specialised): a new batch shape
# must not stall serving on a compile.
@triton.jit(do_not_specialize=["reach"])
def _relative_bias_attention_kernel(
    Q, K, V, Out, Tiles, cu_seqlens,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_th,
    qk_scale, reach,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, D_PADDED: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """`reach`: T, the tiles' offsets run -T..T (Tiles `[H, 2T + 1, BLOCK, BLOCK]`, log2 domain)."""
    block_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(cu_seqlens + seq).to(tl.int64)
    seqlen = (tl.load(cu_seqlens + seq + 1) - start).to(tl.int32)
    m_lo = block_m * BLOCK
    if m_lo >= seqlen:
        return

    offs_m = m_lo + tl.arange(0, BLOCK)  # query index within the sequence
    offs_d = tl.arange(0, BLOCK_D)
    offs_b = tl.arange(0, BLOCK)
    row_ok = (offs_m < seqlen)[:, None]
    if D_PADDED:
        d_ok = (offs_d < HEAD_DIM)[None, :]
        row_ok = row_ok & d_ok
    q_tok = start + offs_m.to(tl.int64)
    q = tl.load(Q + q_tok[:, None] * stride_qt + head * stride_qh + offs_d[None, :], mask=row_ok, other=0.0)
    k_base = K + start * stride_kt + head * stride_kh
    v_base = V + start * stride_vt + head * stride_vh
    tile_cells = Tiles + head * stride_th + offs_b[:, None] * BLOCK + offs_b[None, :]

    m_i = tl.full([BLOCK], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, seqlen, BLOCK):
        offs_n = start_n + offs_b
        in_seq = offs_n < seqlen
        kv_mask = in_seq[:, None]
        if D_PADDED:
            kv_mask = kv_mask & d_ok
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        # This tile's offset in blocks (start_n - m_lo is a multiple of BLOCK), clamped: its bias tile.
        t = tl.minimum(tl.maximum((start_n - m_lo) // BLOCK, -reach), reach) + reach
        s += tl.load(tile_cells + t * (BLOCK * BLOCK))
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


def _launch_config(head_dim: int, dtype: torch.dtype, max_seqlen: int, on_gpu: bool) -> tuple[int, int, int]:
    """(BLOCK, num_warps, num_stages): square tiles (the bias tiles need BLOCK_M = BLOCK_N). 64 x 64,
    4 warps, 2 stages were the fastest square tiles at MPNet's (64, 512) (H200,
    tools/gpu/tune_relative_attention.py); 32 for fp32 or heads past 128; 16 in the CPU interpreter (the
    smallest tl.dot takes)."""
    if not on_gpu:
        return 16, 4, 1
    if dtype == torch.float32 or head_dim > 128:
        return 32, 4 if head_dim <= 64 else 8, 2
    return 64, 4, 2


# id(bias table) -> (a weak reference to it, {BLOCK: (the table's version when made, tiles, T)}); an
# entry goes with its table (tensors compare element-wise, so they cannot key a WeakKeyDictionary).
_TILES: dict[int, tuple[weakref.ref, dict]] = {}


def _bias_tiles(bias: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """(tiles `[H, 2T + 1, block, block]` fp32 in the log2 domain, T) of a bias table `[H, 2R + 1]`:
    tiles[h, t + T, a, b] = bias[h, clamp(t * block + b - a, -R, R) + R] * log2(e). Made once per
    table and block (a forward's first call, outside any CUDA-graph capture: capture_graph runs its
    function once first), again if the table is written in place."""
    key = id(bias)
    entry = _TILES.get(key)
    if entry is None or entry[0]() is not bias:
        entry = _TILES[key] = (weakref.ref(bias, lambda _, key=key: _TILES.pop(key, None)), {})
    made = entry[1]
    version, tiles, reach = made.get(block, (-1, None, 0))
    if version != bias._version:
        r = (bias.shape[1] - 1) // 2
        reach = -(-(r + block - 1) // block)
        offsets = torch.arange(-reach, reach + 1, device=bias.device)
        cells = torch.arange(block, device=bias.device)
        distance = offsets[:, None, None] * block + cells[None, None, :] - cells[None, :, None]
        tiles = (bias[:, distance.clamp(-r, r) + r] * _LOG2E).contiguous()
        made[block] = (bias._version, tiles, reach)
    return tiles, reach


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
    block, num_warps, num_stages = _launch_config(block_d, q.dtype, max_seqlen, q.is_cuda)
    tiles, reach = _bias_tiles(bias, block)
    _relative_bias_attention_kernel[(triton.cdiv(max_seqlen, block), num_seqs, num_heads)](
        q, k, v, out, tiles, cu_seqlens.contiguous(),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        tiles.stride(0), scale * _LOG2E, reach,
        BLOCK=block, BLOCK_D=block_d, HEAD_DIM=head_dim, D_PADDED=block_d != head_dim,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
