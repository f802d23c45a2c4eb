"""Latent attention's steps between its projections (models/mla.py), one launch each.

A DeepSeek-style layer turns its first projection's rows into queries, keys and values through
two RMSNorms (query and key-value latents), two more projections and a rotary, then writes
every head's key [rotary(k_pe); k_nope] and zero-padded value to the paged cache. Done with
general ops that is about a dozen launches per layer (copies of strided slices, the norms, the
rotary, a concatenation, a pad, the cache write), each a few microseconds of a decode step that
reads only a few MB: the 27 layers of DeepSeek-V2-Lite spent about as long launching them as
reading their weights. Here:

- `mla_latent_norms`: both norms, read from the strided slices of the projection's output, in
  one launch (grid: rows x the two latents);
- `mla_kv_to_cache`: the shared rotary key rotated once per program, each head's key and value
  assembled and stored at the token's cache slot (grid: rows x blocks of heads).

Same semantics and signatures as `reference.mla_latent_norms` / `reference.mla_kv_to_cache`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels.dispatch import register

_TILE_ELEMS = 4096  # elements per program of the cache write: 32 per thread at 4 warps


@triton.jit
def _norm_row(x_ptr, w_ptr, out_ptr, width, eps, BLOCK: tl.constexpr):
    """out[:width] = RMSNorm(x[:width]) * w in fp32, rounded once to out's dtype."""
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    h = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / width + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + cols, (h * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _latent_norms_kernel(a_ptr, stride_a, q_w_ptr, kv_w_ptr, q_out_ptr, kv_out_ptr, q_width, kv_width, eps,
                         BLOCK: tl.constexpr):
    """Program (t, 0) normalises row t's key-value latent, (t, 1) its query latent."""
    t = tl.program_id(0).to(tl.int64)
    row = a_ptr + t * stride_a
    if tl.program_id(1) == 0:
        _norm_row(row + q_width, kv_w_ptr, kv_out_ptr + t * kv_width, kv_width, eps, BLOCK)
    else:
        _norm_row(row, q_w_ptr, q_out_ptr + t * q_width, q_width, eps, BLOCK)


@register("mla_latent_norms")
def mla_latent_norms(a: torch.Tensor, q_width: int, q_norm: torch.Tensor | None, kv_norm: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor | None, torch.Tensor]:
    """See reference.mla_latent_norms. `a` may be any view whose last dim is contiguous."""
    assert a.dim() == 2 and a.stride(1) == 1, "a must be [rows, cols] with contiguous rows"
    kv_width = kv_norm.shape[0]
    t = a.shape[0]
    kv = torch.empty((t, kv_width), dtype=a.dtype, device=a.device)
    q = torch.empty((t, q_width), dtype=a.dtype, device=a.device) if q_norm is not None else None
    if t:
        block = triton.next_power_of_2(max(kv_width, q_width if q_norm is not None else 1))
        _latent_norms_kernel[(t, 2 if q_norm is not None else 1)](
            a, a.stride(0), q_norm if q_norm is not None else kv_norm, kv_norm, q if q is not None else kv, kv,
            q_width, kv_width, float(eps), BLOCK=block, num_warps=max(1, min(8, block // 256)),
        )
    return q, kv


@triton.jit(do_not_specialize=["n_heads"])
def _kv_to_cache_kernel(
    kv_ptr, pe_ptr, cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr, n_heads,
    stride_kvt, stride_kvh, stride_pet, stride_ct, stride_st, stride_slot, stride_head,
    NOPE: tl.constexpr, VDIM: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
    ROTARY: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Token t's heads h0 .. h0 + BLOCK_H - 1: key [rotary(k_pe); kv[:NOPE]], value [kv[NOPE:]; 0]."""
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    half: tl.constexpr = R // 2
    # The rotary key, shared by every head: column c < R pairs dim j = c mod R/2 with j + R/2.
    in_pe = cols < R
    j = cols % half
    lo = tl.load(pe_ptr + t * stride_pet + j, mask=in_pe, other=0.0).to(tl.float32)
    hi = tl.load(pe_ptr + t * stride_pet + j + half, mask=in_pe, other=0.0).to(tl.float32)
    if ROTARY:
        c = tl.load(cos_ptr + t * stride_ct + j, mask=in_pe, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + t * stride_st + j, mask=in_pe, other=0.0).to(tl.float32)
        pe = tl.where(cols < half, lo * c - hi * s, hi * c + lo * s)
    else:
        pe = tl.where(cols < half, lo, hi)
    pe = pe.to(k_ptr.dtype.element_ty)
    h_ok = (heads < n_heads)[:, None]
    row = kv_ptr + t * stride_kvt + heads[:, None].to(tl.int64) * stride_kvh
    k_nope = tl.load(row + (cols - R)[None, :], mask=h_ok & ((cols >= R) & (cols < D))[None, :], other=0.0)
    k = tl.where(in_pe[None, :], pe[None, :], k_nope.to(k_ptr.dtype.element_ty))
    v = tl.load(row + NOPE + cols[None, :], mask=h_ok & (cols < VDIM)[None, :], other=0.0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    out = slot * stride_slot + heads[:, None].to(tl.int64) * stride_head + cols[None, :]
    mask = h_ok & (cols < D)[None, :]
    tl.store(k_ptr + out, k, mask=mask)
    tl.store(v_ptr + out, v.to(v_ptr.dtype.element_ty), mask=mask)


@register("mla_kv_to_cache")
def mla_kv_to_cache(kv: torch.Tensor, k_pe: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """See reference.mla_kv_to_cache. k_pe and cos / sin may be strided over rows."""
    t, heads, width = kv.shape
    d, r = k_cache.shape[-1], k_pe.shape[1]
    nope = d - r
    assert kv.stride(2) == 1 and k_pe.stride(1) == 1, "kv and k_pe need contiguous last dims"
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[-2] == heads
    assert r % 2 == 0 and 0 < width - nope <= d, "an even rotary key and values of at most the head's dims"
    if cos is not None:
        assert cos.stride(1) == 1 and sin.stride(1) == 1 and cos.shape[1] >= r // 2
    if t == 0:
        return
    block_d = triton.next_power_of_2(d)
    block_h = min(triton.next_power_of_2(heads), max(1, _TILE_ELEMS // block_d))
    _kv_to_cache_kernel[(t, triton.cdiv(heads, block_h))](
        kv, k_pe, cos if cos is not None else k_pe, sin if sin is not None else k_pe, slot_mapping, k_cache, v_cache,
        heads, kv.stride(0), kv.stride(1), k_pe.stride(0),
        cos.stride(0) if cos is not None else 0, sin.stride(0) if sin is not None else 0,
        heads * d, d,
        NOPE=nope, VDIM=width - nope, R=r, D=d, ROTARY=cos is not None, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=4,
    )
