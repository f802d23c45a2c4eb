"""Attention over a paged KV cache: the Triton kernel against `reference.paged_attention`, and
the reference against plain `varlen_attention` on the same keys gathered contiguously.

Block tables are random permutations of the pool, so a kernel that ignored the table (or read
a neighbour's block) would fail. Tiny shapes run in Triton's CPU interpreter; the `gpu` group
runs serving-sized ones.
"""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def paged_case(lq, lk, heads, kv_heads, head_dim, block_size, dtype, seed):
    """Random q, a random pool with each sequence's keys scattered over random blocks, and the
    same keys packed contiguously (what varlen_attention takes)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_each = [-(-n // block_size) for n in lk]
    num_blocks = sum(blocks_each) + 3  # a few blocks no sequence owns
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_each + [1])
    tables = torch.zeros(len(lk), width, dtype=torch.int32)
    for i, nb in enumerate(blocks_each):
        tables[i, :nb] = torch.tensor(order[:nb], dtype=torch.int32)
        order = order[nb:]

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    k_cache = rand(num_blocks, block_size, kv_heads, head_dim)
    v_cache = rand(num_blocks, block_size, kv_heads, head_dim)
    q = rand(sum(lq), heads, head_dim)
    packed_k = torch.cat([k_cache[tables[i, : blocks_each[i]].long()].flatten(0, 1)[:n] for i, n in enumerate(lk)])
    packed_v = torch.cat([v_cache[tables[i, : blocks_each[i]].long()].flatten(0, 1)[:n] for i, n in enumerate(lk)])
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32)
    seqlens = torch.tensor(lk, dtype=torch.int32)
    to = lambda *ts: [t.to(DEVICE) for t in ts]  # noqa: E731
    return to(q, k_cache, v_cache, tables, cu_q, seqlens, packed_k, packed_v, cu_k)


def test_reference_equals_varlen_on_gathered_keys():
    q, kc, vc, bt, cq, sk, pk, pv, ck = paged_case([3, 1, 5], [7, 20, 5], 4, 2, 16, 4, torch.float32, seed=1)
    out = ref.paged_attention(q, kc, vc, bt, cq, sk, causal=True)
    torch.testing.assert_close(out, ref.varlen_attention(q, pk, pv, cq, ck, causal=True), atol=0, rtol=0)


def test_write_kv_puts_each_token_in_its_slot():
    gen = torch.Generator().manual_seed(2)
    kc, vc = torch.randn(6, 4, 2, 8, generator=gen), torch.randn(6, 4, 2, 8, generator=gen)
    k, v = torch.randn(3, 2, 8, generator=gen), torch.randn(3, 2, 8, generator=gen)
    slots = torch.tensor([21, 2, 8])  # block 5 offset 1, block 0 offset 2, block 2 offset 0
    before = kc.clone()
    ref.write_kv(kc, vc, k, v, slots)
    assert torch.equal(kc[5, 1], k[0]) and torch.equal(kc[0, 2], k[1]) and torch.equal(kc[2, 0], k[2])
    assert torch.equal(vc[5, 1], v[0]) and torch.equal(vc[2, 0], v[2])
    untouched = torch.ones(6 * 4, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(kc.view(24, 2, 8)[untouched], before.view(24, 2, 8)[untouched])


triton_needed = pytest.mark.skipif(
    DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1", reason="no GPU and no Triton interpreter"
)


def check_kernel(lq, lk, heads, kv_heads, head_dim, block_size, dtype, seed, causal=True, window=None, softcap=None,
                 chunk=None, **kwargs):
    pytest.importorskip("triton")
    from tritonformer.kernels.triton_attention import paged_attention

    q, kc, vc, bt, cq, sk, *_ = paged_case(lq, lk, heads, kv_heads, head_dim, block_size, dtype, seed)
    options = dict(window=window, softcap=softcap, **({"chunk": chunk} if chunk is not None else {}))
    out = paged_attention(q, kc, vc, bt, cq, sk, causal, max_seqlen_q=max(lq), **options, **kwargs)
    expected = ref.paged_attention(q, kc, vc, bt, cq, sk, causal, max_seqlen_q=max(lq), **options)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


@triton_needed
@pytest.mark.parametrize("block_size", [4, 16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_kernel_decode_rows(block_size, heads, kv_heads):
    check_kernel([1, 1, 1], [37, 1, 20], heads, kv_heads, 32, block_size, torch.float32, seed=3)


@triton_needed
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_prefill_chunks_after_cached_keys(causal):
    check_kernel([5, 17, 1], [12, 17, 9], 4, 2, 16, 8, torch.float32, seed=4, causal=causal)


@triton_needed
@pytest.mark.parametrize("splits", [2, 4])
def test_kernel_fixed_key_splits(splits):
    """A fixed split count (what a captured CUDA graph uses), even where splits are empty."""
    check_kernel([1, 1, 1, 1], [40, 3, 0, 18], 4, 1, 16, 8, torch.float32, seed=5, num_splits=splits)


@triton_needed
@pytest.mark.parametrize("splits", [3, 0])
def test_a_fixed_split_count_must_be_a_power_of_two(splits):
    """The combine kernel ranges over the splits: 3 is refused by name, not by the compiler."""
    with pytest.raises(ValueError, match="num_splits must be a power of two"):
        check_kernel([1, 1], [40, 3], 4, 1, 16, 8, torch.float32, seed=5, num_splits=splits)


@pytest.mark.parametrize("window,softcap", [(3, None), (6, 2.0), (50, None)])
def test_reference_window_softcap_equal_varlen_on_gathered_keys(window, softcap):
    q, kc, vc, bt, cq, sk, pk, pv, ck = paged_case([3, 1, 5], [7, 20, 5], 4, 2, 16, 4, torch.float32, seed=11)
    out = ref.paged_attention(q, kc, vc, bt, cq, sk, True, window=window, softcap=softcap)
    expected = ref.varlen_attention(q, pk, pv, cq, ck, True, window=window, softcap=softcap)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


@triton_needed
@pytest.mark.parametrize("window,block_size,heads,kv_heads", [
    (1, 4, 4, 4),  # the query's own key only
    (3, 8, 4, 2),  # narrower than a cache block
    (13, 4, 4, 1),  # crossing cache blocks and the kernel's 16-key blocks
    (100, 16, 4, 2),  # wider than every sequence
])
def test_kernel_window_decode_and_chunks(window, block_size, heads, kv_heads):
    """Decode rows (Lq = 1), a prefill chunk after cached keys (Lq < Lk) and a whole prompt."""
    check_kernel([1, 1, 6, 9], [37, 2, 29, 9], heads, kv_heads, 32, block_size, torch.float32, seed=12, window=window)


@triton_needed
@pytest.mark.parametrize("splits,window", [(2, 5), (4, 24)])
def test_kernel_window_fixed_key_splits(splits, window):
    """A captured decode graph's fixed split count, splitting only the window's keys."""
    check_kernel([1, 1, 1, 1], [60, 3, 0, 18], 4, 1, 16, 8, torch.float32, seed=13, num_splits=splits, window=window)


@triton_needed
def test_kernel_window_never_reads_blocks_before_it():
    """Cache blocks wholly before the first 16-key kernel block any query of the sequence sees
    hold NaN: a kernel that visited them at all (even masked: 0 * NaN in P @ V) would return
    NaN. With splits, only the visible range is split."""
    pytest.importorskip("triton")
    from tritonformer.kernels.triton_attention import paged_attention

    window, lq, lk, page = 5, [1, 4], [70, 40], 8
    q, kc, vc, bt, cq, sk, *_ = paged_case(lq, lk, 4, 2, 16, page, torch.float32, seed=14)
    expected = ref.paged_attention(q, kc, vc, bt, cq, sk, True, window=window)
    kc, vc = kc.clone(), vc.clone()
    for i, (a, b) in enumerate(zip(lq, lk)):
        first = max(b - a - window + 1, 0) // 16 * 16
        assert first >= 2 * page  # something is poisoned
        kc[bt[i, : first // page].long()] = float("nan")
        vc[bt[i, : first // page].long()] = float("nan")
    for splits in (1, 2):
        out = paged_attention(q, kc, vc, bt, cq, sk, True, window=window, num_splits=splits)
        atol, rtol = TOL[torch.float32]
        torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


@triton_needed
@pytest.mark.parametrize("window", [None, 7])
def test_kernel_softcap(window):
    check_kernel([1, 5, 1], [30, 12, 9], 4, 2, 16, 8, torch.float32, seed=15, window=window, softcap=2.0)


@triton_needed
@pytest.mark.parametrize("splits", [None, 2])
def test_kernel_head_dim_96_cache(splits):
    """Phi-3's head dim in a paged cache (96-wide rows, a 128-wide tile), with a window."""
    check_kernel([1, 1, 5], [33, 7, 20], 4, 2, 96, 8, torch.float32, seed=16, num_splits=splits, window=11)


