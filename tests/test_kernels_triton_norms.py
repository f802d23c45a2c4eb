"""Triton-language kernels (kernels/triton_norms.py, kernels/triton_elementwise.py) against
the PyTorch references, on fresh random inputs.

Without a GPU the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, which the
conftest sets), so the first group keeps shapes tiny but still covers non-power-of-2 sizes,
row counts that leave a partial tile, optional operands and the chunked long-row paths
(forced by shrinking the tile limits). The `gpu` group runs real model shapes on CUDA.
"""
from __future__ import annotations

import math
import os
import zlib

import pytest
import torch

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels import triton_elementwise as te  # noqa: E402
from tritonformer.kernels import triton_norms as tn  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (atol, rtol): fp32 is a reordering of the same fp32 arithmetic; fp16/bf16 outputs may be
# one rounding step apart (the kernel and the reference round slightly different fp32 values).
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 1.6e-2)}

# In the interpreter, numpy reports the IEEE behaviour some tests rely on on purpose
# (exp overflowing to inf in the saturated GELU/SiLU tails, 0/0 in an all -inf softmax row).
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning"),
]

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def seed_of(*params) -> int:
    """A stable per-test seed (str hashing is randomised per process; crc32 is not)."""
    return zlib.crc32(repr(params).encode())


def make_rand(seed: int):
    """A seeded normal sampler on DEVICE: rand(*shape, dtype=, mean=, std=)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def rand(*shape, dtype=torch.float32, mean=0.0, std=1.0):
        return (torch.randn(*shape, generator=gen, device=DEVICE) * std + mean).to(dtype)

    return rand


def close(actual, expected, dtype=None):
    atol, rtol = TOL[dtype or expected.dtype]
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True)


@pytest.fixture
def long_rows(monkeypatch):
    """Force the chunked (row does not fit one tile) paths on tiny rows: tiles of 32 columns."""
    monkeypatch.setattr(tn, "_MAX_ONE_TILE", 16)
    monkeypatch.setattr(tn, "_MAX_ONE_TILE_RMS", 16)
    monkeypatch.setattr(tn, "_LOOP_BLOCK", 32)


def test_kernels_are_registered_with_the_dispatcher():
    for name, mod in [
        ("add_bias_residual_layer_norm", tn), ("embedding_layer_norm", tn), ("rms_norm", tn), ("embedding_rms_norm", tn), ("embedding_part", tn),
        ("segment_rms_norms", tn),
        ("softmax", tn),
        ("bias_gelu", te), ("silu_and_mul", te), ("gated_act", te), ("apply_rotary", te),
        ("qkv_split", te), ("qkv_split_rotary", te), ("qkv_to_cache", te), ("feed_tokens", te),
    ]:
        assert dispatch._KERNELS[name] is getattr(mod, name)


def test_row_launch_choices():
    rows, block, one_tile, _ = tn._row_launch(10_000, 768)
    assert (rows, block, one_tile) == (2, 1024, True)
    rows, block, one_tile, _ = tn._row_launch(3, 64)
    assert rows == 4 and one_tile  # never taller than the batch
    rows, block, one_tile, _ = tn._row_launch(10_000, 12288)
    assert (rows, block, one_tile) == (1, 4096, False)
    assert tn._row_launch(10_000, 12288, tn._MAX_ONE_TILE_RMS)[1:3] == (16384, True)


# ---------------------------------------------------------------- LayerNorm (interpreter)

def _ln_inputs(rand, n_rows, hidden, dtype, with_bias, with_res, mean=3.0):
    # A non-zero mean exercises the one-pass E[x²] − E[x]² variance.
    x = rand(n_rows, hidden, dtype=dtype, mean=mean)
    bias = rand(hidden, dtype=dtype) if with_bias else None
    res = rand(n_rows, hidden, dtype=dtype, mean=-1.0) if with_res else None
    return x, bias, res, rand(hidden, mean=1.0), rand(hidden)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias,with_res", [(True, True), (False, True), (True, False), (False, False)])
@pytest.mark.parametrize("n_rows,hidden", [(37, 96), (5, 8)])
def test_layer_norm(dtype, with_bias, with_res, n_rows, hidden):
    rand = make_rand(seed_of(n_rows, hidden, with_bias, with_res))
    args = _ln_inputs(rand, n_rows, hidden, dtype, with_bias, with_res)
    close(tn.add_bias_residual_layer_norm(*args, 1e-5), ref.add_bias_residual_layer_norm(*args, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_chunked_rows(long_rows, dtype):
    rand = make_rand(1)
    args = _ln_inputs(rand, 7, 80, dtype, True, True)  # 80 columns: 3 chunks, the last partial
    assert not tn._row_launch(7, 80)[2]
    close(tn.add_bias_residual_layer_norm(*args, 1e-6), ref.add_bias_residual_layer_norm(*args, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n_rows,hidden", [(9, 96), (7, 80)])  # one tile; chunked columns (long_rows below)
def test_layer_norm_also_writes_the_sum(dtype, n_rows, hidden, monkeypatch):
    """sum_out = x + bias + residual, the pre-norm decoder's next residual, from the same pass."""
    if hidden == 80:
        monkeypatch.setattr(tn, "_MAX_ONE_TILE", 16)
        monkeypatch.setattr(tn, "_LOOP_BLOCK", 32)
    rand = make_rand(seed_of(n_rows, hidden, 11))
    args = _ln_inputs(rand, n_rows, hidden, dtype, True, True)
    got_sum, want_sum = torch.empty_like(args[0]), torch.empty_like(args[0])
    close(tn.add_bias_residual_layer_norm(*args, 1e-5, sum_out=got_sum),
          ref.add_bias_residual_layer_norm(*args, 1e-5, sum_out=want_sum))
    close(got_sum, want_sum)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("std", [1.0, 0.01])
