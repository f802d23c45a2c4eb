"""A mixture-of-experts MLP (Mixtral, Qwen MoE, gpt-oss) as two grouped GEMMs over the routed rows.

Every (token, slot) pair of the top-k routing goes to one expert. The pairs are sorted by expert
into blocks of BLOCK_M rows, each block one expert's (padded with a sentinel row), with no host
sync, so a decode step with its MoE layers is captured in a CUDA graph: for a decode step's few
tokens one program does the routing (scores, the kept groups where the choice is group-limited,
top k, renormalisation) and the sort (`_route_align_kernel`: one launch where tensor ops took
about twenty, each a few microseconds of a step that reads a few hundred microseconds of
weights per layer); for more tokens (a prefill's) three launches where tensor ops took about
thirty-five: each program routes a chunk of tokens and counts its pairs per expert, one program
turns the counts into each chunk's offsets in each expert's run, and each chunk's pairs, sorted
in their program, are written there (the pairs in pair order inside each expert, as
`reference.moe_align` orders them).
`_moe_gemm` then runs one program per (block, column tile): it gathers its block's input rows,
reads its expert's weight tile once and writes each pair's output row. The first GEMM applies
the gated activation to [gate | up] (both halves' tiles in one program; a plain one, Nemotron-H's
squared ReLU, to the up projection's tile), the second multiplies
each pair's row by its routing weight (each after its expert's bias, where the experts have
biases); the k rows of a token are summed in fp32 and rounded once
(`_sum_pairs_kernel`: one launch where a reduction and a cast took two).

At decode (a few tokens) a block holds one row or few: each selected expert's weights are read
once per step, which is what bounds a small batch. Tried and removed: for one token, routing
inside GEMV-style gate-up programs and the k-pair sum inside the down programs (two launches
instead of four) took 42.6 us a Qwen3-30B-A3B layer at its best setting against these four
launches' 32.2 (H200; docs/benchmarks/decoder-families.md, "Mixture of experts"). What a decode step's chain
does instead: every kernel here launches with PDL (PDL_MAX_PAIRS), so each one's launch overlaps
the tail of the one before; the block's norm runs in the router linear's prologue, which writes
the normalised rows for the experts (PreNorm.normed_out); a decode row's routing program is one
warp. Semantics: `reference.moe_mlp`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels import reference, triton_pdl
from tritonformer.kernels.dispatch import register
from tritonformer.kernels.triton_elementwise import ACT_CODE, apply_act

# Route and sort in one program up to this many pairs (tokens x top k), in three launches past it.
# H200, us per call in a CUDA graph (tools/gpu/tune_moe_gemm.py --routing), one program against
# three: Granite-3B-A800M (40 experts, k 8) 7.7 / 11.1 at 8 tokens, 11.2 / 11.1 at 16, 56.6 /
# 12.4 at 64; Qwen3-30B-A3B (128, k 8) 8.0 / 10.4, 10.9 / 11.9, 47.0 / 12.4; Mixtral (8, k 2)
# 3.6 / 4.7 at 64 tokens (128 pairs). The one program sorts every pair itself.
FUSED_MAX_PAIRS = 128
CHUNK_TOKENS = 16  # past that, tokens per program of the routing and of the scatter
FUSED_MAX_EXPERTS = 256
# Up to this many tokens the one routing program is a single warp (its reductions stay in the
# warp's shuffles), four warps past them (0: always four; a benchmark comparing sets it). H200,
# decode step at batch 1 with PDL (tools/gpu/ab_decode_step.py, docs/results/moe/2026-11-29c/):
# Granite-3B-A800M 0.955 -> 0.881 ms, Qwen3-30B-A3B 2.833 -> 2.779, gpt-oss-20b 2.382 -> 2.375.
ONE_WARP_ROUTING_TOKENS = 2
# Up to this many pairs (a decode step's: 64 rows of top 8) every MoE kernel launches with PDL
# where the GPU has it (0: never; a benchmark comparing sets it): each waits for the kernel before
# it first thing, so its launch overlaps its predecessor's tail. H200, same runs, decode step
# without -> with: Qwen3-30B-A3B 3.047 -> 2.863 ms at batch 1, 5.217 -> 4.997 at 64; Granite
# 1.112 -> 0.958, 2.726 -> 2.581; gpt-oss-20b 2.498 -> 2.410, 4.408 -> 4.268. Past it (a prefill's
# GEMM grids, unmeasured) not: a GEMM's programs launched early sit on SMs its predecessor fills.
PDL_MAX_PAIRS = 512


@triton.jit
def _keep_groups(left, cols, E, GROUPS: tl.constexpr, KEPT: tl.constexpr, TOP2: tl.constexpr, E_P2: tl.constexpr):
    """`left` ([rows, E_P2], what chooses; -inf past E) with the experts outside the KEPT best of
    the GROUPS groups (runs of E // GROUPS consecutive experts) set to -inf: a group ranks by
    its largest value, or with TOP2 by the sum of its two largest (reference.moe_route's
    group-limited choice; the first group on ties). The group scores sit in the first GROUPS
    columns of a [rows, E_P2] block."""
    group = cols // (E // GROUPS)  # (>= GROUPS past E: never kept)
    ranked = tl.full(left.shape, float("-inf"), tl.float32)
    for g in tl.static_range(GROUPS):
        mine = tl.where((group == g)[None, :], left, float("-inf"))
        best = tl.max(mine, axis=1)
        if TOP2:  # the largest once (its first column), then the largest of the rest
            first = tl.min(tl.where(mine == best[:, None], cols[None, :], E_P2), axis=1)
            best += tl.max(tl.where(cols[None, :] == first[:, None], float("-inf"), mine), axis=1)
        ranked = tl.where(cols[None, :] == g, best[:, None], ranked)
    keep = tl.zeros(left.shape, dtype=tl.int32)
    for _ in tl.static_range(KEPT):
        top = tl.max(ranked, axis=1)
        pick = tl.min(tl.where(ranked == top[:, None], cols[None, :], E_P2), axis=1)
        keep = tl.where(group[None, :] == pick[:, None], 1, keep)
        ranked = tl.where(cols[None, :] == pick[:, None], float("-inf"), ranked)
    return tl.where(keep != 0, left, float("-inf"))


@triton.jit
def _route_top_k(logits_ptr, stride_l, rows, row_ok, E, bias_ptr, scale, eps, TOP_K: tl.constexpr,
                 NORMALIZE: tl.constexpr, ROUND: tl.constexpr, SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr,
                 K_P2: tl.constexpr, E_P2: tl.constexpr, GROUPS: tl.constexpr, KEPT: tl.constexpr,
                 GROUP_TOP2: tl.constexpr, SPARSEMIXER: tl.constexpr):
    """reference.moe_route of the logits' `rows`: (weights, expert ids), both [len(rows), K_P2].
    Softmax scoring, or with SIGMOID each expert's sigmoid(logit), chosen by that plus the
    `bias_ptr` vector (HAS_BIAS); where GROUPS > KEPT only among the KEPT best groups'
    experts (_keep_groups; GROUPS = KEPT = 1 where the choice is not group-limited, and none of
    that code is compiled in); with SPARSEMIXER each pick's weight is one over the sum of
    exp(logit - its logit) over the experts not yet picked whose logit is within 2 * `eps` of it
    (reference.moe_route's `sparsemixer`); the weights times `scale`, rounded (ROUND,
    _ROUND_CODE) to fp16 (1) or bf16 (2)."""
    cols = tl.arange(0, E_P2)
    col_ok = (cols < E)[None, :]
    logits = tl.load(logits_ptr + rows[:, None] * stride_l + cols[None, :],
                     mask=row_ok[:, None] & col_ok, other=float("-inf")).to(tl.float32)
    logits = tl.where(row_ok[:, None], logits, 0.0)  # (rows past T: finite, never stored)
    if SIGMOID:
        scores = 1.0 / (1.0 + tl.exp(-logits))  # 0 past E
    else:
        row_max = tl.max(logits, axis=1)
        scores = tl.exp(logits - row_max[:, None])
        scores = scores / tl.sum(scores, axis=1)[:, None]
    left = logits  # what chooses: the scores' order, or with a bias the scores + bias
    if SIGMOID or HAS_BIAS or GROUPS > KEPT:  # (groups rank by the scores' values, not the logits')
        left = scores
        if HAS_BIAS:
            left += tl.load(bias_ptr + cols, mask=cols < E, other=0.0).to(tl.float32)[None, :]
        left = tl.where(col_ok, left, float("-inf"))
    if GROUPS > KEPT:
        left = _keep_groups(left, cols, E, GROUPS, KEPT, GROUP_TOP2, E_P2)
    slots = tl.arange(0, K_P2)
    weights = tl.zeros((rows.shape[0], K_P2), dtype=tl.float32)
    ids = tl.zeros((rows.shape[0], K_P2), dtype=tl.int32)
    for j in tl.static_range(TOP_K):  # the k largest, one at a time (first index on ties)
        best = tl.max(left, axis=1)
        pick = tl.min(tl.where(left == best[:, None], cols[None, :], E_P2), axis=1)
        chosen = cols[None, :] == pick[:, None]
        if SPARSEMIXER:  # (left: the logits of the experts not yet picked; -inf past E and once picked)
            far = (best[:, None] - logits) / tl.maximum(tl.abs(logits), best[:, None]) > 2 * eps  # (NaN: near)
            near = tl.where(far | (left == float("-inf")), 0.0, tl.exp(left - best[:, None]))
            weight = 1.0 / tl.sum(near, axis=1)
        else:
            weight = tl.sum(tl.where(chosen, scores, 0.0), axis=1)
        weights = tl.where(slots[None, :] == j, weight[:, None], weights)
        ids = tl.where(slots[None, :] == j, pick[:, None], ids)
        left = tl.where(chosen, float("-inf"), left)
    if NORMALIZE:
        if SIGMOID:
            weights = weights / (tl.sum(weights, axis=1)[:, None] + 1e-20)
        else:
            weights = weights / tl.sum(weights, axis=1)[:, None]
    weights = weights * scale
    if ROUND == 1:
        weights = weights.to(tl.float16).to(tl.float32)
    elif ROUND == 2:
        weights = weights.to(tl.bfloat16).to(tl.float32)
    return weights, ids


@triton.jit
def _sort_by_expert(ids, pair, slot_ok, P2: tl.constexpr, E_P2: tl.constexpr):
    """The pair slots `[rows, K_P2]` (expert `ids`, pair number `pair` < P2) sorted by expert,
    then pair: keys expert * P2 + pair, the empty slots last (key E_P2 * P2); and how many pairs
    each expert has (a histogram of 2 * E_P2 bins, bin E_P2 counting the empty slots)."""
    keys = tl.sort(tl.reshape(tl.where(slot_ok, ids * P2 + pair, E_P2 * P2), [P2]))
    return keys, tl.histogram(tl.reshape(tl.where(slot_ok, ids, E_P2), [P2]), 2 * E_P2)


@triton.jit
def _store_owners(experts_ptr, block_end, E, n_blocks):
    """Each block's expert (-1 past the last run): how many experts' runs end at or before it."""
    for b0 in range(0, n_blocks, 64):
        b = b0 + tl.arange(0, 64)
        owner = tl.sum((block_end[None, :] <= b[:, None]).to(tl.int32), axis=1)
        tl.store(experts_ptr + b, tl.where(owner < E, owner, -1), mask=b < n_blocks)


@triton.jit
def _route_align_kernel(
    logits_ptr, weights_ptr, pairs_ptr, experts_ptr, scratch_ptr, bias_ptr, scale, eps,
    T, E, stride_l, max_rows, n_blocks,
    TOP_K: tl.constexpr, NORMALIZE: tl.constexpr, ROUND: tl.constexpr, SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, T_P2: tl.constexpr, K_P2: tl.constexpr, E_P2: tl.constexpr, PDL: tl.constexpr,
    GROUPS: tl.constexpr, KEPT: tl.constexpr, GROUP_TOP2: tl.constexpr, SPARSEMIXER: tl.constexpr,
):
    """One program: reference.moe_route of the `[T, E]` logits (weights `[T, TOP_K]` fp32 out),
    then moe_align of the routed pairs (pairs and experts out, as moe_align returns them).
    `scratch_ptr`: 4 * E_P2 int32 of memory for the per-expert starts."""
    triton_pdl.wait_for_predecessor(PDL)
    P2: tl.constexpr = T_P2 * K_P2  # pair slots: pair p = t * TOP_K + j lives in slot t * K_P2 + j
    rows = tl.arange(0, T_P2)
    row_ok = rows < T
    weights, ids = _route_top_k(logits_ptr, stride_l, rows, row_ok, E, bias_ptr, scale, eps, TOP_K, NORMALIZE, ROUND,
                                SIGMOID, HAS_BIAS, K_P2, E_P2, GROUPS, KEPT, GROUP_TOP2, SPARSEMIXER)
    slots = tl.arange(0, K_P2)
    slot_ok = row_ok[:, None] & (slots < TOP_K)[None, :]
    tl.store(weights_ptr + rows[:, None] * TOP_K + slots[None, :], weights, mask=slot_ok)

    # The pairs sorted by expert (then pair), and each expert's count.
    keys, counts = _sort_by_expert(ids, rows[:, None] * TOP_K + slots[None, :], slot_ok, P2, E_P2)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, 0)
    bins = tl.arange(0, 2 * E_P2)
    tl.store(scratch_ptr + bins, tl.cumsum(counts, 0) - counts)  # each expert's first sorted position
    tl.store(scratch_ptr + 2 * E_P2 + bins, block_end - blocks)  # and first block
    for r0 in range(0, max_rows, 1024):  # every row a sentinel, then the pairs over them
        r = r0 + tl.arange(0, 1024)
        tl.store(pairs_ptr + r, T * TOP_K, mask=r < max_rows)
    tl.debug_barrier()
    ok = keys < E_P2 * P2
    expert = keys // P2
    first = tl.load(scratch_ptr + expert, mask=ok, other=0)
    first_block = tl.load(scratch_ptr + 2 * E_P2 + expert, mask=ok, other=0)
    dest = first_block * BLOCK_M + tl.arange(0, P2) - first
    tl.store(pairs_ptr + dest, keys % P2, mask=ok)
    _store_owners(experts_ptr, block_end, E, n_blocks)


@triton.jit
def _route_chunk_kernel(
    logits_ptr, weights_ptr, ids_ptr, counts_ptr, pairs_ptr, bias_ptr, scale, eps, T, E, stride_l, max_rows,
    TOP_K: tl.constexpr, NORMALIZE: tl.constexpr, ROUND: tl.constexpr, SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr,
    CHUNK: tl.constexpr, K_P2: tl.constexpr, E_P2: tl.constexpr, FILL: tl.constexpr, PDL: tl.constexpr,
    GROUPS: tl.constexpr, KEPT: tl.constexpr, GROUP_TOP2: tl.constexpr, SPARSEMIXER: tl.constexpr,
):
    """Many tokens, step 1 of 3; one program per CHUNK tokens: their routing (weights and ids
    out), how many of their pairs go to each expert (counts `[chunks, E_P2]`), and FILL rows of
    the sorted pairs set to the sentinel."""
    triton_pdl.wait_for_predecessor(PDL)
    c = tl.program_id(0)
    rows = c * CHUNK + tl.arange(0, CHUNK)
    row_ok = rows < T
    weights, ids = _route_top_k(logits_ptr, stride_l, rows, row_ok, E, bias_ptr, scale, eps, TOP_K, NORMALIZE, ROUND,
                                SIGMOID, HAS_BIAS, K_P2, E_P2, GROUPS, KEPT, GROUP_TOP2, SPARSEMIXER)
    slots = tl.arange(0, K_P2)
    slot_ok = row_ok[:, None] & (slots < TOP_K)[None, :]
    tl.store(weights_ptr + rows[:, None] * TOP_K + slots[None, :], weights, mask=slot_ok)
    tl.store(ids_ptr + rows[:, None] * TOP_K + slots[None, :], ids, mask=slot_ok)
    counts = tl.histogram(tl.reshape(tl.where(slot_ok, ids, E_P2), [CHUNK * K_P2]), 2 * E_P2)
    bins = tl.arange(0, 2 * E_P2)
    tl.store(counts_ptr + c * E_P2 + bins, counts, mask=bins < E_P2)
    r = c * FILL + tl.arange(0, FILL)
    tl.store(pairs_ptr + r, T * TOP_K, mask=r < max_rows)


@triton.jit
def _align_offsets_kernel(counts_ptr, offsets_ptr, experts_ptr, chunks, E, n_blocks,
                          BLOCK_M: tl.constexpr, E_P2: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    """Many tokens, step 2 of 3; one program: each expert's run of blocks (experts out, as
    moe_align returns them) and where each chunk's pairs of each expert start in it
    (offsets `[chunks, E_P2]`: the run's first row plus the earlier chunks' pairs)."""
    triton_pdl.wait_for_predecessor(PDL)
    cols = tl.arange(0, E_P2)
    total = tl.zeros((E_P2,), dtype=tl.int32)
    for c0 in range(0, chunks, ROWS):
        c = c0 + tl.arange(0, ROWS)
        total += tl.sum(tl.load(counts_ptr + c[:, None] * E_P2 + cols[None, :], mask=(c < chunks)[:, None], other=0),
                        axis=0)
    blocks = (total + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, 0)
    running = (block_end - blocks) * BLOCK_M
    for c0 in range(0, chunks, ROWS):
        c = c0 + tl.arange(0, ROWS)
        ok = (c < chunks)[:, None]
        counts = tl.load(counts_ptr + c[:, None] * E_P2 + cols[None, :], mask=ok, other=0)
        tl.store(offsets_ptr + c[:, None] * E_P2 + cols[None, :], running[None, :] + tl.cumsum(counts, 0) - counts,
                 mask=ok)
        running += tl.sum(counts, axis=0)
    _store_owners(experts_ptr, block_end, E, n_blocks)


@triton.jit
def _scatter_chunk_kernel(ids_ptr, offsets_ptr, pairs_ptr, T, TOP_K: tl.constexpr, CHUNK: tl.constexpr,
                          K_P2: tl.constexpr, E_P2: tl.constexpr, PDL: tl.constexpr):
    """Many tokens, step 3 of 3; one program per chunk: its pairs sorted by expert (then pair),
    each written at its expert's offset for this chunk plus its rank among them."""
    triton_pdl.wait_for_predecessor(PDL)
    P2: tl.constexpr = CHUNK * K_P2
    c = tl.program_id(0)
    rows = c * CHUNK + tl.arange(0, CHUNK)
    slots = tl.arange(0, K_P2)
    slot_ok = (rows < T)[:, None] & (slots < TOP_K)[None, :]
    ids = tl.load(ids_ptr + rows[:, None] * TOP_K + slots[None, :], mask=slot_ok, other=0)
    keys, counts = _sort_by_expert(ids, tl.arange(0, CHUNK)[:, None] * TOP_K + slots[None, :], slot_ok, P2, E_P2)
    ok = keys < E_P2 * P2
    expert = keys // P2
    # rank among this chunk's pairs of the same expert = sorted position - pairs of smaller experts
    before = tl.gather(tl.cumsum(counts, 0) - counts, expert, 0)
    start = tl.load(offsets_ptr + c * E_P2 + expert, mask=ok, other=0)
    tl.store(pairs_ptr + start + tl.arange(0, P2) - before, c * CHUNK * TOP_K + keys % P2, mask=ok)


