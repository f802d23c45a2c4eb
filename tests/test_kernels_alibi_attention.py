"""ALiBi (attention with linear biases: BLOOM, MPT, Falcon-RW): the reference against Hugging Face's
biases, and the Triton kernels (contiguous and paged keys, unsplit and split) against the reference.

Query head h's score of key position k for the query at position p gains slope_h * (k - p). Hugging
Face adds slope_h * k (BLOOM, Falcon) or slope_h * (k - Lk + 1) (MPT) instead, the same up to a
constant per query row, which the softmax cancels; the reference test below builds HF's own tensors.
The slopes drawn here are steep enough that a kernel which dropped them, used another head's, put
the query at another position or scaled them by the softmax scale would fail. 6 query heads over 2
KV heads: a head count that is not a power of two, in GQA groups of 3. Without a GPU the kernels run
in Triton's CPU interpreter on tiny shapes.
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

TOL = dict(atol=2e-5, rtol=1e-4)  # against the fp32 reference, as in the other attention tests
HEADS, KV_HEADS = 6, 2


def cu(lengths: list[int]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=DEVICE)


def slopes(gen: torch.Generator, heads: int = HEADS) -> torch.Tensor:
    """One slope per head, from 0.05 to 1.5 (fresh each test): steep next to the scores of
    unit-variance q and k."""
    return (torch.rand(heads, generator=gen) * 1.45 + 0.05).to(DEVICE)


def make(lq, lk, head_dim=32, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE)

    q, k, v = rand(sum(lq), HEADS, head_dim), rand(sum(lk), KV_HEADS, head_dim), rand(sum(lk), KV_HEADS, head_dim)
    return q, k, v, cu(lq), cu(lk), slopes(gen)


def paged(lq, lk, head_dim=16, block_size=8, seed=0, heads=HEADS, kv_heads=KV_HEADS, dtype=torch.float32):
    """Random q and slopes, each sequence's keys scattered over random blocks of a pool (a few
    blocks owned by nobody), its block tables, cu_seqlens_q and key counts."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q, k_cache, v_cache, tables, seqlens = random_paged_pool(lq, lk, heads, kv_heads, head_dim, block_size, dtype, gen,
                                                             DEVICE)
    return q, k_cache, v_cache, tables, cu(lq), seqlens, slopes(gen, heads)


def hf_biased_attention(q, k, v, cu_q, cu_k, bias_of):
    """Eager attention per sequence with an additive bias `bias_of(lk)` (`[H, 1, Lk]`: Hugging
    Face's per-key ALiBi tensor) plus the causal mask of the dtype's minimum, softmax in fp32."""
    heads, head_dim = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        qs = q[cq[i]: cq[i + 1]].transpose(0, 1).float()
        ks = k[ck[i]: ck[i + 1]].transpose(0, 1).float().repeat_interleave(group, dim=0)
        vs = v[ck[i]: ck[i + 1]].transpose(0, 1).float().repeat_interleave(group, dim=0)
        lq, lk = qs.shape[1], ks.shape[1]
        keep = torch.arange(lk)[None, :] <= torch.arange(lk - lq, lk)[:, None]
        mask = torch.zeros(lq, lk).masked_fill(~keep, torch.finfo(torch.float32).min).to(q.device)
        scores = qs @ ks.transpose(1, 2) * head_dim ** -0.5 + bias_of(lk).float() + mask
        out[cq[i]: cq[i + 1]] = (torch.softmax(scores, dim=-1) @ vs).transpose(0, 1)
    return out