def test_layer_norm_large_mean_no_cancellation(chunked, std, monkeypatch):
    """|mean| >> std: plain fp32 E[x²] − E[x]² loses the variance entirely (error ~1 and
    ~1e4 here); the per-row shift keeps the kernel within fp32 rounding of an fp64 LayerNorm
    (closer than the fp32 reference itself, whose error here is ~2e-4 and ~1.5e-2)."""
    if chunked:
        monkeypatch.setattr(tn, "_MAX_ONE_TILE", 16)
        monkeypatch.setattr(tn, "_LOOP_BLOCK", 32)
    rand = make_rand(seed_of(std))
    x, w, b = rand(6, 96, mean=1000.0, std=std), rand(96), rand(96)
    exact = torch.nn.functional.layer_norm(x.double(), (96,), w.double(), b.double(), 1e-12)
    out = tn.add_bias_residual_layer_norm(x, None, None, w, b, 1e-12)
    torch.testing.assert_close(out.double(), exact, atol=2e-5, rtol=1e-5)
    m = x.mean(-1, keepdim=True)
    naive = (x - m) * torch.rsqrt(((x * x).mean(-1, keepdim=True) - m * m).clamp_min(0) + 1e-12) * w + b
    assert (naive.double() - exact).abs().max() > 0.1  # what the shift buys


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_bias,with_sum,chunked", [(True, False, False), (False, True, False), (True, True, True)])
def test_embedding_layer_norm_gathers_its_rows(dtype, with_bias, with_sum, chunked, monkeypatch):
    """LayerNorm(table[ids] + bias + position_table[positions]) with the rows gathered in the
    kernel: repeated and unordered ids, int64 and int32 indices, a partial last tile."""
    if chunked:
        monkeypatch.setattr(tn, "_MAX_ONE_TILE", 16)
        monkeypatch.setattr(tn, "_LOOP_BLOCK", 32)
    rand = make_rand(seed_of(dtype, with_bias, with_sum, chunked))
    hidden = 80 if chunked else 96
    table, positions_table = rand(50, hidden, dtype=dtype, mean=2.0), rand(20, hidden, dtype=dtype)
    bias = rand(hidden, dtype=dtype) if with_bias else None
    w, b = rand(hidden, mean=1.0), rand(hidden)
    gen = torch.Generator(device=DEVICE).manual_seed(seed_of(hidden))
    ids = torch.randint(0, 50, (37,), generator=gen, device=DEVICE)
    ids[5] = ids[9]  # a repeated token
    for index_dtype in (torch.int64, torch.int32):
        positions = torch.randint(0, 20, (37,), generator=gen, device=DEVICE).to(index_dtype)
        args = (ids.to(index_dtype), table, positions, positions_table, bias, w, b, 1e-5)
        got_sum = torch.empty(37, hidden, dtype=dtype, device=DEVICE) if with_sum else None
        want_sum = torch.empty(37, hidden, dtype=dtype, device=DEVICE) if with_sum else None
        close(tn.embedding_layer_norm(*args, sum_out=got_sum), ref.embedding_layer_norm(*args, sum_out=want_sum))
        if with_sum:
            close(got_sum, want_sum)
    empty = ids[:0]
    assert tn.embedding_layer_norm(empty, table, empty, positions_table, None, w, b, 1e-5).shape == (0, hidden)


def test_layer_norm_3d_and_non_contiguous():
    rand = make_rand(3)
    x = rand(2, 24, 5).transpose(1, 2)  # [2, 5, 24], not contiguous
    res, w, b = rand(2, 5, 24), rand(24), rand(24)
    close(tn.add_bias_residual_layer_norm(x, None, res, w, b, 1e-5),
          ref.add_bias_residual_layer_norm(x, None, res, w, b, 1e-5))


# ---------------------------------------------------------------- RMSNorm (interpreter)

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_res", [True, False])
@pytest.mark.parametrize("n_rows,hidden", [(37, 96), (3, 40)])
def test_rms_norm(dtype, with_res, n_rows, hidden):
    rand = make_rand(seed_of(n_rows, hidden, with_res))
    x, w = rand(n_rows, hidden, dtype=dtype, mean=0.5), rand(hidden, mean=1.0)
    res = rand(n_rows, hidden, dtype=dtype) if with_res else None
    out, summed = tn.rms_norm(x, w, 1e-6, res)
    exp_out, exp_sum = ref.rms_norm(x, w, 1e-6, res)
    close(out, exp_out)
    close(summed, exp_sum)
    if res is None:
        assert summed is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("sizes", [(24, 16, 16), (7, 5)])
def test_segment_rms_norms(dtype, weighted, sizes):
    """Mamba-1's dt, B and C norms in one launch: each segment of strided rows normalised on its own,
    (Jamba) times its weight; contiguous outputs."""
    rand = make_rand(seed_of(dtype, weighted, sizes))
    wide = rand(9, sum(sizes) + 11, dtype=dtype, mean=0.3)
    x = wide[:, 3 : 3 + sum(sizes)]  # a strided view, as x_proj's output split from the layer's
    w = rand(sum(sizes), dtype=dtype, mean=1.0) if weighted else None
    got, want = tn.segment_rms_norms(x, sizes, 1e-5, w), ref.segment_rms_norms(x, sizes, 1e-5, w)
    assert len(got) == len(sizes)
    for actual, expected in zip(got, want):
        assert actual.is_contiguous()
        close(actual, expected)


