"""Lightning attention's ops (MiniMax, kernels/triton_lightning.py): the reference step against the recurrence
written out per head, the block form of a prompt against step after step (across blocks, from a state already
held), and the Triton decode kernel against the reference on fresh random inputs, with states at strided slots as
the state cache holds them."""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.backend.models.lightning import LightningSpec
from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _case(rows, heads, d, dtype, seed=0):
    """Projection rows [q | k | v per head] as a strided slice of wider rows, the decay factors of a model's layer
    1 of 3, and a recurrent state at strided slots (a view into wider rows) with distinct slots out of 6."""
    qkv = _rand(rows, 3 * heads * d + 3, seed=seed, dtype=dtype)[:, 3:]
    slope = LightningSpec(heads, d, 3).slopes(1).to(DEVICE)
    data = _rand(7, heads * d * d + 4, seed=seed + 3) * 0.3
    state = data[:, 4:].view(7, heads, d, d)
    slots = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:rows].to(DEVICE)
    return qkv, slope, state, slots


def test_reference_step_decays_each_head_by_its_own_factor():
    """S' = e^-lambda_h S + k^T v per head, o = q S', q k v the SiLU of the row's [q | k | v] of that head."""
    qkv, slope, state, slots = _case(2, 3, 4, torch.float32, seed=4)
    before = state.clone()
    got = ref.lightning_decode(qkv, torch.exp(-slope), state, slots)
    assert len({round(x, 6) for x in slope.tolist()}) == 3 and bool((slope > 0).all())
    for i, s in enumerate(slots.tolist()):
        for h in range(3):
            q, k, v = (torch.nn.functional.silu(qkv[i, h * 12 + j * 4 : h * 12 + (j + 1) * 4]) for j in range(3))
            S = before[s, h] * torch.exp(-slope[h]) + torch.outer(k, v)
            torch.testing.assert_close(state[s, h], S)
            torch.testing.assert_close(got[i, h], q @ S)
    others = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(state[others], before[others])


def test_slopes_are_alibi_rates_falling_with_depth():
    spec = LightningSpec(num_heads=4, head_dim=8, num_layers=5)
    torch.testing.assert_close(spec.slopes(0), torch.tensor([0.25, 0.0625, 0.015625, 0.00390625]) * (1 + 1e-5))
    torch.testing.assert_close(spec.slopes(2), spec.slopes(0) * (1 - 2 / (4 + 1e-5) + 1e-5) / (1 + 1e-5))


@pytest.mark.parametrize("length", [1, 63, 64, 150])
def test_block_form_equals_the_recurrence_step_by_step(length):
    """A prompt of `length` tokens (blocks of 64 crossed or not) from a state already held: the outputs and the
    state left at the slot those of one decode step per token."""
    heads, d = 3, 8
    qkv = _rand(length, 3 * heads * d, seed=length)
    slope = LightningSpec(heads, d, 4).slopes(0).to(DEVICE) * 20  # (fast decays: the block edges matter)
    held = _rand(3, heads, d, d, seed=9) * 0.3
    stepped = held.clone()
    slot = torch.tensor([1], device=DEVICE)
    expected = torch.cat([ref.lightning_decode(qkv[t : t + 1], torch.exp(-slope), stepped, slot)
                          for t in range(length)])
    q, k, v = ref.lightning_inputs(qkv, heads)
    out = torch.empty(length, heads, d, device=DEVICE)
    chunked = held.clone()
    ref.lightning_chunk(q, k, v, slope, chunked, slot, out)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunked, stepped, atol=1e-5, rtol=1e-4)
    assert torch.equal(chunked[[0, 2]], held[[0, 2]])


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_lightning as tl_  # noqa: E402

# Outputs are sums of many products (near zero a relative tolerance alone fails); with bf16 inputs q, k, v are
# rounded to bf16 after the SiLU, which the interpreter's truncating cast may round one step off: every one of
# them, so bf16 outputs and states are held to 2 % of the largest, not of each.
SUM_TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2.0 ** -6)}


@pytest.mark.parametrize("rows,heads,d,dtype", [
    (1, 1, 16, torch.float32), (3, 2, 32, torch.float32), (2, 3, 128, torch.float32),
    (4, 2, 64, torch.bfloat16), (0, 2, 16, torch.float32), (3, 2, 24, torch.float32),
])
def test_lightning_decode_kernel(rows, heads, d, dtype):
    qkv, slope, state, slots = _case(rows, heads, d, dtype, seed=rows + d)
    decay = torch.exp(-slope)
    mine, theirs = state.clone(), state.clone()
    got = tl_.lightning_decode(qkv, decay, mine, slots)
    expected = ref.lightning_decode(qkv, decay, theirs, slots)
    atol, rtol = SUM_TOL[dtype]
    if dtype == torch.bfloat16:
        atol *= float(expected.float().abs().max())
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    state_tol = (1e-5, 1e-4) if dtype == torch.float32 else (2e-2 * float(theirs.abs().max()), 1e-2)
    torch.testing.assert_close(mine, theirs, atol=state_tol[0], rtol=state_tol[1])
    untouched = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(mine[untouched], state[untouched])
    assert dispatch._KERNELS["lightning_decode"] is tl_.lightning_decode