def test_reference_is_hugging_faces_bloom_and_mpt_biases():
    """BLOOM's slopes (6 heads: 4 of the power-of-two series and 2 interleaved from the next) times
    the key position, and MPT's (alibi_bias_max 8) times the key's distance from the last key: the
    reference with the same slopes gives HF's attention on a prompt, a decode row and a chunk."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    q, k, v, cq, ck, _ = make([5, 1, 7], [5, 9, 12], seed=1)
    q, k, v, cq, ck = (t.cpu() for t in (q, k, v, cq, ck))  # (the references' math: on the CPU, as HF's tensors)
    q = q * 3  # (scores as steep as the biases)
    bloom = _get_alibi_slopes(HEADS, torch.device("cpu"))
    expected = hf_biased_attention(q, k, v, cq, ck, lambda lk: bloom[:, None, None] * torch.arange(lk))
    got = ref.varlen_attention(q, k, v, cq, ck, True, alibi_slopes=bloom)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)
    assert (got - ref.varlen_attention(q, k, v, cq, ck, True)).abs().max() > 0.05  # the biases matter

    mpt = build_mpt_alibi_tensor(HEADS, 64)  # [H, 1, 64]: slope * (j - 63), sliced to the last Lk keys
    expected = hf_biased_attention(q, k, v, cq, ck, lambda lk: mpt[:, :, 64 - lk:])
    got = ref.varlen_attention(q, k, v, cq, ck, True, alibi_slopes=mpt[:, 0, -2].neg())
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def check_varlen(lq, lk, seed, **kwargs):
    q, k, v, cq, ck, alibi = make(lq, lk, kwargs.pop("head_dim", 32), seed=seed)
    out = varlen_attention(q, k, v, cq, ck, True, alibi_slopes=alibi, **kwargs)
    expected = ref.varlen_attention(q, k, v, cq, ck, True, alibi_slopes=alibi, **kwargs)
    torch.testing.assert_close(out, expected, **TOL)
    assert (expected - ref.varlen_attention(q, k, v, cq, ck, True, **kwargs)).abs().max() > 0.05


@pytest.mark.parametrize("window", [None, 5])
def test_varlen_kernel(window):
    """A decode row against a cache, prompts across key blocks, a chunk after cached keys and a
    chunk longer than its keys (its first queries see no key: zeros); and under a window."""
    check_varlen([1, 5, 21, 4], [20, 5, 21, 2], seed=2, window=window)


def test_varlen_kernel_softcap_scale_and_head_dim_not_a_power_of_two():
    """The bias after the soft-capped, rescaled score, in a padded tile (head dim 24 in 32)."""
    check_varlen([1, 9], [13, 30], seed=3, head_dim=24, scale=0.3, softcap=2.0)


def check_paged(lq, lk, splits, seed):
    q, kc, vc, bt, cq, sk, alibi = paged(lq, lk, seed=seed)
    out = paged_attention(q, kc, vc, bt, cq, sk, True, max_seqlen_q=max(lq), num_splits=splits, alibi_slopes=alibi)
    expected = ref.paged_attention(q, kc, vc, bt, cq, sk, True, alibi_slopes=alibi)
    torch.testing.assert_close(out, expected, **TOL)


@pytest.mark.parametrize("splits", [1, 4])
def test_paged_kernel_decode_rows(splits):
    """One query per sequence (the decode launch); with 4 splits each split's log-sum-exp carries
    its keys' biases, some splits see no key, and the sequence with no key gets zeros."""
    check_paged([1, 1, 1, 1], [37, 1, 0, 50], splits, seed=4)


@pytest.mark.parametrize("splits", [1, 2])
def test_paged_kernel_prefill_chunk(splits):
    """A prompt chunk after cached keys (chunked prefill over the cache) beside a decode row."""
    check_paged([6, 1], [29, 40], splits, seed=5)


def test_no_slopes_changes_nothing():
    """alibi_slopes=None is the call without the argument, bit for bit (unsplit and split)."""
    q, k, v, cq, ck, _ = make([1, 5], [20, 5], seed=6)
    torch.testing.assert_close(varlen_attention(q, k, v, cq, ck, True, alibi_slopes=None),
                               varlen_attention(q, k, v, cq, ck, True), atol=0, rtol=0)
    q, kc, vc, bt, cq, sk, _ = paged([1, 1, 1], [37, 3, 20], seed=7)
    for splits in (1, 2):
        torch.testing.assert_close(
            paged_attention(q, kc, vc, bt, cq, sk, True, num_splits=splits, alibi_slopes=None),
            paged_attention(q, kc, vc, bt, cq, sk, True, num_splits=splits), atol=0, rtol=0)