@pytest.mark.parametrize("with_res", [True, False])
def test_rms_norm_chunked_rows(long_rows, with_res):
    rand = make_rand(4)
    x, w = rand(5, 72, dtype=torch.float16), rand(72)
    res = rand(5, 72, dtype=torch.float16) if with_res else None
    for actual, expected in zip(tn.rms_norm(x, w, 1e-5, res), ref.rms_norm(x, w, 1e-5, res)):
        close(actual, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunked", [False, True])
def test_embedding_rms_norm_gathers_its_rows(dtype, chunked, monkeypatch):
    """(RMSNorm(table[ids]), table[ids]) with the rows gathered in the kernel; repeated ids,
    int32 and int64 ids, a partial last tile, and the chunked long-row path."""
    if chunked:
        monkeypatch.setattr(tn, "_MAX_ONE_TILE_RMS", 16)
        monkeypatch.setattr(tn, "_LOOP_BLOCK", 32)
    rand = make_rand(seed_of(dtype, chunked, 5))
    hidden = 72 if chunked else 96
    table, w = rand(40, hidden, dtype=dtype, mean=0.5), rand(hidden, mean=1.0)
    ids = torch.randint(0, 40, (23,), generator=torch.Generator(device=DEVICE).manual_seed(6), device=DEVICE)
    ids[3] = ids[17]
    for index_dtype in (torch.int64, torch.int32):
        got, want = tn.embedding_rms_norm(ids.to(index_dtype), table, w, 1e-6), ref.embedding_rms_norm(ids, table, w, 1e-6)
        close(got[0], want[0])
        assert torch.equal(got[1], want[1])  # the rows themselves, copied exactly
    out, rows = tn.embedding_rms_norm(ids[:0], table, w, 1e-6)
    assert out.shape == rows.shape == (0, hidden)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunked", [False, True])
def test_embedding_rms_norm_scaled_rows(dtype, chunked, monkeypatch):
    """Gemma's embeddings times sqrt(hidden): the scale and the product rounded to the table's
    dtype as torch rounds `rows * torch.tensor(scale, dtype=table.dtype)`; the norm of the
    rounded rows. sqrt(72) is not exact in any of the dtypes."""
    if chunked:
        monkeypatch.setattr(tn, "_MAX_ONE_TILE_RMS", 16)
        monkeypatch.setattr(tn, "_LOOP_BLOCK", 32)
    rand = make_rand(seed_of(dtype, chunked, "scaled"))
    hidden = 72
    table, w = rand(40, hidden, dtype=dtype, mean=0.5), rand(hidden, mean=1.0)
    ids = torch.randint(0, 40, (23,), generator=torch.Generator(device=DEVICE).manual_seed(7), device=DEVICE)
    got, want = tn.embedding_rms_norm(ids, table, w, 1e-6, hidden ** 0.5), ref.embedding_rms_norm(ids, table, w, 1e-6,
                                                                                                hidden ** 0.5)
    if INTERPRETED and dtype == torch.bfloat16:
        # the interpreter's fp32 -> bf16 cast truncates (the GPU rounds to nearest): one bf16 step apart
        torch.testing.assert_close(got[1], want[1], atol=0, rtol=2.0 ** -7)
        close(got[0], want[0])
    else:
        assert torch.equal(got[1], want[1])
        close(got[0], want[0])
    assert not torch.equal(want[1], table[ids])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scaled", [False, True])
def test_embedding_part_is_one_ranks_share(dtype, scaled):
    """A vocabulary-parallel embedding: each of three ranks' parts (table rows [start, start +
    rows)) against the reference, rows it does not hold zero, and the parts summed equal to the
    whole table's (scaled) rows; repeated ids, the first and last id of each part, int32 ids,
    a row longer than one column tile."""
    rand = make_rand(seed_of(dtype, scaled, "part"))
    vocab, hidden, ranks = 30, 72, 3
    table = rand(vocab, hidden, dtype=dtype, mean=0.5)
    ids = torch.tensor([0, 9, 10, 19, 20, 29, 5, 5, 17, 28, 3], device=DEVICE)
    scale = hidden ** 0.5 if scaled else None
    per_rank, total = vocab // ranks, None
    for rank in range(ranks):
        start = rank * per_rank
        part = table[start:start + per_rank]
        got = tn.embedding_part(ids.to(torch.int32), part, start, scale)
        want = ref.embedding_part(ids, part, start, scale)
        if INTERPRETED and scaled and dtype == torch.bfloat16:  # the interpreter's bf16 cast truncates
            torch.testing.assert_close(got, want, atol=0, rtol=2.0 ** -7)
        else:
            assert torch.equal(got, want)
        held = (ids >= start) & (ids < start + per_rank)
        assert torch.all(got[~held] == 0) and torch.all(got[held].abs().sum(1) > 0)
        total = want.float() if total is None else total + want.float()
    whole = table[ids] * torch.tensor(scale, dtype=dtype, device=DEVICE) if scaled else table[ids]
    assert torch.equal(total.to(dtype), whole)
    with pytest.MonkeyPatch.context() as mp:  # more columns than one tile holds
        mp.setattr(tn, "triton", _SmallPow2(tn.triton, 32))
        assert torch.equal(tn.embedding_part(ids, table, 0), table[ids])
    assert tn.embedding_part(ids[:0], table, 0).shape == (0, hidden)


class _SmallPow2:
    """`triton` with next_power_of_2 capped (a column tile shorter than the row)."""

    def __init__(self, real, cap):
        self._real, self._cap = real, cap

    def next_power_of_2(self, n):
        return min(self._real.next_power_of_2(n), self._cap)

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                             (torch.float32, torch.bfloat16)])
def test_norm_weights_of_another_dtype(x_dtype, w_dtype):
    """A norm weight need not be in x's dtype (Gemma's 1 + w is kept in fp32): every norm kernel
    reads it as it is, like the reference."""
    rand = make_rand(seed_of(x_dtype, w_dtype, "norm-dtypes"))
    x, res = rand(9, 40, dtype=x_dtype, mean=0.5), rand(9, 40, dtype=x_dtype)
    w, b = rand(40, dtype=w_dtype, mean=1.0), rand(40, dtype=w_dtype)
    for got, want in zip(tn.rms_norm(x, w, 1e-6, res), ref.rms_norm(x, w, 1e-6, res)):
        close(got, want)
    close(tn.add_bias_residual_layer_norm(x, None, res, w, b, 1e-5),
          ref.add_bias_residual_layer_norm(x, None, res, w, b, 1e-5))
    ids = torch.tensor([3, 0, 8, 3], device=DEVICE)
    close(tn.embedding_rms_norm(ids, x, w, 1e-6, 2.5)[0], ref.embedding_rms_norm(ids, x, w, 1e-6, 2.5)[0])


