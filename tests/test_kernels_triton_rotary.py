"""The in-place rotary kernel (an encoder's q and k heads inside its QKV buffer) against
`reference.rotary_in_place`, and that reference against an independent formulation.

Fresh seeded random inputs; without a GPU the kernel runs in Triton's CPU interpreter
(TRITON_INTERPRET=1, set by conftest.py), so shapes are small.
"""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _complex_rotation(x, positions, theta):
    """Rotate-half rotary as a complex product: pairs (x[i], x[i + D/2]) times e^{i pos f_i},
    in float64: independent of how the reference forms its cos/sin tables."""
    half = x.shape[-1] // 2
    freqs = 1.0 / theta ** (torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angle = positions.double().cpu()[:, None] * freqs[None, :]
    z = torch.complex(x[..., :half].double().cpu(), x[..., half:].double().cpu()) * torch.polar(
        torch.ones_like(angle), angle)[:, None, :]
    return torch.cat([z.real, z.imag], dim=-1)


def test_reference_rotates_the_q_and_k_heads_of_a_qkv_buffer_and_nothing_else():
    tokens, heads, head_dim, theta = 11, 3, 16, 10_000.0
    qkv = _rand(tokens, 3 * heads * head_dim, seed=0)
    before = qkv.clone()
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6], device=DEVICE)
    cos, sin = ref.rotary_cos_sin(torch.arange(64, device=DEVICE), head_dim, theta)
    qk = qkv.view(tokens, 3 * heads, head_dim)[:, : 2 * heads]
    assert ref.rotary_in_place(qk, cos, sin, positions) is qk
    view = qkv.view(tokens, 3 * heads, head_dim)
    expected = _complex_rotation(before.view(tokens, 3 * heads, head_dim)[:, : 2 * heads], positions, theta)
    torch.testing.assert_close(view[:, : 2 * heads].double().cpu(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(view[:, 2 * heads :], before.view(tokens, 3 * heads, head_dim)[:, 2 * heads :])  # v untouched
    # per-token rows (no positions) are the same rotation
    qkv2 = before.clone()
    qk2 = qkv2.view(tokens, 3 * heads, head_dim)[:, : 2 * heads]
    ref.rotary_in_place(qk2, cos[positions], sin[positions])
    torch.testing.assert_close(qkv2, qkv)


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernel cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels.triton_rotary import rotary_in_place  # noqa: E402


def _check(tokens, heads, head_dim, dtype, with_positions, seed):
    """Kernel and reference on the same strided q/k view of a packed QKV buffer."""
    qkv = _rand(tokens, 3 * heads * head_dim, seed=seed, dtype=dtype)
    table_rows = 40
    cos, sin = ref.rotary_cos_sin(torch.arange(table_rows, device=DEVICE), head_dim, 160_000.0)
    positions = None
    if with_positions:
        positions = torch.randint(0, table_rows, (tokens,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    else:
        rows = torch.arange(tokens, device=DEVICE) % table_rows
        cos, sin = cos[rows], sin[rows]
    expected = qkv.clone()
    ref.rotary_in_place(expected.view(tokens, 3 * heads, head_dim)[:, : 2 * heads], cos, sin, positions)
    qk = qkv.view(tokens, 3 * heads, head_dim)[:, : 2 * heads]
    assert rotary_in_place(qk, cos, sin, positions) is qk
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(qkv, expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("tokens,heads,head_dim", [(1, 1, 16), (37, 3, 32), (5, 12, 64), (9, 2, 96)])
@pytest.mark.parametrize("with_positions", [False, True])
def test_kernel_matches_reference_fp32(tokens, heads, head_dim, with_positions):
    """Token and head counts that are not powers of two, head dim 96 (a padded half), tables
    indexed by position or one row per token."""
    _check(tokens, heads, head_dim, torch.float32, with_positions, seed=tokens + heads)


def test_kernel_matches_reference_fp16():
    _check(50, 4, 64, torch.float16, True, seed=3)


def test_kernel_leaves_v_and_other_tokens_alone():
    """Only the viewed heads change: v (the last third of every row) is bit for bit unchanged."""
    tokens, heads, head_dim = 13, 2, 32
    qkv = _rand(tokens, 3 * heads * head_dim, seed=4)
    v_before = qkv[:, 2 * heads * head_dim :].clone()
    cos, sin = ref.rotary_cos_sin(torch.arange(tokens, device=DEVICE), head_dim, 10_000.0)
    rotary_in_place(qkv.view(tokens, 3 * heads, head_dim)[:, : 2 * heads], cos, sin)
    assert torch.equal(qkv[:, 2 * heads * head_dim :], v_before)


def test_kernel_rejects_odd_head_dim_and_mismatched_tables():
    x = _rand(4, 2, 15, seed=5)
    cos, sin = ref.rotary_cos_sin(torch.arange(4, device=DEVICE), 16, 10_000.0)
    with pytest.raises(ValueError, match="even"):
        rotary_in_place(x, cos[:, :7], sin[:, :7])
    with pytest.raises(AssertionError, match="one row per token"):
        rotary_in_place(_rand(5, 2, 16, seed=6), cos, sin)


def test_registered_for_dispatch():
    assert dispatch._KERNELS["rotary_in_place"] is rotary_in_place


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_modernbert_base_shape(dtype):
    """ModernBERT-base's q and k heads (12 + 12 of 64) over 65,536 packed tokens."""
    _check(65_536, 12, 64, dtype, True, seed=7)
