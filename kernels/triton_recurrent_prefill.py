"""Hybrid models' recurrent layers over a prompt chunk (models/mixers.py): a sequence's rows from the state
at its slot, the state after them written back.

`conv1d_chunk`: the depthwise causal convolution before gated DeltaNet's, Mamba's and LFM2's mixing, one
launch: a program per (block of rows, block of channels) sums its K taps from the rows or, before the chunk's
first row, from the slot's saved inputs; the programs of the first row block, the only ones that read the slot,
write its new inputs (the chunk's last K - 1) once all their reads are done. (With general ops: a concatenation
with the state, a transpose, the convolution, an activation, a copy back, and the state's gather and scatter.)

`gated_delta_chunk`: the gated delta rule (gated DeltaNet's prefill, models/gated_deltanet.py), two launches.
Written with general ops, the chunked form is a few batched products for the chunks' own terms and then,
chunk after chunk, six small products to carry the state: at 64 tokens a chunk a 2,000-token prompt is ~200
launches a layer, and the triangular solves run on cuBLAS's batched TRSM. Here:

1. `_delta_chunk_prepare_kernel`, one program per (chunk, head), all chunks at once: the chunk's
   cumulative decay G, the strictly lower L_ts = beta_t e^(G_t - G_s) k_t . k_s, the inverse of I + L, and
   from it W = (I + L)^-1 diag(beta e^G) K and U0 = (I + L)^-1 diag(beta) V. The inverse in products (a row at
   a time, Hugging Face's loop, is 63 dependent steps): the 16 x 16 blocks on the diagonal by forward
   substitution, row r of the four blocks at once (15 steps), then the rest from I + L = (I + L_d)(I + N),
   N = (I + L_d)^-1 L_o strictly block-lower, so N^4 = 0 and (I + N)^-1 = (I - N)(I + N^2).
2. `_delta_chunk_scan_kernel`, one program per (head, block of value columns), the state's block in
   registers from the first chunk to the last: per chunk U = U0 - W S, o = e^G Q S + (Q K^T * decay) U,
   S = e^(G_C) S + (e^(G_C - G) K)^T U; the state read from its slot at the start and written back at the end.

`ssd_chunk`: Mamba-2's recurrence (models/mamba2.py), one launch: a program per (head, block of the head's
channels), the state's block in registers through the prompt, 64 tokens at a time: within a chunk the
outputs are C_t . B_u weighted by exp(sum of dt A over (u, t]) (a masked cumulative sum, as the reference's)
times dt_u x_u, plus the entering state decayed to t; the state leaving the chunk is the entering one decayed
over it plus each token's dt x B^T decayed from its position.

`kda_chunk`: Kimi Delta Attention's rule (models/kda.py), the gated delta rule with a decay per key channel,
two launches as gated_delta_chunk's. Per channel, the within-chunk weights e^(G_t - G_s) are no longer a scalar
per pair of rows, and e^(G_t) e^(-G_s) overflows where a chunk decays far (its sums reach -100s), so:

1. `_kda_chunk_prepare_kernel`, one program per (chunk, head), KDA_BLOCK_K key channels at a time: the pairs'
   sums over channels, L_ts = beta_t sum_c k_t k_s e^(G_t - G_s) and P_ts = sum_c q_t k_s e^(G_t - G_s), for
   s in a 16-row block before t's as products through the last row r of the block before t's (e^(G_t - G_r)
   e^(G_r - G_s): both factors <= 1), and within a block a column at a time (s = the block's row j in every
   block at once: e^(G_t - G_s) elementwise, the differences carried down the block); then (I + L)^-1 as
   gated_delta_chunk's, W = (I + L)^-1 diag(beta) (K * e^G), U0 = (I + L)^-1 diag(beta) V, and what the scan
   reads of them: Q * e^G - P W, P U0, K * e^(G_C - G) and e^(G_C).
2. `_kda_chunk_scan_kernel`, one program per (head, block of value columns), the state's block in registers:
   per chunk U = U0 - W S, o = P U0 + (Q * e^G - P W) S, S = diag(e^(G_C)) S + (K * e^(G_C - G))^T U: three
   products, every elementwise exp done in the prepare launch, which runs all chunks at once.

`selective_scan_chunk`: Mamba-1's selective scan (models/mamba1.py), one launch: a program per block of
SELECTIVE_BLOCK_C channels holds their state `[channels, d_state]` in registers through the prompt, a tile of
tokens at a time: the tile's x, dt, z, B and C loaded whole (coalesced along the channels), each token's
(decay, input) = (exp(dt A), dt x B) composed along the tile by an associative scan, (a1, b1) then (a2, b2) =
(a1 a2, a2 b1 + b2), and every h of the tile from the state entering it; the outputs (h C + D x) * silu(z)
rounded as the reference rounds. (A loop of one token a step waits on its loads each step: the loads of a
tile are issued together, and only the tile's last h is carried.)

The products take fp32 operands to fp32's accuracy (DOT, three TF32 products each), as PyTorch's fp32 matmuls
(which do not use TF32 by default) do: the rule's state is carried across thousands of tokens.

Same semantics and signatures as the references in kernels/reference.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register
from tritonformer.kernels.reference import DELTA_CHUNK

# The products' precision: each fp32 operand as a TF32 high part and a TF32 remainder, three tensor-core products
# accumulated in fp32: about fp32's accuracy (TF32 alone rounds to 1e-3) at tensor-core speed.
DOT: tl.constexpr = tl.constexpr("tf32x3")
SUB: tl.constexpr = tl.constexpr(16)  # rows of the diagonal blocks the delta rule's inverse starts from
# The narrowest block of a product's dims (narrower heads are masked): the first launch with 16-wide blocks faulted
# (an illegal address) on an H200, where the models' 32- to 256-wide ones ran.
MIN_BLOCK = 32


@triton.jit(do_not_specialize=["length", "n_channels"])
def _conv1d_chunk_kernel(x_ptr, w_ptr, b_ptr, state_ptr, slot_ptr, out_ptr, length, n_channels, stride_x, stride_o,
                         stride_slot, stride_sc, K: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr,
                         SILU: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    pt, pc = tl.program_id(0), tl.program_id(1)
    t = pt * BT + tl.arange(0, BT)
    c = pc * BC + tl.arange(0, BC)
    cm = c < n_channels
    held = state_ptr + tl.load(slot_ptr) * stride_slot + c * stride_sc  # [BC]: each channel's saved inputs
    acc = tl.zeros((BT, BC), dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(K):
        src = t - (K - 1) + j  # the input row tap j reads; < 0: the slot's saved input K - 1 + src
        from_x = tl.load(x_ptr + src[:, None] * stride_x + c[None, :],
                         mask=((src >= 0) & (src < length))[:, None] & cm[None, :], other=0.0).to(tl.float32)
        from_state = tl.load(held[None, :] + (K - 1 + src)[:, None],
                             mask=((src < 0) & (t < length))[:, None] & cm[None, :], other=0.0)
        acc += (from_x + from_state) * tl.load(w_ptr + c * K + j, mask=cm, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + t[:, None] * stride_o + c[None, :], acc, mask=(t < length)[:, None] & cm[None, :])
    if pt == 0:  # the slot's new inputs: the last K - 1 of [saved; x]
        tail = tl.arange(0, KP)
        last = length - (K - 1) + tail  # the input rows of the new state; < 0: saved inputs kept
        keep = (tail < K - 1)[:, None] & cm[None, :]
        new = tl.load(x_ptr + last[:, None] * stride_x + c[None, :], mask=(last >= 0)[:, None] & keep,
                      other=0.0).to(tl.float32)
        new += tl.load(held[None, :] + (K - 1 + last)[:, None], mask=(last < 0)[:, None] & keep, other=0.0)
        tl.debug_barrier()  # every thread's reads of the saved inputs done before any is overwritten
        tl.store(held[None, :] + tail[:, None], new, mask=keep)


CONV_BLOCK_T, CONV_BLOCK_C = 32, 128


@register("conv1d_chunk")
def conv1d_chunk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_state: torch.Tensor,
                 slot: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """See reference.conv1d_chunk. x may be strided over rows (a slice of a projection's output); the
    state's slots and channels at any stride, each channel's K - 1 inputs contiguous."""
    length, channels = x.shape
    k = weight.shape[1]
    if activation not in (None, "silu"):
        raise ValueError(f"unsupported convolution activation {activation!r} (supported: silu)")
    assert x.stride(1) == 1 and weight.is_contiguous() and conv_state.dtype == torch.float32
    assert 2 <= k <= CONV_BLOCK_T + 1 and conv_state.stride(2) == 1 and (bias is None or bias.is_contiguous())
    out = torch.empty((length, channels), dtype=x.dtype, device=x.device)
    if length == 0:
        return out
    grid = (triton.cdiv(length, CONV_BLOCK_T), triton.cdiv(channels, CONV_BLOCK_C))
    _conv1d_chunk_kernel[grid](
        x, weight, bias if bias is not None else weight, conv_state, slot, out, length, channels, x.stride(0),
        out.stride(0), conv_state.stride(0), conv_state.stride(1), K=k, KP=triton.next_power_of_2(k - 1),
        HAS_BIAS=bias is not None, SILU=activation == "silu", BT=CONV_BLOCK_T, BC=CONV_BLOCK_C, num_warps=4)
    return out


@triton.jit
def _unit_lower_inverse(neg_l, C: tl.constexpr):
    """(I + L)^-1 for L `[C, C]` strictly lower (given as -L), C at most 4 SUB: the SUB x SUB blocks on the
    diagonal by forward substitution, row r of every block at once, then the rest in products."""
    rows = tl.arange(0, C)
    eye = (rows[:, None] == rows[None, :]).to(tl.float32)
    # D = (I + L_d)^-1, L_d the 16 x 16 blocks on the diagonal: forward substitution, row r of every block at once
    # (row r = -L_r - sum_(j < r) L_rj row j, Hugging Face's loop)
    diagonal = (rows[:, None] // SUB) == (rows[None, :] // SUB)
    neg_ld = tl.where(diagonal, neg_l, 0.0)
    d = neg_ld
    for r in range(1, SUB):
        m = tl.where((rows % SUB == r)[:, None], neg_ld, 0.0)
        d = tl.where((rows % SUB == r)[:, None], m + tl.dot(m, d, input_precision=DOT), d)
    d += eye
    # I + L = (I + L_d)(I + N), N = D L_o (L_o: L below the diagonal blocks) nilpotent in C / SUB = 4 steps:
    # (I + L)^-1 = (I - N)(I + N^2) D
    n = tl.dot(d, tl.where(diagonal, 0.0, -neg_l), input_precision=DOT)
    inv = tl.dot(eye - n, eye + tl.dot(n, n, input_precision=DOT), input_precision=DOT)
    return tl.dot(inv, d, input_precision=DOT)


@triton.jit(do_not_specialize=["length"])
def _delta_chunk_prepare_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, length, padded,
                                stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_gh, stride_bt,
                                stride_bh, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                                C: tl.constexpr):
    chunk, h = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, C)
    t = chunk * C + rows
    live = t < length
    ck, cv = tl.arange(0, BK), tl.arange(0, BV)
    k = tl.load(k_ptr + t[:, None] * stride_kt + h * stride_kh + ck[None, :], mask=live[:, None] & (ck[None, :] < K),
                other=0.0)
    v = tl.load(v_ptr + t[:, None] * stride_vt + h * stride_vh + cv[None, :], mask=live[:, None] & (cv[None, :] < V),
                other=0.0)
    g = tl.load(g_ptr + t * stride_gt + h * stride_gh, mask=live, other=0.0)
    beta = tl.load(beta_ptr + t * stride_bt + h * stride_bh, mask=live, other=0.0)
    cum = tl.cumsum(g, 0)
    below = rows[:, None] > rows[None, :]
    decay = tl.exp(tl.where(below, cum[:, None] - cum[None, :], float("-inf")))
    neg_l = -(beta[:, None] * tl.dot(k, tl.trans(k), input_precision=DOT) * decay)  # -L, 0 on and above
    inv = _unit_lower_inverse(neg_l, C)
    w = tl.dot(inv, k * (beta * tl.exp(cum))[:, None], input_precision=DOT)
    u = tl.dot(inv, v * beta[:, None], input_precision=DOT)
    tl.store(w_ptr + (h * padded + t[:, None]) * K + ck[None, :], w, mask=ck[None, :] < K)
    tl.store(u_ptr + (h * padded + t[:, None]) * V + cv[None, :], u, mask=cv[None, :] < V)


@triton.jit(do_not_specialize=["length", "n_chunks"])
def _delta_chunk_scan_kernel(q_ptr, k_ptr, g_ptr, w_ptr, u_ptr, state_ptr, slot_ptr, out_ptr, length, padded,
                             n_chunks, stride_qt, stride_qh, stride_kt, stride_kh, stride_gt, stride_gh,
                             stride_slot, stride_ot, stride_oh, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                             BV: tl.constexpr, C: tl.constexpr):
    h, vb = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, C)
    ck, cv = tl.arange(0, BK), vb * BV + tl.arange(0, BV)
    kmask, vmask = ck < K, cv < V
    s_ptrs = state_ptr + tl.load(slot_ptr) * stride_slot + h * K * V + ck[:, None] * V + cv[None, :]
    s_mask = kmask[:, None] & vmask[None, :]
    s = tl.load(s_ptrs, mask=s_mask, other=0.0)
    causal = rows[:, None] >= rows[None, :]
    for chunk in range(n_chunks):
        t = chunk * C + rows
        live = t < length
        q = tl.load(q_ptr + t[:, None] * stride_qt + h * stride_qh + ck[None, :], mask=live[:, None] & kmask[None, :],
                    other=0.0)
        k = tl.load(k_ptr + t[:, None] * stride_kt + h * stride_kh + ck[None, :], mask=live[:, None] & kmask[None, :],
                    other=0.0)
        cum = tl.cumsum(tl.load(g_ptr + t * stride_gt + h * stride_gh, mask=live, other=0.0), 0)
        last = tl.sum(tl.where(rows == C - 1, cum, 0.0), 0)
        w = tl.load(w_ptr + (h * padded + t[:, None]) * K + ck[None, :], mask=kmask[None, :], other=0.0)
        u = tl.load(u_ptr + (h * padded + t[:, None]) * V + cv[None, :], mask=vmask[None, :], other=0.0)
        u = u - tl.dot(w, s, input_precision=DOT)
        decay = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], float("-inf")))
        scores = tl.dot(q, tl.trans(k), input_precision=DOT) * decay
        o = tl.dot(q * tl.exp(cum)[:, None], s, input_precision=DOT) + tl.dot(scores, u, input_precision=DOT)
        tl.store(out_ptr + t[:, None] * stride_ot + h * stride_oh + cv[None, :], o,
                 mask=live[:, None] & vmask[None, :])
        s = s * tl.exp(last) + tl.dot(tl.trans(k * tl.exp(last - cum)[:, None]), u, input_precision=DOT)
    tl.store(s_ptrs, s, mask=s_mask)


SCAN_BLOCK_V = 32  # value columns per program of the scan (a head's state split over programs)
SCAN_WARPS = 8
SCAN_STAGES = 1  # the scans' loads not pipelined: their tiles would outgrow shared memory, or halve programs per SM


@register("gated_delta_chunk")
def gated_delta_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      state: torch.Tensor, slot: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """See reference.gated_delta_chunk. q, k, v may be strided over tokens and heads (their last dim
    contiguous); the state's slots at any stride, each slot's `[H, K, V]` contiguous."""
    length, heads, kd = k.shape
    vd = v.shape[-1]
    assert q.dtype == k.dtype == v.dtype == g.dtype == beta.dtype == state.dtype == torch.float32
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
    assert state.stride(3) == 1 and state.stride(2) == vd and state.stride(1) == kd * vd
    if out is None:
        out = torch.empty((length, heads, vd), dtype=torch.float32, device=q.device)
    assert out.stride(2) == 1
    if length == 0:
        return out
    c = DELTA_CHUNK
    assert c <= 4 * SUB  # (the inverse's (I - N)(I + N^2): N^4 = 0 for at most four diagonal blocks)
    n = triton.cdiv(length, c)
    bk, bv = max(MIN_BLOCK, triton.next_power_of_2(kd)), max(MIN_BLOCK, triton.next_power_of_2(vd))
    w = torch.empty((heads, n * c, kd), dtype=torch.float32, device=q.device)
    u = torch.empty((heads, n * c, vd), dtype=torch.float32, device=q.device)
    _delta_chunk_prepare_kernel[(n, heads)](
        k, v, g, beta, w, u, length, n * c, k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0),
        g.stride(1), beta.stride(0), beta.stride(1), K=kd, V=vd, BK=bk, BV=bv, C=c, num_warps=8)
    block_v = min(SCAN_BLOCK_V, bv)
    _delta_chunk_scan_kernel[(heads, triton.cdiv(vd, block_v))](
        q, k, g, w, u, state, slot, out, length, n * c, n, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        g.stride(0), g.stride(1), state.stride(0), out.stride(0), out.stride(1), K=kd, V=vd, BK=bk, BV=block_v, C=c,
        num_warps=SCAN_WARPS, num_stages=SCAN_STAGES)
    return out


@triton.jit(do_not_specialize=["length", "n_chunks"])
def _ssd_chunk_kernel(x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, state_ptr, slot_ptr, y_ptr, length, n_chunks, group,
                      stride_xt, stride_xh, stride_dt, stride_dh, stride_bt, stride_bg, stride_ct, stride_cg,
                      stride_slot, stride_sh, stride_yt, stride_yh, P: tl.constexpr, N: tl.constexpr,
                      BP: tl.constexpr, BN: tl.constexpr, C: tl.constexpr):
    h, pb = tl.program_id(0), tl.program_id(1)
    g = h // group
    rows = tl.arange(0, C)
    cp, cn = pb * BP + tl.arange(0, BP), tl.arange(0, BN)
    pm, nm = cp < P, cn < N
    s_ptrs = state_ptr + tl.load(slot_ptr) * stride_slot + h * stride_sh + cp[:, None] * N + cn[None, :]
    s = tl.load(s_ptrs, mask=pm[:, None] & nm[None, :], other=0.0)  # [BP, BN]
    rate = tl.load(a_ptr + h)
    causal = rows[:, None] >= rows[None, :]
    after = rows[:, None] > rows[None, :]  # [k, u]: token k is after u
    for chunk in range(n_chunks):
        t = chunk * C + rows
        live = t < length
        x = tl.load(x_ptr + t[:, None] * stride_xt + h * stride_xh + cp[None, :], mask=live[:, None] & pm[None, :],
                    other=0.0)
        dt = tl.load(dt_ptr + t * stride_dt + h * stride_dh, mask=live, other=0.0)
        bk = tl.load(b_ptr + t[:, None] * stride_bt + g * stride_bg + cn[None, :], mask=live[:, None] & nm[None, :],
                     other=0.0)
        ck = tl.load(c_ptr + t[:, None] * stride_ct + g * stride_cg + cn[None, :], mask=live[:, None] & nm[None, :],
                     other=0.0)
        a = dt * rate
        # between[t, u] = sum of a over (u, t]: a masked cumulative sum down the rows
        between = tl.cumsum(tl.where(after, a[:, None], 0.0), 0)
        decay = tl.exp(tl.where(causal, between, float("-inf")))
        entering = tl.exp(tl.cumsum(a, 0))  # the entering state's decay to t (incl. t)
        xdt = x * dt[:, None]
        scores = tl.dot(ck, tl.trans(bk), input_precision=DOT) * decay
        y = tl.dot(scores, xdt, input_precision=DOT)
        y += tl.dot(ck, tl.trans(s), input_precision=DOT) * entering[:, None]
        tl.store(y_ptr + t[:, None] * stride_yt + h * stride_yh + cp[None, :], y, mask=live[:, None] & pm[None, :])
        to_end = tl.sum(tl.where((rows == C - 1)[:, None], decay, 0.0), 0)  # exp(sum of a over (u, end])
        last = tl.sum(tl.where(rows == C - 1, entering, 0.0), 0)
        s = s * last + tl.dot(tl.trans(xdt * to_end[:, None]), bk, input_precision=DOT)
    tl.store(s_ptrs, s, mask=pm[:, None] & nm[None, :])


SSD_CHUNK, SSD_BLOCK_P = 64, 32


@register("ssd_chunk")
def ssd_chunk(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
              state: torch.Tensor, slot: torch.Tensor, chunk_size: int = 256) -> torch.Tensor:
    """See reference.ssd_chunk (chunked here SSD_CHUNK tokens at a time whatever `chunk_size` says). x, b, c
    may be strided over tokens, heads and groups (their last dim contiguous); the state's slots and heads at any
    stride, each head's `[P, N]` contiguous."""
    length, heads, p = x.shape
    groups, n = b.shape[1], b.shape[2]
    assert x.dtype == dt.dtype == A.dtype == b.dtype == c.dtype == state.dtype == torch.float32
    assert x.stride(2) == 1 and b.stride(2) == 1 and c.stride(2) == 1 and heads % groups == 0
    assert state.stride(3) == 1 and state.stride(2) == n
    y = torch.empty((length, heads, p), dtype=torch.float32, device=x.device)
    if length == 0:
        return y
    bp = min(SSD_BLOCK_P, max(MIN_BLOCK, triton.next_power_of_2(p)))
    bn = max(MIN_BLOCK, triton.next_power_of_2(n))
    _ssd_chunk_kernel[(heads, triton.cdiv(p, bp))](
        x, dt, A, b, c, state, slot, y, length, triton.cdiv(length, SSD_CHUNK), heads // groups, x.stride(0),
        x.stride(1), dt.stride(0), dt.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1), state.stride(0),
        state.stride(1), y.stride(0), y.stride(1), P=p, N=n, BP=bp, BN=bn, C=SSD_CHUNK, num_warps=8,
        num_stages=SCAN_STAGES)
    return y


