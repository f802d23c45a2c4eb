"""Flash attention over packed, variable-length sequences in the Triton language.

Same semantics and signature as `reference.varlen_attention`; registered for CUDA tensors.

* Packed, mask-free. A batch is one `[tokens, heads, head_dim]` tensor plus `cu_seqlens`; there is
  no padding and no mask tensor (EET's idea). Each program reads its sequence's bounds from
  `cu_seqlens` and compares positions in registers, so nothing per batch is materialised.
* Online softmax. A program owns BLOCK_M query rows of one sequence. It streams the
  sequence's keys and values in BLOCK_N blocks, keeping a running row max, row sum and output
  accumulator in fp32; the `[Lq, Lk]` score matrix never exists. Scores are scaled by
  `scale * log2(e)` so that `exp2` can replace `exp`.
* Causal alignment to the end. Query j of a sequence with Lq queries and Lk keys sits at
  position Lk - Lq + j and sees keys 0 .. Lk - Lq + j. That one rule covers prefill (Lq == Lk),
  chunked prefill and decode against a KV cache (Lq < Lk, Lq == 1 included). Key blocks wholly
  above a query block's diagonal are never visited; blocks wholly below it run unmasked; only
  the few blocks that straddle the diagonal (and the ragged last key block) pay for the
  position comparison.
* Grouped-query heads: query head h reads kv head h // G, G = H // Hkv. A program serves one
  kv head and all G query heads that share it: its BLOCK_M rows are (query, head-in-group)
  pairs, row r = query r // G, head r % G. Each K/V tile is then loaded once for G heads, and
  a decode step (one query per sequence) fills G rows of the tile instead of one.

* Split keys for small decode launches (flash-decoding). When a few sequences decode against
  long caches, (sequences x Hkv) programs leave most of the GPU idle; then each sequence's
  keys are cut into NUM_SPLITS chunks handled by separate programs, which write a normalised
  partial output and its log-sum-exp to fp32 workspaces, and `_combine_splits_kernel` merges
  them.
* Sliding window and soft-capping (Mistral, Qwen2, Gemma 2/3). With `window`, query position p
  sees keys p - window < k <= p; a program starts its key loop at the first block its first
  query can see, so a long context under a short window costs only the window, and with
  splits only that visible range is split. Blocks wholly inside every query's window run
  unmasked; only those straddling the window's lower edge or the diagonal are masked. With
  `softcap`, scores are softcap * tanh(scale * q.k / softcap) before masking and softmax.
* Symmetric window (ModernBERT's local attention, not causal): query position p sees keys
  |k - p| <= w, w = window // 2. That is the causal sliding window of 2w + 1 keys whose
  diagonal is moved w keys ahead (p - w <= k <= p + w), so it runs as the CAUSAL + HAS_WINDOW
  kernel with a `lookahead` of w added to every query's position: the same block skipping (a
  long sequence under a 128-key window costs only the window) and the same masking. A window
  whose reach covers every key of the batch runs the plain non-causal kernel.
* Any head_dim in [16, 512] (512: Gemma 4's full layers): one that is not a power of two (Phi-3's 96) runs in a tile
  padded to the next power of two, its extra lanes masked on every load and store.
* Attention sinks (gpt-oss): one learned logit per query head that joins every softmax's
  normaliser but carries no value, p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink)). The key loop
  is unchanged: an unsplit program adds the sink's term when it normalises its rows, and with
  splits `_combine_splits_kernel` adds it once to the splits' total weight.
* Chunked attention (Llama 4's rope layers): with `chunk` C, query position p sees keys
  (p // C) * C <= k <= p, its own chunk of C positions up to itself. It runs as the window
  kernel (HAS_WINDOW, the chunk size in `window`'s place) with CHUNKED choosing that lower edge:
  the same block skipping and masking (a long context costs at most one chunk), splits included.
* ALiBi (BLOOM, MPT, Falcon-RW): with `alibi_slopes` (`[H]` fp32) query head h's score of key
  position k for the query at position p gains slope_h * (k - p), after the scaling (and any
  soft-capping). Hugging Face adds slope_h * k (BLOOM, Falcon) or slope_h * (k - Lk + 1) (MPT):
  on one causal row these differ from ours by a constant, which the softmax cancels; ours stays
  small (0 on the diagonal) whatever the context. Key splits need nothing more: each split's
  log-sum-exp carries its keys' biases.
  Each of these is a constexpr flag (HAS_WINDOW, SOFTCAP, D_PADDED, HAS_SINKS, CHUNKED, ALIBI):
  without them the kernel compiles to the same code as before they existed.

Grid: (cdiv(max_seqlen_q * G, BLOCK_M) * NUM_SPLITS, num_seqs, Hkv). Programs whose rows start
past their sequence's end exit at once, so the grid can be sized from the longest sequence.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tritonformer.kernels import reference, triton_pdl
from tritonformer.kernels.dispatch import register
from tritonformer.kernels.gpu_info import hopper_or_newer, sm_count

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_blocks(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kt, stride_vt,
    offs_q, offs_d, q_shift, seqlen_k, qk_scale,
    start, end, block_table, window, softcap_log2e, alibi_log2e,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    PAGE: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PADDED: tl.constexpr, CHUNKED: tl.constexpr, ALIBI: tl.constexpr,
):
    """Fold key/value blocks [start, end) of one sequence into the online-softmax state.

    Row r of the block is query offs_q[r]. With MASKED, keys past the sequence's end, (if
    CAUSAL) keys after a query's position `q_shift + offs_q` and (if HAS_WINDOW) keys at or
    before `q_shift + offs_q - window` get a score of -inf (with CHUNKED, `window` is the chunk
    size C and keys before the query's chunk, (q_shift + offs_q) // C * C, do); without MASKED
    every key in the range is visible. With PAGE > 0 the keys live in a paged cache: key n is row
    `block_table[n // PAGE] * PAGE + n % PAGE` of the flattened cache (a gather per key, so any
    block size works, whatever BLOCK_N is). With SOFTCAP the log2-domain score is
    `softcap_log2e * tanh(q.k * scale / softcap)`, where the caller passes
    `qk_scale = 2 * scale / softcap * log2(e)` (tanh x = 1 - 2 / (e^2x + 1)). With D_PADDED the
    tile's head dim BLOCK_D exceeds HEAD_DIM and the lanes past it are loaded as zeros. With ALIBI
    each row's slope times log2(e) (`alibi_log2e`, `[BLOCK_M]` fp32) times (key position - query
    position) is added to the log2-domain score (after any soft-capping, before masking).
    """
    if D_PADDED:
        d_ok = (offs_d < HEAD_DIM)[None, :]
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if PAGE > 0:
            if MASKED:
                blk = tl.load(block_table + offs_n // PAGE, mask=offs_n < seqlen_k, other=0)
            else:
                blk = tl.load(block_table + offs_n // PAGE)
            rows_k = blk.to(tl.int64) * PAGE + offs_n % PAGE
        else:
            rows_k = offs_n.to(tl.int64)
        k_ptrs = k_base + rows_k[:, None] * stride_kt + offs_d[None, :]
        v_ptrs = v_base + rows_k[:, None] * stride_vt + offs_d[None, :]
        if MASKED:
            in_seq = offs_n < seqlen_k
            if D_PADDED:
                kv_mask = in_seq[:, None] & d_ok
            else:
                kv_mask = in_seq[:, None]
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        elif D_PADDED:
            k = tl.load(k_ptrs, mask=d_ok, other=0.0)
        else:
            k = tl.load(k_ptrs)
        if SOFTCAP:
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            s = softcap_log2e * (1.0 - 2.0 / (tl.exp2(s * qk_scale) + 1.0))
        else:
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if ALIBI:  # (<= 0 on the causal keys: 0 on the diagonal, falling linearly into the past)
            s += alibi_log2e[:, None] * (offs_n[None, :] - (q_shift + offs_q)[:, None]).to(tl.float32)
        if MASKED:
            visible = in_seq[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= (q_shift + offs_q)[:, None])
            if HAS_WINDOW and CHUNKED:  # (window: the chunk size) keys from the query's chunk's start
                visible = visible & (offs_n[None, :] >= ((q_shift + offs_q) // window * window)[:, None])
            elif HAS_WINDOW:
                visible = visible & (offs_n[None, :] > (q_shift + offs_q - window)[:, None])
            s = tl.where(visible, s, float("-inf"))
        # m_i starts finite (-1e30), so a row that has seen only masked keys keeps alpha = 1
        # and p = 0 instead of producing inf - inf.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        elif D_PADDED:
            v = tl.load(v_ptrs, mask=d_ok, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


# Batch-dependent integers are not specialised on (Triton would otherwise compile a variant per
# "divisible by 16 / equal to 1" class of each): a new batch shape must not stall serving on a compile.
@triton.jit(do_not_specialize=["split_stride", "stride_bt", "window", "lookahead"])
def _varlen_attention_kernel(
    Q, K, V, Out, cu_seqlens_q, cu_seqlens_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    qk_scale, PartialOut, PartialLse, split_stride, BlockTables, stride_bt, window, softcap_log2e, lookahead,
    Sinks, Slopes,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
    PAGE: tl.constexpr, PDL: tl.constexpr,
    HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PADDED: tl.constexpr,
    HAS_SINKS: tl.constexpr, CHUNKED: tl.constexpr, ALIBI: tl.constexpr,
):
    triton_pdl.wait_for_predecessor(PDL)
    # One program: BLOCK_M rows of one sequence and one kv head. Row r is query r // GROUP of
    # the sequence in query head kv_head * GROUP + r % GROUP, so the GROUP query heads that
    # share a kv head share every K/V tile this program loads. With NUM_SPLITS > 1 the program
    # covers only its split's share of the keys and writes a partial result (see below).
    block_m = tl.program_id(0) // NUM_SPLITS
    split = tl.program_id(0) % NUM_SPLITS
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start = tl.load(cu_seqlens_q + seq).to(tl.int64)
    seqlen_q = (tl.load(cu_seqlens_q + seq + 1) - q_start).to(tl.int32)
    m_lo = block_m * BLOCK_M
    if m_lo >= seqlen_q * GROUP:
        return
    if PAGE > 0:  # paged: cu_seqlens_k holds each sequence's key count; K, V are flat caches
        k_start = tl.zeros([], dtype=tl.int64)
        seqlen_k = tl.load(cu_seqlens_k + seq).to(tl.int32)
    else:
        k_start = tl.load(cu_seqlens_k + seq).to(tl.int64)
        seqlen_k = (tl.load(cu_seqlens_k + seq + 1) - k_start).to(tl.int32)
    block_table = BlockTables + seq.to(tl.int64) * stride_bt

    rows = m_lo + tl.arange(0, BLOCK_M)
    offs_q = rows // GROUP  # query index within the sequence
    heads = kv_head * GROUP + rows % GROUP
    row_ok = (offs_q < seqlen_q)[:, None]
    offs_d = tl.arange(0, BLOCK_D)
    if D_PADDED:  # head_dim not a power of two: lanes HEAD_DIM.. of the tile are zeros, never stored
        row_ok = row_ok & (offs_d < HEAD_DIM)[None, :]
    q_tok = q_start + offs_q.to(tl.int64)
    q_ptrs = Q + q_tok[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok, other=0.0)

    k_base = K + k_start * stride_kt + kv_head * stride_kh
    v_base = V + k_start * stride_vt + kv_head * stride_vh

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if ALIBI:  # each row's head's ALiBi slope (fp32 [H]), in the log2 domain
        alibi_log2e = tl.load(Slopes + heads) * 1.4426950408889634
    else:
        alibi_log2e = 0.0

    # Query j sits at key position q_shift + j (causal queries are aligned to the end). A
    # symmetric window moves every query's diagonal `lookahead` keys ahead (0 for causal ones).
    q_shift = seqlen_k - seqlen_q
    if HAS_WINDOW:
        q_shift += lookahead
    if CAUSAL:
        # Keys < full_end are visible to every query of this block (its first query, q_lo,
        # sees keys 0 .. q_shift + q_lo); keys >= end are visible to none of them.
        q_lo = m_lo // GROUP
        q_hi = tl.minimum((m_lo + BLOCK_M - 1) // GROUP, seqlen_q - 1)
        end = tl.maximum(tl.minimum(seqlen_k, q_shift + q_hi + 1), 0)
        full_end = (tl.maximum(q_shift + q_lo + 1, 0) // BLOCK_N) * BLOCK_N
        full_end = tl.minimum(full_end, end)
    else:
        end = seqlen_k
        full_end = (seqlen_k // BLOCK_N) * BLOCK_N

    if HAS_WINDOW:
        # Sliding window (CAUSAL only): query position p sees keys p - window < k <= p. Keys
        # before kv_lo (the block holding the first query's first key) are seen by no query
        # of this block and never visited; keys from full_lo on are inside every query's
        # window. So the blocks [kv_lo, full_lo) straddle the window's lower edge and are
        # masked, [full_lo, full_end) run unmasked, [full_end, end) straddle the diagonal.
        # With a lookahead, a block's diagonal can pass the sequence's end: the unmasked blocks
        # must stop at its last whole block (causal windows never reach it: a no-op there).
        full_end = tl.minimum(full_end, (seqlen_k // BLOCK_N) * BLOCK_N)
        if CHUNKED:
            # Chunked attention (Llama 4; `window` is the chunk size C): query position p sees
            # keys (p // C) * C <= k <= p. That first key never decreases with p either, so the
            # same three ranges hold with it in place of p - window + 1.
            kv_lo = ((tl.maximum(q_shift + q_lo, 0) // window * window) // BLOCK_N) * BLOCK_N
            full_lo = tl.cdiv(tl.maximum(q_shift + q_hi, 0) // window * window, BLOCK_N) * BLOCK_N
        else:
            kv_lo = (tl.maximum(q_shift + q_lo - window + 1, 0) // BLOCK_N) * BLOCK_N
            full_lo = tl.cdiv(tl.maximum(q_shift + q_hi - window + 1, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.minimum(full_lo, full_end)
        # This program's keys: all of [kv_lo, end), or with splits one BLOCK_N-aligned chunk.
        lo = kv_lo
        if NUM_SPLITS > 1:
            chunk = tl.cdiv(tl.cdiv(end - kv_lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
            lo = kv_lo + split * chunk
            end = tl.minimum(end, lo + chunk)
        acc, l_i, m_i = _attend_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
            offs_q, offs_d, q_shift, seqlen_k, qk_scale, lo, tl.minimum(full_lo, end), block_table,
            window, softcap_log2e, alibi_log2e,
            BLOCK_N, True, CAUSAL, PRECISION, PAGE, HAS_WINDOW, SOFTCAP, HEAD_DIM, D_PADDED, CHUNKED, ALIBI,
        )
        acc, l_i, m_i = _attend_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
            offs_q, offs_d, q_shift, seqlen_k, qk_scale, tl.maximum(full_lo, lo), tl.minimum(full_end, end),
            block_table, window, softcap_log2e, alibi_log2e,
            BLOCK_N, False, CAUSAL, PRECISION, PAGE, HAS_WINDOW, SOFTCAP, HEAD_DIM, D_PADDED, CHUNKED, ALIBI,
        )
    else:
        # This program's keys: all of [0, end), or with splits one BLOCK_N-aligned chunk of it.
        lo = 0
        if NUM_SPLITS > 1:
            chunk = tl.cdiv(tl.cdiv(end, NUM_SPLITS), BLOCK_N) * BLOCK_N
            lo = split * chunk
            end = tl.minimum(end, lo + chunk)
        acc, l_i, m_i = _attend_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
            offs_q, offs_d, q_shift, seqlen_k, qk_scale, lo, tl.minimum(full_end, end), block_table,
            window, softcap_log2e, alibi_log2e,
            BLOCK_N, False, CAUSAL, PRECISION, PAGE, HAS_WINDOW, SOFTCAP, HEAD_DIM, D_PADDED, CHUNKED, ALIBI,
        )
    acc, l_i, m_i = _attend_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
        offs_q, offs_d, q_shift, seqlen_k, qk_scale, tl.maximum(full_end, lo), end, block_table,
        window, softcap_log2e, alibi_log2e,
        BLOCK_N, True, CAUSAL, PRECISION, PAGE, HAS_WINDOW, SOFTCAP, HEAD_DIM, D_PADDED, CHUNKED, ALIBI,
    )

    # A query that sees no key at all (only possible when Lk < Lq, or Lk == 0) gets zeros.
    seen = l_i > 0.0
    if HAS_SINKS and NUM_SPLITS == 1:
        # The head's sink logit (fp32 [H], per row: rows are GQA heads) joins the normaliser in
        # the log2 domain: out = acc 2^(m_i - m) / (l_i 2^(m_i - m) + 2^(sink - m)), m the larger.
        # With splits the sink is added once, by the combine kernel.
        sink = tl.load(Sinks + heads) * 1.4426950408889634
        m_all = tl.maximum(m_i, sink)
        alpha = tl.exp2(m_i - m_all)
        denom = l_i * alpha + tl.exp2(sink - m_all)
        out = acc * tl.where(seen, alpha / tl.where(seen, denom, 1.0), 0.0)[:, None]
    else:
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        o_ptrs = Out + q_tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok)
    else:
        # Partial result of this split: its normalised output and log2-sum-exp2 of its scores
        # (-1e30 when it saw no key), in fp32 workspaces laid out [NUM_SPLITS, Tq, H, (BLOCK_D)].
        part = split * split_stride + q_tok * (GROUP * tl.num_programs(2)) + heads
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), -1.0e30)
        tl.store(PartialLse + part, lse, mask=offs_q < seqlen_q)
        tl.store(PartialOut + part[:, None] * BLOCK_D + offs_d[None, :], out, mask=row_ok)


@triton.jit
def _combine_splits_kernel(
    PartialOut, PartialLse, Out, split_stride, stride_ot, stride_oh, Sinks,
    NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PADDED: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    """Out[t, h] = the splits' partial outputs weighted by their share of the softmax mass.

    With HAS_SINKS the head's sink logit adds its mass to the total weight (once, here: the
    splits leave it out) and no output."""
    triton_pdl.wait_for_predecessor(PDL)
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    part = tl.arange(0, NUM_SPLITS) * split_stride + tok * tl.num_programs(1) + head
    lse = tl.load(PartialLse + part)
    if HAS_SINKS:
        sink = tl.load(Sinks + head) * 1.4426950408889634
        m_all = tl.maximum(tl.max(lse, 0), sink)
        weight = tl.exp2(lse - m_all)
    else:
        weight = tl.exp2(lse - tl.max(lse, 0))
    weight = tl.where(lse > -1.0e29, weight, 0.0)
    offs_d = tl.arange(0, BLOCK_D)
    partial = tl.load(PartialOut + part[:, None] * BLOCK_D + offs_d[None, :])
    total = tl.sum(weight, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m_all)
    out = tl.sum(partial * weight[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    if D_PADDED:
        tl.store(Out + tok * stride_ot + head * stride_oh + offs_d, out.to(Out.dtype.element_ty),
                 mask=offs_d < HEAD_DIM)
    else:
        tl.store(Out + tok * stride_ot + head * stride_oh + offs_d, out.to(Out.dtype.element_ty))


def _launch_config(head_dim: int, dtype: torch.dtype, rows: int, on_gpu: bool,
                   hopper: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the longest sequence's `rows` (its
    queries times the GQA group).

    Measured on an H100: 128x64 blocks and 8 warps for long prefills; 64-row blocks for
    batches of short sequences (less padding in each sequence's last block, more programs to
    spread; 64x32 at head dim 128); down to 16 rows when every sequence has only a few
    queries (decode), so a one-query program does not compute 127 dead rows. fp32 tiles are twice the bytes and get smaller
    blocks. In the CPU interpreter: 16x16 tiles, the smallest tl.dot takes.
    Decode launches (at most 16 rows) run fastest with 2 warps and no software pipelining
    (`tools/gpu/tune_decode_attention.py`): 7.6 vs 9.4 us per launch for GPT-2 at batch 64,
    context 128, 6.5 vs 7.5 for the Llama-1B shape; such a program folds in only a few key
    blocks, so there is nothing for the pipeline stages to overlap (head dims up to 64; larger
    ones take that form where their keys are split: _split_decode_config).
    `head_dim` is the tile's (padded) head dim: 96 and 80 run as 128. A long prompt's prefill
    (`tools/gpu/tune_prefill_attention.py --decoders`, one causal prompt of 2,000 tokens, paged
    keys, bf16, H100): at head dim 256 (Gemma) 128x64 blocks, 8 warps, 2 stages, 0.177 against
    0.325 ms for the small tiles (3 stages took 0.205, and 262,144 bytes of shared memory, past
    the H100's 232,448, at a GQA group of 4); at 128 with one query head per KV head (Phi-3,
    2,000 rows) 64x64, 4 warps, 2 stages, 0.155 against 0.204 ms. Shorter head-dim-256
    launches keep the small fp32 tiles (not tuned), and so do all of them before Hopper
    (`hopper` False), whose shared memory is smaller than the 128x64 tiles' pipeline at head
    dim 256.
    """
    if not on_gpu:
        return 16, 16, 4, 1
    if head_dim > 256:  # (Gemma 4's full layers, 512 wide: the smallest tiles, one stage; not yet measured)
        return 16, 16, 8, 1
    if hopper and dtype != torch.float32 and head_dim > 128 and rows > 512:
        return 128, 64, 8, 2
    if dtype == torch.float32 or head_dim > 128:
        return min(64, max(16, triton.next_power_of_2(rows))), 32, 4 if head_dim <= 64 else 8, 2
    if head_dim > 64 and 1024 < rows <= 2048:
        return 64, 64, 4, 2
    if head_dim > 64 and rows <= 2048:
        return min(64, max(16, triton.next_power_of_2(rows))), 32, 4, 3
    if rows > 512:
        return 128, 64, 8, 3
    if rows <= 16:  # decode
        return 16, 64, 2, 1
    return min(64, max(16, triton.next_power_of_2(rows))), 64, 4, 3


