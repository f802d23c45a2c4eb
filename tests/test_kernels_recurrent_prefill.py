"""Hybrid models' recurrent layers over a prompt (kernels/triton_recurrent_prefill.py: the causal convolution, the
gated delta rule, Kimi Delta Attention's, Mamba-2's recurrence and Mamba-1's selective scan) against their
references on fresh random inputs: prompts shorter than a chunk, one chunk, several with a ragged end; dims not
powers of two; inputs strided as the layers pass them; the state read from and written to its slot only."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from tritonformer.kernels import dispatch
from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import triton_recurrent_prefill as trp  # noqa: E402


def _case(length, heads, kd, vd, seed):
    """q, k, v as views into one wider [T, H, width] row (the layer's inputs are slices), L2-normalised q and
    k as the layer's are, decays up to -0.02 / -3 / -0.3 a token by head (weak ones reach across a whole chunk),
    beta in [0, 2] (OLMo hybrid's range), a state of 4 slots."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(length, heads, 2 * kd + vd + 3, generator=gen)
    q, k, v = rows[..., :kd], rows[..., kd : 2 * kd], rows[..., 2 * kd + 3 :]
    q, k = F.normalize(q, dim=-1) * kd ** -0.5, F.normalize(k, dim=-1)
    g = -torch.rand(length, heads, generator=gen) * torch.tensor([0.02, 3.0, 0.3])[:heads]  # weak to strong
    beta = torch.rand(length, heads, generator=gen) * 2
    state = torch.randn(4, heads, kd, vd, generator=gen)
    return [t.to(DEVICE) for t in (q, k, v, g, beta, state)]


@pytest.mark.parametrize("length,heads,kd,vd", [(1, 2, 16, 16), (37, 3, 32, 24), (64, 2, 16, 32),
                                                (150, 1, 96, 192), (200, 1, 128, 128)])
def test_gated_delta_chunk_kernel(length, heads, kd, vd):
    """q, k, v strided over one row, the output written into a strided bf16 tensor and returned in fp32."""
    q, k, v, g, beta, state = _case(length, heads, kd, vd, seed=length)
    slot = torch.tensor([2], device=DEVICE)
    mine, theirs = state.clone(), state.clone()
    out = torch.zeros(length, heads + 1, vd, dtype=torch.bfloat16, device=DEVICE)[:, 1:]  # strided, bf16
    got = trp.gated_delta_chunk(q, k, v, g, beta, mine, slot, out)
    expected = ref.gated_delta_chunk(q, k, v, g, beta, theirs, slot)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=1e-2)  # (bf16's step)
    fp32 = trp.gated_delta_chunk(q, k, v, g, beta, state.clone(), slot)
    torch.testing.assert_close(fp32, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    assert torch.equal(mine[[0, 1, 3]], state[[0, 1, 3]])
    assert dispatch._KERNELS["gated_delta_chunk"] is trp.gated_delta_chunk



@pytest.mark.parametrize("length,channels,k,bias,activation,dtype", [
    (1, 5, 4, True, "silu", torch.float32), (2, 130, 4, False, None, torch.float32),
    (40, 200, 3, True, "silu", torch.bfloat16), (70, 24, 2, False, "silu", torch.float32),
    (0, 8, 4, True, None, torch.float32)])
def test_conv1d_chunk_kernel(length, channels, k, bias, activation, dtype):
    """Prompts shorter than the window (the new state partly the old), longer than a block of rows, 2-4 taps,
    x a strided slice, a state at strided slots and channels (a view into wider rows, as the state cache's)."""
    gen = torch.Generator().manual_seed(length + channels)
    x = torch.randn(length, channels + 3, generator=gen)[:, 3:].to(DEVICE, dtype)
    w = torch.randn(channels, k, generator=gen).to(DEVICE, dtype)
    b = torch.randn(channels, generator=gen).to(DEVICE, dtype) if bias else None
    rows = torch.randn(4, channels, k + 1, generator=gen).to(DEVICE)
    state = rows[:, :, 1:]  # [slots, C, K]: each channel's K - 1 inputs contiguous at a stride of K + 1
    state = state[:, :, : k - 1]
    slot = torch.tensor([1], device=DEVICE)
    mine, theirs = state.clone(), state.clone()
    got = trp.conv1d_chunk(x, w, b, mine, slot, activation)
    expected = ref.conv1d_chunk(x, w, b, theirs, slot, activation)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-6)
    assert torch.equal(mine[[0, 2, 3]], state[[0, 2, 3]])
    assert dispatch._KERNELS["conv1d_chunk"] is trp.conv1d_chunk


@pytest.mark.parametrize("length,heads,groups,p,n,chunk_size", [
    (1, 2, 1, 16, 16, 256), (37, 4, 2, 24, 16, 256), (150, 2, 2, 32, 64, 256), (130, 3, 1, 64, 128, 48)])
def test_ssd_chunk_kernel(length, heads, groups, p, n, chunk_size):
    """Mamba-2's recurrence over a prompt: B / C shared by groups of heads, head and state dims not powers of two,
    the reference chunked otherwise than the kernel (its chunk_size), x / B / C strided slices of one row as the
    layer's; dt up to 0.5 and A down to -4 (decays to e^-2 a token); the state at its slot only."""
    gen = torch.Generator().manual_seed(length + heads)
    inner = heads * p
    row = torch.randn(length, inner + 2 * groups * n + 1, generator=gen).to(DEVICE)
    x = row[:, 1 : 1 + inner].view(length, heads, p)
    b = row[:, 1 + inner : 1 + inner + groups * n].view(length, groups, n)
    c = row[:, 1 + inner + groups * n :].view(length, groups, n)
    dt = (torch.rand(length, heads, generator=gen) * 0.5).to(DEVICE)
    A = (-torch.rand(heads, generator=gen) * 4).to(DEVICE)
    state = torch.randn(3, heads, p, n, generator=gen).to(DEVICE)
    slot = torch.tensor([2], device=DEVICE)
    mine, theirs = state.clone(), state.clone()
    got = trp.ssd_chunk(x, dt, A, b, c, mine, slot, chunk_size)
    expected = ref.ssd_chunk(x, dt, A, b, c, theirs, slot, chunk_size)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    assert torch.equal(mine[:2], state[:2])
    assert dispatch._KERNELS["ssd_chunk"] is trp.ssd_chunk


@pytest.mark.parametrize("length,heads,kd,vd", [(1, 2, 16, 16), (37, 3, 32, 24), (64, 2, 16, 32),
                                                (150, 3, 48, 40), (130, 1, 128, 128)])
def test_kda_chunk_kernel(length, heads, kd, vd):
    """Kimi Delta Attention's rule (a decay per key channel): q, k, v strided over one row and g over a wider one,
    per-channel decays of up to -0.05 / -5 / -0.5 a token by head (the strong head's sum over a chunk, ~-160,
    overflows e^-G: the within-chunk products must stay relative), the output written into a strided bf16
    tensor and, fp32, returned; a non-zero state read from and written back to its slot only."""
    q, k, v, _, beta, state = _case(length, heads, kd, vd, seed=length + kd)
    gen = torch.Generator().manual_seed(length)
    rates = torch.tensor([0.05, 5.0, 0.5])[:heads, None]
    g = (-torch.rand(length, heads, kd + 2, generator=gen) * rates)[:, :, 1 : kd + 1].to(DEVICE)  # (strided rows)
    slot = torch.tensor([1], device=DEVICE)
    mine, theirs = state.clone(), state.clone()
    out = torch.zeros(length, heads + 1, vd, dtype=torch.bfloat16, device=DEVICE)[:, 1:]  # strided, bf16
    got = trp.kda_chunk(q, k, v, g, beta, mine, slot, out)
    expected = ref.kda_chunk(q, k, v, g, beta, theirs, slot)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=1e-2)  # (bf16's step)
    fp32 = trp.kda_chunk(q, k, v, g, beta, state.clone(), slot)
    torch.testing.assert_close(fp32, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    assert torch.equal(mine[[0, 2, 3]], state[[0, 2, 3]])
    assert dispatch._KERNELS["kda_chunk"] is trp.kda_chunk


@pytest.mark.parametrize("length,channels,n,dtype", [(1, 40, 16, torch.float32), (16, 32, 16, torch.float32),
                                                     (37, 70, 6, torch.float32), (40, 40, 16, torch.bfloat16),
                                                     (21, 33, 32, torch.bfloat16)])
def test_selective_scan_chunk_kernel(length, channels, n, dtype):
    """Mamba-1's selective scan over a prompt: one token, exactly a tile, ragged ends (the last tile's rows past
    the end must not move the state), channels not a multiple of a program's block, state sizes 6 / 16 / 32;
    x and z strided halves of one projection's rows, dt, B and C slices of wider ones, the output written into a
    strided view; dt up to ~2 (with A down to -3, decays to e^-6 a token); a non-zero state read from and written
    back to its slot only."""
    gen = torch.Generator().manual_seed(length + channels)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    xz = rand(length, 2 * channels + 3).to(DEVICE, dtype)
    x, z = xz[:, 1 : 1 + channels], xz[:, 1 + channels : 1 + 2 * channels]
    dt = (rand(length, channels + 2)[:, 2:] - 1.0).to(DEVICE, dtype)
    dbc = rand(length, 5 + 2 * n).to(DEVICE, dtype)
    b, c = dbc[:, 5 : 5 + n], dbc[:, 5 + n :]
    dt_bias, D = (rand(channels) * 0.5).to(DEVICE), rand(channels).to(DEVICE)
    A = (-torch.rand(channels, n, generator=gen) * 3).to(DEVICE)
    state = rand(3, channels * n + 4)[:, 4:].view(3, channels, n).to(DEVICE)  # (slots at a stride)
    slot = torch.tensor([2], device=DEVICE)
    mine, theirs = state.clone(), state.clone()
    out = torch.zeros(length, channels + 1, dtype=dtype, device=DEVICE)[:, 1:]
    got = trp.selective_scan_chunk(x, dt, b, c, z, dt_bias, A, D, mine, slot, out)
    expected = ref.selective_scan_chunk(x, dt, b, c, z, dt_bias, A, D, theirs, slot)
    assert got.data_ptr() == out.data_ptr() and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    else:  # h C and silu(z) rounded to bf16 on the way (a step apart where they round otherwise), then D x added
        torch.testing.assert_close(got.float(), expected.float(), atol=2e-2 * expected.abs().max().item(), rtol=2e-2)
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)
    assert torch.equal(mine[:2], state[:2])
    assert dispatch._KERNELS["selective_scan_chunk"] is trp.selective_scan_chunk
