"""Attention sinks (gpt-oss): the reference against Hugging Face's eager formula, and the Triton
kernels (contiguous and paged keys, unsplit and split) against the reference.

A sink is one learned logit per query head that joins every softmax's normaliser and carries no
value: p_j = exp(s_j) / (sum_i exp(s_i) + exp(sinks[h])). The sinks drawn here are large enough
to take a good share of each row's mass, so a kernel that dropped the sink, scaled it like a
score, counted it once per split or read another head's would fail. Without a GPU the kernels
run in Triton's CPU interpreter on tiny shapes; the `gpu` test runs a gpt-oss-sized decode.
"""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernel cannot run", allow_module_level=True)

from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels.triton_attention import paged_attention, varlen_attention  # noqa: E402
from paged_inputs import random_paged_pool  # noqa: E402  (tests/ helper)

# (atol, rtol) against the fp32 reference, as in the other attention tests.
TOL = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (1.6e-2, 1.6e-2)}


def cu(lengths: list[int]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=DEVICE)


def make(lq, lk, heads, kv_heads, head_dim, dtype=torch.float32, seed=0):
    """Packed q, k, v, their cu_seqlens and one sink logit per head (around log of a few keys'
    mass, so the sink matters)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)

    q, k, v = rand(sum(lq), heads, head_dim), rand(sum(lk), kv_heads, head_dim), rand(sum(lk), kv_heads, head_dim)
    sinks = (torch.randn(heads, generator=gen) * 1.5 + 1.5).to(DEVICE)
    return q, k, v, cu(lq), cu(lk), sinks


def paged(lq, lk, heads, kv_heads, head_dim, block_size, dtype=torch.float32, seed=0):
    """Random q and sinks, each sequence's keys scattered over random blocks of a pool (a few
    blocks owned by nobody), its block tables, cu_seqlens_q and key counts."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q, k_cache, v_cache, tables, seqlens = random_paged_pool(lq, lk, heads, kv_heads, head_dim, block_size, dtype, gen,
                                                             DEVICE)
    sinks = (torch.randn(heads, generator=gen) * 1.5 + 1.5).to(DEVICE)
    return q, k_cache, v_cache, tables, cu(lq), seqlens, sinks


def hf_sink_attention(q, k, v, cu_q, cu_k, sinks, window=None):
    """Hugging Face's gpt-oss eager attention written out per sequence: scaled scores plus an
    additive causal (and sliding-window) mask of the dtype's minimum, the head's sink appended as
    one more column, the row max subtracted, softmax, the sink's column dropped, times V."""
    heads, head_dim = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        qs = q[cq[i] : cq[i + 1]].transpose(0, 1).float()  # [H, Lq, D]
        ks = k[ck[i] : ck[i + 1]].transpose(0, 1).float().repeat_interleave(group, dim=0)
        vs = v[ck[i] : ck[i + 1]].transpose(0, 1).float().repeat_interleave(group, dim=0)
        lq, lk = qs.shape[1], ks.shape[1]
        q_pos = torch.arange(lk - lq, lk, device=q.device)[:, None]
        k_pos = torch.arange(lk, device=q.device)[None, :]
        keep = k_pos <= q_pos
        if window is not None:
            keep = keep & (k_pos > q_pos - window)
        mask = torch.zeros(lq, lk, device=q.device).masked_fill(~keep, torch.finfo(torch.float32).min)
        scores = qs @ ks.transpose(1, 2) * head_dim**-0.5 + mask
        combined = torch.cat([scores, sinks.float().reshape(-1, 1, 1).expand(-1, lq, 1)], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)[..., :-1]
        out[cq[i] : cq[i + 1]] = (probs @ vs).transpose(0, 1)
    return out


