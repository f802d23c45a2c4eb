"""ZAYA's CCA convolution step (kernels/triton_cca.py): the reference against the plain definition (two causal
Conv1d's over the whole window, as transformers runs them), and the Triton kernel against the reference on fresh
random inputs, with states at strided slots as the state cache holds them."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _case(rows, heads, d, t0, t1, dtype, seed=0):
    """x `[rows, heads * d]`, the two convolutions' fp32 weights and biases, a state `[7, C, K]` at strided slots
    (a view into wider rows, as the state cache's) and distinct slots out of 6."""
    c, k = heads * d, t0 + t1 - 2
    x = _rand(rows, c, seed=seed, dtype=dtype)
    w1, b1 = _rand(c, t0, seed=seed + 1), _rand(c, seed=seed + 2)
    w2, b2 = _rand(c, d, t1, seed=seed + 3) * d ** -0.5, _rand(c, seed=seed + 4)
    data = _rand(7, c * k + 5, seed=seed + 5)
    state = data[:, 3: 3 + c * k].view(7, c, k)
    slots = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:rows].to(DEVICE)
    return x, w1, b1, w2, b2, state, slots


def test_reference_step_is_the_two_convolutions_over_state_then_input():
    x, w1, b1, w2, b2, state, slots = _case(3, 3, 4, 3, 2, torch.float32)
    before = state.clone()
    got = ref.cca_conv_decode(x, w1, b1, w2, b2, state, slots)
    for i, s in enumerate(slots.tolist()):
        seq = torch.cat([before[s], x[i][:, None]], dim=1)  # [C, K + 1]: the whole window
        dw = F.conv1d(seq[None], w1[:, None, :], b1, groups=12)
        y = F.conv1d(dw, w2, b2, groups=3)[0, :, -1]
        torch.testing.assert_close(got[i], y)
        assert torch.equal(state[s], seq[:, 1:])
    others = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(state[others], before[others])


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernel cannot run", allow_module_level=True)

from tritonformer.kernels import triton_cca as tc  # noqa: E402

# (bf16: the interpreter truncates where a GPU rounds, so on the CPU the depthwise outputs' rounding to bf16 is a
# step apart in most channels; the fp32 cases pin the math)
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (7e-2, 2e-2) if DEVICE == "cpu" else (1e-2, 1e-2)}


@pytest.mark.parametrize("rows,heads,d,t0,t1,dtype", [
    (3, 3, 8, 2, 2, torch.float32),  # ZAYA1-8B's taps
    (2, 5, 6, 3, 2, torch.float32),  # a head not a power of two, K = 3
    (2, 2, 16, 1, 3, torch.float32),  # a one-tap depthwise convolution
    (3, 3, 8, 2, 2, torch.bfloat16),
])
def test_kernel_matches_reference(rows, heads, d, t0, t1, dtype, monkeypatch):
    # (the reference's grouped convolution goes through cuDNN, whose fp32 convolutions round their inputs to TF32
    # by default: 2e-3 off on the H200; the reference is fp32 math)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    x, w1, b1, w2, b2, state, slots = _case(rows, heads, d, t0, t1, dtype, seed=rows + heads + d)
    want_state = state.clone()
    want = ref.cca_conv_decode(x, w1, b1, w2, b2, want_state, slots)
    got = tc.cca_conv_decode(x, w1, b1, w2, b2, state, slots)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(state, want_state, atol=0.0, rtol=0.0)


def test_registered_for_cuda_tensors():
    """kernels.cca_conv_decode dispatches here on CUDA (the module is loaded with the others)."""
    from tritonformer.kernels import dispatch

    assert dispatch._KERNELS["cca_conv_decode"] is tc.cca_conv_decode
    assert "triton_cca" in dispatch._KERNEL_MODULES