@triton_needed
def test_kernel_window_softcap_fp16():
    check_kernel([1, 6], [40, 21], 4, 1, 32, 16, torch.float16, seed=17, window=9, softcap=5.0)


@triton_needed
def test_kernel_is_dispatched_for_the_paged_op():
    pytest.importorskip("triton")
    from tritonformer.kernels import dispatch, triton_attention

    dispatch.load_kernels()
    assert dispatch._KERNELS["paged_attention"] is triton_attention.paged_attention


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim,heads,kv_heads", [(64, 12, 12), (64, 32, 8), (128, 32, 8)])
def test_gpu_serving_step(dtype, head_dim, heads, kv_heads):
    gen = torch.Generator().manual_seed(6)
    lk = torch.randint(1, 3000, (63,), generator=gen).tolist() + [4096]
    check_kernel([1] * 63 + [512], lk, heads, kv_heads, head_dim, 16, dtype, seed=7)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("splits", [None, 8, 32])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])  # 96 to 256 with GQA: split decodes in 64-key blocks
def test_gpu_few_long_decodes(splits, head_dim):
    check_kernel([1, 1], [8000, 77], 32, 8, head_dim, 16, torch.float16, seed=8, num_splits=splits)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("splits", [16, 32])
@pytest.mark.parametrize("window", [None, 2047])
def test_gpu_few_long_decodes_without_gqa(splits, window):
    """Phi-3's 32 KV heads of head dim 96 (group 1): split decodes in 32-key blocks."""
    check_kernel([1, 1, 1], [8000, 130, 3], 32, 32, 96, 16, torch.bfloat16, seed=10, num_splits=splits,
                 window=window)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_few_long_decodes_window_softcap():
    check_kernel([1, 1, 1], [9000, 4100, 5], 16, 8, 256, 16, torch.bfloat16, seed=9, num_splits=32, window=4096,
                 softcap=50.0)