# ---------------------------------------------------------------- softmax (interpreter)

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.125, -0.7])
@pytest.mark.parametrize("n_rows,n_cols", [(37, 96), (3, 8)])
def test_softmax(dtype, scale, n_rows, n_cols):
    rand = make_rand(seed_of(n_rows, n_cols, scale))
    x = rand(n_rows, n_cols, dtype=dtype, mean=2.0, std=3.0)
    close(tn.softmax(x, scale), ref.softmax(x, scale))


def _masked_scores(rand, n_rows, n_cols, dtype):
    """Causal-style -inf entries, plus one row entirely -inf (NaN, as in torch)."""
    x = rand(n_rows, n_cols, dtype=dtype, std=4.0)
    keep = torch.arange(n_cols, device=DEVICE)[None, :] <= torch.arange(n_rows, device=DEVICE)[:, None] * 7
    x = x.masked_fill(~keep, float("-inf"))
    x[-1] = float("-inf")
    return x


@pytest.mark.parametrize("chunked", [False, True])
def test_softmax_with_infinities(chunked, monkeypatch):
    if chunked:
        monkeypatch.setattr(tn, "_MAX_ONE_TILE", 16)
        monkeypatch.setattr(tn, "_LOOP_BLOCK", 32)
    x = _masked_scores(make_rand(5), 9, 70, torch.float32)
    out = tn.softmax(x, 0.5)
    close(out, ref.softmax(x, 0.5))
    assert out[-1].isnan().all() and not out[:-1].isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softmax_chunked_rows(long_rows, dtype):
    x = make_rand(6)(6, 100, dtype=dtype, std=5.0)
    close(tn.softmax(x, 0.3), ref.softmax(x, 0.3))


# ---------------------------------------------------------------- element-wise (interpreter)

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_bias_gelu(dtype, approximate, with_bias):
    rand = make_rand(seed_of(approximate, with_bias))
    x = rand(37, 96, dtype=dtype, std=4.0)  # wide range: both tails and the saturated tanh
    bias = rand(96, dtype=dtype) if with_bias else None
    close(te.bias_gelu(x, bias, approximate), ref.bias_gelu(x, bias, approximate))


def test_bias_gelu_3d_extremes():
    x = make_rand(7)(2, 3, 40)
    x[0, 0, :4] = torch.tensor([-60.0, 60.0, -1e4, 1e4])
    bias = make_rand(8)(40, dtype=torch.float16)
    for approximate in ("none", "tanh"):
        close(te.bias_gelu(x, bias, approximate), ref.bias_gelu(x, bias, approximate))
    with pytest.raises(ValueError):
        te.bias_gelu(x, bias, "exact")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 2 * 48), (2, 3, 2 * 20)])
def test_silu_and_mul(dtype, shape):
    gate_up = make_rand(9)(*shape, dtype=dtype, std=3.0)
    gate_up.view(-1)[:2] = torch.tensor([-200.0, 200.0])  # saturated sigmoid, no NaN
    close(te.silu_and_mul(gate_up), ref.silu_and_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", sorted(ref.GATED_ACTIVATIONS))
@pytest.mark.parametrize("shape", [(37, 2 * 48), (2, 3, 2 * 20)])
def test_gated_act(dtype, activation, shape):
    gate_up = make_rand(seed_of(activation, shape))(*shape, dtype=dtype, std=3.0)
    gate_up.view(-1)[:2] = torch.tensor([-200.0, 200.0])  # saturated tails, no NaN
    close(te.gated_act(gate_up, activation), ref.gated_act(gate_up, activation))
    with pytest.raises(ValueError, match="activation must be one of"):
        te.gated_act(gate_up, "gelu_tanh")


@pytest.mark.cuda_ok
@pytest.mark.parametrize("n", [1, 37, 1500])
def test_feed_tokens(n):
    gen = torch.Generator().manual_seed(n)
    last = torch.randint(0, 50_000, (64,), generator=gen).to(DEVICE)
    ids = torch.randint(0, 50_000, (n,), generator=gen)
    fed = torch.rand(n, generator=gen) < 0.5
    ids[fed] = -1 - torch.randint(0, 64, (int(fed.sum()),), generator=gen)
    ids = ids.to(DEVICE)
    expected = ref.feed_tokens(ids.clone(), last)
    assert te.feed_tokens(ids, last) is ids
    assert torch.equal(ids, expected) and bool((ids >= 0).all())


def _cos_sin(n_tokens, head_dim, dtype=torch.float32, seed=10):
    positions = torch.randint(0, 4096, (n_tokens,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    return ref.rotary_cos_sin(positions, head_dim, 10000.0, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 20])
def test_apply_rotary(dtype, head_dim):
    x = make_rand(11)(7, 3, head_dim, dtype=dtype)
    cos, sin = _cos_sin(7, head_dim)
    close(te.apply_rotary(x, cos, sin), ref.apply_rotary(x, cos, sin))


def test_apply_rotary_strided_view():
    """q as a view into a fused QKV buffer (token stride != H * D), bf16 tables."""
    qkv = make_rand(12)(5, (4 + 2 * 2) * 12, dtype=torch.float16)
    q = qkv[:, : 4 * 12].view(5, 4, 12)
    cos, sin = _cos_sin(5, 12, torch.bfloat16)
    out = te.apply_rotary(q, cos, sin)
    close(out, ref.apply_rotary(q, cos, sin))
    assert out.is_contiguous()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 12), (3, 3, 5)])
