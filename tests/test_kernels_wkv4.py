"""RWKV-4's WKV (kernels/triton_wkv4.py): the reference against Hugging Face's recurrence over whole sequences,
and the Triton kernel against the reference on fresh random inputs: decode rows (each its own sequence) and prompt
chunks of several lengths, states at strided slots as the state cache holds them, fresh and carried slots."""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(rows, width, seed, dtype=torch.float32, slots=7):
    """k fp32 and v `dtype` as strided slices of one projection, u and w (w = -exp(decay)), states as strided views
    into wider rows: slot 0 fresh (zeroed), the others carrying a state (den >= 1, a max exponent)."""
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(rows, 2 * width + 3, generator=g) * 2
    k, v = proj[:, 1 : 1 + width].to(DEVICE), proj[:, 1 + width : 1 + 2 * width].to(DEVICE, dtype)
    u = (torch.randn(width, generator=g) * 0.5).to(DEVICE)
    w = -torch.exp(torch.randn(width, generator=g)).to(DEVICE)
    states = []
    for scale in (1.0, 1.0, 3.0):
        data = torch.randn(slots, width + 4, generator=g).abs() * scale
        states.append(data[:, 1 : 1 + width].to(DEVICE) if DEVICE == "cpu" else data.to(DEVICE)[:, 1 : 1 + width])
    num, den, top = states
    den += 1.0
    for t in states:
        t[0] = 0.0
    return k, v, u, w, num, den, top


def test_reference_over_a_prompt_is_hf_rwkv_linear_attention():
    """reference.wkv4 over one sequence from a fresh slot equals transformers' rwkv_linear_attention_cpu with no
    state (its start at a max exponent of -1e38), then a second chunk from the carried slot equals HF's with the state it returned."""
    pytest.importorskip("transformers")
    from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

    width = 16
    k, v, u, w, num, den, top = _case(11, width, seed=1)
    decay = torch.log(-w)  # (HF takes time_decay and computes -exp itself)
    slot = torch.tensor([0], device=DEVICE)
    got = ref.wkv4(k[:6], v[:6], u, w, num, den, top, slot, torch.tensor([6], device=DEVICE))
    expected, state = rwkv_linear_attention_cpu(decay, u, k[None, :6], v[None, :6], state=None, return_state=True)
    torch.testing.assert_close(got, expected[0], atol=1e-5, rtol=1e-5)
    got = ref.wkv4(k[6:], v[6:], u, w, num, den, top, slot, torch.tensor([5], device=DEVICE))
    expected, _ = rwkv_linear_attention_cpu(decay, u, k[None, 6:], v[None, 6:], state=state, return_state=True)
    torch.testing.assert_close(got, expected[0], atol=1e-5, rtol=1e-5)


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_wkv4 as tw  # noqa: E402


@pytest.mark.parametrize("lens,width,dtype", [
    (None, 16, torch.float32), (None, 200, torch.bfloat16), ([1, 9, 4], 16, torch.float32),
    ([13], 160, torch.bfloat16), ([3, 1], 300, torch.float32),
])
def test_wkv4_kernel(lens, width, dtype):
    sequences = 3 if lens is None else len(lens)
    rows = sequences if lens is None else sum(lens)
    k, v, u, w, num, den, top = _case(rows, width, seed=rows + width, dtype=dtype)
    slots = torch.tensor([4, 0, 2][:sequences], device=DEVICE)
    lens_t = None if lens is None else torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    mine = [t.clone() for t in (num, den, top)]
    theirs = [t.clone() for t in (num, den, top)]
    got = tw.wkv4(k, v, u, w, *mine, slots, lens_t)
    expected = ref.wkv4(k, v, u, w, *theirs, slots, lens_t)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for a, b, before in zip(mine, theirs, (num, den, top)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        untouched = [s for s in range(7) if s not in slots.tolist()]
        assert torch.equal(a[untouched], before[untouched])
    assert dispatch._KERNELS["wkv4"] is tw.wkv4