@triton_needed
@pytest.mark.parametrize("block_n,splits", [(64, 4), (64, 32), (32, 16)])
def test_kernel_split_decode_in_key_blocks_of_the_gpu(block_n, splits, monkeypatch):
    """The GPU's split-decode configurations (64-key blocks with GQA, 32-key blocks without; a
    sequence shorter than the splits' blocks leaves splits with no key) in the interpreter,
    where the launch would otherwise keep its small tiles."""
    pytest.importorskip("triton")
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_split_decode_config", lambda *args: (block_n, 4, 1))
    check_kernel([1, 1, 1, 1], [200, 3, 0, 70], 4, 2, 16, 8, torch.float32, seed=20, num_splits=splits)
    check_kernel([1, 1], [150, 64], 4, 1, 16, 8, torch.float32, seed=21, num_splits=splits, window=40)
    check_kernel([1, 1], [130, 9], 2, 1, 96, 16, torch.float32, seed=22, num_splits=splits, softcap=30.0)
    check_kernel([1, 1], [300, 40], 2, 2, 96, 16, torch.float32, seed=23, num_splits=splits)  # no GQA (Phi-3)


def test_split_decode_blocks_follow_the_gqa_group():
    from tritonformer.kernels.triton_attention import _split_decode_config

    unsplit = (16, 2, 3)
    assert _split_decode_config(128, torch.bfloat16, True, unsplit, group=1) == (32, 4, 1)
    assert _split_decode_config(128, torch.float16, True, unsplit, group=4) == (64, 4, 1)
    assert _split_decode_config(256, torch.bfloat16, True, unsplit, group=2) == (64, 4, 1)
    assert _split_decode_config(64, torch.float16, True, unsplit, group=1) == unsplit  # the decode row's own
    assert _split_decode_config(128, torch.float32, True, unsplit, group=1) == unsplit
    assert _split_decode_config(128, torch.float16, False, unsplit, group=1) == unsplit


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim,heads,kv_heads,window,softcap", [
    (128, 32, 8, 4096, None),  # Mistral 7B
    (128, 28, 4, 1000, None),  # Qwen2 7B's GQA under a short window
    (256, 8, 4, 4096, 50.0),  # Gemma 2 2B
    (256, 16, 8, 1024, None),  # Gemma 3's local layers (4B: 8 heads / 4 kv heads, a 1024 window)
    (96, 32, 32, None, None),  # Phi-3 mini
    (96, 32, 32, 2047, None),  # Phi-3 with its sliding window
])
def test_gpu_serving_step_window_softcap(dtype, head_dim, heads, kv_heads, window, softcap):
    gen = torch.Generator().manual_seed(18)
    lk = torch.randint(1, 9000, (63,), generator=gen).tolist() + [8192]
    check_kernel([1] * 63 + [512], lk, heads, kv_heads, head_dim, 16, dtype, seed=19, window=window, softcap=softcap)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("splits", [None, 8])