def test_qkv_split(dtype, with_bias, heads, kv_heads, head_dim):
    rand = make_rand(seed_of(with_bias, heads, head_dim))
    qkv = rand(9, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    bias = rand(qkv.shape[1], dtype=dtype) if with_bias else None
    got = te.qkv_split(qkv, bias, heads, kv_heads, head_dim)
    for actual, expected in zip(got, ref.qkv_split(qkv, bias, heads, kv_heads, head_dim)):
        assert actual.is_contiguous()
        close(actual, expected)


def test_qkv_split_rotary_strided_rows():
    """qkv as a column slice of a wider buffer (row stride > width), strided cos/sin rows."""
    rand = make_rand(14)
    wide = rand(5, 3 * 8 + 16, dtype=torch.float16)
    qkv = wide[:, : 3 * 8]
    table = rand(5, 2 * 4)
    cos, sin = table[:, :4], table[:, 4:]
    got = te.qkv_split_rotary(qkv, None, 1, 1, 8, cos, sin)
    for actual, expected in zip(got, ref.qkv_split_rotary(qkv, None, 1, 1, 8, cos, sin)):
        close(actual, expected)


def test_qkv_split_promotes_like_the_reference():
    """fp16 qkv + fp32 bias: the reference's `qkv + bias` is fp32, and so are the outputs."""
    rand = make_rand(13)
    qkv, bias = rand(3, 4 * 8, dtype=torch.float16), rand(4 * 8)
    for actual, expected in zip(te.qkv_split(qkv, bias, 2, 1, 8), ref.qkv_split(qkv, bias, 2, 1, 8)):
        close(actual, expected)
    with pytest.raises(ValueError):
        te.qkv_split(qkv, bias, 2, 2, 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (2, 2, 20), (6, 1, 8)])
