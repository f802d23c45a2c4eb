"""The mLSTM decode step (models/mlstm.py: xLSTM), one launch for every decoding row of a layer.

A program takes one row and one head: it updates the head's normaliser n `[dk]` at the row's state slot and takes
q . n, then walks the head's matrix memory C `[dk, dv]` in tiles, each read once, updated (f C + i k v^T) and
written back in place while its product with q accumulates: the state crosses memory once each way, where the
PyTorch step gathered it, computed a new one and scattered it back (about seven passes over 4 MB a sequence and
layer at xLSTM-7b's sizes).

Same semantics and signature as reference.mlstm_decode (the roundings to the model's dtype included).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels import reference
from tritonformer.kernels.dispatch import register

BLOCK_K = 32  # rows of C a tile
BLOCK_V = 128  # columns of C a tile
# Fewer decoding rows than this take the reference's PyTorch ops: a program streams a whole head's C, so one row is
# `heads` programs (8 for xLSTM-7b) and most of the GPU idles. xLSTM-7b on the H200, bf16: 1 row 6.94 ms a step
# against the reference's 6.71 (1.035x), 64 rows 12.32 against 47.43 (0.26x); rows in between not measured.
MIN_ROWS = 4


@triton.jit
def _mlstm_decode_kernel(q_ptr, k_ptr, v_ptr, i_ptr, f_ptr, c_ptr, n_ptr, m_ptr, slots_ptr, h_ptr,
                         stride_q, stride_k, stride_v, stride_i, stride_f, stride_c, stride_n, stride_m, eps, scale,
                         H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dt = q_ptr.dtype.element_ty
    slot = tl.load(slots_ptr + row).to(tl.int64)
    ig = tl.load(i_ptr + row * stride_i + head).to(tl.float32)
    fg = tl.load(f_ptr + row * stride_f + head).to(tl.float32)
    # log sigmoid in the model's dtype, as transformers takes it: min(f, 0) - log(1 + e^-|f|)
    f_log = (tl.minimum(fg, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(fg)))).to(dt).to(tl.float32)
    m_cell = m_ptr + slot * stride_m + head
    m0 = tl.load(m_cell)
    m1 = tl.maximum(f_log + m0, ig)
    f_act = tl.exp(f_log + m0 - m1)
    i_act = tl.exp(ig - m1)
    q_row = q_ptr + row * stride_q + head * DK
    k_row = k_ptr + row * stride_k + head * DK
    n_head = n_ptr + slot * stride_n + head * DK
    qn = tl.zeros([BK], dtype=tl.float32)
    for k0 in range(0, DK, BK):
        ks = k0 + tl.arange(0, BK)
        ok = ks < DK
        qk = (tl.load(q_row + ks, mask=ok, other=0.0).to(tl.float32) * scale).to(dt).to(tl.float32)
        kk = tl.load(k_row + ks, mask=ok, other=0.0).to(tl.float32)
        n1 = f_act * tl.load(n_head + ks, mask=ok, other=0.0) + i_act * kk
        tl.store(n_head + ks, n1, mask=ok)
        qn += qk * n1.to(dt).to(tl.float32)
    qn_all = tl.sum(qn, axis=0).to(dt).to(tl.float32)
    den = tl.maximum(tl.abs(qn_all), tl.exp(-m1)) + eps
    tl.store(m_cell, m1)
    c_head = c_ptr + slot * stride_c + head * DK * DV
    v_row = v_ptr + row * stride_v + head * DV
    h_row = h_ptr + (row * H + head) * DV
    for v0 in range(0, DV, BV):
        vs = v0 + tl.arange(0, BV)
        v_ok = vs < DV
        vv = tl.load(v_row + vs, mask=v_ok, other=0.0).to(tl.float32)
        num = tl.zeros([BV], dtype=tl.float32)
        for k0 in range(0, DK, BK):
            ks = k0 + tl.arange(0, BK)
            ok = ks < DK
            qk = (tl.load(q_row + ks, mask=ok, other=0.0).to(tl.float32) * scale).to(dt).to(tl.float32)
            kk = tl.load(k_row + ks, mask=ok, other=0.0).to(tl.float32)
            tile = c_head + ks[:, None] * DV + vs[None, :]
            both = ok[:, None] & v_ok[None, :]
            kv = (kk[:, None] * vv[None, :]).to(dt).to(tl.float32)
            c1 = f_act * tl.load(tile, mask=both, other=0.0) + i_act * kv
            tl.store(tile, c1, mask=both)
            num += tl.sum(qk[:, None] * c1.to(dt).to(tl.float32), axis=0)
        h = num.to(dt).to(tl.float32) / den
        tl.store(h_row + vs, h.to(h_ptr.dtype.element_ty), mask=v_ok)


@register("mlstm_decode")
def mlstm_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor,
                 c: torch.Tensor, n: torch.Tensor, m: torch.Tensor, slots: torch.Tensor, eps: float) -> torch.Tensor:
    """See reference.mlstm_decode: the kernel (mlstm_decode_kernel) from MIN_ROWS rows, the reference below."""
    if q.shape[0] < MIN_ROWS:
        return reference.mlstm_decode(q, k, v, i, f, c, n, m, slots, eps)
    return mlstm_decode_kernel(q, k, v, i, f, c, n, m, slots, eps)


def mlstm_decode_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor,
                        c: torch.Tensor, n: torch.Tensor, m: torch.Tensor, slots: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """reference.mlstm_decode on the kernel at any row count. q, k, v, i and f may be strided over rows (each row's
    heads contiguous); the states' slots at any stride, each slot's heads contiguous."""
    rows, heads, dk = q.shape
    dv = v.shape[-1]
    assert k.shape == (rows, heads, dk) and v.shape == (rows, heads, dv) and i.shape == f.shape == (rows, heads)
    for t in (q, k, v):
        assert t.stride(2) == 1 and t.stride(1) == t.shape[2]
    assert i.stride(1) == 1 and f.stride(1) == 1
    assert c.dtype == n.dtype == m.dtype == torch.float32
    assert c.shape[1:] == (heads, dk, dv) and c[0].is_contiguous() and n.shape[1:] == (heads, dk)
    assert n.stride(2) == 1 and n.stride(1) == dk and m.shape[1:] == (heads, 1) and m.stride(1) == 1
    h = torch.empty((rows, heads, dv), dtype=q.dtype, device=q.device)
    if rows == 0:
        return h
    _mlstm_decode_kernel[(rows, heads)](
        q, k, v, i, f, c, n, m, slots, h, q.stride(0), k.stride(0), v.stride(0), i.stride(0), f.stride(0),
        c.stride(0), n.stride(0), m.stride(0), eps, dk ** -0.5, H=heads, DK=dk, DV=dv,
        BK=min(BLOCK_K, triton.next_power_of_2(dk)), BV=min(BLOCK_V, triton.next_power_of_2(dv)), num_warps=4,
    )
    return h