@triton.jit(do_not_specialize=["length"])
def _kda_chunk_prepare_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, qs_ptr, kc_ptr, u_ptr, o_ptr, end_ptr,
                              length, padded, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                              stride_gt, stride_gh, stride_bt, stride_bh, K: tl.constexpr, V: tl.constexpr,
                              BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr, C: tl.constexpr):
    chunk, h = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, C)
    t = chunk * C + rows
    live = t < length
    block = rows // SUB
    first = block * SUB  # the first row of each row's diagonal block
    beta = tl.load(beta_ptr + t * stride_bt + h * stride_bh, mask=live, other=0.0)
    lower = tl.zeros((C, C), dtype=tl.float32)  # sum_c k_t[c] k_s[c] e^(G_t[c] - G_s[c]) for s < t: L / beta_t
    pairs = tl.zeros((C, C), dtype=tl.float32)  # sum_c q_t[c] k_s[c] e^(G_t[c] - G_s[c]) for s <= t
    for k0 in range(0, BK, KB):  # KB key channels at a time: the sums over channels accumulate
        ck = k0 + tl.arange(0, KB)
        m = live[:, None] & (ck < K)[None, :]
        k = tl.load(k_ptr + t[:, None] * stride_kt + h * stride_kh + ck[None, :], mask=m, other=0.0)
        q = tl.load(q_ptr + t[:, None] * stride_qt + h * stride_qh + ck[None, :], mask=m, other=0.0)
        cum = tl.cumsum(tl.load(g_ptr + t[:, None] * stride_gt + h * stride_gh + ck[None, :], mask=m, other=0.0), 0)
        # s in a block before t's: through the last row r of the block before t's, e^(G_t - G_s) =
        # e^(G_t - G_r) e^(G_r - G_s), both factors <= 1 (a product of exps of unbounded G alone would overflow)
        for i in tl.static_range(1, C // SUB):
            at_r = tl.sum(tl.where((rows == i * SUB - 1)[:, None], cum, 0.0), 0)  # G_r [KB]
            from_r = tl.exp(tl.where((block == i)[:, None], cum - at_r[None, :], float("-inf")))  # t in block i
            to_r = k * tl.exp(tl.where((rows < i * SUB)[:, None], at_r[None, :] - cum, float("-inf")))  # s <= r
            lower += tl.dot(k * from_r, tl.trans(to_r), input_precision=DOT)
            pairs += tl.dot(q * from_r, tl.trans(to_r), input_precision=DOT)
        # s in t's block, a column of every block at a time: s = first + j, G_t - G_s by differences within it
        since = cum
        for i in tl.static_range(C // SUB):
            at_first = tl.sum(tl.where((rows == i * SUB)[:, None], cum, 0.0), 0)
            since = tl.where((block == i)[:, None], cum - at_first[None, :], since)
        for j in range(SUB):
            s = first + j
            ts = chunk * C + s
            ms = (ts < length)[:, None] & (ck < K)[None, :]
            ks = tl.load(k_ptr + ts[:, None] * stride_kt + h * stride_kh + ck[None, :], mask=ms, other=0.0)
            ks = ks * tl.exp(tl.where((rows >= s)[:, None], since, float("-inf")))  # k_s e^(G_t - G_s), s <= t
            at = rows[None, :] == s[:, None]
            lower += tl.where(at & (rows > s)[:, None], tl.sum(k * ks, 1)[:, None], 0.0)
            pairs += tl.where(at, tl.sum(q * ks, 1)[:, None], 0.0)
            nxt = ts + 1  # G_t - G_(s + 1) = G_t - G_s - g_(s + 1)
            since -= tl.load(g_ptr + nxt[:, None] * stride_gt + h * stride_gh + ck[None, :],
                             mask=((nxt < length) & (j + 1 < SUB))[:, None] & (ck < K)[None, :], other=0.0)
    inv = _unit_lower_inverse(-(beta[:, None] * lower), C)
    # W = (I + L)^-1 diag(beta) (K * e^G); the state's readers folded: o = (Q * e^G - P W) S0 + P U0
    n_chunks = padded // C
    for k0 in range(0, BK, KB):
        ck = k0 + tl.arange(0, KB)
        km = ck < K
        m = live[:, None] & km[None, :]
        k = tl.load(k_ptr + t[:, None] * stride_kt + h * stride_kh + ck[None, :], mask=m, other=0.0)
        q = tl.load(q_ptr + t[:, None] * stride_qt + h * stride_qh + ck[None, :], mask=m, other=0.0)
        cum = tl.cumsum(tl.load(g_ptr + t[:, None] * stride_gt + h * stride_gh + ck[None, :], mask=m, other=0.0), 0)
        last = tl.sum(tl.where((rows == C - 1)[:, None], cum, 0.0), 0)  # G_C [KB]
        w = tl.dot(inv, k * beta[:, None] * tl.exp(cum), input_precision=DOT)
        at = (h * padded + t[:, None]) * K + ck[None, :]
        tl.store(w_ptr + at, w, mask=km[None, :])
        tl.store(qs_ptr + at, q * tl.exp(cum) - tl.dot(pairs, w, input_precision=DOT), mask=km[None, :])
        tl.store(kc_ptr + at, k * tl.exp(last[None, :] - cum), mask=km[None, :])
        tl.store(end_ptr + (h * n_chunks + chunk) * K + ck, tl.exp(last), mask=km)
    for v0 in range(0, BV, KB):  # U0 = (I + L)^-1 diag(beta) V and P U0
        cv = v0 + tl.arange(0, KB)
        vm = cv < V
        v = tl.load(v_ptr + t[:, None] * stride_vt + h * stride_vh + cv[None, :], mask=live[:, None] & vm[None, :],
                    other=0.0)
        u = tl.dot(inv, v * beta[:, None], input_precision=DOT)
        at = (h * padded + t[:, None]) * V + cv[None, :]
        tl.store(u_ptr + at, u, mask=vm[None, :])
        tl.store(o_ptr + at, tl.dot(pairs, u, input_precision=DOT), mask=vm[None, :])


@triton.jit(do_not_specialize=["length", "n_chunks"])
def _kda_chunk_scan_kernel(w_ptr, qs_ptr, kc_ptr, u_ptr, o_ptr, end_ptr, state_ptr, slot_ptr, out_ptr, length, padded,
                           n_chunks, stride_slot, stride_ot, stride_oh, K: tl.constexpr, V: tl.constexpr,
                           BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr):
    h, vb = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, C)
    ck, cv = tl.arange(0, BK), vb * BV + tl.arange(0, BV)
    kmask, vmask = ck < K, cv < V
    s_ptrs = state_ptr + tl.load(slot_ptr) * stride_slot + h * K * V + ck[:, None] * V + cv[None, :]
    s_mask = kmask[:, None] & vmask[None, :]
    s = tl.load(s_ptrs, mask=s_mask, other=0.0)
    for chunk in range(n_chunks):
        t = chunk * C + rows
        at_k = (h * padded + t[:, None]) * K + ck[None, :]
        at_v = (h * padded + t[:, None]) * V + cv[None, :]
        w = tl.load(w_ptr + at_k, mask=kmask[None, :], other=0.0)
        qs = tl.load(qs_ptr + at_k, mask=kmask[None, :], other=0.0)
        kc = tl.load(kc_ptr + at_k, mask=kmask[None, :], other=0.0)
        end = tl.load(end_ptr + (h * n_chunks + chunk) * K + ck, mask=kmask, other=0.0)
        u = tl.load(u_ptr + at_v, mask=vmask[None, :], other=0.0) - tl.dot(w, s, input_precision=DOT)
        o = tl.load(o_ptr + at_v, mask=vmask[None, :], other=0.0) + tl.dot(qs, s, input_precision=DOT)
        tl.store(out_ptr + t[:, None] * stride_ot + h * stride_oh + cv[None, :], o,
                 mask=(t < length)[:, None] & vmask[None, :])
        s = s * end[:, None] + tl.dot(tl.trans(kc), u, input_precision=DOT)
    tl.store(s_ptrs, s, mask=s_mask)


KDA_BLOCK_K = 32  # key (and value) channels per step of the prepare kernel's loops
KDA_PREPARE_WARPS = 8


@register("kda_chunk")
def kda_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor, slot: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """See reference.kda_chunk. q, k, v and g may be strided over tokens and heads (their last dim contiguous);
    the state's slots at any stride, each slot's `[H, K, V]` contiguous."""
    length, heads, kd = k.shape
    vd = v.shape[-1]
    assert q.dtype == k.dtype == v.dtype == g.dtype == beta.dtype == state.dtype == torch.float32
    assert g.shape == k.shape and q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1 and g.stride(2) == 1
    assert state.stride(3) == 1 and state.stride(2) == vd and state.stride(1) == kd * vd
    if out is None:
        out = torch.empty((length, heads, vd), dtype=torch.float32, device=q.device)
    assert out.stride(2) == 1
    if length == 0:
        return out
    c = DELTA_CHUNK
    assert c <= 4 * SUB and c % SUB.value == 0
    n = triton.cdiv(length, c)
    bk, bv = max(MIN_BLOCK, triton.next_power_of_2(kd)), max(MIN_BLOCK, triton.next_power_of_2(vd))
    keyed = torch.empty((3, heads, n * c, kd), dtype=torch.float32, device=q.device)  # W, Q e^G - P W, K e^(G_C - G)
    valued = torch.empty((2, heads, n * c, vd), dtype=torch.float32, device=q.device)  # U0, P U0
    end = torch.empty((heads, n, kd), dtype=torch.float32, device=q.device)  # e^(G_C)
    _kda_chunk_prepare_kernel[(n, heads)](
        q, k, v, g, beta, keyed[0], keyed[1], keyed[2], valued[0], valued[1], end, length, n * c, q.stride(0),
        q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1), beta.stride(0),
        beta.stride(1), K=kd, V=vd, BK=bk, BV=bv, KB=KDA_BLOCK_K, C=c, num_warps=KDA_PREPARE_WARPS)
    block_v = min(SCAN_BLOCK_V, bv)
    _kda_chunk_scan_kernel[(heads, triton.cdiv(vd, block_v))](
        keyed[0], keyed[1], keyed[2], valued[0], valued[1], end, state, slot, out, length, n * c, n,
        state.stride(0), out.stride(0), out.stride(1), K=kd, V=vd, BK=bk, BV=block_v, C=c, num_warps=SCAN_WARPS,
        num_stages=SCAN_STAGES)
    return out


