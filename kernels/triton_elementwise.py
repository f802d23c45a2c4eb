"""Triton-language element-wise kernels: bias + activation, gated activations (SwiGLU, GeGLU),
xIELU with learnt scalars, rotary, the QKV split and its per-head q/k norms.

These are the "element-wise" non-GEMM kernels of TurboTransformers' fusion rule (seeds.md
§1.1.2: fuse everything between two GEMMs into one kernel): each reads the previous GEMM's
output once and writes exactly what the next GEMM or attention needs, in fp32 arithmetic and
the input dtype in memory. They are memory-bound, so the point is one read and one write per
element and enough elements per program (`_TILE_ELEMS`) to keep loads in flight.

Every wrapper has the signature and result of its counterpart in `reference.py`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels import triton_pdl
from tritonformer.kernels.dispatch import register
from tritonformer.kernels.reference import GATED_ACTIVATIONS, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, gate_group

_TILE_ELEMS = 4096  # elements per program (32 per thread at 4 warps)
# From this many tokens the split + rotary kernel launches with PDL where the GPU has it (a large
# number: never; a benchmark comparing sets it). H200, decode step (tools/gpu/ab_decode_step.py,
# docs/results/moe/2026-11-29c/): at 64 rows Qwen3-8B 5.467 -> 5.425 ms, Qwen3-30B-A3B 5.220 ->
# 5.185; at one row, after the GEMV's PDL launch, it lost: 4.261 -> 4.351, 2.817 -> 2.833.
SPLIT_ROTARY_PDL_MIN_TOKENS = 3
_MAX_BLOCK_COLS = 1024
_MAX_ROWS = 64


def _contig(t: torch.Tensor) -> torch.Tensor:
    """t itself when contiguous (the usual case), else a contiguous copy. The kernels index
    rows as `row * n_cols` and need no 2-D view; wrappers keep their torch calls few because
    the host-side cost per op is comparable to a small kernel's run time."""
    return t if t.is_contiguous() else t.contiguous()


