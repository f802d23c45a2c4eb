"""RecurrentGemma's RG-LRU decode step (kernels/triton_rglru.py): the reference against Hugging Face's
RecurrentGemmaRglru on one token, and the Triton kernel against the reference on fresh random inputs, with
states at strided slots as the state cache holds them, rows at the first position among them."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE, dtype)


def _case(rows, heads, block, dtype, seed=0):
    """x and y as strided slices of one projection, the gates' block-diagonal weights and biases, the rate,
    a state at strided slots (a view into wider rows), distinct slots out of 6 and positions (the second row,
    where there is one, a sequence's first token)."""
    width = heads * block
    proj = _rand(rows, 2 * width + 3, seed=seed, dtype=dtype)
    x, y = proj[:, 1 : 1 + width], proj[:, 1 + width : 1 + 2 * width]
    wi, wa = (_rand(heads, block, block, seed=seed + s, dtype=dtype, scale=block ** -0.5) for s in (1, 2))
    bi, ba = (_rand(heads, block, seed=seed + s, dtype=dtype, scale=0.5) for s in (3, 4))
    rate = F.softplus(_rand(width, seed=seed + 5, dtype=dtype) - 2.0)
    data = _rand(7, width + 5, seed=seed + 6)
    state = data[:, 2 : 2 + width]
    slots = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:rows].to(DEVICE)
    positions = torch.arange(rows, device=DEVICE) * 7 + 3
    if rows > 1:
        positions[1] = 0
    return x, y, wi, bi, wa, ba, rate, state, slots, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_step_is_hf_rglru_on_one_token(dtype):
    """In fp32, and in bf16 rounded where transformers rounds (on the CPU: bit for bit)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

    rows, heads, block = 3, 2, 8 if dtype == torch.float32 else 64
    x, y, wi, bi, wa, ba, _, state, slots, positions = _case(rows, heads, block, dtype, seed=3)
    width = heads * block
    cfg = transformers.RecurrentGemmaConfig(hidden_size=width, lru_width=width, num_attention_heads=heads)
    hf = RecurrentGemmaRglru(cfg).to(DEVICE, dtype)
    with torch.no_grad():
        for name, t in (("input_gate_weight", wi), ("input_gate_bias", bi), ("recurrent_gate_weight", wa),
                        ("recurrent_gate_bias", ba)):
            getattr(hf, name).copy_(t)
        hf.recurrent_param.copy_(_rand(heads * block, seed=9))
        before = state.clone()
        hf.recurrent_states = before[slots]
        expected = hf(x.contiguous()[:, None, :], positions[:, None])[:, 0]
    rate = F.softplus(hf.recurrent_param.detach())
    got = ref.rglru_decode(x, y, wi, bi, wa, ba, rate, state, slots, positions)
    exact = dtype == torch.float32 or DEVICE == "cpu"
    tol = {} if dtype == torch.float32 else dict(atol=0.0, rtol=0.0) if exact else dict(atol=1e-2, rtol=2.0 ** -6)
    torch.testing.assert_close(got, expected * y, **tol)
    torch.testing.assert_close(state[slots], hf.recurrent_states, **tol)
    others = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(state[others], before[others])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("start", [0, 5])
def test_prompt_chunk_scan_is_the_decode_steps_in_turn(dtype, start):
    """models/recurrent_gemma.py's prompt path (the gates of every row, then the prefix scan from the slot's state)
    equals reference.rglru_decode applied to one row after another: a sequence's first chunk (from position 0, the
    reset) and a later one, 13 rows (the scan's steps past a power of two)."""
    from tritonformer.backend.models.recurrent_gemma import RgLru, linear_scan, rglru_inputs

    rows, heads, block = 13, 2, 8
    x, y, wi, bi, wa, ba, rate, state, _, _ = _case(rows, heads, block, dtype, seed=start + 1)
    positions = torch.arange(start, start + rows, device=DEVICE)
    mixer = RgLru(*(None,) * 4, None, None, wi, bi, wa, ba, rate, None, None)
    a, v = rglru_inputs(x, mixer, positions)
    got = linear_scan(a, v, state[4])
    steps = state.clone()
    for t in range(rows):
        expected = ref.rglru_decode(x[t : t + 1], torch.ones_like(y[t : t + 1]), wi, bi, wa, ba, rate, steps,
                                    torch.tensor([4], device=DEVICE), positions[t : t + 1])
        torch.testing.assert_close(got[t].to(dtype), expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[-1], steps[4], atol=1e-5, rtol=1e-5)


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_rglru as trg  # noqa: E402


@pytest.mark.parametrize("rows,heads,block,dtype", [
    (1, 1, 16, torch.float32), (3, 2, 24, torch.float32), (4, 2, 256, torch.float32), (3, 4, 64, torch.bfloat16),
    (0, 2, 16, torch.float32),
])
def test_rglru_decode_kernel(rows, heads, block, dtype):
    x, y, wi, bi, wa, ba, rate, state, slots, positions = _case(rows, heads, block, dtype, seed=rows + block)
    mine, theirs = state.clone(), state.clone()
    got = trg.rglru_decode(x, y, wi, bi, wa, ba, rate, mine, slots, positions)
    expected = ref.rglru_decode(x, y, wi, bi, wa, ba, rate, theirs, slots, positions)
    # bf16: each rounding may land one step apart where the interpreter truncates and a sum's order differs
    tol = (1e-5, 1e-5) if dtype == torch.float32 else (5e-2, 5e-2)
    torch.testing.assert_close(got, expected, atol=tol[0], rtol=tol[1])
    torch.testing.assert_close(mine, theirs, atol=tol[0], rtol=tol[1])
    untouched = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(mine[untouched], state[untouched])
    assert dispatch._KERNELS["rglru_decode"] is trg.rglru_decode
