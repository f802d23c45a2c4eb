"""A mixture-of-experts MLP (Mixtral, Qwen MoE) as two grouped GEMMs over the routed rows.

Every (token, slot) pair of the top-k routing goes to one expert. `moe_align` sorts the pairs by
expert into blocks of BLOCK_M rows, each block one expert's (padded with a sentinel row), using
tensor ops only: no host sync, so a decode step with its MoE layers is captured in a CUDA graph.
`_moe_gemm` then runs one program per (block, column tile): it gathers its block's input rows,
reads its expert's weight tile once and writes each pair's output row. The first GEMM applies
the gated activation to [gate | up] (both halves' tiles in one program), the second multiplies
each pair's row by its routing weight; the k rows of a token are summed in fp32 and rounded once.

At decode (one to a few tokens) a block holds one row or few: each selected expert's weights are
read once per step, which is what bounds a small batch. Semantics: `reference.moe_mlp`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register
from tritonformer.kernels.triton_elementwise import ACT_CODE, apply_act


def moe_align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The routed pairs of `ids` ([T, k] expert ids; pair p = t * k + slot) grouped by expert:
    (pairs [blocks * block_m]: pair ids, expert by expert, each expert's run padded to a
    multiple of block_m with the sentinel T * k; experts [blocks]: each block's expert, -1 for
    the unused blocks at the end). `blocks` is an upper bound fixed by the shape
    (ceil(T * k / block_m) + min(E, T * k)), so nothing here waits for the GPU."""
    flat = ids.reshape(-1).long()
    pairs = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    blocks = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(blocks, 0)
    max_blocks = -(-pairs // block_m) + min(num_experts, pairs)
    order = torch.sort(flat, stable=True).indices  # the pairs, expert by expert, in pair order inside one
    expert = flat[order]
    rank = torch.arange(pairs, device=ids.device) - (torch.cumsum(counts, 0) - counts)[expert]
    dest = (block_end - blocks)[expert] * block_m + rank
    sorted_pairs = torch.full((max_blocks * block_m,), pairs, dtype=torch.int32, device=ids.device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    owner = torch.searchsorted(block_end, torch.arange(max_blocks, device=ids.device), right=True)
    experts = torch.where(owner < num_experts, owner, -1).to(torch.int32)
    return sorted_pairs, experts


@triton.jit
def _moe_gemm(
    x_ptr, w_ptr, out_ptr, pairs_ptr, experts_ptr, scale_ptr,
    num_pairs, N, K, stride_xm, stride_we, stride_wn, stride_om,
    X_PER_PAIR: tl.constexpr, ACT: tl.constexpr, GATED: tl.constexpr, SCALED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[p, n] = act(x[row(p)] @ w[e]^T)[n] (times scale[p] where SCALED) for the pairs p of
    this block, all routed to expert e. row(p) = p // X_PER_PAIR (the token, k for the first
    GEMM) or p (1: the second GEMM reads the pairs' own rows). GATED: w[e] is [gate; up] of 2N
    rows; the tile of both halves is accumulated and act(gate) * up stored. Grid: (blocks,
    column tiles)."""
    e = tl.load(experts_ptr + tl.program_id(0))
    if e < 0:
        return
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pairs_ptr + m)
    valid = pair < num_pairs
    row = pair // X_PER_PAIR
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    w_base = w_ptr + e.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        a = tl.load(x_ptr + row[:, None].to(tl.int64) * stride_xm + k[None, :], mask=valid[:, None] & k_ok[None, :],
                    other=0.0)
        b = tl.load(w_base + n[None, :] * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        acc += tl.dot(a, b)
        if GATED:
            b_up = tl.load(w_base + (n[None, :] + N) * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None],
                           other=0.0)
            acc_b += tl.dot(a, b_up)
    acc = apply_act(acc, acc_b, ACT)
    if SCALED:
        acc = acc * tl.load(scale_ptr + pair, mask=valid, other=0.0)[:, None]
    tl.store(out_ptr + pair[:, None].to(tl.int64) * stride_om + n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


def _grouped(x, w, out, pairs, experts, scale, x_per_pair: int, activation: str, block_m: int):
    n = out.shape[1]
    gated = activation != "none"
    block_n = 64 if gated else 128
    grid = (experts.numel(), triton.cdiv(n, block_n))
    _moe_gemm[grid](x, w, out, pairs, experts, scale if scale is not None else out,
                    out.shape[0], n, x.shape[1], x.stride(0), w.stride(0), w.stride(1), out.stride(0),
                    X_PER_PAIR=x_per_pair, ACT=ACT_CODE[activation], GATED=gated, SCALED=scale is not None,
                    BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=64, num_warps=4)
    return out


@register("moe_mlp")
def moe_mlp(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
            activation: str = "silu_mul") -> torch.Tensor:
    tokens, top_k = ids.shape
    pairs = tokens * top_k
    block_m = 16 if pairs <= 256 else 64  # a decode step's few rows per expert; a prefill's many
    sorted_pairs, experts = moe_align(ids, gate_up.shape[0], block_m)
    x = x.contiguous()
    inner = torch.empty(pairs, gate_up.shape[1] // 2, device=x.device, dtype=x.dtype)
    _grouped(x, gate_up, inner, sorted_pairs, experts, None, top_k, activation, block_m)
    rows = torch.empty(pairs, down.shape[1], device=x.device, dtype=torch.float32)
    _grouped(inner, down, rows, sorted_pairs, experts, weights.reshape(-1).float().contiguous(), 1, "none", block_m)
    return rows.view(tokens, top_k, -1).sum(1).to(x.dtype)
