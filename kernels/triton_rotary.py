"""Rotary embedding written back in place, for an encoder's packed QKV projection.

Same semantics and signature as `reference.rotary_in_place`; registered for CUDA tensors.

A decoder's rotary rides in the kernel that splits QKV and writes the KV cache
(`triton_elementwise`). An encoder has no cache: its attention reads q, k and v as strided
views of the QKV GEMM output (the BERT path), so the cheapest rotary there is one pass over
the q and k heads of that buffer, rotating them where they lie: v is never read, and nothing
new is allocated (the activation arena's plan stays as it is).

The cos/sin tables may be per token (`[T, D/2]`) or, with `positions`, tables of every
position computed once at load time: a program then reads its token's position and the row of
that position, so a forward builds no per-token table at all.

Grid: (cdiv(T, ROWS), cdiv(H, BLOCK_H)); a program rotates ROWS tokens x BLOCK_H heads. Each
element is read and written by the same program, which is what makes the update in place safe.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register

_TILE_ELEMS = 4096  # elements per program: 32 per thread at 4 warps


@triton.jit(do_not_specialize=["n_tokens"])  # one compiled kernel whatever the token count
def _rotary_in_place_kernel(
    x_ptr, cos_ptr, sin_ptr, pos_ptr, n_tokens, n_heads, half,
    stride_xt, stride_xh, stride_ct, stride_st,
    HAS_POSITIONS: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """x[t, h, :half], x[t, h, half:] = x1 c - x2 s, x2 c + x1 s with c, s the cos/sin row of
    token t (or of its position), in fp32, rounded once to x's dtype."""
    tokens = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    tok_ok = tokens < n_tokens
    if HAS_POSITIONS:
        rows = tl.load(pos_ptr + tokens, mask=tok_ok, other=0).to(tl.int64)
    else:
        rows = tokens.to(tl.int64)
    cs_mask = tok_ok[:, None] & (cols < half)[None, :]
    c = tl.load(cos_ptr + rows[:, None] * stride_ct + cols[None, :], mask=cs_mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + rows[:, None] * stride_st + cols[None, :], mask=cs_mask, other=0.0).to(tl.float32)
    # [ROWS, BLOCK_H, BLOCK_D] tiles: the token's cos/sin row is shared by all its heads.
    offs = (tokens.to(tl.int64)[:, None, None] * stride_xt + heads[None, :, None] * stride_xh
            + cols[None, None, :])
    mask = tok_ok[:, None, None] & (heads < n_heads)[None, :, None] & (cols < half)[None, None, :]
    x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + offs + half, mask=mask, other=0.0).to(tl.float32)
    c3 = c[:, None, :]
    s3 = s[:, None, :]
    tl.store(x_ptr + offs, (x1 * c3 - x2 * s3).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(x_ptr + offs + half, (x2 * c3 + x1 * s3).to(x_ptr.dtype.element_ty), mask=mask)


@register("rotary_in_place")
def rotary_in_place(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Rotate-half rotary on x `[T, H, D]` in place; see reference.rotary_in_place. x may be
    strided over tokens and heads (the q and k heads of a QKV buffer) but its last dim must be
    contiguous: it is written in place, so it cannot be copied first."""
    assert x.dim() == 3 and x.stride(-1) == 1, "x must be [tokens, heads, head_dim] with a contiguous last dim"
    n_tokens, n_heads, head_dim = x.shape
    if head_dim % 2:
        raise ValueError(f"rotary needs an even head_dim, got {head_dim}")
    half = head_dim // 2
    assert cos.shape == sin.shape and cos.dim() == 2 and cos.shape[1] == half, (
        f"cos and sin must be [rows, head_dim // 2] = [rows, {half}], got {list(cos.shape)} and {list(sin.shape)}")
    if positions is None:
        assert cos.shape[0] == n_tokens, f"without positions, cos/sin need one row per token ({n_tokens})"
    else:
        assert positions.shape == (n_tokens,), f"positions must be [{n_tokens}], got {list(positions.shape)}"
    if n_tokens == 0 or n_heads == 0:
        return x
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    block_d = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(n_heads), max(1, _TILE_ELEMS // (2 * block_d)))
    rows = max(1, min(_TILE_ELEMS // (2 * block_d * block_h), triton.next_power_of_2(n_tokens)))
    num_warps = max(1, min(8, rows * block_h * block_d * 2 // 1024))
    grid = (triton.cdiv(n_tokens, rows), triton.cdiv(n_heads, block_h))
    _rotary_in_place_kernel[grid](
        x, cos, sin, positions.contiguous() if positions is not None else cos, n_tokens, n_heads, half,
        x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
        HAS_POSITIONS=positions is not None, ROWS=rows, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=num_warps,
    )
    return x