@pytest.mark.parametrize("head_dim", [96, 256])
def test_gpu_few_long_decodes_window(splits, head_dim):
    check_kernel([1, 1], [32000, 77], 16, 8, head_dim, 16, torch.bfloat16, seed=20, num_splits=splits, window=4096,
                 softcap=50.0)


def _qkv_case(tokens, heads, kv_heads, head_dim, rotary, bias, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    width = (heads + 2 * kv_heads) * head_dim
    qkv = torch.randn(tokens, width, generator=gen).to(dtype)
    b = torch.randn(width, generator=gen).to(dtype) if bias else None
    cos = sin = None
    if rotary:
        cos, sin = ref.rotary_cos_sin(torch.randint(0, 500, (tokens,), generator=gen), head_dim, 10000.0)
    k_cache = torch.randn(6, 8, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(6, 8, kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(48, generator=gen)[:tokens]
    to = lambda t: t.to(DEVICE) if t is not None else None  # noqa: E731
    return [to(t) for t in (qkv, b, cos, sin, k_cache, v_cache, slots)]


@triton_needed
@pytest.mark.parametrize("rotary,bias", [(True, False), (False, True), (True, True)])
def test_qkv_to_cache_kernel_matches_reference(rotary, bias):
    """Split (+ bias, + rotary) with k and v written straight into their cache slots."""
    pytest.importorskip("triton")
    from tritonformer.kernels.triton_elementwise import qkv_to_cache

    heads, kv_heads, head_dim = 4, 2, 16
    qkv, b, cos, sin, kc, vc, slots = _qkv_case(7, heads, kv_heads, head_dim, rotary, bias, torch.float32, seed=9)
    kc2, vc2 = kc.clone(), vc.clone()
    q = qkv_to_cache(qkv, b, heads, kv_heads, head_dim, cos, sin, kc, vc, slots)
    q_ref = ref.qkv_to_cache(qkv, b, heads, kv_heads, head_dim, cos, sin, kc2, vc2, slots)
    torch.testing.assert_close(q, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kc, kc2, atol=1e-5, rtol=1e-5)  # written slots and untouched ones
    torch.testing.assert_close(vc, vc2, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_qkv_to_cache_llama_shape(dtype):
    from tritonformer.kernels.triton_elementwise import qkv_to_cache

    qkv, b, cos, sin, kc, vc, slots = _qkv_case(40, 32, 8, 64, True, False, dtype, seed=10)
    kc2, vc2 = kc.clone(), vc.clone()
    q = qkv_to_cache(qkv, b, 32, 8, 64, cos, sin, kc, vc, slots)
    q_ref = ref.qkv_to_cache(qkv, b, 32, 8, 64, cos, sin, kc2, vc2, slots)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(q, q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(kc, kc2, atol=atol, rtol=rtol)
    torch.testing.assert_close(vc, vc2, atol=atol, rtol=rtol)


def _chunk_mask(lq: int, lk: int, chunk: int) -> torch.Tensor:
    """[lq, lk]: whether query j (at position lk - lq + j) sees key k, written from Hugging Face's
    chunked rule: same chunk (k // chunk == p // chunk) and causal."""
    p = torch.arange(lk - lq, lk, device=DEVICE)[:, None]
    k = torch.arange(lk, device=DEVICE)[None, :]
    return (k // chunk == p // chunk) & (k <= p)


def test_reference_chunk_is_attention_inside_each_query_chunk():
    """The reference's chunked attention against plain softmax attention under Hugging Face's mask,
    on sequences crossing chunk boundaries (decode rows and a prefill chunk after cached keys)."""
    lq, lk, chunk = [1, 6, 9], [37, 29, 9], 8
    q, kc, vc, bt, cq, sk, pk, pv, ck = paged_case(lq, lk, 4, 2, 16, 4, torch.float32, seed=21)
    out = ref.paged_attention(q, kc, vc, bt, cq, sk, True, chunk=chunk)
    for i, (a, b) in enumerate(zip(lq, lk)):
        qs = q[cq[i]:cq[i + 1]].transpose(0, 1)
        ks = pk[ck[i]:ck[i + 1]].transpose(0, 1).repeat_interleave(2, 0)
        vs = pv[ck[i]:ck[i + 1]].transpose(0, 1).repeat_interleave(2, 0)
        s = (qs @ ks.transpose(-1, -2) * 16 ** -0.5).masked_fill(~_chunk_mask(a, b, chunk), float("-inf"))
        torch.testing.assert_close(out[cq[i]:cq[i + 1]], (torch.softmax(s, -1) @ vs).transpose(0, 1),
                                   atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, ref.paged_attention(q, kc, vc, bt, cq, sk, True), atol=1e-3)  # (the chunk matters)


@pytest.mark.parametrize("changes,named", [({"chunk": 0}, "chunk must be a positive integer"),
                                           ({"chunk": 8, "window": 4}, "no sliding window"),
                                           ({"chunk": 8, "causal": False}, "is causal")])
def test_chunk_options_are_checked_by_name(changes, named):
    q, kc, vc, bt, cq, sk, *_ = paged_case([1], [9], 4, 2, 16, 4, torch.float32, seed=22)
    options = {"causal": True, **changes}
    with pytest.raises(ValueError, match=named):
        ref.paged_attention(q, kc, vc, bt, cq, sk, **options)


@triton_needed
@pytest.mark.parametrize("chunk,block_size,heads,kv_heads", [
    (1, 4, 4, 4),  # the query's own key only
    (8, 4, 4, 2),  # chunks narrower than the kernel's 16-key blocks
    (16, 8, 4, 1),  # chunks of one kernel block, the prompt crossing two boundaries
    (20, 16, 4, 2),  # chunk edges inside kernel blocks
    (100, 16, 4, 2),  # one chunk covering every sequence
])
def test_kernel_chunk_decode_and_prefill(chunk, block_size, heads, kv_heads):
    """Chunked attention in the kernel against the reference on fresh random inputs: decode rows
    (Lq = 1), a prefill chunk after cached keys (Lq < Lk) and a whole prompt, each across a chunk
    boundary."""
    check_kernel([1, 1, 6, 9, 33], [37, 2, 29, 9, 40], heads, kv_heads, 32, block_size, torch.float32,
                 seed=23 + chunk, chunk=chunk)


@triton_needed
@pytest.mark.parametrize("splits,chunk", [(2, 5), (4, 24), (2, 16)])
def test_kernel_chunk_fixed_key_splits(splits, chunk):
    """The split-key decode path (a captured graph's fixed split count) over the query's chunk only."""
    pytest.importorskip("triton")
    from tritonformer.kernels.triton_attention import paged_attention

    q, kc, vc, bt, cq, sk, *_ = paged_case([1, 1, 1, 1], [60, 3, 0, 18], 4, 1, 16, 8, torch.float32, seed=24)
    out = paged_attention(q, kc, vc, bt, cq, sk, True, max_seqlen_q=1, num_splits=splits, chunk=chunk)
    torch.testing.assert_close(out, ref.paged_attention(q, kc, vc, bt, cq, sk, True, chunk=chunk),
                               atol=TOL[torch.float32][0], rtol=TOL[torch.float32][1])


@triton_needed
def test_kernel_chunk_never_reads_blocks_before_the_query_chunk():
    """Cache blocks wholly before the 16-key kernel block holding the first query's chunk start hold
    NaN: a kernel that visited them (even masked) would return NaN; with splits too."""
    pytest.importorskip("triton")
    from tritonformer.kernels.triton_attention import paged_attention

    chunk, lq, lk, page = 32, [1, 4], [70, 45], 8
    q, kc, vc, bt, cq, sk, *_ = paged_case(lq, lk, 4, 2, 16, page, torch.float32, seed=25)
    expected = ref.paged_attention(q, kc, vc, bt, cq, sk, True, chunk=chunk)
    kc, vc = kc.clone(), vc.clone()
    for i, (a, b) in enumerate(zip(lq, lk)):
        first = (b - a) // chunk * chunk // 16 * 16
        assert first >= 2 * page  # something is poisoned
        kc[bt[i, : first // page].long()] = float("nan")
        vc[bt[i, : first // page].long()] = float("nan")
    for splits in (1, 2):
        out = paged_attention(q, kc, vc, bt, cq, sk, True, chunk=chunk, num_splits=splits)
        torch.testing.assert_close(out, expected, atol=TOL[torch.float32][0], rtol=TOL[torch.float32][1])


@triton_needed
def test_kernel_chunk_on_contiguous_keys():
    """varlen_attention's entry point (keys packed, no cache) takes the chunk too."""
    pytest.importorskip("triton")
    from tritonformer.kernels.triton_attention import varlen_attention

    lq, lk, chunk = [1, 6, 21], [37, 29, 21], 8
    q, *_, pk, pv, ck = paged_case(lq, lk, 4, 2, 32, 8, torch.float32, seed=26)
    cq = torch.tensor([0, 1, 7, 28], dtype=torch.int32, device=q.device)
    out = varlen_attention(q, pk, pv, cq, ck, True, max_seqlen_q=max(lq), chunk=chunk)
    torch.testing.assert_close(out, ref.varlen_attention(q, pk, pv, cq, ck, True, chunk=chunk),
                               atol=TOL[torch.float32][0], rtol=TOL[torch.float32][1])
