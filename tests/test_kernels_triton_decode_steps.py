"""kernels/triton_decode_steps.py against the PyTorch reference on fresh random inputs: in
Triton's CPU interpreter (CI) and on a GPU (marked)."""
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
from tritonformer.kernels import triton_decode_steps as tds  # noqa: E402

BLOCK_SIZE, WIDTH, SCRATCH = 16, 6, 4096


def _inputs(rows: int, seed: int) -> tuple:
    """A decode bucket's static inputs, as the host packs them: live rows at random positions
    with random block tables and steps left (some 0), then padding rows."""
    gen = torch.Generator().manual_seed(seed)
    live = max(1, rows - 2)
    positions = torch.randint(0, BLOCK_SIZE * WIDTH - 1, (rows,), generator=gen)
    positions[live:] = 0
    tables = torch.randint(0, SCRATCH // BLOCK_SIZE, (rows, WIDTH), generator=gen, dtype=torch.int32)
    steps_left = torch.randint(0, 4, (rows,), generator=gen, dtype=torch.int32)
    steps_left[live:] = 0
    steps_left[0] = 2  # at least one row moves on
    ids = torch.randint(-rows, 50_000, (rows,), generator=gen)
    slots = torch.randint(0, SCRATCH, (rows,), generator=gen)
    seqlens = (positions + 1).to(torch.int32)
    return tuple(t.to(DEVICE) for t in (ids, positions, slots, seqlens, tables, steps_left))


def test_registered():
    assert dispatch._KERNELS["advance_decode_inputs"] is tds.advance_decode_inputs


@pytest.mark.cuda_ok
@pytest.mark.parametrize("rows", [1, 5, 16, 64])
def test_matches_reference(rows):
    ours = _inputs(rows, seed=rows)
    expected = tuple(t.clone() for t in ours)
    # The table as a view with a row stride wider than its width (the bucket's buffer layout).
    wide = torch.zeros(rows, WIDTH + 3, dtype=torch.int32, device=DEVICE)
    wide[:, :WIDTH] = ours[4]
    ours = ours[:4] + (wide[:, :WIDTH],) + ours[5:]
    for _ in range(3):  # three steps: rows run out of steps and turn into padding on the way
        tds.advance_decode_inputs(*ours, BLOCK_SIZE, SCRATCH)
        ref.advance_decode_inputs(*expected, BLOCK_SIZE, SCRATCH)
        for got, want in zip(ours, expected):
            assert got.tolist() == want.tolist()


def test_reference_semantics():
    """One row by hand: it moves to the next block at a block boundary, then turns into
    padding when its steps run out."""
    ids, positions, slots = torch.tensor([7]), torch.tensor([15]), torch.tensor([0])
    seqlens, tables, steps = torch.tensor([16], dtype=torch.int32), torch.tensor([[3, 9]], dtype=torch.int32), \
        torch.tensor([1], dtype=torch.int32)
    ref.advance_decode_inputs(ids, positions, slots, seqlens, tables, steps, 16, 999)
    assert (ids.item(), positions.item(), slots.item(), seqlens.item(), steps.item()) == (-1, 16, 9 * 16, 17, 0)
    ref.advance_decode_inputs(ids, positions, slots, seqlens, tables, steps, 16, 999)
    assert (ids.item(), positions.item(), slots.item(), seqlens.item(), steps.item()) == (0, 0, 999, 0, 0)
