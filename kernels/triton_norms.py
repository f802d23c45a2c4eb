"""Triton-language row-reduction kernels: fused LayerNorm, RMSNorm and softmax.

These are the "reduction" non-GEMM kernels of TurboTransformers (seeds.md §1.1.2-1.1.3),
written as batch reductions:

* Several short rows are reduced by one program (a `[ROWS, BLOCK]` tile), so one launch
  covers many rows with few programs and each program's reductions overlap. ROWS is chosen
  from the row length so that a tile holds about `_TILE_ELEMS` elements.
* LayerNorm statistics come from ONE pass: Σd and Σd² are accumulated together in fp32 and
  Var = E[d²] − E[d]², clamped at 0. To blunt the catastrophic cancellation of that formula
  when |mean| >> std, d is the input shifted by the row's first element (Var is
  shift-invariant), which keeps E[d] near 0 at the cost of one extra scalar load per row.
* A row that fits in `_MAX_ONE_TILE` elements (`_MAX_ONE_TILE_RMS` for RMSNorm) stays in
  registers between the statistics and the normalisation; longer rows (e.g. LayerNorm at
  hidden 12288) are walked in `_LOOP_BLOCK` chunks twice (statistics, then normalise), the
  second pass mostly hitting L2. Softmax's long-row path is an online softmax.
* The LayerNorm can also write its output quantised per token (E4M3 + fp32 row scales, an
  fp8.Fp8Activation, `fp8_out`) from the same registers: the next FP8 linear's operand (BERT's
  QKV and FFN up projections), which then skips its own quantisation pass over the rows.

Every wrapper has the signature and result of its counterpart in `reference.py`, computes in
fp32 and writes the input dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels import fp8, triton_fp8, triton_pdl
from tritonformer.kernels.dispatch import register

# Elements per program tile for short rows (ROWS = _TILE_ELEMS // BLOCK). Measured on an
# H100 with fp16 and 8192 rows: ~2K-element tiles at 4 warps beat 4K tiles at 8 warps for
# hidden 768/1024 (~1.9 vs ~1.7 TB/s for LayerNorm), and longer rows want 16 warps.
_TILE_ELEMS = 2048
# Longest power-of-2 row kept entirely in registers; longer rows are processed in chunks.
# Measured on an H100 at hidden 12288 (fp16): LayerNorm streams best in 4096-wide chunks
# (2.8 TB/s vs 2.5 one-tile), while RMSNorm with a residual is much better one-tile (3.0 vs
# 2.2 TB/s: its chunked form writes the sum between the two passes over x and residual).
_MAX_ONE_TILE = 8192
_MAX_ONE_TILE_RMS = 16384
_LOOP_BLOCK = 4096
_MAX_ROWS = 32


def _row_launch(n_rows: int, n_cols: int, max_one_tile: int | None = None) -> tuple[int, int, bool, int]:
    """(ROWS per program, BLOCK, ONE_TILE, num_warps) for a row reduction over n_cols."""
    block = triton.next_power_of_2(n_cols)
    one_tile = block <= (max_one_tile or _MAX_ONE_TILE)
    if not one_tile:
        block = _LOOP_BLOCK
    rows = max(1, min(_MAX_ROWS, _TILE_ELEMS // block)) if one_tile else 1
    # No point in a tile taller than the whole batch (e.g. decode with a handful of rows).
    rows = min(rows, triton.next_power_of_2(max(n_rows, 1)))
    # Short tiles: 4 warps (fewer for tiny rows). Long rows/chunks (>= 4096): 16 warps, so
    # each thread holds only 8-16 fp32 values and the cross-warp reduction is short.
    tile = rows * block
    num_warps = max(1, min(4, tile // 256)) if tile <= 2048 else 16
    return rows, block, one_tile, num_warps


def _contig(t: torch.Tensor) -> torch.Tensor:
    """t itself when contiguous (the usual case), else a contiguous copy. The kernels index
    rows as `row * n_cols`, so they only need a contiguous buffer, not a 2-D view; wrappers
    keep their torch calls few because the host-side cost per op is comparable to a small
    kernel's run time."""
    return t if t.is_contiguous() else t.contiguous()


