"""The Triton disentangled-attention kernel (DeBERTa-v2/v3) against
`reference.disentangled_attention`.

Fresh seeded random inputs every time. Without a GPU the kernel runs in Triton's CPU
interpreter (TRITON_INTERPRET=1, set before triton is imported), so those shapes are tiny: a
column table of 8 buckets over 16 relative positions (reach 17), sequences from 1 token to well
past it; the `gpu` group runs deberta-v3-base's shape (12 heads of 64, 512 columns).
"""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernel cannot run", allow_module_level=True)

from tritonformer.backend.models.deberta_v2 import DebertaV2Config, relative_column_table  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels.triton_disentangled_attention import disentangled_attention  # noqa: E402

TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (2e-3, 2e-3)}


def _table(buckets: int, max_rel: int) -> tuple[torch.Tensor, int]:
    cfg = DebertaV2Config.from_hf({"relative_attention": True, "share_att_key": True, "pos_att_type": "p2c|c2p",
                                   "norm_rel_ebd": "layer_norm", "hidden_size": 64, "num_attention_heads": 4,
                                   "position_buckets": buckets, "max_relative_positions": max_rel,
                                   "hidden_act": "gelu"})
    return relative_column_table(cfg).to(DEVICE), 2 * cfg.att_span


def _inputs(lengths, heads, head_dim, cols, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)

    # q, k, v as strided views of one QKV buffer, c2p / p2c as [T, H, R] views of [H, T, R], as the model passes them
    qkv = rand(total, 3, heads, head_dim)
    c2p = (2 * rand(heads, total, cols)).transpose(0, 1)
    p2c = (2 * rand(heads, total, cols)).transpose(0, 1)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    return qkv[:, 0], qkv[:, 1], qkv[:, 2], c2p, p2c, cu


def check(lengths, heads, head_dim, dtype, buckets=8, max_rel=16, seed=0):
    table, cols = _table(buckets, max_rel)
    q, k, v, c2p, p2c, cu = _inputs(lengths, heads, head_dim, cols, dtype, seed)
    scale = (3 * head_dim) ** -0.5
    out = disentangled_attention(q, k, v, c2p, p2c, table, cu, scale, max(lengths))
    expected = ref.disentangled_attention(q, k, v, c2p, p2c, table, cu, scale, max(lengths))
    assert out.shape == q.shape and out.dtype == dtype
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    return out, (q, k, v, c2p, p2c, table, cu, scale)


@pytest.mark.parametrize("head_dim", [16, 24, 32])
def test_fp32_variable_lengths_past_the_reach(head_dim):
    """Lengths 1 to 45 around 16-row blocks and the table's reach of 17 (8 buckets over 16
    relative positions); head dim 24 runs in a padded tile."""
    check([1, 17, 45, 5, 20], heads=2, head_dim=head_dim, dtype=torch.float32, seed=head_dim)


def test_fp16_and_unbucketed_table():
    """fp16 inputs; a table without buckets (column = distance + span, clamped)."""
    check([33, 3, 18], heads=2, head_dim=32, dtype=torch.float16, seed=1)
    check([40, 9], heads=2, head_dim=16, dtype=torch.float32, buckets=-1, max_rel=12, seed=2)


def test_reference_against_a_loop_over_pairs():
    """The reference's semantics written out pair by pair (scores, then a softmax per query)."""
    table, cols = _table(8, 16)
    q, k, v, c2p, p2c, cu = _inputs([4, 23], 2, 16, cols, torch.float64, seed=6)
    reach, scale = (table.shape[0] - 1) // 2, 0.1
    got = ref.disentangled_attention(q, k, v, c2p, p2c, table, cu, scale)
    for lo, hi in ((0, 4), (4, 27)):
        for h in range(2):
            for i in range(hi - lo):
                col = [int(table[max(-reach, min(reach, i - j)) + reach]) for j in range(hi - lo)]
                s = torch.stack([q[lo + i, h] @ k[lo + j, h] + c2p[lo + i, h, col[j]] + p2c[lo + j, h, col[j]]
                                 for j in range(hi - lo)]) * scale
                torch.testing.assert_close(got[lo + i, h], torch.softmax(s, 0) @ v[lo:hi, h])


def test_first_column():
    """c2p and p2c holding only the columns short sequences reach (from `first_column` on), as
    the model passes them: the same result as the full columns."""
    table, cols = _table(8, 16)
    q, k, v, c2p, p2c, cu = _inputs([9, 3, 6], 2, 16, cols, torch.float32, seed=5)
    reach, scale = (table.shape[0] - 1) // 2, 48 ** -0.5
    first, last = int(table[reach - 8]), int(table[reach + 8])
    assert 0 < first and last < cols - 1  # a strict subset
    full = ref.disentangled_attention(q, k, v, c2p, p2c, table, cu, scale)
    part = [x[:, :, first : last + 1] for x in (c2p, p2c)]
    torch.testing.assert_close(ref.disentangled_attention(q, k, v, *part, table, cu, scale, first_column=first), full)
    got = disentangled_attention(q, k, v, *part, table, cu, scale, 9, first_column=first)
    torch.testing.assert_close(got, full, atol=2e-5, rtol=1e-4)


def test_position_terms_are_read_per_pair():
    """Each position term moves the result on its own (the comparison above could pass with
    one of them ignored only if both paths ignored it): zeroing c2p or p2c changes the output,
    and swapping their roles does too (p2c is read at the key's row, c2p at the query's)."""
    out, (q, k, v, c2p, p2c, table, cu, scale) = check([30, 12], heads=2, head_dim=16, dtype=torch.float32, seed=3)
    for c, p in ((torch.zeros_like(c2p), p2c), (c2p, torch.zeros_like(p2c)), (p2c, c2p)):
        other = disentangled_attention(q, k, v, c, p, table, cu, scale, 30)
        assert (other - out).abs().max() > 1e-2


def test_registered_for_cuda_tensors():
    from tritonformer.kernels import dispatch

    assert dispatch._KERNELS["disentangled_attention"] is disentangled_attention
    assert "triton_disentangled_attention" in dispatch._KERNEL_MODULES


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_deberta_v3_base_shape():
    """deberta-v3-base's attention shape in fp16: 12 heads of 64, 256 buckets over 512 relative
    positions (512 columns), a packed batch from 1 to 700 tokens."""
    check([1, 63, 64, 65, 300, 512, 700], heads=12, head_dim=64, dtype=torch.float16, buckets=256, max_rel=512)
