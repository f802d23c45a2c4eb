"""The Triton varlen flash-attention kernel against `reference.varlen_attention`.

Fresh seeded random inputs every time. Without a GPU the kernel runs in Triton's CPU
interpreter (TRITON_INTERPRET=1, set before triton is imported), so those shapes are tiny;
the `gpu` group runs serving-sized shapes on CUDA.
"""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernel cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels.triton_attention import varlen_attention  # noqa: E402

# (atol, rtol) against the fp32 reference; fp16/bf16 round P to the input dtype before P @ V.
TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def cu(lengths: list[int]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=DEVICE)


def make(lq, lk, heads, kv_heads, head_dim, dtype, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)

    q = rand(sum(lq), heads, head_dim)
    k = rand(sum(lk), kv_heads, head_dim)
    v = rand(sum(lk), kv_heads, head_dim)
    return q, k, v, cu(lq), cu(lk)


def check(q, k, v, cq, ck, causal, **kwargs):
    out = varlen_attention(q, k, v, cq, ck, causal, **kwargs)
    expected = ref.varlen_attention(q, k, v, cq, ck, causal, **kwargs)
    assert out.dtype == q.dtype and out.shape == q.shape
    atol, rtol = TOL[q.dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    return out


# ---------------------------------------------------------------- tiny (interpreter) shapes

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("head_dim", [32, 64])
def test_prefill_fp32(causal, heads, kv_heads, head_dim):
    lengths = [1, 5, 17, 33]
    check(*make(lengths, lengths, heads, kv_heads, head_dim, torch.float32, seed=head_dim + heads * kv_heads), causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_half(dtype, causal):
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("Triton's CPU interpreter computes bf16 tl.dot wrongly (bf16 is held as uint16); bf16 runs in the gpu group")
    lengths = [33, 5, 17]
    check(*make(lengths, lengths, 4, 2, 32, dtype, seed=1), causal)


@pytest.mark.parametrize("causal", [False, True])
def test_decode_against_cache(causal):
    """One query per sequence against a longer cache (Lq == 1 < Lk), GQA."""
    check(*make([1, 1, 1], [20, 1, 37], 4, 1, 32, torch.float32, seed=2), causal)


@pytest.mark.parametrize("causal", [False, True])
def test_chunked_prefill(causal):
    """Query chunks aligned to the end of their keys (Lq < Lk), crossing block edges."""
    check(*make([7, 17, 3], [30, 40, 3], 4, 2, 32, torch.float32, seed=3), causal)


def test_chunked_prefill_fp16_head_dim_64():
    check(*make([7, 20], [30, 20], 4, 4, 64, torch.float16, seed=4), True)


@pytest.mark.parametrize("causal", [False, True])
def test_empty_sequence_in_batch(causal):
    check(*make([0, 5, 0, 18], [4, 5, 0, 30], 4, 2, 32, torch.float32, seed=5), causal)


@pytest.mark.parametrize("causal", [False, True])
def test_no_queries_at_all(causal):
    q, k, v, cq, ck = make([0, 0], [3, 6], 4, 2, 32, torch.float32, seed=6)
    out = varlen_attention(q, k, v, cq, ck, causal)
    assert out.shape == (0, 4, 32)
    q, k, v, cq, ck = make([], [], 4, 2, 32, torch.float32, seed=6)
    assert varlen_attention(q, k, v, cq, ck, causal).shape == (0, 4, 32)


def test_strided_views_of_packed_qkv_scale_and_max_seqlen():
    """q/k/v as column slices of one packed QKV projection, explicit scale and max_seqlen_q."""
    heads, kv_heads, head_dim, lengths = 4, 2, 32, [9, 21]
    gen = torch.Generator(device="cpu").manual_seed(7)
    qkv = torch.randn(sum(lengths), (heads + 2 * kv_heads) * head_dim, generator=gen).to(DEVICE)
    q, k, v = ref.qkv_split(qkv, None, heads, kv_heads, head_dim)
    assert not q.is_contiguous() and not k.is_contiguous()
    check(q, k, v, cu(lengths), cu(lengths), True, scale=0.3, max_seqlen_q=21)


H100_SHARED_MEMORY = 232_448  # bytes per block (the compiler's "Hardware limit")


@pytest.mark.parametrize("hopper", [False, True])
def test_every_gpu_tile_fits_shared_memory(hopper):
    """The Q tile plus `stages` K and V tiles of every GPU launch configuration fit the H100's
    shared memory. (The compiler asked 262,144 bytes for 128 x 64 blocks of head dim 256 in 3
    stages, exactly this sum, and refused them; 2 stages pass.)"""
    from tritonformer.kernels import triton_attention

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for head_dim in (32, 64, 128, 256):
            for rows in (1, 4, 16, 17, 100, 512, 513, 1024, 1025, 2048, 2049, 12000, 65536):
                m, n, _, stages = triton_attention._launch_config(head_dim, dtype, rows, True, hopper)
                need = (m + 2 * stages * n) * head_dim * dtype.itemsize
                assert need <= H100_SHARED_MEMORY, (dtype, head_dim, rows, (m, n, stages), need)


@pytest.mark.parametrize("block_m,block_n", [(32, 16), (16, 32)])
def test_other_block_shapes(monkeypatch, block_m, block_n):
    """The causal block bounds with BLOCK_M != BLOCK_N (as on the GPU: 128 x 64)."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_launch_config", lambda *a: (block_m, block_n, 4, 1))
    check(*make([7, 40, 33, 1], [30, 40, 50, 9], 4, 2, 32, torch.float32, seed=15), True)


@pytest.mark.parametrize("splits", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_split_keys(monkeypatch, splits, causal):
    """Flash-decoding path: keys split across programs, partial results combined. Lengths
    leave some splits with no keys (Lk = 1) and cross split edges; includes an empty query
    sequence and a short chunk (Lq = 3 < Lk)."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_num_splits", lambda *a: splits)
    check(*make([1, 1, 0, 3, 1], [70, 1, 5, 50, 33], 4, 2, 32, torch.float32, seed=17), causal)


@pytest.mark.parametrize("causal", [False, True])
def test_group_of_three(causal):
    """A GQA group that is not a power of two (SmolLM2: 9 heads over 3 kv heads)."""
    check(*make([7, 17, 1], [30, 17, 12], 6, 2, 32, torch.float32, seed=16), causal)


@pytest.mark.parametrize("head_dim", [8, 640])
def test_rejects_bad_head_dim(head_dim):
    q, k, v, cq, ck = make([3], [3], 2, 1, head_dim, torch.float32)
    with pytest.raises(AssertionError, match=r"head_dim in \[16, 512\]"):
        varlen_attention(q, k, v, cq, ck, False)


# ---------------------------------------------------------------- sliding window, soft-capping, head dims

# Batches mixing decode (Lq = 1 < Lk), chunked prefill (Lq < Lk) and prefill (Lq == Lk) rows, with
# lengths that cross the interpreter's 16-key blocks.
WINDOW_LQ, WINDOW_LK = [1, 7, 21], [40, 30, 21]


@pytest.mark.parametrize("window,heads,kv_heads", [
    (1, 4, 4),  # only the query's own key
    (5, 4, 2),  # narrower than a block
    (16, 4, 1),  # exactly one block
    (21, 4, 2),  # crossing block edges
    (200, 4, 4),  # wider than every sequence
])
def test_window_fp32(window, heads, kv_heads):
    check(*make(WINDOW_LQ, WINDOW_LK, heads, kv_heads, 32, torch.float32, seed=40 + window), True, window=window)


@pytest.mark.parametrize("block_m,block_n,window", [(32, 16, 3), (16, 32, 3), (32, 16, 20)])
def test_window_other_block_shapes(monkeypatch, block_m, block_n, window):
    """The window's block bounds with BLOCK_M != BLOCK_N, including a window narrower than a
    query block (its lower edge and the diagonal cut the same blocks)."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_launch_config", lambda *a: (block_m, block_n, 4, 1))
    check(*make([7, 40, 1], [30, 40, 50], 4, 2, 32, torch.float32, seed=41), True, window=window)


@pytest.mark.parametrize("splits,window", [(2, 6), (4, 33)])
def test_window_split_keys(monkeypatch, splits, window):
    """Flash-decoding splits of the visible range only: decode rows against caches longer than
    the window, a chunk, a sequence shorter than the window and one with a single key."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_num_splits", lambda *a: splits)
    check(*make([1, 1, 3, 1], [70, 1, 50, 20], 4, 2, 32, torch.float32, seed=42), True, window=window)


