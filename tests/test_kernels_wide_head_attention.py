"""Attention over heads 512 wide (Gemma 4's full layers) through the Triton kernels, in Triton's CPU interpreter
(TRITON_INTERPRET=1) on fresh random inputs: the paged attention (decode rows with their keys split, a prompt chunk
with a window) against `reference.paged_attention`, and the QKV-to-cache write (per-head norms, the proportional
rotary's table) against `reference.qkv_to_cache`."""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.kernels import reference as ref

from test_kernels_paged_attention import DEVICE, paged_case  # noqa: E402  (tests/ helper)

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="the Triton kernels run in the interpreter (TRITON_INTERPRET=1) or on a GPU")


@pytest.mark.parametrize("lq,lk,splits,window", [([1, 1], [9, 23], 4, None), ([5], [13], None, 8)])
def test_paged_attention_at_head_dim_512_matches_the_reference(lq, lk, splits, window):
    from tritonformer.kernels.triton_attention import paged_attention

    q, kc, vc, bt, cq, sk, *_ = paged_case(lq, lk, 8, 1, 512, 4, torch.float32, seed=3)
    got = paged_attention(q, kc, vc, bt, cq, sk, True, scale=1.0, max_seqlen_q=max(lq), num_splits=splits,
                          window=window)
    want = ref.paged_attention(q, kc, vc, bt, cq, sk, True, scale=1.0, window=window)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_qkv_to_cache_at_head_dim_512_matches_the_reference():
    from tritonformer.backend.models.rope import Rope
    from tritonformer.kernels.triton_elementwise import qkv_to_cache

    gen = torch.Generator().manual_seed(4)
    heads, kv, d, rows = 2, 1, 512, 3
    qkv = torch.randn(rows, (heads + 2 * kv) * d, generator=gen).to(DEVICE)
    table = Rope(1e6, "proportional", proportion=0.25).cos_sin(16, d, torch.device(DEVICE))[[0, 5, 9]]
    norms = [(torch.randn(d, generator=gen) * 0.1 + 1).to(DEVICE) for _ in range(2)]
    caches = [torch.zeros(4, 4, kv, d, device=DEVICE) for _ in range(4)]
    slots = torch.tensor([1, 6, 13], device=DEVICE)
    got = qkv_to_cache(qkv.clone(), None, heads, kv, d, table[:, 0], table[:, 1], caches[0], caches[1], slots,
                       q_norm=norms[0], k_norm=norms[1], norm_eps=1e-6)
    want = ref.qkv_to_cache(qkv.clone(), None, heads, kv, d, table[:, 0], table[:, 1], caches[2], caches[3], slots,
                            q_norm=norms[0], k_norm=norms[1], norm_eps=1e-6)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(caches[0], caches[2], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(caches[1], caches[3], atol=0, rtol=0)