@triton.jit
def _linear_recurrence(a1, b1, a2, b2):
    """(a1, b1) then (a2, b2) of h -> a h + b: (a1 a2, a2 b1 + b2)."""
    return a1 * a2, a2 * b1 + b2


@triton.jit(do_not_specialize=["length", "n_channels"])
def _selective_scan_chunk_kernel(x_ptr, dt_ptr, b_ptr, c_ptr, z_ptr, dt_bias_ptr, a_ptr, d_ptr, state_ptr, slot_ptr,
                                 y_ptr, length, n_channels, stride_x, stride_dt, stride_b, stride_c, stride_z,
                                 stride_slot, stride_y, N: tl.constexpr, BC: tl.constexpr, BN: tl.constexpr,
                                 TB: tl.constexpr):
    cols = tl.program_id(0) * BC + tl.arange(0, BC)
    nc, r = tl.arange(0, BN), tl.arange(0, TB)
    cm, nm = cols < n_channels, nc < N
    hm = cm[:, None] & nm[None, :]
    rate = tl.load(a_ptr + cols[:, None] * N + nc[None, :], mask=hm, other=0.0)  # A [BC, BN]
    h_ptrs = state_ptr + tl.load(slot_ptr) * stride_slot + cols[:, None] * N + nc[None, :]
    h = tl.load(h_ptrs, mask=hm, other=0.0)
    bias = tl.load(dt_bias_ptr + cols, mask=cm, other=0.0)
    skip = tl.load(d_ptr + cols, mask=cm, other=0.0)
    dtype = x_ptr.dtype.element_ty  # (the model's: h C and silu(z) rounded to it)
    for t0 in range(0, length, TB):
        t = t0 + r
        live = t < length
        m = live[:, None] & cm[None, :]
        x = tl.load(x_ptr + t[:, None] * stride_x + cols[None, :], mask=m, other=0.0).to(tl.float32)
        raw = tl.load(dt_ptr + t[:, None] * stride_dt + cols[None, :], mask=m, other=0.0).to(tl.float32)
        raw += bias[None, :]
        dt = tl.where(raw > 20.0, raw, tl.log(1.0 + tl.exp(tl.minimum(raw, 20.0))))  # softplus (torch's threshold)
        dt = tl.where(live[:, None], dt, 0.0)  # (rows past the end: decay 1, input 0)
        mn = live[:, None] & nm[None, :]
        b = tl.load(b_ptr + t[:, None] * stride_b + nc[None, :], mask=mn, other=0.0).to(tl.float32)
        c = tl.load(c_ptr + t[:, None] * stride_c + nc[None, :], mask=mn, other=0.0).to(tl.float32)
        # each token's (decay, input) [TB, BC, BN], composed along the tokens: h_t = decay_t h_(t0 - 1) + input_t
        decay, inp = tl.associative_scan((tl.exp(dt[:, :, None] * rate[None, :, :]),
                                          (dt * x)[:, :, None] * b[:, None, :]), 0, _linear_recurrence)
        hs = decay * h[None, :, :] + inp
        h = tl.sum(tl.where((r == TB - 1)[:, None, None], hs, 0.0), 0)
        # h C in the model's dtype (h rounded, the sum rounded), as Hugging Face's scan computes it
        y = tl.sum(hs.to(dtype).to(tl.float32) * c.to(dtype).to(tl.float32)[:, None, :], 2)
        y = y.to(dtype).to(tl.float32) + skip[None, :] * x
        z = tl.load(z_ptr + t[:, None] * stride_z + cols[None, :], mask=m, other=0.0).to(tl.float32)
        gate = (z / (1.0 + tl.exp(-z))).to(dtype).to(tl.float32)
        tl.store(y_ptr + t[:, None] * stride_y + cols[None, :], y * gate, mask=m)
    tl.store(h_ptrs, h, mask=hm)


