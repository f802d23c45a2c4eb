"""kernels/triton_sampling.py against the PyTorch reference on fresh random inputs: in Triton's
CPU interpreter on small shapes (CI), and on GPT-2's vocabulary on a GPU (marked)."""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels import triton_sampling as ts  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _padded_logits(rows, vocab, pad, dtype, seed):
    """Random logits `[rows, vocab]` as a slice of a `[rows, vocab + pad]` projection (the
    models pad the vocabulary), the padding columns larger than any real logit."""
    gen = torch.Generator().manual_seed(seed)
    full = (torch.randn(rows, vocab + pad, generator=gen) * 4).to(dtype)
    full[:, vocab:] = 100.0  # must never win: outside the slice
    return full.to(DEVICE)[:, :vocab]


def test_registered():
    assert dispatch._KERNELS["argmax_rows"] is ts.argmax_rows


@pytest.mark.cuda_ok
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,vocab", [(1, 1), (3, 37), (5, 200)])
def test_matches_reference(rows, vocab, dtype, monkeypatch):
    monkeypatch.setattr(ts, "_BLOCK", 16)  # many steps per row, the last one partial
    logits = _padded_logits(rows, vocab, 11, dtype, seed=rows * vocab)
    out = torch.full((rows,), -7, dtype=torch.long, device=DEVICE)
    expected = ref.argmax_rows(logits, torch.empty(rows, dtype=torch.long, device=DEVICE))
    assert ts.argmax_rows(logits, out) is out
    assert out.tolist() == expected.tolist()


@pytest.mark.cuda_ok
@pytest.mark.parametrize("block", [16, 64])
def test_ties_go_to_the_first_column(monkeypatch, block):
    """The maximum repeated in one lane across steps, in other lanes, and in a later step:
    the earliest column wins, as torch.argmax picks."""
    monkeypatch.setattr(ts, "_BLOCK", block)
    gen = torch.Generator().manual_seed(block)
    logits = torch.randn(4, 100, generator=gen)
    logits[0, [70, 5, 21, 86]] = 9.0  # lanes 5, 5, 6 (block 16), 22 ...
    logits[1, [99, 37]] = 9.0
    logits[2, :] = -torch.inf  # nothing larger than -inf: column 0
    logits[3, [3, 19]] = 9.0  # the same lane (block 16), the earlier step wins
    logits = logits.to(DEVICE)
    out = ts.argmax_rows(logits, torch.empty(4, dtype=torch.long, device=DEVICE))
    assert out.tolist() == [5, 37, 0, 3] == ref.argmax_rows(logits, torch.empty_like(out)).tolist()


@pytest.mark.cuda_ok
@pytest.mark.parametrize("split_rows", [0, 1024])
def test_parts_across_signs_zeros_and_infinities(monkeypatch, split_rows):
    """Rows split over programs (and, with split_rows 0, one program a row): the packed keys
    order negative, zero and infinite logits as the logits order, -0.0 and 0.0 tie (the earlier
    column wins), NaN is skipped; the scratch is zero again afterwards."""
    from tritonformer.kernels import arrival_counters

    monkeypatch.setattr(ts, "_BLOCK", 16)
    monkeypatch.setattr(ts, "_SPLIT_MAX_ROWS", split_rows)
    logits = torch.full((6, 70), -1e30)
    logits[0, [3, 50]] = torch.tensor([-2.5, -2.0])  # all negative: the later, larger one
    logits[1, [20, 40]] = torch.tensor([-0.0, 0.0])  # zeros of both signs tie: the earlier column
    logits[1, 60] = -1e-30
    logits[2, [5, 69]] = torch.tensor([float("inf"), float("inf")])
    logits[3, :] = float("nan")
    logits[3, 33] = 1.0  # NaN everywhere else
    logits[4, [16, 17]] = torch.tensor([1e-30, 3e-30])  # denormal-small positives
    logits[5, :] = -float("inf")
    logits = logits.to(DEVICE)
    out = ts.argmax_rows(logits, torch.empty(6, dtype=torch.long, device=DEVICE))
    assert out.tolist() == [50, 20, 5, 33, 17, 0]
    assert not any(c[0].any() for c in arrival_counters.HELD.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 2, 64])
def test_gpt2_vocabulary_on_gpu(rows):
    logits = _padded_logits(rows, 50257, 47, torch.float16, seed=rows)
    out = ts.argmax_rows(logits, torch.empty(rows, dtype=torch.long, device=DEVICE))
    assert out.tolist() == logits.float().argmax(-1).tolist()