@pytest.mark.parametrize("window", [None, 3])
def test_reference_is_hugging_faces_formula(window):
    """Causal GQA (4 heads over 2): a prompt, a decode row against a cache and a chunk."""
    q, k, v, cq, ck, sinks = make([5, 1, 7], [5, 9, 12], 4, 2, 16, seed=1)
    out = ref.varlen_attention(q, k, v, cq, ck, True, window=window, sinks=sinks)
    torch.testing.assert_close(out, hf_sink_attention(q, k, v, cq, ck, sinks, window), atol=2e-6, rtol=1e-5)
    without = ref.varlen_attention(q, k, v, cq, ck, True, window=window)
    assert (out - without).abs().max() > 0.05  # the sinks take a visible share


def check_varlen(lq, lk, causal, seed, sinks_dtype=torch.float32, **kwargs):
    q, k, v, cq, ck, sinks = make(lq, lk, 4, 2, kwargs.pop("head_dim", 32), seed=seed)
    sinks = sinks.to(sinks_dtype)
    out = varlen_attention(q, k, v, cq, ck, causal, sinks=sinks, **kwargs)
    expected = ref.varlen_attention(q, k, v, cq, ck, causal, sinks=sinks, **kwargs)
    torch.testing.assert_close(out, expected, atol=TOL[torch.float32][0], rtol=TOL[torch.float32][1])


@pytest.mark.parametrize("causal,window,sinks_dtype", [
    (True, None, torch.float32),
    (True, 5, torch.bfloat16),  # sinks in the checkpoint's dtype, read as fp32
    (False, None, torch.float32),
])
def test_varlen_kernel(causal, window, sinks_dtype):
    """A decode row against a cache, prompts, a chunk after cached keys and (causal) a chunk
    longer than its keys, whose first queries see no key and stay zeros."""
    check_varlen([1, 5, 17, 4], [20, 5, 17, 2], causal, seed=2, sinks_dtype=sinks_dtype, window=window)


def test_varlen_kernel_head_dim_16_and_scale():
    check_varlen([1, 9], [13, 30], True, seed=3, head_dim=16, scale=0.3)


def check_paged(lq, lk, splits, window, seed):
    q, kc, vc, bt, cq, sk, sinks = paged(lq, lk, 4, 2, 16, 8, seed=seed)
    options = dict(max_seqlen_q=max(lq), window=window, sinks=sinks)
    out = paged_attention(q, kc, vc, bt, cq, sk, True, num_splits=splits, **options)
    expected = ref.paged_attention(q, kc, vc, bt, cq, sk, True, **options)
    torch.testing.assert_close(out, expected, atol=TOL[torch.float32][0], rtol=TOL[torch.float32][1])


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("window", [None, 6])
def test_paged_kernel_decode_rows(splits, window):
    """One query per sequence (max_seqlen_q 1); with 4 splits some splits see no key, and the
    sequence with no key at all gets zeros."""
    check_paged([1, 1, 1, 1], [37, 1, 0, 50], splits, window, seed=4)


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("window", [None, 6])
def test_paged_kernel_prefill_chunk(splits, window):
    """A prefill chunk after cached keys beside a decode row."""
    check_paged([6, 1], [29, 40], splits, window, seed=5)


def test_no_sinks_changes_nothing():
    """sinks=None is the call without the argument, bit for bit (unsplit and split)."""
    q, k, v, cq, ck, _ = make([1, 5], [20, 5], 4, 2, 32, seed=6)
    torch.testing.assert_close(varlen_attention(q, k, v, cq, ck, True, sinks=None),
                               varlen_attention(q, k, v, cq, ck, True), atol=0, rtol=0)
    torch.testing.assert_close(ref.varlen_attention(q, k, v, cq, ck, True, window=3, sinks=None),
                               ref.varlen_attention(q, k, v, cq, ck, True, window=3), atol=0, rtol=0)
    q, kc, vc, bt, cq, sk, _ = paged([1, 1, 1], [37, 3, 20], 4, 2, 16, 8, seed=7)
    for splits in (1, 2):
        torch.testing.assert_close(paged_attention(q, kc, vc, bt, cq, sk, True, num_splits=splits, sinks=None),
                                   paged_attention(q, kc, vc, bt, cq, sk, True, num_splits=splits), atol=0, rtol=0)