@pytest.mark.parametrize("shape, causal", [((4,), True), ((6, 1), True), ((6,), False)])
def test_rejects_bad_slopes_and_non_causal_attention(shape, causal):
    q, k, v, cq, ck, _ = make([3], [3], head_dim=16, seed=8)
    bad = torch.full(shape, 0.5, device=DEVICE)
    for fn in (ref.varlen_attention, varlen_attention):
        with pytest.raises(ValueError, match="alibi_slopes"):
            fn(q, k, v, cq, ck, causal, alibi_slopes=bad)


def test_decoder_batch_passes_the_slopes_to_both_launches():
    """DecoderBatch.attention: decode rows and a prompt chunk in one batch, each part equal to
    its own paged attention with the slopes."""
    from tritonformer.backend.decoder.batch import BatchEntry, build_batch
    from tritonformer.kernels import paged_attention as dispatched_paged_attention

    entries = [BatchEntry([7], 20, [3, 0, 5], True), BatchEntry([1, 2, 3, 4], 6, [1, 4], True)]
    batch = build_batch(entries, 8, torch.device(DEVICE))
    gen = torch.Generator().manual_seed(9)
    kc = torch.randn(6, 8, KV_HEADS, 16, generator=gen).to(DEVICE)
    vc = torch.randn(6, 8, KV_HEADS, 16, generator=gen).to(DEVICE)
    q = torch.randn(5, HEADS, 16, generator=gen).to(DEVICE)
    alibi = slopes(gen)
    out = batch.attention(q, kc, vc, alibi_slopes=alibi)
    decode = dispatched_paged_attention(q[:1], kc, vc, batch.decode_tables, batch.decode_cu_q, batch.decode_seqlens,
                                        True, max_seqlen_q=1, alibi_slopes=alibi)
    prefill = dispatched_paged_attention(q[1:], kc, vc, batch.prefill_tables, batch.prefill_cu_q,
                                         batch.prefill_seqlens, True, max_seqlen_q=4, alibi_slopes=alibi)
    torch.testing.assert_close(out, torch.cat([decode, prefill]), atol=0, rtol=0)
    assert (out - batch.attention(q, kc, vc)).abs().max() > 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("splits", [None, 16])
def test_gpu_bf16_decode_and_chunk_bloom_7b1_shape(splits):
    """BLOOM-7B1's attention (32 heads of 128, one per KV head) with its own slopes: bf16 decode
    rows against long caches (16 splits: a captured graph's fixed count; None: the kernel's
    choice) and a 200-token prompt chunk after 1,000 cached keys, against the fp32 reference."""
    from tritonformer.backend.models.bloom import alibi_slopes

    lk = [4000, 300, 129, 1, 2048]
    q, kc, vc, bt, cq, sk, _ = paged([1] * len(lk), lk, 128, 16, seed=10, heads=32, kv_heads=32, dtype=torch.bfloat16)
    alibi = torch.tensor(alibi_slopes(32), device=DEVICE)
    out = paged_attention(q, kc, vc, bt, cq, sk, True, max_seqlen_q=1, num_splits=splits, alibi_slopes=alibi)
    expected = ref.paged_attention(q.float(), kc.float(), vc.float(), bt, cq, sk, True, alibi_slopes=alibi)
    torch.testing.assert_close(out.float(), expected, atol=1.6e-2, rtol=1.6e-2)
    without = ref.paged_attention(q.float(), kc.float(), vc.float(), bt, cq, sk, True)
    assert (expected - without).abs().max() > 0.05
    q, kc, vc, bt, cq, sk, _ = paged([200], [1200], 128, 16, seed=11, heads=32, kv_heads=32, dtype=torch.bfloat16)
    out = paged_attention(q, kc, vc, bt, cq, sk, True, max_seqlen_q=200, alibi_slopes=alibi)
    expected = ref.paged_attention(q.float(), kc.float(), vc.float(), bt, cq, sk, True, alibi_slopes=alibi)
    torch.testing.assert_close(out.float(), expected, atol=1.6e-2, rtol=1.6e-2)