def _split_decode_config(head_dim: int, dtype: torch.dtype, on_gpu: bool,
                         unsplit: tuple[int, int, int], group: int = 2) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) for a decode launch (at most 16 rows) whose keys are
    split, given `unsplit`, _launch_config's choice for the same launch unsplit, and the GQA
    `group` (query heads per KV head).

    Such a launch (a few sequences, batch 1 above all) is latency-bound: each program folds in
    one or a few key blocks, so what pays is many programs of small key blocks with no software
    pipeline. Measured on an H100 at batch 1 (`tools/gpu/tune_decode_attention.py`: attention
    plus combine per layer, this configuration with 32 splits against the 32-key blocks, 3
    stages and 16 splits used before): at 2,048 keys the Llama-3.1-8B TP=2 share 10.4 -> 8.6 us,
    the 70B shape's TP=4 share 10.1 -> 6.8, Gemma-2-9B (head dim 256; 8 warps, 2 stages before)
    17.5 -> 12.8; at 8,192 keys Gemma-2-9B 42.0 -> 30.5. The Llama-3.1-8B decode step at
    context 512: 5.407 -> 5.337 ms. Head dims up to 64 already run 64-key blocks without a
    pipeline (_launch_config's decode row); fp32 keeps its small tiles.

    Without GQA (group 1: Phi-3's 32 KV heads, which take 16 splits) 32-key blocks, one stage:
    a program's 16-row tile holds one query row, so a 64-key block is mostly dead work. Phi-3
    (head dim 96 in a 128 tile), us per layer against 64-key blocks: 6.89 vs 8.15 at 128 keys,
    8.66 vs 12.23 at 512, 17.63 vs 20.86 at 2,048, 52.42 vs 64.77 at 8,192; its decode step at
    batch 1, context 128, 3.163 -> 2.938 ms, at 2,048 3.509 -> 3.378 ms. With GQA the same
    blocks win at short contexts and lose at long ones (Llama-3.1-8B: 6.73 vs 8.53 us at 128
    keys, 23.46 vs 20.82 at 8,192; its step at context 128 5.340 -> 5.324 ms, at 2,048 5.497
    -> 5.533), which a CUDA graph captured once cannot choose between: 64 there (H100,
    2026-11-27, docs/results/decoder-families/2026-11-27/tune_split_block_n.log).
    """
    if on_gpu and dtype != torch.float32 and 128 <= head_dim <= 256:  # (wider heads keep their small tiles)
        return (32, 4, 1) if group == 1 else (64, 4, 1)
    return unsplit


def _num_splits(programs: int, rows: int, keys_per_seq: float, device: torch.device) -> int:
    """How many ways to split each sequence's keys (flash-decoding).

    Only for decode-like launches (at most 64 query rows per sequence and kv head) that have
    too few programs to fill the GPU, e.g. a handful of sequences decoding against long
    caches: each split keeps at least 256 keys, and the partial results cost one small
    combine kernel. A power of two, at most 16; 1 means no split.
    """
    if device.type != "cuda" or rows > 64:
        return 1
    target = 2 * sm_count(device)
    splits = 1
    while splits < 16 and programs * splits < target and keys_per_seq / (2 * splits) >= 256:
        splits *= 2
    return splits


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
    out: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton flash attention with exactly `reference.varlen_attention`'s contract.

    q `[Tq, H, D]`, k/v `[Tk, Hkv, D]` may be strided views along the token and head dims
    (slices of a packed QKV, say); a tensor whose last dim is not contiguous is copied first.
    Without `max_seqlen_q`, one device-to-host sync computes it from `cu_seqlens_q`.
    """
    assert cu_seqlens_q.numel() == cu_seqlens_k.numel(), "cu_seqlens_q and cu_seqlens_k differ in length"
    assert cu_seqlens_k.device == q.device, f"cu_seqlens_k must be on q's device {q.device}"
    num_seqs = cu_seqlens_q.numel() - 1
    keys_per_seq = k.shape[0] / max(num_seqs, 1)
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, None, 0, keys_per_seq, causal, scale, max_seqlen_q, out,
                      None, window, softcap, sinks, chunk, alibi_slopes)


@register("paged_attention")
def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqlens_k: torch.Tensor,
    causal: bool,
    scale: float | None = None,
    max_seqlen_q: int | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton flash attention over a paged KV cache, `reference.paged_attention`'s contract.

    The same kernel as `varlen_attention`: keys are gathered through the block table inside
    the kernel, so nothing is copied out of the cache. `num_splits` fixes the number of key
    splits (CUDA-graph capture needs a launch that does not depend on the lengths); without
    it the split count is chosen from the table's width (or the window, when smaller). With a
    window, a program reads nothing (keys, values, table entries) before the BLOCK_N-aligned
    key block holding its first query's first visible key.
    """
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "k/v caches must be [blocks, block_size, Hkv, D]"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "k/v caches must be contiguous"
    assert block_tables.dim() == 2 and block_tables.dtype == torch.int32, "block_tables must be [B, max_blocks] int32"
    assert seqlens_k.numel() == cu_seqlens_q.numel() - 1 == block_tables.shape[0], (
        "seqlens_k, cu_seqlens_q and block_tables disagree on the number of sequences"
    )
    page = k_cache.shape[1]
    k = k_cache.view(-1, *k_cache.shape[2:])
    v = v_cache.view(-1, *v_cache.shape[2:])
    keys_per_seq = block_tables.shape[1] * page
    return _attention(
        q, k, v, cu_seqlens_q, seqlens_k.to(torch.int32), block_tables, page, keys_per_seq,
        causal, scale, max_seqlen_q, out, num_splits, window, softcap, sinks, chunk, alibi_slopes,
    )


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, block_tables, page, keys_per_seq, causal, scale, max_seqlen_q,
               out, num_splits, window, softcap, sinks=None, chunk=None, alibi_slopes=None):
    """Checks, launch configuration and the launch shared by the contiguous and paged entry
    points. Paged (`page` > 0): k/v are the flattened caches and `cu_seqlens_k` holds key counts.
    `sinks` (`[H]`, any float dtype) reaches the kernels as fp32 on q's device, as do
    `alibi_slopes` (ALIBI; a decoder keeps them so, on its device from the load, so that a
    captured graph replays no copy). `chunk` runs as a window of the chunk's size with CHUNKED set."""
    assert q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "q, k, v must be [tokens, heads, head_dim]"
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[1]
    assert k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape"
    assert k.shape[2] == head_dim, f"q head_dim {head_dim} != k/v head_dim {k.shape[2]}"
    assert num_kv_heads > 0 and num_heads % num_kv_heads == 0, (
        f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}"
    )
    assert 16 <= head_dim <= 512, f"triton attention needs a head_dim in [16, 512], got {head_dim}"
    assert q.dtype == k.dtype == v.dtype, f"q/k/v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}"
    assert cu_seqlens_q.device == q.device, f"cu_seqlens_q must be on q's device {q.device}"
    reference.check_attention_options(causal, window, softcap)
    reference.check_attention_sinks(sinks, num_heads)
    reference.check_attention_chunk(causal, window, chunk)
    reference.check_attention_alibi(alibi_slopes, num_heads, causal)
    chunked = chunk is not None
    if chunked:  # (a query reads at most `chunk` keys, from its chunk's start: the window's machinery)
        window = chunk
    lookahead = 0
    if window is not None and not causal:
        # Symmetric: |k - p| <= reach. A reach past every key of the batch masks nothing (the
        # plain kernel runs); otherwise the causal window of 2 * reach + 1 keys, `lookahead` ahead.
        reach = int(window) // 2
        if reach >= k.shape[0] + q.shape[0]:
            window = None
        else:
            causal, lookahead, window = True, reach, 2 * reach + 1

    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    assert out.shape == q.shape and out.stride(-1) == 1, "out must be shaped like q with a contiguous last dim"
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
    # A head_dim that is not a power of two (Phi-3's 96, 80) runs in a tile padded to the next
    # one, its extra lanes masked off on every load and store.
    block_d = triton.next_power_of_2(head_dim)
    group = num_heads // num_kv_heads
    rows = max_seqlen_q * group
    block_m, block_n, num_warps, num_stages = _launch_config(block_d, q.dtype, rows, q.is_cuda,
                                                             hopper_or_newer(q.device))
    m_blocks = triton.cdiv(rows, block_m)
    if window is not None:  # a query reads at most `window` keys: split only those
        keys_per_seq = min(keys_per_seq, window)
    if num_splits is not None and (num_splits < 1 or num_splits & (num_splits - 1)):
        raise ValueError(f"num_splits must be a power of two (the combine kernel's range), got {num_splits}")
    splits = num_splits or _num_splits(m_blocks * num_seqs * num_kv_heads, rows, keys_per_seq, q.device)
    if splits > 1 and rows <= 16:
        unsplit = (block_n, num_warps, num_stages)
        block_n, num_warps, num_stages = _split_decode_config(block_d, q.dtype, q.is_cuda, unsplit, group)
    total_q = q.shape[0]
    split_stride = total_q * num_heads
    if splits > 1:
        partial_out = torch.empty((splits, total_q, num_heads, block_d), dtype=torch.float32, device=q.device)
        partial_lse = torch.empty((splits, total_q, num_heads), dtype=torch.float32, device=q.device)
    else:
        partial_out = partial_lse = out  # unused
    tables = block_tables if block_tables is not None else cu_seqlens_k  # unused when not paged
    if sinks is not None:  # a no-op for an fp32 contiguous tensor on q's device
        sinks = sinks.to(device=q.device, dtype=torch.float32).contiguous()
    sinks_arg = sinks if sinks is not None else out  # unused without sinks
    if alibi_slopes is not None:  # (likewise)
        alibi_slopes = alibi_slopes.to(device=q.device, dtype=torch.float32).contiguous()
    slopes_arg = alibi_slopes if alibi_slopes is not None else out  # unused without ALiBi
    if softcap is not None:
        # log2-domain score = softcap * log2(e) * tanh(x), x = scale * q.k / softcap, with
        # tanh(x) = 1 - 2 / (exp2(2 * log2(e) * x) + 1): the kernel's qk_scale is 2 log2(e) scale / softcap.
        qk_scale, softcap_log2e = 2.0 * _LOG2E * float(scale) / float(softcap), float(softcap) * _LOG2E
    else:
        qk_scale, softcap_log2e = float(scale) * _LOG2E, 0.0
    pdl = triton_pdl.enabled(q.device)
    _varlen_attention_kernel[(m_blocks * splits, num_seqs, num_kv_heads)](
        q, k, v, out, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        qk_scale, partial_out, partial_lse, split_stride,
        tables, tables.stride(0) if block_tables is not None else 0,
        min(int(window), 2**30) if window is not None else 0, softcap_log2e, lookahead, sinks_arg, slopes_arg,
        GROUP=group,
        CAUSAL=bool(causal),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, NUM_SPLITS=splits, PAGE=page, PDL=pdl,
        HAS_WINDOW=window is not None, SOFTCAP=softcap is not None, HEAD_DIM=head_dim, D_PADDED=block_d != head_dim,
        HAS_SINKS=sinks is not None, CHUNKED=chunked, ALIBI=alibi_slopes is not None,
        num_warps=num_warps, num_stages=num_stages, **triton_pdl.launch_options(pdl),
    )
    if splits > 1:
        _combine_splits_kernel[(total_q, num_heads)](
            partial_out, partial_lse, out, split_stride, out.stride(0), out.stride(1), sinks_arg,
            NUM_SPLITS=splits, BLOCK_D=block_d, PDL=pdl, HEAD_DIM=head_dim, D_PADDED=block_d != head_dim,
            HAS_SINKS=sinks is not None,
            num_warps=4 if block_d <= 64 else 8, **triton_pdl.launch_options(pdl),
        )
    return out