@pytest.mark.parametrize("shape", [(2,), (4, 1), ()])
def test_rejects_bad_sinks_shape(shape):
    q, k, v, cq, ck, _ = make([3], [3], 4, 2, 16, seed=8)
    bad = torch.zeros(shape, device=DEVICE)
    for fn in (ref.varlen_attention, varlen_attention):
        with pytest.raises(ValueError, match="sinks"):
            fn(q, k, v, cq, ck, True, sinks=bad)
    q, kc, vc, bt, cq, sk, _ = paged([1], [5], 4, 2, 16, 8, seed=8)
    for fn in (ref.paged_attention, paged_attention):
        with pytest.raises(ValueError, match="sinks"):
            fn(q, kc, vc, bt, cq, sk, True, sinks=bad)


def test_decoder_batch_passes_sinks_to_both_launches():
    """DecoderBatch.attention: decode rows and a prompt chunk in one batch, each part equal to
    its own paged attention with the sinks."""
    from tritonformer.backend.decoder.batch import BatchEntry, build_batch
    from tritonformer.kernels import paged_attention as dispatched_paged_attention

    block_size, heads, kv_heads, head_dim = 8, 4, 2, 16
    entries = [BatchEntry([7], 20, [3, 0, 5], True), BatchEntry([1, 2, 3, 4], 6, [1, 4], True)]
    batch = build_batch(entries, block_size, torch.device(DEVICE))
    gen = torch.Generator().manual_seed(9)
    kc = torch.randn(6, block_size, kv_heads, head_dim, generator=gen).to(DEVICE)
    vc = torch.randn(6, block_size, kv_heads, head_dim, generator=gen).to(DEVICE)
    q = torch.randn(5, heads, head_dim, generator=gen).to(DEVICE)
    sinks = torch.tensor([2.0, -1.0, 3.0, 0.5], device=DEVICE)
    out = batch.attention(q, kc, vc, window=9, sinks=sinks)
    decode = dispatched_paged_attention(q[:1], kc, vc, batch.decode_tables, batch.decode_cu_q, batch.decode_seqlens,
                                        True, max_seqlen_q=1, window=9, sinks=sinks)
    prefill = dispatched_paged_attention(q[1:], kc, vc, batch.prefill_tables, batch.prefill_cu_q,
                                         batch.prefill_seqlens, True, max_seqlen_q=4, window=9, sinks=sinks)
    torch.testing.assert_close(out, torch.cat([decode, prefill]), atol=0, rtol=0)
    without = batch.attention(q, kc, vc, window=9)
    assert (out[:1] - without[:1]).abs().max() > 0.05 and (out[1:] - without[1:]).abs().max() > 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("window", [128, None])
@pytest.mark.parametrize("splits", [None, 16])
def test_gpu_bf16_decode_gpt_oss_shape(window, splits):
    """gpt-oss's attention (64 heads over 8 KV heads, head dim 64, a 128-key window on every
    other layer): bf16 decode rows against long caches, against the fp32 reference. 16 splits
    is a captured graph's fixed count; None lets the kernel choose (4 splits without the window,
    none within it)."""
    lk = [4000, 300, 129, 1, 2048]
    q, kc, vc, bt, cq, sk, sinks = paged([1] * len(lk), lk, 64, 8, 64, 16, dtype=torch.bfloat16, seed=10)
    sinks = sinks.to(torch.bfloat16)
    out = paged_attention(q, kc, vc, bt, cq, sk, True, max_seqlen_q=1, num_splits=splits, window=window, sinks=sinks)
    expected = ref.paged_attention(q.float(), kc.float(), vc.float(), bt, cq, sk, True, window=window, sinks=sinks)
    atol, rtol = TOL[torch.bfloat16]
    torch.testing.assert_close(out.float(), expected, atol=atol, rtol=rtol)
    without = ref.paged_attention(q.float(), kc.float(), vc.float(), bt, cq, sk, True, window=window)
    assert (expected - without).abs().max() > 0.05