def test_qkv_split_rotary(dtype, with_bias, heads, kv_heads, head_dim):
    rand = make_rand(seed_of(with_bias, heads, kv_heads, head_dim))
    n_tokens = 6
    qkv = rand(n_tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    bias = rand(qkv.shape[1], dtype=dtype) if with_bias else None
    cos, sin = _cos_sin(n_tokens, head_dim, dtype)
    got = te.qkv_split_rotary(qkv, bias, heads, kv_heads, head_dim, cos, sin)
    expected = ref.qkv_split_rotary(qkv, bias, heads, kv_heads, head_dim, cos, sin)
    for a, e in zip(got, expected):
        assert a.is_contiguous()
        if INTERPRETED and dtype == torch.bfloat16 and with_bias:
            # The interpreter's fp32 -> bf16 cast truncates (the GPU rounds to nearest), so
            # the rounded qkv + bias can be one ulp off before the rotation, whose
            # cancellation (x1*c - x2*s) turns that into a large relative error near 0.
            torch.testing.assert_close(a, e, atol=2.0**-7 * 8, rtol=1.6e-2)
        else:
            close(a, e)


QK_NORM_CASES = [  # (heads, kv_heads, head_dim, rotary, bias, norms)
    (4, 2, 16, True, True, "qk"), (2, 2, 20, True, False, "q"), (6, 1, 8, False, True, "qk"),
    (3, 1, 12, False, False, "k"), (2, 1, 96, True, True, "qk"), (2, 1, 256, True, False, "qk"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary,with_bias,norms", QK_NORM_CASES)
def test_qkv_to_cache_with_head_norms(dtype, heads, kv_heads, head_dim, rotary, with_bias, norms):
    """Per-head RMSNorm of q and/or k (Qwen3, Gemma 3) after the bias, before rotary, with the
    cache write: GQA, half widths that are no power of two (10, 48), no rotary, Phi-3's and
    Gemma's head dims, fp32 norm weights beside fp16/bf16 activations."""
    rand = make_rand(seed_of(dtype, heads, kv_heads, head_dim, rotary, with_bias, norms))
    n_tokens = 5
    qkv = rand(n_tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    bias = rand(qkv.shape[1], dtype=dtype) if with_bias else None
    cos, sin = _cos_sin(n_tokens, head_dim, dtype) if rotary else (None, None)
    q_norm = rand(head_dim, mean=1.0, std=0.3) if "q" in norms else None  # fp32 whatever qkv's dtype
    k_norm = rand(head_dim, mean=1.0, std=0.3) if "k" in norms else None
    kc, vc, slots = _check_normed_qkv_to_cache(rand, qkv, bias, heads, kv_heads, head_dim, cos, sin, q_norm, k_norm,
                                               loose=with_bias or rotary)
    with pytest.raises(ValueError, match="q_norm must be"):
        te.qkv_to_cache(qkv, bias, heads, kv_heads, head_dim, cos, sin, kc, vc, slots, rand(head_dim + 1), None)


def _check_normed_qkv_to_cache(rand, qkv, bias, heads, kv_heads, head_dim, cos, sin, q_norm, k_norm, loose,
                               **v_options):
    """qkv_to_cache with q/k norms (and `v_options`, v_norm / v_from_k) by the kernel and by the reference on equal inputs and caches:
    q and both caches agree (bf16 in the interpreter, where `loose`: one ulp before the rotary).
    Returns (k cache, v cache, slots) for further calls."""
    dtype = qkv.dtype
    kc, vc = rand(3, 4, kv_heads, head_dim, dtype=dtype), rand(3, 4, kv_heads, head_dim, dtype=dtype)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.randperm(12, generator=torch.Generator().manual_seed(1))[:qkv.shape[0]].to(DEVICE)
    args = (heads, kv_heads, head_dim, cos, sin)
    q = te.qkv_to_cache(qkv, bias, *args, kc, vc, slots, q_norm, k_norm, 1e-6, **v_options)
    q_ref = ref.qkv_to_cache(qkv, bias, *args, kc_ref, vc_ref, slots, q_norm, k_norm, 1e-6, **v_options)
    for a, e in ((q, q_ref), (kc, kc_ref), (vc, vc_ref)):
        if INTERPRETED and dtype == torch.bfloat16 and loose:
            # the interpreter's bf16 rounding truncates: the normalised head one ulp off before rotary
            torch.testing.assert_close(a, e, atol=2.0**-7 * 8, rtol=1.6e-2)
        else:
            close(a, e)
    return kc, vc, slots


V_NORM_CASES = [  # (heads, kv_heads, head_dim, rotary, v_from_k, norms): Gemma 4's sliding layers (v_proj) and
    # its full layers (v from k's projection), with and without q / k norms and rotary, half widths no power of two
    (4, 2, 16, True, False, "qk"), (4, 1, 32, True, True, "qk"), (2, 2, 20, True, True, ""),
    (3, 1, 12, False, True, "k"), (2, 1, 24, False, False, ""),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary,v_from_k,norms", V_NORM_CASES)
def test_qkv_to_cache_normalises_values_and_reads_them_from_keys(dtype, heads, kv_heads, head_dim, rotary, v_from_k,
                                                                  norms):
    """Gemma 4's attention input: every v head RMS-normalised without a weight (`v_norm`), and on its full layers v
    taken from the key projection's output before k's norm and rotary (`v_from_k`, qkv holding q and k only): the
    kernel against the reference, and the v cache rows against the weightless norm of the v (or k) columns."""
    rand = make_rand(seed_of(dtype, heads, kv_heads, head_dim, rotary, v_from_k, norms, "v"))
    n_tokens = 5
    qkv = rand(n_tokens, (heads + (1 if v_from_k else 2) * kv_heads) * head_dim, dtype=dtype)
    cos, sin = _cos_sin(n_tokens, head_dim, dtype) if rotary else (None, None)
    q_norm = rand(head_dim, mean=1.0, std=0.3) if "q" in norms else None
    k_norm = rand(head_dim, mean=1.0, std=0.3) if "k" in norms else None
    kc, vc, slots = _check_normed_qkv_to_cache(rand, qkv, None, heads, kv_heads, head_dim, cos, sin, q_norm, k_norm,
                                               loose=rotary, v_norm=True, v_from_k=v_from_k)
    start = (heads + (0 if v_from_k else kv_heads)) * head_dim
    v = qkv[:, start : start + kv_heads * head_dim].float().view(n_tokens, kv_heads, head_dim)
    want = (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    close(vc.view(-1, kv_heads, head_dim)[slots], want)
    with pytest.raises(ValueError, match="qkv must be"):
        te.qkv_to_cache(qkv[:, :-head_dim], None, heads, kv_heads, head_dim, cos, sin, kc, vc, slots,
                        v_norm=True, v_from_k=v_from_k)


WHOLE_WIDTH_CASES = [  # (heads, kv_heads, head_dim, rotary, norms): OLMo 2's (MHA), GQA, no rotary, k's
    # alone, and rows past one summing step (5 x 256 = 1,280 > 1,024 q values)
    (4, 4, 16, True, "qk"), (4, 2, 20, True, "qk"), (3, 1, 12, False, "qk"), (2, 2, 16, True, "k"),
    (5, 1, 256, True, "qk"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary,norms", WHOLE_WIDTH_CASES)
def test_qkv_to_cache_with_whole_width_norms(dtype, heads, kv_heads, head_dim, rotary, norms):
    """OLMo 2's q/k norms, each over a token's whole q (k) width ([H * D] weights), before
    rotary, with the cache write: every program takes its token's statistics over all heads."""
    rand = make_rand(seed_of("whole", dtype, heads, kv_heads, head_dim, rotary, norms))
    n_tokens = 5
    qkv = rand(n_tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    cos, sin = _cos_sin(n_tokens, head_dim, dtype) if rotary else (None, None)
    q_norm = rand(heads * head_dim, mean=1.0, std=0.3) if "q" in norms else None
    k_norm = rand(kv_heads * head_dim, mean=1.0, std=0.3)
    kc, vc, slots = _check_normed_qkv_to_cache(rand, qkv, None, heads, kv_heads, head_dim, cos, sin, q_norm, k_norm,
                                               loose=rotary)
    args = (heads, kv_heads, head_dim, cos, sin)
    if kv_heads > 1:  # q's norm whole, k's per head: no such model
        with pytest.raises(ValueError, match="k_norm must be"):
            te.qkv_to_cache(qkv, None, *args, kc, vc, slots, rand(heads * head_dim), rand(head_dim))
    with pytest.raises(ValueError, match="after a QKV bias"):
        te.qkv_to_cache(qkv, rand(qkv.shape[1], dtype=dtype), *args, kc, vc, slots, q_norm, k_norm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary,norms", [(4, 4, 16, True, "qk"), (4, 2, 20, True, "qk"),
                                                                  (2, 2, 12, False, "k"), (6, 2, 256, True, "qk")])
def test_whole_width_norms_split_over_two_ranks(dtype, heads, kv_heads, head_dim, rotary, norms):
    """Tensor parallelism's form of OLMo 2's q / k norms: each of two ranks holds half the heads, sums its q's and
    k's squares (qk_squares), and normalises its heads by both ranks' sums (qkv_to_cache's norm_squares): its
    q and cache rows are the whole model's (the reference on every head) at its heads."""
    rand = make_rand(seed_of("split", dtype, heads, kv_heads, head_dim, rotary, norms))
    n_tokens, d = 5, head_dim
    whole = rand(n_tokens, (heads + 2 * kv_heads) * d, dtype=dtype)
    cos, sin = _cos_sin(n_tokens, d, dtype) if rotary else (None, None)
    q_norm = rand(heads * d, mean=1.0, std=0.3) if "q" in norms else None
    k_norm = rand(kv_heads * d, mean=1.0, std=0.3)
    slots = torch.randperm(12, generator=torch.Generator().manual_seed(1))[:n_tokens].to(DEVICE)
    kc, vc = torch.zeros(3, 4, kv_heads, d, dtype=dtype, device=DEVICE), torch.zeros(3, 4, kv_heads, d, dtype=dtype,
                                                                                   device=DEVICE)
    q_whole = ref.qkv_to_cache(whole, None, heads, kv_heads, d, cos, sin, kc, vc, slots, q_norm, k_norm, 1e-6)
    h, hk = heads // 2, kv_heads // 2

    def share(r):  # rank r's rows of the QKV projection: its q heads, its k heads, its v heads
        cols = [whole[:, (start + r * n) * d : (start + (r + 1) * n) * d]
                for start, n in ((0, h), (heads, hk), (heads + kv_heads, hk))]
        return torch.cat(cols, dim=1).contiguous()

    parts = [share(r) for r in (0, 1)]
    squares = [te.qk_squares(p, h, hk, d) for p in parts]
    for p, sq in zip(parts, squares):
        torch.testing.assert_close(sq, ref.qk_squares(p, h, hk, d), rtol=1e-5, atol=1e-4)
    summed = (squares[0] + squares[1]).contiguous()
    for r, p in enumerate(parts):
        kc_r, vc_r = torch.zeros_like(kc[:, :, :hk]), torch.zeros_like(vc[:, :, :hk])
        own_q = None if q_norm is None else q_norm[r * h * d : (r + 1) * h * d]
        own_k = k_norm[r * hk * d : (r + 1) * hk * d]
        args = (p, None, h, hk, d, cos, sin, kc_r, vc_r, slots, own_q, own_k, 1e-6)
        q = te.qkv_to_cache(*args, norm_squares=summed, norm_ranks=2)
        kc_ref, vc_ref = kc_r.clone(), vc_r.clone()
        q_ref = ref.qkv_to_cache(p, None, h, hk, d, cos, sin, kc_ref, vc_ref, slots, own_q, own_k, 1e-6,
                                 norm_squares=summed, norm_ranks=2)
        heads_of = slice(r * h, (r + 1) * h)
        for a, e in ((q_ref, q_whole[:, heads_of]), (kc_ref, kc[:, :, r * hk : (r + 1) * hk]),
                     (vc_ref, vc[:, :, r * hk : (r + 1) * hk])):
            close(a, e)  # the split reference is the whole model's at this rank's heads
        loose = INTERPRETED and dtype == torch.bfloat16 and rotary
        for a, e in ((q, q_ref), (kc_r, kc_ref), (vc_r, vc_ref)):
            if loose:  # (the interpreter's bf16 rounding, as _check_normed_qkv_to_cache allows)
                torch.testing.assert_close(a, e, atol=2.0**-7 * 8, rtol=1.6e-2)
            else:
                close(a, e)


def test_empty_inputs():
    x = torch.empty(0, 16, device=DEVICE)
    w = torch.ones(16, device=DEVICE)
    assert tn.add_bias_residual_layer_norm(x, None, None, w, w, 1e-5).shape == (0, 16)
    assert tn.softmax(x).shape == (0, 16)
    assert tn.rms_norm(x, w, 1e-5, x)[1].shape == (0, 16)
    assert te.silu_and_mul(x).shape == (0, 8)
    assert [t.shape for t in te.qkv_split_rotary(x, None, 1, 0, 16, x[:, :8], x[:, :8])] == [(0, 1, 16), (0, 0, 16), (0, 0, 16)]


# ---------------------------------------------------------------- real shapes on the GPU

LOW = [torch.float16, torch.bfloat16]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("hidden", [768, 4096, 12288])
@pytest.mark.parametrize("with_bias,with_res", [(True, True), (False, False)])
def test_gpu_layer_norm(dtype, hidden, with_bias, with_res):
    rand = make_rand(100 + hidden)
    args = _ln_inputs(rand, 3001, hidden, dtype, with_bias, with_res)
    close(tn.add_bias_residual_layer_norm(*args, 1e-12), ref.add_bias_residual_layer_norm(*args, 1e-12))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("hidden", [768, 12288])
def test_gpu_embedding_layer_norm(dtype, hidden):
    rand = make_rand(150 + hidden)
    vocab = 50257 if hidden == 768 else 4096  # gpt2's table; a smaller one at 12288 wide
    table, positions_table, bias = rand(vocab, hidden, dtype=dtype), rand(1024, hidden, dtype=dtype), rand(hidden, dtype=dtype)
    w, b = rand(hidden, mean=1.0), rand(hidden)
    gen = torch.Generator(device=DEVICE).manual_seed(hidden)
    ids = torch.randint(0, vocab, (3001,), generator=gen, device=DEVICE)
    positions = torch.randint(0, 1024, (3001,), generator=gen, device=DEVICE)
    got_sum, want_sum = (torch.empty(3001, hidden, dtype=dtype, device=DEVICE) for _ in range(2))
    args = (ids, table, positions, positions_table, bias, w, b, 1e-5)
    close(tn.embedding_layer_norm(*args, sum_out=got_sum), ref.embedding_layer_norm(*args, sum_out=want_sum))
    close(got_sum, want_sum)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("hidden", [768, 4096, 12288])
def test_gpu_rms_norm(dtype, hidden):
    rand = make_rand(200 + hidden)
    x, res, w = rand(3001, hidden, dtype=dtype), rand(3001, hidden, dtype=dtype), rand(hidden, mean=1.0)
    for actual, expected in zip(tn.rms_norm(x, w, 1e-6, res), ref.rms_norm(x, w, 1e-6, res)):
        close(actual, expected)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("hidden", [2048, 12288])
def test_gpu_embedding_rms_norm(dtype, hidden):
    rand = make_rand(250 + hidden)
    table, w = rand(8192, hidden, dtype=dtype), rand(hidden, mean=1.0)
    ids = torch.randint(0, 8192, (3001,), generator=torch.Generator(device=DEVICE).manual_seed(hidden), device=DEVICE)
    got, want = tn.embedding_rms_norm(ids, table, w, 1e-5), ref.embedding_rms_norm(ids, table, w, 1e-5)
    close(got[0], want[0])
    assert torch.equal(got[1], want[1])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n_cols", [512, 2048, 8192, 10000])
def test_gpu_softmax(dtype, n_cols):
    x = make_rand(300 + n_cols)(4099, n_cols, dtype=dtype, std=4.0)
    close(tn.softmax(x, 1 / math.sqrt(128)), ref.softmax(x, 1 / math.sqrt(128)))
    x = _masked_scores(make_rand(301), 1030, n_cols, dtype)
    close(tn.softmax(x, 0.5), ref.softmax(x, 0.5))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW)
def test_gpu_elementwise(dtype):
    rand = make_rand(400)
    x, bias = rand(4099, 3072, dtype=dtype, std=3.0), rand(3072, dtype=dtype)
    for approximate in ("none", "tanh"):
        close(te.bias_gelu(x, bias, approximate), ref.bias_gelu(x, bias, approximate))
    gate_up = rand(4099, 2 * 11008, dtype=dtype, std=3.0)
    close(te.silu_and_mul(gate_up), ref.silu_and_mul(gate_up))
    close(te.gated_act(gate_up, "gelu_tanh_mul"), ref.gated_act(gate_up, "gelu_tanh_mul"))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("heads,kv_heads,head_dim,with_bias", [(32, 8, 128, False), (12, 12, 64, True), (14, 2, 64, True)])
def test_gpu_qkv_split_rotary(dtype, heads, kv_heads, head_dim, with_bias):
    rand = make_rand(500 + heads)
    n_tokens = 4099
    qkv = rand(n_tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    bias = rand(qkv.shape[1], dtype=dtype) if with_bias else None
    cos, sin = _cos_sin(n_tokens, head_dim, dtype)
    got = te.qkv_split_rotary(qkv, bias, heads, kv_heads, head_dim, cos, sin)
    for a, e in zip(got, ref.qkv_split_rotary(qkv, bias, heads, kv_heads, head_dim, cos, sin)):
        close(a, e)
    for a, e in zip(te.qkv_split(qkv, bias, heads, kv_heads, head_dim), ref.qkv_split(qkv, bias, heads, kv_heads, head_dim)):
        close(a, e)
    q = ref.qkv_split(qkv, None, heads, kv_heads, head_dim)[0]  # strided view
    close(te.apply_rotary(q, cos, sin), ref.apply_rotary(q, cos, sin))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("heads,kv_heads,head_dim,with_bias",
                         [(32, 8, 128, False), (8, 4, 256, False), (16, 8, 128, True)])
def test_gpu_qkv_to_cache_head_norms(dtype, heads, kv_heads, head_dim, with_bias):
    """Qwen3-8B's, Gemma-3-4B's heads (and a biased variant), q and k normalised, fp32 norm weights."""
    rand = make_rand(600 + heads + head_dim)
    n_tokens = 4099
    qkv = rand(n_tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    bias = rand(qkv.shape[1], dtype=dtype) if with_bias else None
    cos, sin = _cos_sin(n_tokens, head_dim, dtype)
    q_norm, k_norm = rand(head_dim, mean=1.0, std=0.3), rand(head_dim, mean=1.0, std=0.3)
    kc, vc = (torch.zeros(520, 8, kv_heads, head_dim, dtype=dtype, device=DEVICE) for _ in range(2))
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.randperm(520 * 8, device=DEVICE)[:n_tokens]
    args = (heads, kv_heads, head_dim, cos, sin)
    q = te.qkv_to_cache(qkv, bias, *args, kc, vc, slots, q_norm, k_norm, 1e-6)
    q_ref = ref.qkv_to_cache(qkv, bias, *args, kc_ref, vc_ref, slots, q_norm, k_norm, 1e-6)
    for a, e in ((q, q_ref), (kc, kc_ref), (vc, vc_ref)):
        close(a, e)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW)
def test_gpu_embedding_rms_norm_scaled(dtype):
    """Gemma-2-2B's embedding (hidden 2304, scale 48) and Gemma-3-4B's (2560, sqrt 2560 = 50.6)."""
    for hidden in (2304, 2560):
        rand = make_rand(700 + hidden)
        table, w = rand(8192, hidden, dtype=dtype), rand(hidden, mean=1.0)
        ids = torch.randint(0, 8192, (3001,), generator=torch.Generator(device=DEVICE).manual_seed(hidden),
                            device=DEVICE)
        got = tn.embedding_rms_norm(ids, table, w, 1e-6, hidden ** 0.5)
        want = ref.embedding_rms_norm(ids, table, w, 1e-6, hidden ** 0.5)
        close(got[0], want[0])
        assert torch.equal(got[1], want[1])