SELECTIVE_BLOCK_C = 32  # channels per program of the selective scan
SELECTIVE_TILE = 256  # [tokens, state] values per channel a step of the selective scan holds (16 tokens of 16)
SELECTIVE_WARPS = 8


@register("selective_scan_chunk")
def selective_scan_chunk(x: torch.Tensor, dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor, z: torch.Tensor,
                         dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
                         slot: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """See reference.selective_scan_chunk (its blocks of tokens are this kernel's tiles: the same sums, rounded
    otherwise). x, dt, B, C and z may be strided over rows; the state's slots at any stride, each slot's
    `[I, N]` contiguous."""
    length, channels = x.shape
    n = state.shape[2]
    assert x.stride(1) == 1 and dt.stride(1) == 1 and b.stride(1) == 1 and c.stride(1) == 1 and z.stride(1) == 1
    assert dt.shape == z.shape == (length, channels) and b.shape == c.shape == (length, n)
    assert state.dtype == torch.float32 and state.stride(2) == 1 and state.stride(1) == n
    assert A.dtype == torch.float32 and A.is_contiguous() and A.shape == (channels, n) and D.dtype == torch.float32
    assert dt_bias.is_contiguous() and D.is_contiguous()
    y = torch.empty((length, channels), dtype=x.dtype, device=x.device) if out is None else out
    assert y.shape == (length, channels) and y.stride(1) == 1
    if length == 0:
        return y
    bn = triton.next_power_of_2(n)
    tile = max(2, min(16, SELECTIVE_TILE // bn))
    _selective_scan_chunk_kernel[(triton.cdiv(channels, SELECTIVE_BLOCK_C),)](
        x, dt, b, c, z, dt_bias, A, D, state, slot, y, length, channels, x.stride(0), dt.stride(0), b.stride(0),
        c.stride(0), z.stride(0), state.stride(0), y.stride(0), N=n, BC=SELECTIVE_BLOCK_C, BN=bn, TB=tile,
        num_warps=SELECTIVE_WARPS)
    return y