# The routing weights' rounding (weights_dtype) as _route_top_k's ROUND: none, fp16, bf16.
_ROUND_CODE = {None: 0, torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _pdl(pairs: int, device: torch.device) -> dict:
    """The PDL constexpr and launch option of an MoE kernel over `pairs` routed rows (PDL_MAX_PAIRS)."""
    pdl = pairs <= PDL_MAX_PAIRS and triton_pdl.enabled(device)
    return {"PDL": pdl, **triton_pdl.launch_options(pdl)}


def _routing_constants(router_logits: torch.Tensor, top_k: int, normalize: bool, weights_dtype: torch.dtype | None,
                       scoring: str = "softmax", score_bias: torch.Tensor | None = None, groups: int = 1,
                       kept_groups: int = 1, group_score: str = "top2_sum") -> dict | None:
    """The routing kernels' constexprs (`_route_top_k`'s), or None where they cannot route: more
    than FUSED_MAX_EXPERTS experts. A choice that is not group-limited gets GROUPS = KEPT = 1
    (one compiled kernel whatever the config's n_group)."""
    experts = router_logits.shape[1]
    if experts > FUSED_MAX_EXPERTS:
        return None
    reference.check_moe_scoring(scoring)
    grouped = reference.moe_grouped(experts, top_k, groups, kept_groups, group_score)
    return dict(TOP_K=top_k, NORMALIZE=normalize, ROUND=_ROUND_CODE[weights_dtype], SIGMOID=scoring == "sigmoid",
                HAS_BIAS=score_bias is not None, K_P2=triton.next_power_of_2(top_k),
                E_P2=triton.next_power_of_2(experts), GROUPS=groups if grouped else 1,
                KEPT=kept_groups if grouped else 1, GROUP_TOP2=grouped and group_score == "top2_sum",
                SPARSEMIXER=scoring == "sparsemixer")


def route_align(router_logits: torch.Tensor, top_k: int, normalize: bool, weights_dtype: torch.dtype | None,
                block_m: int, scoring: str = "softmax", score_bias: torch.Tensor | None = None,
                scale: float = 1.0, groups: int = 1, kept_groups: int = 1, group_score: str = "top2_sum",
                mask_eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """reference.moe_route_align (same contract, the same pairs in the same order): in one launch
    where T * top_k <= FUSED_MAX_PAIRS, in three past it (route and count per chunk of tokens,
    the offsets, the scatter), where E <= FUSED_MAX_EXPERTS; the reference otherwise."""
    tokens, experts = router_logits.shape
    common = _routing_constants(router_logits, top_k, normalize, weights_dtype, scoring, score_bias, groups,
                                kept_groups, group_score)
    if common is None:
        return reference.moe_route_align(router_logits, top_k, normalize, weights_dtype, block_m, scoring, score_bias,
                                         scale, groups, kept_groups, group_score, mask_eps)
    router_logits = router_logits.contiguous()
    device = router_logits.device
    bias = score_bias.float().contiguous() if score_bias is not None else router_logits  # (unused without HAS_BIAS)
    n_blocks = reference.moe_max_blocks(tokens * top_k, experts, block_m)
    weights = torch.empty(tokens, top_k, device=device, dtype=torch.float32)
    pairs = torch.empty(n_blocks * block_m, device=device, dtype=torch.int32)
    owners = torch.empty(n_blocks, device=device, dtype=torch.int32)
    e_p2, k_p2 = common["E_P2"], common["K_P2"]
    pdl = _pdl(tokens * top_k, device)
    if tokens * top_k <= FUSED_MAX_PAIRS:
        scratch = torch.empty(4 * e_p2, device=device, dtype=torch.int32)
        warps = 1 if tokens <= ONE_WARP_ROUTING_TOKENS else 4
        _route_align_kernel[(1,)](router_logits, weights, pairs, owners, scratch, bias, float(scale), float(mask_eps),
                                  tokens, experts, router_logits.stride(0), pairs.numel(), n_blocks, BLOCK_M=block_m,
                                  T_P2=triton.next_power_of_2(tokens), num_warps=warps, **pdl, **common)
        return weights, pairs, owners
    chunks = triton.cdiv(tokens, CHUNK_TOKENS)
    ids = torch.empty(tokens * top_k, device=device, dtype=torch.int32)
    counts = torch.empty(chunks, e_p2, device=device, dtype=torch.int32)
    offsets = torch.empty_like(counts)
    fill = triton.next_power_of_2(triton.cdiv(pairs.numel(), chunks))
    _route_chunk_kernel[(chunks,)](router_logits, weights, ids, counts, pairs, bias, float(scale), float(mask_eps),
                                   tokens, experts, router_logits.stride(0), pairs.numel(), CHUNK=CHUNK_TOKENS,
                                   FILL=fill,
                                   num_warps=4, **pdl, **common)
    _align_offsets_kernel[(1,)](counts, offsets, owners, chunks, experts, n_blocks, BLOCK_M=block_m, E_P2=e_p2,
                                ROWS=16, num_warps=4, **pdl)
    _scatter_chunk_kernel[(chunks,)](ids, offsets, pairs, tokens, TOP_K=top_k, CHUNK=CHUNK_TOKENS, K_P2=k_p2,
                                     E_P2=e_p2, num_warps=4, **pdl)
    return weights, pairs, owners


@triton.jit
def _moe_gemm(
    x_ptr, w_ptr, out_ptr, pairs_ptr, experts_ptr, scale_ptr, bias_ptr,
    num_pairs, N, K, stride_xm, stride_we, stride_wn, stride_om, stride_be,
    X_PER_PAIR: tl.constexpr, ACT: tl.constexpr, GATED: tl.constexpr, SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[p, n] = act(x[row(p)] @ w[e]^T + bias[e])[n] (times scale[p] where SCALED) for the
    pairs p of this block, all routed to expert e. row(p) = p // X_PER_PAIR (the token, k for
    the first GEMM) or p (1: the second GEMM reads the pairs' own rows). GATED: w[e] is
    [gate; up] of 2N rows; the tile of both halves is accumulated and act(gate, up) stored.
    HAS_BIAS: each expert's bias row (stride_be apart; GATED: [gate; up], 2N long) is added to
    the fp32 accumulators before the activation and the scale. Grid: (blocks, column tiles)."""
    triton_pdl.wait_for_predecessor(PDL)
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
        acc += tl.dot(a, b, input_precision=PRECISION)
        if GATED:
            b_up = tl.load(w_base + (n[None, :] + N) * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None],
                           other=0.0)
            acc_b += tl.dot(a, b_up, input_precision=PRECISION)
    if HAS_BIAS:
        b_base = bias_ptr + e.to(tl.int64) * stride_be
        acc += tl.load(b_base + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_b += tl.load(b_base + n + N, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    acc = apply_act(acc, acc_b, ACT)
    if SCALED:
        acc = acc * tl.load(scale_ptr + pair, mask=valid, other=0.0)[:, None]
    tl.store(out_ptr + pair[:, None].to(tl.int64) * stride_om + n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


def gemm_config(pairs: int, experts: int, gated: bool) -> dict:
    """Tile and launch settings of `_moe_gemm` for a step of `pairs` routed rows over `experts`,
    from tools/gpu/tune_moe_gemm.py on an H200 (Qwen3-30B-A3B and Mixtral-8x7B shapes; bf16).

    Up to 256 pairs (a decode step's few rows per expert) a block is 16 rows and the GEMMs read
    weights: deep K tiles and a fourth pipeline stage keep enough bytes in flight; 64 columns a
    program (Mixtral's down projection at 128 left half the SMs idle: 111 us against 56). Past
    64 rows per expert (a long prefill's) 128x128 tiles over 8 warps: 1.1-1.4x the 64x64 ones.
    Between the two, 64-row blocks."""
    if pairs <= 256:
        if gated:
            return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3}
    if pairs >= 64 * experts:
        return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    return {"BLOCK_M": 64, "BLOCK_N": 64 if gated else 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}


@triton.jit
def _sum_pairs_kernel(rows_ptr, out_ptr, N, TOP_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out[t] = sum over j < TOP_K of rows[t * TOP_K + j], fp32 sums rounded once to out's dtype.
    Grid: (tokens, column blocks)."""
    triton_pdl.wait_for_predecessor(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = n < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(rows_ptr + (t * TOP_K + j) * N + n, mask=ok, other=0.0)
    tl.store(out_ptr + t * N + n, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _grouped(x, w, out, pairs, experts, scale, x_per_pair: int, activation: str, config: dict, bias=None):
    """One grouped GEMM (`_moe_gemm`) of the sorted pairs: w `[E, N or 2N, K]`, bias `[E, N or
    2N]` (an expert's row [gate; up] where the activation is gated) or None."""
    n = out.shape[1]
    gated = activation in reference.GATED_ACTIVATIONS
    if bias is not None:
        assert bias.shape == w.shape[:2] and bias.stride(1) == 1, f"bias must be {list(w.shape[:2])}, row-contiguous"
    grid = (experts.numel(), triton.cdiv(n, config["BLOCK_N"]))
    _moe_gemm[grid](x, w, out, pairs, experts, scale if scale is not None else out, bias if bias is not None else out,
                    out.shape[0], n, x.shape[1], x.stride(0), w.stride(0), w.stride(1), out.stride(0),
                    bias.stride(0) if bias is not None else 0,
                    X_PER_PAIR=x_per_pair, ACT=ACT_CODE[activation], GATED=gated, SCALED=scale is not None,
                    HAS_BIAS=bias is not None,
                    PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # (fp32 in, fp32 products)
                    **_pdl(out.shape[0], x.device), **config)
    return out


@register("moe_mlp")
def moe_mlp(x: torch.Tensor, router_logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int,
            normalize: bool, weights_dtype: torch.dtype | None = None, activation: str = "silu_mul",
            scoring: str = "softmax", score_bias: torch.Tensor | None = None, scale: float = 1.0,
            gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None, groups: int = 1,
            kept_groups: int = 1, group_score: str = "top2_sum", mask_eps: float = 0.0,
            identity_experts: int = 0) -> torch.Tensor:
    """reference.moe_mlp over the pairs sorted by expert: route_align (with the group-limited
    choice where groups > kept_groups), the two grouped GEMMs, the k-row sum (four launches at
    any token count). The expert biases (gate_up_bias `[E, 2I]`, down_bias `[E, H]`, gpt-oss's)
    are added in the GEMMs' epilogues, before the activation and before the routing weight.

    Identity experts (`identity_experts`, the logits' last ids): their pairs' rows are weight * x, written
    before the GEMMs, whose blocks of those ids are skipped (expert -1), so the pair sum adds them as it adds
    the others'. Static shapes, no host sync."""
    tokens, num_experts = router_logits.shape
    pairs = tokens * top_k
    gated = activation in reference.GATED_ACTIVATIONS  # (else a plain one: gate_up is the experts' up `[E, I, H]`)
    first, second = gemm_config(pairs, num_experts, gated), gemm_config(pairs, num_experts, False)
    assert first["BLOCK_M"] == second["BLOCK_M"]  # (one sort of the pairs serves both GEMMs)
    weights, sorted_pairs, experts = route_align(router_logits, top_k, normalize, weights_dtype, first["BLOCK_M"],
                                                 scoring, score_bias, scale, groups, kept_groups, group_score,
                                                 mask_eps)
    x = x.contiguous()
    rows = torch.empty(pairs, down.shape[1], device=x.device, dtype=torch.float32)
    if identity_experts:
        if num_experts != gate_up.shape[0] + identity_experts:
            raise ValueError(f"{num_experts} router logits for {gate_up.shape[0]} experts and "
                             f"{identity_experts} identity experts")
        computing = gate_up.shape[0]
        # each pair's expert, from the block it was sorted into (the padding's sentinel pairs into a spare slot)
        pair_expert = torch.full((pairs + 1,), -1, dtype=experts.dtype, device=x.device)
        pair_expert.scatter_(0, sorted_pairs.long(), experts.repeat_interleave(first["BLOCK_M"]))
        identity = (pair_expert[:pairs] >= computing).float() * weights.reshape(-1).float()
        rows = torch.mul(x.repeat_interleave(top_k, dim=0).float(), identity[:, None], out=rows)
        experts = torch.where(experts < computing, experts, -1)
    inner = torch.empty(pairs, gate_up.shape[1] // 2 if gated else gate_up.shape[1], device=x.device, dtype=x.dtype)
    _grouped(x, gate_up, inner, sorted_pairs, experts, None, top_k, activation, first, gate_up_bias)
    _grouped(inner, down, rows, sorted_pairs, experts, weights.reshape(-1).float().contiguous(), 1, "none", second,
             down_bias)
    out = torch.empty(tokens, down.shape[1], device=x.device, dtype=x.dtype)
    block = min(1024, triton.next_power_of_2(down.shape[1]))
    _sum_pairs_kernel[(tokens, triton.cdiv(down.shape[1], block))](rows, out, down.shape[1], TOP_K=top_k, BLOCK=block,
                                                                   num_warps=4, **_pdl(pairs, x.device))
    return out
