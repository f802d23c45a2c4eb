"""The mLSTM decode step (kernels/triton_mlstm.py: xLSTM): the reference against Hugging Face's recurrent step, and
the Triton kernel against the reference on fresh random inputs, with q / k / v / gates as strided slices of one
projection and states at strided slots (fresh and carried ones) as the state cache holds them."""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(rows, heads, dk, dv, dtype, seed=0, slots=6):
    g = torch.Generator().manual_seed(seed)
    width = heads * (2 * dk + dv) + 2 * heads
    proj = torch.randn(rows, width + 3, generator=g).to(DEVICE, dtype)
    at = [1]

    def part(n, *shape):
        out = proj[:, at[0] : at[0] + n].reshape(rows, *shape)
        at[0] += n
        return out

    q, k = part(heads * dk, heads, dk), part(heads * dk, heads, dk)
    v = part(heads * dv, heads, dv)
    i, f = part(heads, heads) * 3, part(heads, heads) * 3
    data = torch.randn(slots, heads * dk * dv + 5, generator=g).to(DEVICE)
    c = data[:, 2 : 2 + heads * dk * dv].reshape(slots, heads, dk, dv)  # (each slot contiguous, the slots apart)
    n = torch.randn(slots, heads * dk + 3, generator=g).to(DEVICE)[:, 1 : 1 + heads * dk].reshape(slots, heads, dk)
    m = torch.randn(slots, heads + 1, generator=g).to(DEVICE)[:, :heads].reshape(slots, heads, 1)
    c[0], n[0], m[0] = 0.0, 0.0, 0.0  # a fresh slot
    return q, k, v, i, f, c, n, m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_step_is_hf_mlstm_recurrent_step(dtype):
    """In fp32, and in bf16 rounded where transformers rounds (on the CPU: bit for bit)."""
    xlstm = pytest.importorskip("transformers.models.xlstm.modeling_xlstm")
    q, k, v, i, f, c, n, m = _case(3, 2, 16, 24, dtype, seed=1)
    slots = torch.tensor([3, 0, 5], device=DEVICE)
    before = c.clone(), n.clone(), m.clone()
    h, (c1, n1, m1) = xlstm.mlstm_recurrent_step_native(q, k, v, i[..., None], f[..., None], before[0][slots],
                                                         before[1][slots], before[2][slots], eps=1e-6)
    got = ref.mlstm_decode(q, k, v, i, f, c, n, m, slots, 1e-6)
    tol = dict(atol=0.0, rtol=0.0) if DEVICE == "cpu" else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got, h, **tol)
    for mine, theirs in ((c, c1), (n, n1), (m, m1)):
        torch.testing.assert_close(mine[slots], theirs, **tol)
    others = [1, 2, 4]
    assert all(torch.equal(s[others], b[others]) for s, b in zip((c, n, m), before))


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_mlstm as tm  # noqa: E402


@pytest.mark.parametrize("rows,heads,dk,dv,dtype", [
    (1, 1, 16, 16, torch.float32), (3, 2, 48, 40, torch.float32), (2, 2, 64, 256, torch.bfloat16),
    (4, 1, 32, 24, torch.bfloat16), (0, 2, 16, 16, torch.float32),
])
def test_mlstm_decode_kernel(rows, heads, dk, dv, dtype):
    q, k, v, i, f, c, n, m = _case(rows, heads, dk, dv, dtype, seed=rows + dk)
    slots = torch.tensor([3, 0, 5, 1][:rows], dtype=torch.long, device=DEVICE)
    mine, theirs = [t.clone() for t in (c, n, m)], [t.clone() for t in (c, n, m)]
    got = tm.mlstm_decode_kernel(q, k, v, i, f, *mine, slots, 1e-6)
    expected = ref.mlstm_decode(q, k, v, i, f, *theirs, slots, 1e-6)
    # bf16: each rounding may land one step apart where the interpreter truncates and a sum's order differs (h
    # where its numerator cancels most)
    tol = (1e-5, 1e-5) if dtype == torch.float32 else (5e-2, 5e-2)
    torch.testing.assert_close(got, expected, atol=tol[0], rtol=tol[1])
    for a, b, before in zip(mine, theirs, (c, n, m)):
        torch.testing.assert_close(a, b, atol=tol[0], rtol=tol[1])
        untouched = [s for s in range(6) if s not in slots.tolist()]
        assert torch.equal(a[untouched], before[untouched])
    assert dispatch._KERNELS["mlstm_decode"] is tm.mlstm_decode


def test_mlstm_decode_takes_the_reference_below_its_row_threshold():
    """Fewer rows than MIN_ROWS run the reference's ops (bit for bit), more the kernel."""
    for rows, kernel in ((tm.MIN_ROWS - 1, False), (tm.MIN_ROWS, True)):
        q, k, v, i, f, c, n, m = _case(rows, 2, 16, 16, torch.float32, seed=9)
        slots = torch.arange(rows, device=DEVICE)
        mine, theirs = [t.clone() for t in (c, n, m)], [t.clone() for t in (c, n, m)]
        got = tm.mlstm_decode(q, k, v, i, f, *mine, slots, 1e-6)
        expected = ref.mlstm_decode(q, k, v, i, f, *theirs, slots, 1e-6)
        if kernel:
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        else:
            assert torch.equal(got, expected) and all(torch.equal(a, b) for a, b in zip(mine, theirs))