@triton.jit
def _load_sum(x_ptr, bias_ptr, res_ptr, row_start, res_start, cols, mask, HAS_BIAS: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr):
    """x + bias + residual as fp32 for a tile; row_start (x's rows) and res_start (the
    residual's, the same rows unless gathered) are [ROWS, 1] (int64), cols [1, B]."""
    h = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        h += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        h += tl.load(res_ptr + res_start + cols, mask=mask, other=0.0).to(tl.float32)
    return h


@triton.jit
def _store_fp8_rows(y, q_ptrs, scale_ptrs, mask, row_ok, MIN_AMAX: tl.constexpr, FP8_MAX: tl.constexpr):
    """A tile of rows y `[ROWS, BLOCK]` (fp32, the values as stored) quantised per row as
    reference.quantize_rows_fp8 does: E4M3 values at q_ptrs, scale = max(amax, MIN_AMAX) /
    FP8_MAX at scale_ptrs `[ROWS]`."""
    scale = tl.maximum(tl.max(tl.where(mask, tl.abs(y), 0.0), axis=1), MIN_AMAX) / FP8_MAX
    q = tl.clamp(y / scale[:, None], -FP8_MAX, FP8_MAX)
    tl.store(q_ptrs, q.to(q_ptrs.dtype.element_ty), mask=mask)
    tl.store(scale_ptrs, scale, mask=row_ok)