def _tile_2d(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """(ROWS, BLOCK columns, num_warps) for a `[rows, cols]` element-wise launch."""
    block = min(triton.next_power_of_2(n_cols), _MAX_BLOCK_COLS)
    rows = max(1, min(_MAX_ROWS, _TILE_ELEMS // block, triton.next_power_of_2(max(n_rows, 1))))
    num_warps = max(1, min(8, rows * block // 1024))
    return rows, block, num_warps


@triton.jit
def _erfc_nonneg(z):
    """erfc(z) for z >= 0 (fp32) without a branch: t * 2^(P(t) - z^2 log2(e)), t = 1 / (1 + z / 2),
    P of degree 9 in t (Numerical Recipes' `erfcc` form; the coefficients fitted for this in log2
    units, least squares reweighted toward minimax over t in (0, 1], i.e. every z >= 0, against
    float64's erfcx): within 1.0e-7 of erfc relatively; evaluated in fp32, 2e-6 at z <= 4 (the
    exponent's rounding), 1e-5 at z <= 9. One reciprocal, nine FMAs, one exp2."""
    t = 1.0 / (1.0 + 0.5 * z)
    p = 0.24346929788589478 * t - 1.173378825187683
    p = p * t + 2.1254608631134033
    p = p * t - 1.6174126863479614
    p = p * t + 0.39148402214050293
    p = p * t - 0.26540976762771606
    p = p * t + 0.13905924558639526
    p = p * t + 0.5397483110427856
    p = p * t + 1.4427276849746704
    p = p * t - 1.8257482051849365
    return t * tl.exp2(p - z * z * 1.4426950408889634)


@triton.jit
def _erf_gelu(h):
    """Exact GELU (BERT's "gelu"), h * Phi(h), h fp32: Phi(h) = erfc(|h| / sqrt 2) / 2 below 0 and
    1 minus that above, from the branch-free `_erfc_nonneg` (libdevice's erff branches on |h|,
    and a warp of mixed signs and sizes ran both sides: the FP8 FFN's act + quantise kernel took
    220 us on bert-base's (64, 512) [32768, 3072] output on an H200, 76 us without the GELU; 182
    us with this). Within 3.1e-6 of h * Phi(h) relatively where h > -5.6 (fp32, interpreted);
    both tails keep their relative accuracy (erfc is computed, never 1 - erf)."""
    half_e = 0.5 * _erfc_nonneg(tl.abs(h) * 0.7071067811865476)
    return h * tl.where(h < 0, half_e, 1.0 - half_e)


@triton.jit
def _tanh_gelu(h):
    """GPT-2's "gelu_new" tanh approximation."""
    # tanh(u) = 1 - 2 / (exp(2u) + 1): no libdevice tanh needed, and it saturates to ±1
    # cleanly (exp overflowing to inf gives 1, underflowing to 0 gives -1).
    u = 0.7978845608028654 * (h + 0.044715 * h * h * h)
    return 0.5 * h * (2.0 - 2.0 / (tl.exp(2.0 * u) + 1.0))


# The activation codes of `apply_act` (below): linear_act's names; the gated ones take the up
# half as a second operand (reference.GATED_ACTIVATIONS).
ACT_CODE = {"none": 0, "gelu": 1, "gelu_tanh": 2, "silu_mul": 3, "gelu_tanh_mul": 4, "gelu_mul": 5, "swiglu_oai": 6,
            "relu2": 7, "relu": 8}
# "swiglu_oai": gpt-oss's swiglu_alpha (1.702) and swiglu_limit (7.0), the reference's values
# as compile-time constants of the kernels.
_OAI_ALPHA = tl.constexpr(SWIGLU_OAI_ALPHA)
_OAI_LIMIT = tl.constexpr(SWIGLU_OAI_LIMIT)


@triton.jit
def apply_act(acc, acc_b, ACT: tl.constexpr):
    """An activation on fp32 values: ACT_CODE's; a gated one's up half is acc_b."""
    if ACT == 1:
        acc = _erf_gelu(acc)
    elif ACT == 2:
        acc = _tanh_gelu(acc)
    elif ACT == 3:
        # silu(g) = g * sigmoid(g) = g / (1 + exp(-g)); for g -> -inf this tends to -0, no NaN.
        acc = acc / (1.0 + tl.exp(-acc)) * acc_b
    elif ACT == 4:
        acc = _tanh_gelu(acc) * acc_b
    elif ACT == 5:
        acc = _erf_gelu(acc) * acc_b
    elif ACT == 6:
        # gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit), g * sigmoid(alpha g) * (u + 1)
        g = tl.minimum(acc, _OAI_LIMIT)
        u = tl.minimum(tl.maximum(acc_b, -_OAI_LIMIT), _OAI_LIMIT)
        acc = g / (1.0 + tl.exp(g * -_OAI_ALPHA)) * (u + 1.0)
    elif ACT == 7:  # squared ReLU
        acc = tl.maximum(acc, 0.0)
        acc = acc * acc
    elif ACT == 8:
        acc = tl.maximum(acc, 0.0)
    return acc


@triton.jit(do_not_specialize=["n_rows"])  # one compiled kernel whatever the row count
def _bias_gelu_kernel(
    x_ptr, bias_ptr, out_ptr, n_rows, n_cols,
    HAS_BIAS: tl.constexpr, APPROX_TANH: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    """out = GELU(x + bias): BERT's "AddBias + Activation" after the FFN's first GEMM, so
    the biased pre-activation never goes to memory. Grid: (row tiles, column tiles)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    offs = rows.to(tl.int64) * n_cols + cols
    h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        h += tl.load(bias_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    if APPROX_TANH:
        y = _tanh_gelu(h)
    else:
        y = _erf_gelu(h)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@register("bias_gelu")
def bias_gelu(
    x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none", out: torch.Tensor | None = None
) -> torch.Tensor:
    """GELU(x + bias) in one kernel; see reference.bias_gelu. `out` may be x (in place: each
    element is read before it is written by the same program)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    x = _contig(x)
    if out is None:
        out = torch.empty_like(x)
    assert out.shape == x.shape and out.is_contiguous(), "out must be a contiguous tensor shaped like x"
    if out.numel() > 0:
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        rows, block, num_warps = _tile_2d(n_rows, n_cols)
        grid = (triton.cdiv(n_rows, rows), triton.cdiv(n_cols, block))
        _bias_gelu_kernel[grid](
            x, _contig(bias) if bias is not None else x, out, n_rows, n_cols,
            HAS_BIAS=bias is not None, APPROX_TANH=approximate == "tanh",
            ROWS=rows, BLOCK=block, num_warps=num_warps,
        )
    return out


@triton.jit(do_not_specialize=["n_rows"])  # one compiled kernel whatever the row count
def _gated_act_kernel(gu_ptr, out_ptr, n_rows, n_inner, ACT: tl.constexpr, ROWS: tl.constexpr,
                      BLOCK: tl.constexpr):
    """out = act(gate, up) with gate_up = [gate | up] per row (SwiGLU, GeGLU, gpt-oss's clamped
    SwiGLU), read straight from the fused gate/up GEMM output so neither half is materialised
    on its own."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < n_inner)
    rows = rows.to(tl.int64)
    in_offs = rows * (2 * n_inner) + cols
    gate = tl.load(gu_ptr + in_offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + in_offs + n_inner, mask=mask, other=0.0).to(tl.float32)
    y = apply_act(gate, up, ACT)
    tl.store(out_ptr + rows * n_inner + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@register("gated_act")
def gated_act(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate, up) where gate_up = [gate | up] on the last dim; see reference.gated_act."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(GATED_ACTIVATIONS)}, got {activation!r}")
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dim must be even, got {gate_up.shape[-1]}")
    gate_up = _contig(gate_up)
    n_inner = gate_up.shape[-1] // 2
    out = torch.empty((*gate_up.shape[:-1], n_inner), dtype=gate_up.dtype, device=gate_up.device)
    if out.numel() > 0:
        n_rows = out.numel() // n_inner
        rows, block, num_warps = _tile_2d(n_rows, n_inner)
        grid = (triton.cdiv(n_rows, rows), triton.cdiv(n_inner, block))
        _gated_act_kernel[grid](gate_up, out, n_rows, n_inner, ACT=ACT_CODE[activation], ROWS=rows, BLOCK=block,
                                num_warps=num_warps)
    return out


@register("silu_and_mul")
def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up where gate_up = [gate | up] on the last dim; see reference.silu_and_mul."""
    return gated_act(gate_up, "silu_mul")


@triton.jit(do_not_specialize=["n"])  # one compiled kernel whatever the token count
def _sigmoid_mul_kernel(x_ptr, g_ptr, out_ptr, n, group, BLOCK: tl.constexpr):
    """out = x * sigmoid(gate) over flat elements, each gate element over `group` of x's, sigmoid rounded to
    x's dtype first."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs // group, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + offs, (x * s).to(out_ptr.dtype.element_ty), mask=mask)


@register("sigmoid_mul")
def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x * sigmoid(gate) in one launch, per element or per head; see reference.sigmoid_mul (`out` may be x)."""
    group = gate_group(x, gate)
    x, gate = _contig(x), _contig(gate)
    if out is None:
        out = torch.empty_like(x)
    n = x.numel()
    if n:
        _sigmoid_mul_kernel[(triton.cdiv(n, _TILE_ELEMS),)](x, gate, out, n, group, BLOCK=_TILE_ELEMS,
                                                               num_warps=4)
    return out


@triton.jit
def _expm1(z):
    """exp(z) - 1 without the cancellation near 0: there (|z| < 1/32) its Taylor series to z^5, whose
    first term left out is below fp32's resolution; elsewhere exp(z) - 1."""
    series = z * (1.0 + z * (0.5 + z * (1.0 / 6.0 + z * (1.0 / 24.0 + z * (1.0 / 120.0)))))
    return tl.where(tl.abs(z) < 0.03125, series, tl.exp(z) - 1.0)


@triton.jit(do_not_specialize=["n"])  # one compiled kernel whatever the token count
def _xielu_kernel(x_ptr, p_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = xIELU(x) over flat elements, its four scalars read from p_ptr (fp32: alpha_p, alpha_n, beta, eps)."""
    alpha_p = tl.load(p_ptr)
    alpha_n = tl.load(p_ptr + 1)
    beta = tl.load(p_ptr + 2)
    eps = tl.load(p_ptr + 3)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    negative = (_expm1(tl.minimum(h, eps)) - h) * alpha_n + beta * h
    y = tl.where(h > 0.0, alpha_p * h * h + beta * h, negative)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@register("xielu")
def xielu(x: torch.Tensor, params: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """xIELU with scalars read on the device, in one launch; see reference.xielu (`out` may be x: in place).

    A kernel of its own between the plain MLP's two linears, not an epilogue of the first: the
    linears' activation epilogues are compile-time codes of four GEMM / GEMV kernels (and FP8's
    and the MoE's paths), none of which takes a per-layer operand, and threading one pointer
    through all of them is more change than the one extra pass over the `[tokens, I]` activation
    is worth: a read and a write of I elements a token, small beside the down linear's read of
    its I x hidden weights in a decode step (not yet measured on a GPU)."""
    if params.numel() != 4 or params.dtype != torch.float32:
        raise ValueError(f"xielu takes 4 fp32 parameters (alpha_p, alpha_n, beta, eps), got {params.numel()} "
                         f"{params.dtype}")
    x = _contig(x)
    if out is None:
        out = torch.empty_like(x)
    n = x.numel()
    if n:
        _xielu_kernel[(triton.cdiv(n, _TILE_ELEMS),)](x, _contig(params), out, n, BLOCK=_TILE_ELEMS, num_warps=4)
    return out


# One compiled variant whatever the batch: the ids are a slice of a packed buffer whose offset
# (so alignment) changes with the batch, and a first variant compiled under load stalls every
# stream (measured: the only kernel still compiled on a served engine's first requests).
@triton.jit(do_not_specialize=["ids_ptr", "n"])
def _feed_tokens_kernel(ids_ptr, last_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ids = tl.load(ids_ptr + offs, mask=mask, other=0)
    fed = ids < 0
    tok = tl.load(last_ptr + tl.where(fed, -1 - ids, 0), mask=mask & fed, other=0)
    tl.store(ids_ptr + offs, tl.where(fed, tok, ids), mask=mask)


_FEED_BLOCK = 1024  # one block size (one variant): a decode batch fits one program


@register("feed_tokens")
def feed_tokens(input_ids: torch.Tensor, last_ids: torch.Tensor) -> torch.Tensor:
    """One launch for what the reference does in five (see reference.feed_tokens): it runs in
    every decode iteration, inside its CUDA graph."""
    n = input_ids.numel()
    if n:
        _feed_tokens_kernel[(triton.cdiv(n, _FEED_BLOCK),)](input_ids, last_ids, n, BLOCK=_FEED_BLOCK)
    return input_ids


@triton.jit
def _store_split(q_ptr, k_ptr, v_ptr, t, kv_row, heads, cols, y, mask, n_q_heads, n_kv_heads, head_dim):
    """Store a [heads, cols] tile of one token into q / k / v by head slot: slots
    [0, H) go to q, [H, H + Hkv) to k, the rest to v. Three masked stores, so each element
    is written once, to its own contiguous `[rows, heads, D]` output: q's row is the token,
    k's and v's is `kv_row` (the token, or its slot in a paged KV cache)."""
    kv_start = n_q_heads + n_kv_heads
    q_offs = (t * n_q_heads + heads) * head_dim + cols
    k_offs = (kv_row * n_kv_heads + heads - n_q_heads) * head_dim + cols
    v_offs = (kv_row * n_kv_heads + heads - kv_start) * head_dim + cols
    tl.store(q_ptr + q_offs, y.to(q_ptr.dtype.element_ty), mask=mask & (heads < n_q_heads))
    tl.store(k_ptr + k_offs, y.to(k_ptr.dtype.element_ty),
             mask=mask & (heads >= n_q_heads) & (heads < kv_start))
    tl.store(v_ptr + v_offs, y.to(v_ptr.dtype.element_ty), mask=mask & (heads >= kv_start))


@triton.jit
def _head_norm_factors(ss, heads, cols, col_mask, qn_ptr, kn_ptr, n_q_heads, n_kv_heads, head_dim, eps,
                       Q_NORM: tl.constexpr, K_NORM: tl.constexpr, V_NORM: tl.constexpr):
    """(rstd `[BLOCK_H, 1]`, weight `[BLOCK_H, BLOCK_D]` at columns `cols`) of the per-head
    RMSNorm, given each head row's sum of squares `ss`: q heads take q_norm's weight (with
    Q_NORM), k heads k_norm's (with K_NORM), v heads a weight of ones (with V_NORM); every other
    head row gets 1 and 1, unchanged."""
    is_q = heads < n_q_heads
    is_k = (heads >= n_q_heads) & (heads < n_q_heads + n_kv_heads)
    normed = heads < 0  # none
    if Q_NORM:
        normed = normed | is_q
    if K_NORM:
        normed = normed | is_k
    if V_NORM:
        normed = normed | (heads >= n_q_heads + n_kv_heads)
    rstd = tl.where(normed, tl.math.rsqrt(ss / head_dim + eps), 1.0)
    w = cols * 0.0 + 1.0  # ones, [1, BLOCK_D]
    w_q = w
    w_k = w
    if Q_NORM:
        w_q = tl.load(qn_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if K_NORM:
        w_k = tl.load(kn_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    return rstd, tl.where(is_q, w_q, tl.where(is_k, w_k, w))


# Whole-width q/k norms: the elements of a token's row summed per step.
_FULL_NORM_BLOCK = 1024


@triton.jit
def _row_sum_of_squares(row_ptr, start, n, BLOCK: tl.constexpr):
    """The sum of squares of row_ptr[start : start + n], in fp32."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, n, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        v = tl.load(row_ptr + start + offs, mask=offs < n, other=0.0).to(tl.float32)
        acc += v * v
    return tl.sum(acc, axis=0)


@triton.jit
def _full_norm_factors(ss_q, ss_k, heads, cols, col_mask, qn_ptr, kn_ptr, n_q_heads, n_kv_heads, head_dim, eps,
                       ranks, Q_NORM: tl.constexpr, K_NORM: tl.constexpr):
    """_head_norm_factors of whole-width q / k norms (OLMo 2's): every q head takes the token's
    q statistics (`ss_q` over all its q heads, of `ranks` ranks' heads where they are split) and
    q_norm's weight at its own columns (head * D + col), every k head likewise; other head rows
    get 1 and 1."""
    is_q = heads < n_q_heads
    is_k = (heads >= n_q_heads) & (heads < n_q_heads + n_kv_heads)
    is_q_normed = is_q
    is_k_normed = is_k
    if not Q_NORM:
        is_q_normed = heads < 0  # none
    if not K_NORM:
        is_k_normed = heads < 0
    rstd = tl.where(is_q_normed, tl.math.rsqrt(ss_q / (n_q_heads * head_dim * ranks) + eps),
                    tl.where(is_k_normed, tl.math.rsqrt(ss_k / (n_kv_heads * head_dim * ranks) + eps), 1.0))
    w_q = tl.load(qn_ptr + heads * head_dim + cols, mask=is_q_normed & col_mask, other=1.0).to(tl.float32)
    w_k = tl.load(kn_ptr + (heads - n_q_heads) * head_dim + cols, mask=is_k_normed & col_mask,
                  other=1.0).to(tl.float32)
    return rstd, tl.where(is_q_normed, w_q, tl.where(is_k_normed, w_k, 1.0))


@triton.jit
def _split_rotary_kernel(
    src_ptr, bias_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, slot_ptr, qn_ptr, kn_ptr, sq_ptr,
    src_stride_t, src_stride_h, cos_stride_t, sin_stride_t,
    n_q_heads, n_kv_heads, head_dim, half, norm_eps, norm_ranks,
    HAS_BIAS: tl.constexpr, ROTARY: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    TO_SLOTS: tl.constexpr, Q_NORM: tl.constexpr, K_NORM: tl.constexpr, FULL_NORM: tl.constexpr,
    SUMMED: tl.constexpr, FULL_BLOCK: tl.constexpr, PDL: tl.constexpr, V_NORM: tl.constexpr, V_FROM_K: tl.constexpr,
):
    """Bias add + head split (+ rotate-half rotary on q and k) for one token's head slots.

    TurboTransformers' "split + AddBias + Transpose" for the fused QKV GEMM output, with
    Llama's rotary folded in: the GEMM output is read once and q, k, v are written once,
    contiguous. The token's cos/sin row is loaded once and shared by all its heads. With
    n_kv_heads = 0 and no bias it is plain `apply_rotary` on a (possibly strided) q.
    Grid: (tokens, head-slot blocks). ROTARY needs an even head_dim; the halves are
    [0, half) and [half, D) and BLOCK_D covers one half. With TO_SLOTS, k and v go straight
    into a paged KV cache, token t to row `slot_ptr[t]`, instead of to their own tensors.
    Q_NORM / K_NORM: before rotary, each q / k head is RMS-normalised over its D values
    (a program holds whole heads) with weight qn / kn, and rounded to the output dtype.
    FULL_NORM (no bias; heads contiguous in the row): the norms are over each token's whole q
    (k) width instead, weights `[H * D]` (`[Hkv * D]`): every program first sums the squares of
    its token's q and k rows (a few KB, from L2), then normalises its own heads with them. SUMMED
    (FULL_NORM split over `norm_ranks` tensor-parallel ranks): the sums come from sq_ptr `[T, 2]`
    (every rank's, all-reduced) and the widths are norm_ranks times this rank's.
    V_NORM (per-head norms only): each v head RMS-normalised too, without a weight (Gemma 4).
    V_FROM_K (no bias): the source holds q and k only; v head j is k head j as projected, before
    k's norm and rotary (Gemma 4's full layers with attention_k_eq_v).
    PDL: launched early, it waits for the previous kernel before anything else.
    """
    triton_pdl.wait_for_predecessor(PDL)
    t = tl.program_id(0).to(tl.int64)
    if TO_SLOTS:
        kv_row = tl.load(slot_ptr + t).to(tl.int64)
    else:
        kv_row = t
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    n_slots = n_q_heads + 2 * n_kv_heads
    cols = tl.arange(0, BLOCK_D)[None, :]
    src_heads = heads
    if V_FROM_K:
        src_heads = tl.where(heads >= n_q_heads + n_kv_heads, heads - n_kv_heads, heads)
    src = src_ptr + t * src_stride_t + src_heads * src_stride_h
    ss_q = 0.0
    ss_k = 0.0
    if SUMMED:
        ss_q = tl.load(sq_ptr + 2 * t)
        ss_k = tl.load(sq_ptr + 2 * t + 1)
    elif FULL_NORM:
        row = src_ptr + t * src_stride_t
        if Q_NORM:
            ss_q = _row_sum_of_squares(row, 0, n_q_heads * head_dim, FULL_BLOCK)
        if K_NORM:
            ss_k = _row_sum_of_squares(row, n_q_heads * head_dim, n_kv_heads * head_dim, FULL_BLOCK)
    if ROTARY:
        col_mask = cols < half
        mask = (heads < n_slots) & col_mask
        x1 = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + half + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            # The unfused path materialises qkv + bias in the output dtype before rotating;
            # round the same way so that the fused kernel gives the same numbers.
            x1 += tl.load(bias_ptr + heads * head_dim + cols, mask=mask, other=0.0).to(tl.float32)
            x2 += tl.load(bias_ptr + heads * head_dim + half + cols, mask=mask, other=0.0).to(tl.float32)
            x1 = x1.to(q_ptr.dtype.element_ty).to(tl.float32)
            x2 = x2.to(q_ptr.dtype.element_ty).to(tl.float32)
        if FULL_NORM:
            rstd, w1 = _full_norm_factors(ss_q, ss_k, heads, cols, col_mask, qn_ptr, kn_ptr, n_q_heads, n_kv_heads,
                                          head_dim, norm_eps, norm_ranks, Q_NORM, K_NORM)
            _, w2 = _full_norm_factors(ss_q, ss_k, heads, half + cols, col_mask, qn_ptr, kn_ptr, n_q_heads,
                                       n_kv_heads, head_dim, norm_eps, norm_ranks, Q_NORM, K_NORM)
        elif Q_NORM or K_NORM or V_NORM:  # both halves of every head are here: its statistics
            ss = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1))[:, None]
            rstd, w1 = _head_norm_factors(ss, heads, cols, col_mask, qn_ptr, kn_ptr, n_q_heads, n_kv_heads,
                                          head_dim, norm_eps, Q_NORM, K_NORM, V_NORM)
            _, w2 = _head_norm_factors(ss, heads, half + cols, col_mask, qn_ptr, kn_ptr, n_q_heads, n_kv_heads,
                                       head_dim, norm_eps, Q_NORM, K_NORM, V_NORM)
        if FULL_NORM or Q_NORM or K_NORM or V_NORM:
            # rounded to the activation dtype, as the unfused norm stores it before rotary
            x1 = (x1 * rstd * w1).to(q_ptr.dtype.element_ty).to(tl.float32)
            x2 = (x2 * rstd * w2).to(q_ptr.dtype.element_ty).to(tl.float32)
        c = tl.load(cos_ptr + t * cos_stride_t + cols, mask=col_mask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + t * sin_stride_t + cols, mask=col_mask, other=0.0).to(tl.float32)
        rotate = heads < n_q_heads + n_kv_heads  # v passes through un-rotated
        y1 = tl.where(rotate, x1 * c - x2 * s, x1)
        y2 = tl.where(rotate, x2 * c + x1 * s, x2)
        _store_split(q_ptr, k_ptr, v_ptr, t, kv_row, heads, cols, y1, mask, n_q_heads, n_kv_heads, head_dim)
        _store_split(q_ptr, k_ptr, v_ptr, t, kv_row, heads, half + cols, y2, mask, n_q_heads, n_kv_heads, head_dim)
    else:
        mask = (heads < n_slots) & (cols < head_dim)
        x = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(bias_ptr + heads * head_dim + cols, mask=mask, other=0.0).to(tl.float32)
        if FULL_NORM:
            rstd, w = _full_norm_factors(ss_q, ss_k, heads, cols, cols < head_dim, qn_ptr, kn_ptr, n_q_heads,
                                         n_kv_heads, head_dim, norm_eps, norm_ranks, Q_NORM, K_NORM)
            x = x * rstd * w
        elif Q_NORM or K_NORM or V_NORM:
            if HAS_BIAS:  # the norm sees qkv + bias as the unfused path stores it
                x = x.to(q_ptr.dtype.element_ty).to(tl.float32)
            rstd, w = _head_norm_factors(tl.sum(x * x, axis=1)[:, None], heads, cols, cols < head_dim, qn_ptr,
                                         kn_ptr, n_q_heads, n_kv_heads, head_dim, norm_eps, Q_NORM, K_NORM, V_NORM)
            x = x * rstd * w
        _store_split(q_ptr, k_ptr, v_ptr, t, kv_row, heads, cols, x, mask, n_q_heads, n_kv_heads, head_dim)


def _launch_split_rotary(src, src_stride_t, src_stride_h, bias, q, k, v, cos, sin,
                         n_q_heads, n_kv_heads, head_dim, slots=None, q_norm=None, k_norm=None, norm_eps=1e-6,
                         full_norm=False, norm_squares=None, norm_ranks=1, v_norm=False, v_from_k=False):
    """Launch _split_rotary_kernel over all tokens; cos/sin None means no rotary; `slots`
    (int64 `[T]`) sends k and v to those rows of flattened cache tensors; q_norm / k_norm
    (`[D]`; with `full_norm` the whole width, `[H * D]` / `[Hkv * D]`) RMS-normalise q / k
    heads before rotary; `norm_squares` (fp32 `[T, 2]`) and `norm_ranks`: whole-width norms split
    over ranks (reference.qkv_to_cache); `v_norm`, `v_from_k`: as there."""
    n_tokens = q.shape[0]
    n_slots = n_q_heads + 2 * n_kv_heads
    if n_tokens == 0 or head_dim == 0 or n_slots == 0:
        return
    rotary = cos is not None
    if rotary:
        if head_dim % 2:
            raise ValueError(f"rotary needs an even head_dim, got {head_dim}")
        # Only the last dim must be contiguous: rows are addressed by their own stride.
        cos = cos if cos.stride(-1) == 1 else cos.contiguous()
        sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    block_d = triton.next_power_of_2(head_dim // 2 if rotary else head_dim)
    elems_per_head = block_d * (2 if rotary else 1)
    block_h = max(1, min(_TILE_ELEMS // elems_per_head, triton.next_power_of_2(n_slots)))
    num_warps = max(1, min(8, block_h * elems_per_head // 1024))
    grid = (n_tokens, triton.cdiv(n_slots, block_h))
    pdl = n_tokens >= SPLIT_ROTARY_PDL_MIN_TOKENS and triton_pdl.enabled(src.device)
    _split_rotary_kernel[grid](
        src, bias if bias is not None else src, q, k, v,
        cos if rotary else src, sin if rotary else src, slots if slots is not None else src,
        q_norm if q_norm is not None else src, k_norm if k_norm is not None else src,
        norm_squares if norm_squares is not None else src,
        src_stride_t, src_stride_h,
        cos.stride(0) if rotary else 0, sin.stride(0) if rotary else 0,
        n_q_heads, n_kv_heads, head_dim, head_dim // 2, float(norm_eps), int(norm_ranks),
        HAS_BIAS=bias is not None, ROTARY=rotary, BLOCK_H=block_h, BLOCK_D=block_d,
        TO_SLOTS=slots is not None, Q_NORM=q_norm is not None, K_NORM=k_norm is not None, FULL_NORM=full_norm,
        SUMMED=norm_squares is not None, FULL_BLOCK=_FULL_NORM_BLOCK, PDL=pdl, V_NORM=v_norm, V_FROM_K=v_from_k,
        num_warps=num_warps,
        **triton_pdl.launch_options(pdl),
    )


@register("apply_rotary")
def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding on `[T, H, D]`; see reference.apply_rotary. x may be a
    strided view over tokens and heads (e.g. a slice of a QKV buffer); its last dim is made
    contiguous if it is not."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_split_rotary(x, x.stride(0), x.stride(1), None, out, out, out, cos, sin,
                         x.shape[1], 0, x.shape[2])
    return out


def _split_outputs(qkv, bias, num_heads, num_kv_heads, head_dim):
    """Validated contiguous qkv (+ bias) and empty q, k, v in the reference's dtype (qkv + bias
    promotes, e.g. fp16 + fp32 bias gives fp32)."""
    if qkv.dim() != 2 or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(
            f"qkv must be [tokens, (H + 2*Hkv) * D] = [T, {(num_heads + 2 * num_kv_heads) * head_dim}], "
            f"got {list(qkv.shape)}"
        )
    qkv = qkv if qkv.stride(-1) == 1 else qkv.contiguous()  # rows use qkv.stride(0)
    dtype = qkv.dtype if bias is None else torch.promote_types(qkv.dtype, bias.dtype)
    t = qkv.shape[0]
    q = torch.empty((t, num_heads, head_dim), dtype=dtype, device=qkv.device)
    k = torch.empty((t, num_kv_heads, head_dim), dtype=dtype, device=qkv.device)
    v = torch.empty((t, num_kv_heads, head_dim), dtype=dtype, device=qkv.device)
    return qkv, (_contig(bias) if bias is not None else None), q, k, v


@register("qkv_split")
def qkv_split(
    qkv: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bias add and split of the fused QKV output into contiguous q, k, v; see reference.qkv_split."""
    qkv, bias, q, k, v = _split_outputs(qkv, bias, num_heads, num_kv_heads, head_dim)
    _launch_split_rotary(qkv, qkv.stride(0), head_dim, bias, q, k, v, None, None,
                         num_heads, num_kv_heads, head_dim)
    return q, k, v


@register("qkv_split_rotary")
def qkv_split_rotary(
    qkv: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv_split + rotary on q and k in one kernel; see reference.qkv_split_rotary."""
    qkv, bias, q, k, v = _split_outputs(qkv, bias, num_heads, num_kv_heads, head_dim)
    _launch_split_rotary(qkv, qkv.stride(0), head_dim, bias, q, k, v, cos, sin,
                         num_heads, num_kv_heads, head_dim)
    return q, k, v


@register("qkv_to_cache")
def qkv_to_cache(
    qkv: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_squares: torch.Tensor | None = None,
    norm_ranks: int = 1,
    v_norm: bool = False,
    v_from_k: bool = False,
) -> torch.Tensor:
    """Bias, split, the q/k (and v) head norms, rotary and the paged-cache write in one pass; see
    reference.qkv_to_cache. The norm weights may be of any float dtype (read as fp32)."""
    if qkv.dim() != 2 or qkv.shape[1] != (num_heads + (1 if v_from_k else 2) * num_kv_heads) * head_dim:
        raise ValueError(f"qkv must be [tokens, (H + {'' if v_from_k else '2*'}Hkv) * D], got {list(qkv.shape)}")
    if v_from_k and bias is not None:
        raise ValueError("v_from_k (v is k's projection) goes without a QKV bias")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k_cache.shape[-2:] != (num_kv_heads, head_dim):
        raise ValueError("k/v caches must be contiguous [blocks, block_size, Hkv, D]")
    if k_cache.dtype != qkv.dtype or (bias is not None and bias.dtype != qkv.dtype):
        raise ValueError("qkv, bias and the caches must share one dtype")
    full_norm = norm_squares is not None or any(t is not None and t.numel() != head_dim for t in (q_norm, k_norm))
    if norm_squares is not None and (norm_squares.shape != (qkv.shape[0], 2) or norm_squares.dtype != torch.float32
                                     or not norm_squares.is_contiguous()):
        raise ValueError(f"norm_squares must be contiguous fp32 [tokens, 2], got {norm_squares.dtype} "
                         f"{list(norm_squares.shape)}")
    for name, t, heads in (("q_norm", q_norm, num_heads), ("k_norm", k_norm, num_kv_heads)):
        if t is not None and t.shape != ((heads * head_dim,) if full_norm else (head_dim,)):
            raise ValueError(f"{name} must be [head_dim] = [{head_dim}], or both norms the whole width "
                             f"([{num_heads} * {head_dim}], [{num_kv_heads} * {head_dim}]), got {list(t.shape)}")
    if full_norm and bias is not None:
        raise ValueError("whole-width q/k norms after a QKV bias are not supported")
    if full_norm and v_norm:
        raise ValueError("v_norm goes with per-head q/k norms, not whole-width ones")
    qkv = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    q = torch.empty((qkv.shape[0], num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    _launch_split_rotary(qkv, qkv.stride(0), head_dim, _contig(bias) if bias is not None else None, q, k_cache,
                         v_cache, cos, sin, num_heads, num_kv_heads, head_dim, slots=slot_mapping.contiguous(),
                         q_norm=None if q_norm is None else _contig(q_norm),
                         k_norm=None if k_norm is None else _contig(k_norm), norm_eps=norm_eps,
                         full_norm=full_norm, norm_squares=norm_squares, norm_ranks=norm_ranks, v_norm=v_norm,
                         v_from_k=v_from_k)
    return q


@triton.jit
def _qk_squares_kernel(qkv_ptr, out_ptr, stride_t, q_width, k_width, BLOCK: tl.constexpr):
    """Token t's sums of squares of its q columns and of its k columns -> out[t, 0:2] (fp32). Grid: (T,)."""
    row = qkv_ptr + tl.program_id(0).to(tl.int64) * stride_t
    out = out_ptr + tl.program_id(0).to(tl.int64) * 2
    tl.store(out, _row_sum_of_squares(row, 0, q_width, BLOCK))
    tl.store(out + 1, _row_sum_of_squares(row, q_width, k_width, BLOCK))


@register("qk_squares")
def qk_squares(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """See reference.qk_squares: one program per token."""
    assert qkv.dim() == 2 and qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim, \
        f"qkv must be [tokens, (H + 2*Hkv) * D], got {list(qkv.shape)}"
    qkv = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    out = torch.empty((qkv.shape[0], 2), dtype=torch.float32, device=qkv.device)
    if qkv.shape[0]:
        _qk_squares_kernel[(qkv.shape[0],)](qkv, out, qkv.stride(0), num_heads * head_dim, num_kv_heads * head_dim,
                                            BLOCK=_FULL_NORM_BLOCK, num_warps=4)
    return out
