"""Triton-language sentence pooling: an encoder's token states -> one vector per sequence.

The PyTorch reference takes ~8 launches (and used to synchronise with the host to size a
gather); after a small batch's CUDA-graph replay those launches are a visible share of the
request. One program per sequence sums its rows (or takes its first, for CLS pooling, or its last,
for a decoder embedder's last-token pooling) in fp32,
divides by the length and, for a normalised embedding, rescales the row by its L2 norm.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register
from tritonformer.kernels.reference import POOLING_MODES

_MAX_BLOCK_H = 1024  # hidden columns per chunk; wider rows (e.g. 4096) are walked in chunks
_TILE_ELEMS = 4096  # rows x columns loaded per step


@triton.jit
def _pool_kernel(
    X, CU, Out, n_cols, stride_x,
    MEAN: tl.constexpr, LAST: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    H_CHUNKS: tl.constexpr,
):
    seq = tl.program_id(0)
    start = tl.load(CU + seq).to(tl.int64)
    n = (tl.load(CU + seq + 1) - start).to(tl.int32)
    if LAST:
        start = start + tl.maximum(n - 1, 0)  # the last row only
    if not MEAN:
        n = tl.minimum(n, 1)  # CLS / last: one row
    out_row = Out + seq.to(tl.int64) * n_cols
    sumsq = tl.zeros([BLOCK_H], dtype=tl.float32)
    for c in tl.static_range(H_CHUNKS):
        cols = c * BLOCK_H + tl.arange(0, BLOCK_H)
        col_ok = cols < n_cols
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for t0 in range(0, n, BLOCK_T):
            offs_t = t0 + tl.arange(0, BLOCK_T)
            ptrs = X + (start + offs_t.to(tl.int64))[:, None] * stride_x + cols[None, :]
            x = tl.load(ptrs, mask=(offs_t < n)[:, None] & col_ok[None, :], other=0.0)
            acc += tl.sum(x.to(tl.float32), axis=0)
        acc = acc / tl.maximum(n, 1).to(tl.float32)
        sumsq += acc * acc
        tl.store(out_row + cols, acc, mask=col_ok)
    if NORMALIZE:
        scale = 1.0 / tl.maximum(tl.sqrt(tl.sum(sumsq, axis=0)), 1e-12)
        tl.debug_barrier()  # this program's stores above are read back below
        for c in tl.static_range(H_CHUNKS):
            cols = c * BLOCK_H + tl.arange(0, BLOCK_H)
            col_ok = cols < n_cols
            tl.store(out_row + cols, tl.load(out_row + cols, mask=col_ok) * scale, mask=col_ok)


@register("pool_sequences")
def pool_sequences(hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: str, normalize: bool) -> torch.Tensor:
    """One launch for `reference.pool_sequences` (same contract)."""
    if mode not in POOLING_MODES:
        raise ValueError(f"unknown pooling mode {mode!r}")
    assert hidden.dim() == 2 and hidden.stride(1) == 1, "hidden must be [tokens, hidden] with contiguous rows"
    num_seqs, n_cols = cu_seqlens.numel() - 1, hidden.shape[1]
    out = torch.empty((num_seqs, n_cols), dtype=torch.float32, device=hidden.device)
    if num_seqs > 0:
        block_h = min(triton.next_power_of_2(n_cols), _MAX_BLOCK_H)
        block_t = max(1, _TILE_ELEMS // block_h)
        _pool_kernel[(num_seqs,)](
            hidden, cu_seqlens, out, n_cols, hidden.stride(0),
            MEAN=mode == "mean", LAST=mode == "last", NORMALIZE=bool(normalize), BLOCK_T=block_t, BLOCK_H=block_h,
            H_CHUNKS=triton.cdiv(n_cols, block_h), num_warps=4,
        )
    return out