@pytest.mark.parametrize("splits", [1, 2])
def test_window_covering_every_key_changes_nothing(monkeypatch, splits):
    """A window at least as long as every sequence gives bit for bit the windowless result."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_num_splits", lambda *a: splits)
    q, k, v, cq, ck = make([1, 5], [40, 21], 4, 2, 32, torch.float32, seed=43)
    plain = varlen_attention(q, k, v, cq, ck, True)
    for window in (40, 10**9):
        torch.testing.assert_close(varlen_attention(q, k, v, cq, ck, True, window=window), plain, atol=0, rtol=0)


def test_window_needs_a_positive_size():
    q, k, v, cq, ck = make([3], [3], 2, 1, 16, torch.float32)
    for fn in (varlen_attention, ref.varlen_attention):
        for causal in (False, True):
            with pytest.raises(ValueError, match="window"):
                fn(q, k, v, cq, ck, causal, window=0)
            with pytest.raises(ValueError, match="window"):
                fn(q, k, v, cq, ck, causal, window=2.5)
        with pytest.raises(ValueError, match="softcap"):
            fn(q, k, v, cq, ck, True, softcap=0.0)


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 9)])
def test_softcap_fp32(causal, window):
    """Scores capped by softcap * tanh(score / softcap) before masking (Gemma 2: 50; a small cap
    here so that tanh bends), with an explicit scale."""
    q, k, v, cq, ck = make(WINDOW_LQ, WINDOW_LK, 4, 2, 32, torch.float32, seed=44)
    check(q * 3, k, v, cq, ck, causal, scale=0.2, window=window, softcap=2.5)


@pytest.mark.parametrize("window,softcap", [(5, None), (None, 4.0), (12, 4.0)])
def test_window_softcap_fp16(window, softcap):
    check(*make(WINDOW_LQ, WINDOW_LK, 4, 2, 32, torch.float16, seed=45), True, window=window, softcap=softcap)


@pytest.mark.parametrize("head_dim", [96, 80])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_not_a_power_of_two(head_dim, causal):
    """Phi-3's 96 (and 80) run in a 128-wide tile with the extra lanes masked."""
    check(*make([1, 5, 19], [20, 5, 19], 4, 2, head_dim, torch.float32, seed=head_dim), causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_head_dim_96_half_with_window_and_softcap(dtype):
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("Triton's CPU interpreter computes bf16 tl.dot wrongly (bf16 is held as uint16); bf16 runs in the gpu group")
    check(*make([1, 9], [30, 20], 4, 4, 96, dtype, seed=46), True, window=7, softcap=5.0)


@pytest.mark.parametrize("splits", [1, 2])
def test_padded_head_dim_lanes_are_never_written(monkeypatch, splits):
    """`out` a [..., :96] view of a wider buffer: the lanes past 96 keep what they held, with
    and without the split-keys combine."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_num_splits", lambda *a: splits)
    q, k, v, cq, ck = make([1, 1, 4], [37, 5, 20], 4, 2, 96, torch.float32, seed=47)
    wide = torch.full((q.shape[0], 4, 128), 7.0, device=DEVICE)
    out = wide[..., :96]
    assert varlen_attention(q, k, v, cq, ck, True, out=out, window=9) is out
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(out, ref.varlen_attention(q, k, v, cq, ck, True, window=9), atol=atol, rtol=rtol)
    assert torch.all(wide[..., 96:] == 7.0)


def test_registered_for_dispatch():
    assert dispatch._KERNELS["varlen_attention"] is varlen_attention


@pytest.mark.parametrize("splits", [1, 2])
def test_window_never_reads_keys_before_its_first_block(monkeypatch, splits):
    """Keys and values in blocks wholly before every query's window are NaN: a kernel that
    visited them at all (even masked: 0 * NaN in P @ V) would return NaN. With splits, only the
    visible range is split. Interpreter blocks are 16 keys."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_num_splits", lambda *a: splits)
    window, lq, lk = 6, [1, 7, 1], [70, 50, 3]
    q, k, v, cq, ck = make(lq, lk, 4, 2, 32, torch.float32, seed=48)
    expected = ref.varlen_attention(q, k, v, cq, ck, True, window=window)
    # first key any query of the sequence sees: position Lk - Lq - window + 1, rounded down to a block
    first_block = [max(b - a - window + 1, 0) // 16 * 16 for a, b in zip(lq, lk)]
    k, v = k.clone(), v.clone()
    for start, first in zip(ck[:-1].tolist(), first_block):
        k[start : start + first] = float("nan")
        v[start : start + first] = float("nan")
    assert first_block[0] == 64 and first_block[1] == 32  # something is poisoned
    out = varlen_attention(q, k, v, cq, ck, True, window=window)
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


# ---------------------------------------------------------------- symmetric window (ModernBERT's local attention)

def _symmetric_mask_attention(q, k, v, lengths, window):
    """An independent formulation for equal-length q/k: per sequence, scores masked to
    |i - j| <= window // 2 with an explicit -inf matrix and a plain softmax, in float64."""
    out, start = [], 0
    for n in lengths:
        qs, ks, vs = (t[start : start + n].double().transpose(0, 1) for t in (q, k, v))
        group = qs.shape[0] // ks.shape[0]
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        i = torch.arange(n, device=q.device)
        banned = (i[:, None] - i[None, :]).abs() > window // 2
        scores = (qs @ ks.transpose(1, 2)) / qs.shape[-1] ** 0.5
        out.append((torch.softmax(scores.masked_fill(banned, float("-inf")), -1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out).to(q.dtype)


def test_reference_symmetric_window_is_the_banded_mask():
    """The reference's symmetric window against an explicit band mask (odd and even windows, a
    window of 1: each token sees only itself, one wider than every sequence: plain attention)."""
    lengths = [1, 9, 40]
    q, k, v, cq, ck = make(lengths, lengths, 4, 2, 16, torch.float32, seed=60)
    for window in (1, 6, 7, 128):
        torch.testing.assert_close(ref.varlen_attention(q, k, v, cq, ck, False, window=window),
                                   _symmetric_mask_attention(q, k, v, lengths, window), atol=1e-5, rtol=1e-5)
    plain = ref.varlen_attention(q, k, v, cq, ck, False)
    torch.testing.assert_close(ref.varlen_attention(q, k, v, cq, ck, False, window=128), plain, atol=1e-6, rtol=1e-6)
    only_self = ref.varlen_attention(q, k, v, cq, ck, False, window=1)
    torch.testing.assert_close(only_self, v.repeat_interleave(2, dim=1), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("window,heads,kv_heads", [
    (1, 4, 4),  # only the query itself
    (6, 4, 2),  # reach 3: narrower than a 16-key block
    (33, 4, 1),  # reach 16: exactly one block each side
    (40, 4, 2),  # reach 20: crossing block edges
    (128, 4, 4),  # ModernBERT's window: wider than the short sequences, narrower than the long one
])
def test_symmetric_window_fp32(window, heads, kv_heads):
    """Packed prefill sequences shorter and longer than the window (interpreter blocks: 16)."""
    lengths = [1, 5, 21, 70, 150]
    check(*make(lengths, lengths, heads, kv_heads, 32, torch.float32, seed=61 + window), False, window=window)


def test_symmetric_window_fp16_and_chunks_aligned_to_the_end():
    """fp16, and queries fewer than keys (aligned to the end of their keys, as everywhere)."""
    check(*make([40, 3, 1], [40, 30, 20], 4, 2, 32, torch.float16, seed=62), False, window=10)
    check(*make([7, 17, 1], [30, 40, 20], 4, 2, 32, torch.float32, seed=63), False, window=12)


@pytest.mark.parametrize("block_m,block_n,window", [(32, 16, 6), (16, 32, 6), (32, 16, 41)])
def test_symmetric_window_other_block_shapes(monkeypatch, block_m, block_n, window):
    """The window's block bounds with BLOCK_M != BLOCK_N (as on the GPU: 128 x 64)."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_launch_config", lambda *a: (block_m, block_n, 4, 1))
    lengths = [7, 90, 33, 1]
    check(*make(lengths, lengths, 4, 2, 32, torch.float32, seed=64), False, window=window)


@pytest.mark.parametrize("splits", [2, 4])
def test_symmetric_window_split_keys(monkeypatch, splits):
    """Flash-decoding splits of the band only (a few queries against long keys)."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_num_splits", lambda *a: splits)
    check(*make([1, 3, 1, 2], [70, 50, 1, 2], 4, 2, 32, torch.float32, seed=70), False, window=40)


def test_symmetric_window_never_reads_keys_outside_its_band(monkeypatch):
    """Keys and values in blocks wholly outside every query's band are NaN: a kernel that
    visited them at all (even masked) would return NaN. One 96-token sequence in 16 x 16
    blocks: queries 32..47 with reach 4 see keys 28..51 only."""
    from tritonformer.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_launch_config", lambda *a: (16, 16, 4, 1))

    lengths, window = [96], 8
    q, k, v, cq, ck = make(lengths, lengths, 2, 2, 32, torch.float32, seed=65)
    expected = ref.varlen_attention(q, k, v, cq, ck, False, window=window)
    # only the block of queries 32..47 is checked: the others read the poisoned keys legitimately
    k2, v2 = k.clone(), v.clone()
    k2[:16], v2[:16] = float("nan"), float("nan")
    k2[64:], v2[64:] = float("nan"), float("nan")
    out = varlen_attention(q, k2, v2, cq, ck, False, window=window)
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(out[32:48], expected[32:48], atol=atol, rtol=rtol)


def test_symmetric_window_covering_every_key_is_the_plain_kernel():
    """A reach past every key of the batch runs the plain non-causal kernel: bit for bit."""
    lengths = [5, 21]
    q, k, v, cq, ck = make(lengths, lengths, 4, 2, 32, torch.float32, seed=66)
    plain = varlen_attention(q, k, v, cq, ck, False)
    for window in (2 * 60, 10**9):
        torch.testing.assert_close(varlen_attention(q, k, v, cq, ck, False, window=window), plain, atol=0, rtol=0)


# ---------------------------------------------------------------- serving-sized shapes (GPU)

def random_lengths(n, low, high, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(12, 12), (16, 4)])
def test_gpu_many_sequences(dtype, causal, head_dim, heads, kv_heads):
    lengths = random_lengths(64, 5, 500, seed=head_dim + heads)
    check(*make(lengths, lengths, heads, kv_heads, head_dim, dtype, seed=8), causal)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_long_sequences(dtype, causal, head_dim):
    lengths = [8192, 3000, 1]
    check(*make(lengths, lengths, 8, 2, head_dim, dtype, seed=9), causal)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_decode_and_chunked_prefill(dtype, head_dim):
    """A serving step: many one-token decodes against caches plus a prefill chunk."""
    lk = random_lengths(63, 5, 4000, seed=10) + [8192]
    lq = [1] * 63 + [512]
    check(*make(lq, lk, 32, 8, head_dim, dtype, seed=11), True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_few_sequences_split_keys(dtype, head_dim):
    """Few decodes (and a 4-query chunk) against long caches: the split-keys path."""
    from tritonformer.kernels import triton_attention

    lq, lk = [1, 1, 4, 1], [8192, 300, 5000, 1]
    assert triton_attention._num_splits(4 * 8, 4 * 4, sum(lk) / 4, torch.device(DEVICE)) > 1
    check(*make(lq, lk, 32, 8, head_dim, dtype, seed=18), True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_fp32_and_packed_qkv(causal):
    heads, kv_heads, head_dim = 8, 2, 128
    lengths = random_lengths(16, 1, 700, seed=12)
    gen = torch.Generator(device="cpu").manual_seed(13)
    qkv = torch.randn(sum(lengths), (heads + 2 * kv_heads) * head_dim, generator=gen).to(DEVICE)
    q, k, v = ref.qkv_split(qkv, None, heads, kv_heads, head_dim)
    check(q, k, v, cu(lengths), cu(lengths), causal)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_dispatch_runs_the_kernel():
    lengths = [100, 37]
    q, k, v, cq, ck = make(lengths, lengths, 4, 2, 64, torch.float16, seed=14)
    out = dispatch.varlen_attention(q, k, v, cq, ck, True)
    torch.testing.assert_close(out, varlen_attention(q, k, v, cq, ck, True), atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("window,softcap", [(None, None), (1000, None), (4096, 50.0), (None, 30.0)])
def test_gpu_window_softcap_head_dims(dtype, head_dim, window, softcap):
    """A serving step (decodes against caches, a prefill chunk, a whole prompt) for the
    families with sliding windows (Mistral, Qwen2), soft-capping (Gemma 2) and head dims
    96 (Phi-3) and 256 (Gemma)."""
    lk = random_lengths(61, 5, 9000, seed=19) + [8192, 3000, 1]
    lq = [1] * 61 + [512, 3000, 1]
    check(*make(lq, lk, 16, 4, head_dim, dtype, seed=20), True, window=window, softcap=softcap)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("head_dim", [96, 128, 256])
def test_gpu_window_split_keys(head_dim):
    """Few decodes against a 32k cache under a 4k window: the split-keys path splits the window."""
    from tritonformer.kernels import triton_attention

    lq, lk = [1, 1, 4, 1], [32768, 300, 5000, 1]
    assert triton_attention._num_splits(4 * 8, 4 * 4, min(sum(lk) / 4, 4096), torch.device(DEVICE)) > 1
    check(*make(lq, lk, 32, 8, head_dim, torch.bfloat16, seed=21), True, window=4096, softcap=50.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fp32_head_dim_96_window():
    check(*make([700, 1, 33], [700, 2000, 64], 8, 2, 96, torch.float32, seed=22), True, window=256, softcap=20.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_symmetric_window_modernbert_shapes(dtype):
    """ModernBERT-base's local layers: 12 heads of 64, window 128, packed sequences from one
    token to 8,192 (the (8, 8192) benchmark point's length), and a batch of many short ones."""
    lengths = [8192, 3000, 129, 64, 1]
    check(*make(lengths, lengths, 12, 12, 64, dtype, seed=67), False, window=128)
    lengths = random_lengths(64, 5, 512, seed=68)
    check(*make(lengths, lengths, 12, 12, 64, dtype, seed=69), False, window=128)