@triton.jit(do_not_specialize=["n_rows"])  # one compiled kernel whatever the row count
def _add_bias_residual_layer_norm_kernel(
    x_ptr, bias_ptr, res_ptr, w_ptr, b_ptr, out_ptr, sum_ptr, x_rows_ptr, res_rows_ptr, q_ptr, q_scale_ptr,
    n_rows, n_cols, eps,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, WRITE_SUM: tl.constexpr, GATHER: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, ONE_TILE: tl.constexpr, PDL: tl.constexpr,
    QUANT: tl.constexpr, MIN_AMAX: tl.constexpr, FP8_MAX: tl.constexpr,
):
    """out = LayerNorm(x + bias + residual) * w + b for ROWS rows.

    Fuses the bias add and residual add of the preceding GEMM with the LayerNorm (BERT's
    "AddBias + LayerNorm"), so the sum never round-trips through memory. Statistics are one
    shifted pass: Σd, Σd² with d = h − h[row, 0] (see the module docstring). WRITE_SUM also
    stores h = x + bias + residual (a pre-norm decoder's residual stream, GPT-2).
    GATHER: x and residual are tables, row r reads x row x_rows[r] and residual row
    res_rows[r] (token and position embeddings: the embedding layer in one launch).
    QUANT (ONE_TILE only): the output rows as stored are also quantised per token, E4M3 values
    at q_ptr (out's layout) and fp32 row scales at q_scale_ptr (the next FP8 linear's operand).
    """
    triton_pdl.wait_for_predecessor(PDL)
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_mask = rows[:, None] < n_rows
    row_start = rows.to(tl.int64)[:, None] * n_cols  # int64: rows * 12288 can pass 2**31
    out_start = row_start
    res_start = row_start
    if GATHER:
        in_rows = rows < n_rows
        row_start = tl.load(x_rows_ptr + rows, mask=in_rows, other=0).to(tl.int64)[:, None] * n_cols
        if HAS_RESIDUAL:
            res_start = tl.load(res_rows_ptr + rows, mask=in_rows, other=0).to(tl.int64)[:, None] * n_cols

    # Shift: the row's first element (any value near the mean would do).
    shift = _load_sum(x_ptr, bias_ptr, res_ptr, row_start, res_start, tl.zeros([1, 1], tl.int32), row_mask,
                      HAS_BIAS, HAS_RESIDUAL)

    if ONE_TILE:
        cols = tl.arange(0, BLOCK)[None, :]
        mask = row_mask & (cols < n_cols)
        h = _load_sum(x_ptr, bias_ptr, res_ptr, row_start, res_start, cols, mask, HAS_BIAS, HAS_RESIDUAL)
        if WRITE_SUM:
            tl.store(sum_ptr + out_start + cols, h.to(sum_ptr.dtype.element_ty), mask=mask)
        d = tl.where(mask, h - shift, 0.0)
        mean_d = tl.sum(d, axis=1) / n_cols
        var = tl.maximum(tl.sum(d * d, axis=1) / n_cols - mean_d * mean_d, 0.0)
        rstd = tl.math.rsqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = (d - mean_d[:, None]) * rstd[:, None] * w + b
        tl.store(out_ptr + out_start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
        if QUANT:
            _store_fp8_rows(y.to(out_ptr.dtype.element_ty).to(tl.float32), q_ptr + out_start + cols,
                            q_scale_ptr + rows, mask, rows < n_rows, MIN_AMAX, FP8_MAX)
    else:
        # Pass 1: lane-wise partial sums, reduced across the tile only once at the end.
        acc1 = tl.zeros([ROWS, BLOCK], tl.float32)
        acc2 = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            mask = row_mask & (cols < n_cols)
            h = _load_sum(x_ptr, bias_ptr, res_ptr, row_start, res_start, cols, mask, HAS_BIAS, HAS_RESIDUAL)
            if WRITE_SUM:
                tl.store(sum_ptr + out_start + cols, h.to(sum_ptr.dtype.element_ty), mask=mask)
            d = tl.where(mask, h - shift, 0.0)
            acc1 += d
            acc2 += d * d
        mean_d = tl.sum(acc1, axis=1) / n_cols
        var = tl.maximum(tl.sum(acc2, axis=1) / n_cols - mean_d * mean_d, 0.0)
        rstd = tl.math.rsqrt(var + eps)
        # Pass 2: re-read (mostly from L2) and normalise.
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            mask = row_mask & (cols < n_cols)
            h = _load_sum(x_ptr, bias_ptr, res_ptr, row_start, res_start, cols, mask, HAS_BIAS, HAS_RESIDUAL)
            w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            # (h − shift) − mean_d, not h − (shift + mean_d): the latter rounds the mean at
            # the magnitude of h and loses what the shift saved.
            y = ((h - shift) - mean_d[:, None]) * rstd[:, None] * w + b
            tl.store(out_ptr + out_start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@register("add_bias_residual_layer_norm")
def add_bias_residual_layer_norm(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    sum_out: torch.Tensor | None = None,
    fp8_out: fp8.Fp8Activation | None = None,
) -> torch.Tensor:
    """LayerNorm(x + bias + residual), one fused kernel; see reference.add_bias_residual_layer_norm.
    `fp8_out` is filled by the same kernel where a row fits one tile, else by the quantisation
    kernel after it."""
    x = _contig(x)
    if out is None:
        out = torch.empty_like(x)
    return _launch_add_norm(x, bias, residual, weight, ln_bias, eps, out, sum_out, None, None, fp8_out)


@register("embedding_layer_norm")
def embedding_layer_norm(
    ids: torch.Tensor,
    table: torch.Tensor,
    positions: torch.Tensor,
    position_table: torch.Tensor,
    bias: torch.Tensor | None,
    weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    sum_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """LayerNorm(table[ids] + bias + position_table[positions]) in one launch: the rows are
    gathered inside the LayerNorm kernel; see reference.embedding_layer_norm."""
    assert ids.dim() == 1 and positions.shape == ids.shape, "ids and positions must be [T] of one length"
    assert table.dim() == 2 and position_table.dim() == 2 and table.shape[1] == position_table.shape[1], (
        "table and position_table must be [rows, hidden] of one hidden size"
    )
    if out is None:
        out = torch.empty((ids.shape[0], table.shape[1]), dtype=table.dtype, device=table.device)
    return _launch_add_norm(_contig(table), bias, position_table, weight, ln_bias, eps, out, sum_out,
                            _contig(ids), _contig(positions))


def _launch_add_norm(x, bias, residual, weight, ln_bias, eps, out, sum_out, x_rows, res_rows, fp8_out=None):
    """Launch _add_bias_residual_layer_norm_kernel over out's rows; with x_rows/res_rows, x and
    residual are tables whose rows those index tensors pick; `fp8_out` (an fp8.Fp8Activation
    shaped like out) receives out quantised per token."""
    assert out.is_contiguous() and (x_rows is not None or out.shape == x.shape), (
        "out must be a contiguous tensor shaped like x"
    )
    assert sum_out is None or (sum_out.shape == out.shape and sum_out.is_contiguous()), (
        "sum_out must be a contiguous tensor shaped like x"
    )
    assert fp8_out is None or (fp8_out.shape == out.shape and fp8_out.q.is_contiguous()), (
        "fp8_out must be an Fp8Activation shaped like the output, contiguous"
    )
    if out.numel() == 0:
        return out
    n_cols = out.shape[-1]
    n_rows = out.numel() // n_cols
    rows, block, one_tile, num_warps = _row_launch(n_rows, n_cols)
    pdl = triton_pdl.enabled(out.device)
    quant = fp8_out is not None and one_tile
    _add_bias_residual_layer_norm_kernel[(triton.cdiv(n_rows, rows),)](
        x,
        _contig(bias) if bias is not None else x,  # dummy pointers when absent, never read
        _contig(residual) if residual is not None else x,
        _contig(weight), _contig(ln_bias), out, sum_out if sum_out is not None else out,
        x_rows if x_rows is not None else x, res_rows if res_rows is not None else x,
        fp8_out.q if quant else out, fp8_out.scale if quant else out,
        n_rows, n_cols, float(eps),
        HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, WRITE_SUM=sum_out is not None,
        GATHER=x_rows is not None, ROWS=rows, BLOCK=block, ONE_TILE=one_tile, PDL=pdl,
        QUANT=quant, MIN_AMAX=fp8.MIN_AMAX, FP8_MAX=fp8.E4M3_MAX, num_warps=num_warps,
        **triton_pdl.launch_options(pdl),
    )
    if fp8_out is not None and not quant:  # rows past one tile: the quantisation's own pass
        q, scale = triton_fp8.quantize_rows_fp8(out.view(n_rows, n_cols))
        fp8_out.q.copy_(q)
        fp8_out.scale.copy_(scale)
    return out


@triton.jit
def _scaled_rows(h, scale, dtype, SCALE: tl.constexpr):
    """SCALE: h * scale rounded to `dtype` (Gemma's scaled embeddings, as torch multiplies two
    tensors of that dtype), back in fp32."""
    if SCALE:
        h = (h * scale).to(dtype).to(tl.float32)
    return h


@triton.jit(do_not_specialize=["n_rows"])  # one compiled kernel whatever the row count
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, x_rows_ptr,
    n_rows, n_cols, eps, scale,
    HAS_RESIDUAL: tl.constexpr, GATHER: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    ONE_TILE: tl.constexpr, PDL: tl.constexpr, SCALE: tl.constexpr,
):
    """out = (x + residual) * rsqrt(mean((x + residual)²) + eps) * w; also writes x + residual.

    Fuses Llama's residual add with the RMSNorm that follows it: the sum is formed once in
    fp32, normalised from fp32 (not from its rounded copy), and written out as the next
    layer's residual only when there is a residual (otherwise it is x itself).
    GATHER (no residual): x is a table and row r reads its row x_rows[r], which is also
    written out as the "sum" (the token embeddings, the first residual, in the same launch);
    SCALE (with GATHER): that row times `scale` (already in the table's dtype), rounded to
    the table's dtype, is the row normalised and written.
    """
    triton_pdl.wait_for_predecessor(PDL)
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_mask = rows[:, None] < n_rows
    row_start = rows.to(tl.int64)[:, None] * n_cols
    out_start = row_start
    if GATHER:
        row_start = tl.load(x_rows_ptr + rows, mask=rows < n_rows, other=0).to(tl.int64)[:, None] * n_cols

    if ONE_TILE:
        cols = tl.arange(0, BLOCK)[None, :]
        mask = row_mask & (cols < n_cols)
        h = _load_sum(x_ptr, x_ptr, res_ptr, row_start, row_start, cols, mask, False, HAS_RESIDUAL)
        h = _scaled_rows(h, scale, sum_ptr.dtype.element_ty, SCALE)
        if HAS_RESIDUAL or GATHER:
            tl.store(sum_ptr + out_start + cols, h.to(sum_ptr.dtype.element_ty), mask=mask)
        rstd = tl.math.rsqrt(tl.sum(h * h, axis=1) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = h * rstd[:, None] * w
        tl.store(out_ptr + out_start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            mask = row_mask & (cols < n_cols)
            h = _load_sum(x_ptr, x_ptr, res_ptr, row_start, row_start, cols, mask, False, HAS_RESIDUAL)
            h = _scaled_rows(h, scale, sum_ptr.dtype.element_ty, SCALE)
            if HAS_RESIDUAL or GATHER:
                tl.store(sum_ptr + out_start + cols, h.to(sum_ptr.dtype.element_ty), mask=mask)
            acc += h * h
        rstd = tl.math.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            mask = row_mask & (cols < n_cols)
            # Re-form the fp32 sum rather than reading back its rounded copy.
            h = _load_sum(x_ptr, x_ptr, res_ptr, row_start, row_start, cols, mask, False, HAS_RESIDUAL)
            h = _scaled_rows(h, scale, sum_ptr.dtype.element_ty, SCALE)
            w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            y = h * rstd[:, None] * w
            tl.store(out_ptr + out_start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@register("rms_norm")
def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    sum_out: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual), one kernel; see reference.rms_norm."""
    xc = _contig(x)
    for name, given in (("sum_out", sum_out), ("out", out)):
        assert given is None or (given.shape == xc.shape and given.is_contiguous()), \
            f"{name} must be contiguous, shaped like x"
    out = torch.empty_like(xc) if out is None else out
    if residual is None:
        _launch_rms_norm(xc, None, weight, eps, out, None, None)
        # Without a residual the "sum" is x itself, exactly what the reference returns.
        return out, (x if sum_out is None else sum_out.copy_(x))
    summed = sum_out if sum_out is not None else torch.empty_like(xc)
    _launch_rms_norm(xc, residual, weight, eps, out, summed, None)
    return out, summed


@triton.jit(do_not_specialize=["n_rows"])
def _segment_rms_norms_kernel(x_ptr, w_ptr, out_ptr, n_rows, stride_x, eps, S0: tl.constexpr, S1: tl.constexpr,
                              S2: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    """Segment pid(1) of row pid(0), normalised. The outputs lie end to end in out: segment j's `[n_rows, S_j]`
    from n_rows * (S_0 + .. + S_{j-1}) on, each contiguous."""
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    start = tl.where(seg == 0, 0, tl.where(seg == 1, S0, S0 + S1))
    size = tl.where(seg == 0, S0, tl.where(seg == 1, S1, S2))
    cols = tl.arange(0, BLOCK)
    mask = cols < size
    h = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (h * tl.math.rsqrt(tl.sum(h * h, axis=0) / size + eps)).to(out_ptr.dtype.element_ty)
    if HAS_WEIGHT:
        normed = (normed.to(tl.float32) * tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32))
    tl.store(out_ptr + n_rows * start + row * size + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)


@register("segment_rms_norms")
def segment_rms_norms(x: torch.Tensor, sizes: tuple[int, ...], eps: float,
                      weight: torch.Tensor | None = None) -> list[torch.Tensor]:
    """reference.segment_rms_norms in one launch (up to three segments: Mamba-1's dt, B and C, which took
    ~18 PyTorch launches a layer); x's rows may be strided. The segments' outputs share one allocation."""
    assert 1 <= len(sizes) <= 3 and x.dim() == 2 and x.stride(1) == 1 and x.shape[1] == sum(sizes)
    rows = x.shape[0]
    flat = torch.empty(rows * x.shape[1], dtype=x.dtype, device=x.device)
    parts, start = [], 0
    for size in sizes:
        parts.append(flat[rows * start : rows * (start + size)].view(rows, size))
        start += size
    if rows:
        s = tuple(sizes) + (0,) * (3 - len(sizes))
        _segment_rms_norms_kernel[(rows, len(sizes))](
            x, _contig(weight) if weight is not None else x, flat, rows, x.stride(0), float(eps), S0=s[0], S1=s[1],
            S2=s[2], HAS_WEIGHT=weight is not None, BLOCK=triton.next_power_of_2(max(sizes)), num_warps=4)
    return parts


@register("embedding_rms_norm")
def embedding_rms_norm(
    ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(rows), rows) with rows = table[ids] (times `scale`, rounded as Hugging Face
    rounds it) in one launch; see reference.embedding_rms_norm."""
    assert ids.dim() == 1 and table.dim() == 2, "ids must be [T] and table [rows, hidden]"
    out = torch.empty((ids.shape[0], table.shape[1]), dtype=table.dtype, device=table.device)
    rows = torch.empty_like(out)
    # the scale as a tensor of the table's dtype holds it (Gemma's sqrt(3072) is 55.5 in bf16)
    scale = None if scale is None else float(torch.tensor(scale, dtype=table.dtype))
    _launch_rms_norm(_contig(table), None, weight, eps, out, rows, _contig(ids), scale)
    return out, rows


@triton.jit(do_not_specialize=["n_ids", "start"])  # one compiled kernel whatever the batch and the rank
def _embedding_part_kernel(ids_ptr, table_ptr, out_ptr, n_ids, n_rows, n_cols, start, scale,
                           BLOCK: tl.constexpr, PDL: tl.constexpr, SCALE: tl.constexpr):
    """out[t, cols] = table[ids[t] - start, cols] (times scale) where this table holds that id,
    zeros otherwise. Grid: (ids, column tiles)."""
    triton_pdl.wait_for_predecessor(PDL)
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    local = tl.load(ids_ptr + t).to(tl.int64) - start
    held = (local >= 0) & (local < n_rows)
    mask = col_ok & (tl.zeros([BLOCK], tl.int32) + held.to(tl.int32) != 0)  # (a scalar mask broadcast)
    h = tl.load(table_ptr + tl.where(held, local, 0) * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    h = _scaled_rows(h, scale, out_ptr.dtype.element_ty, SCALE)
    tl.store(out_ptr + t.to(tl.int64) * n_cols + cols, h.to(out_ptr.dtype.element_ty), mask=col_ok)


@register("embedding_part")
def embedding_part(ids: torch.Tensor, table: torch.Tensor, start: int, scale: float | None = None) -> torch.Tensor:
    """One rank's share of a vocabulary-parallel embedding in one launch (the reference takes
    six); see reference.embedding_part."""
    assert ids.dim() == 1 and table.dim() == 2, "ids must be [T] and table [rows, hidden]"
    table = _contig(table)
    n_rows, n_cols = table.shape
    out = torch.empty((ids.shape[0], n_cols), dtype=table.dtype, device=table.device)
    if out.numel() == 0:
        return out
    scale = None if scale is None else float(torch.tensor(scale, dtype=table.dtype))
    block = min(triton.next_power_of_2(n_cols), 4096)
    pdl = triton_pdl.enabled(out.device)
    _embedding_part_kernel[(ids.shape[0], triton.cdiv(n_cols, block))](
        _contig(ids), table, out, ids.shape[0], n_rows, n_cols, int(start), 1.0 if scale is None else scale,
        BLOCK=block, PDL=pdl, SCALE=scale is not None, num_warps=4, **triton_pdl.launch_options(pdl),
    )
    return out


def _launch_rms_norm(x, residual, weight, eps, out, summed, x_rows, scale=None):
    """Launch _rms_norm_kernel over out's rows; with x_rows, x is a table whose rows they pick
    (times `scale` when given)."""
    if out.numel() == 0:
        return
    n_cols = out.shape[-1]
    n_rows = out.numel() // n_cols
    rows, block, one_tile, num_warps = _row_launch(n_rows, n_cols, _MAX_ONE_TILE_RMS)
    pdl = triton_pdl.enabled(out.device)
    _rms_norm_kernel[(triton.cdiv(n_rows, rows),)](
        x, _contig(residual) if residual is not None else x, _contig(weight), out,
        summed if summed is not None else out,  # dummy pointer, never written
        x_rows if x_rows is not None else x,
        n_rows, n_cols, float(eps), 1.0 if scale is None else scale,
        HAS_RESIDUAL=residual is not None, GATHER=x_rows is not None, ROWS=rows, BLOCK=block, ONE_TILE=one_tile,
        PDL=pdl, SCALE=scale is not None, num_warps=num_warps, **triton_pdl.launch_options(pdl),
    )


@triton.jit
def _load_scaled(x_ptr, row_start, cols, mask, scale):
    """scale * x as fp32, -inf outside the row (masked after scaling: a negative scale must
    not turn the padding into +inf)."""
    x = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
    return tl.where(mask, x * scale, -float("inf"))


@triton.jit
def _padding_safe(row_sum, valid):
    """The tile's padding rows (past n_rows) have a zero sum; give them 1 so that their
    never-stored outputs are not 0/0 (harmless on the GPU, a warning in the interpreter)."""
    return tl.where(valid, row_sum, 1.0)


@triton.jit(do_not_specialize=["n_rows"])  # one compiled kernel whatever the row count
def _softmax_kernel(
    x_ptr, out_ptr, n_rows, n_cols, scale,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, ONE_TILE: tl.constexpr,
):
    """out = softmax(scale * x) over each row, ROWS rows per program.

    Fuses the score scaling into the softmax. A row that fits one tile is read once (max,
    exp, sum in registers). Longer rows use an online softmax: per lane a running max and a
    sum rescaled when the max grows, so the statistics need one read and the output a second.
    A row that is entirely -inf yields NaN, as torch.softmax does.
    """
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_mask = rows[:, None] < n_rows
    row_start = rows.to(tl.int64)[:, None] * n_cols

    if ONE_TILE:
        cols = tl.arange(0, BLOCK)[None, :]
        mask = row_mask & (cols < n_cols)
        z = _load_scaled(x_ptr, row_start, cols, mask, scale)
        m = tl.max(z, axis=1)
        # Guard -inf - -inf = NaN for padding rows; exp(-inf - 0) = 0 still gives 0/0 = NaN
        # for a genuine all -inf row.
        m = tl.where(m == -float("inf"), 0.0, m)
        e = tl.exp(z - m[:, None])
        s = _padding_safe(tl.sum(e, axis=1), rows < n_rows)
        y = e / s[:, None]
        tl.store(out_ptr + row_start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        m_lane = tl.full([ROWS, BLOCK], -float("inf"), tl.float32)
        s_lane = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            mask = row_mask & (cols < n_cols)
            z = _load_scaled(x_ptr, row_start, cols, mask, scale)
            m_new = tl.maximum(m_lane, z)
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s_lane = s_lane * tl.exp(m_lane - m_safe) + tl.exp(z - m_safe)
            m_lane = m_new
        m = tl.max(m_lane, axis=1)
        m = tl.where(m == -float("inf"), 0.0, m)
        s = _padding_safe(tl.sum(s_lane * tl.exp(m_lane - m[:, None]), axis=1), rows < n_rows)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            mask = row_mask & (cols < n_cols)
            z = _load_scaled(x_ptr, row_start, cols, mask, scale)
            y = tl.exp(z - m[:, None]) / s[:, None]
            tl.store(out_ptr + row_start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@register("softmax")
def softmax(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Row softmax of scale * x over the last dim; see reference.softmax."""
    x = _contig(x)
    out = torch.empty_like(x)
    if out.numel() > 0:
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        rows, block, one_tile, num_warps = _row_launch(n_rows, n_cols)
        _softmax_kernel[(triton.cdiv(n_rows, rows),)](
            x, out, n_rows, n_cols, float(scale),
            ROWS=rows, BLOCK=block, ONE_TILE=one_tile, num_warps=num_warps,
        )
    return out
