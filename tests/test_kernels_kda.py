"""Kimi Delta Attention's decode ops (kernels/triton_kda.py): the reference step against the rule written out
channel by channel, and the Triton kernels against the references on fresh random inputs, with states at
strided slots as the state cache holds them."""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _kda_case(rows, heads, kd, vd, dtype, seed=0):
    """Convolved rows [q; k; v], the forget gate's logits f and the beta logits b as strided slices of one
    projection, the per-head rates and per-channel biases, and a recurrent state at strided slots (a view into
    wider rows) with distinct slots out of 6."""
    width = heads * (2 * kd + vd)
    mixed = _rand(rows, width + 3, seed=seed, dtype=dtype)[:, 3:]
    proj = _rand(rows, heads * kd + heads + 5, seed=seed + 1, dtype=dtype) * 2
    f, b = proj[:, 2 : 2 + heads * kd], proj[:, 2 + heads * kd : 2 + heads * kd + heads]
    neg_a = -torch.rand(heads, generator=torch.Generator().manual_seed(seed)).to(DEVICE) * 4
    dt_bias = _rand(heads * kd, seed=seed + 2)
    data = _rand(7, heads * kd * vd + 4, seed=seed + 3) * 0.3
    state = data[:, 4:].view(7, heads, kd, vd)
    slots = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:rows].to(DEVICE)
    return mixed, f, b, neg_a, dt_bias, state, slots


def test_reference_step_decays_each_key_channel_by_its_own_gate():
    """The reference against the rule written out per key channel c and value column j:
    S'[c, j] = e^(g_c) S[c, j]; u_j = beta (v_j - sum_c S'[c, j] k_c); S[c, j] = S'[c, j] + k_c u_j;
    o_j = sum_c S[c, j] q_c."""
    mixed, f, b, neg_a, dt_bias, state, slots = _kda_case(2, 3, 4, 5, torch.float32, seed=4)
    before = state.clone()
    got = ref.kda_decode(mixed, f, b, neg_a, dt_bias, state, slots)
    q, k, v, g, beta = ref.kda_inputs(mixed, f, b, neg_a, dt_bias)
    assert bool((g < 0).all()) and len({round(x, 6) for x in g[0, 0].tolist()}) == 4  # (a decay per channel)
    for i, s in enumerate(slots.tolist()):
        for h in range(3):
            S = before[s, h].clone()
            for c in range(4):
                S[c] *= torch.exp(g[i, h, c])
            u = beta[i, h] * (v[i, h] - (S * k[i, h][:, None]).sum(0))
            S += k[i, h][:, None] * u[None, :]
            torch.testing.assert_close(state[s, h], S)
            torch.testing.assert_close(got[i, h], (S * q[i, h][:, None]).sum(0))
    others = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(state[others], before[others])


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_kda as tk  # noqa: E402

# Outputs are sums of many products (near zero a relative tolerance alone fails); with bf16 inputs beta is rounded
# to bf16, which the interpreter's truncating cast may round one step off.
SUM_TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-3, 2.0 ** -6)}
NORM_TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 2.0 ** -6)}


# The last three: Ling 3.0's (bailing_hybrid) bounded forget gate, g = lower_bound * sigmoid(-neg_a (f + dt_bias)),
# rounded to f's dtype where its transformers layer rounds it (bf16 here; in fp32 rounding is the identity)
@pytest.mark.parametrize("rows,heads,kd,vd,dtype,bound,rounded", [
    (1, 1, 16, 16, torch.float32, None, False), (3, 2, 32, 24, torch.float32, None, False),
    (2, 3, 64, 128, torch.float32, None, False), (4, 2, 128, 128, torch.bfloat16, None, False),
    (0, 2, 16, 16, torch.float32, None, False), (3, 2, 24, 40, torch.float32, None, False),
    (3, 2, 32, 24, torch.float32, -5.0, False), (2, 3, 16, 16, torch.float32, -1.5, True),
    (4, 2, 64, 64, torch.bfloat16, -5.0, True),
])
def test_kda_decode_kernel(rows, heads, kd, vd, dtype, bound, rounded):
    mixed, f, b, neg_a, dt_bias, state, slots = _kda_case(rows, heads, kd, vd, dtype,
                                                          seed=rows + kd + (bound is not None))
    mine, theirs = state.clone(), state.clone()
    got = tk.kda_decode(mixed, f, b, neg_a, dt_bias, mine, slots, bound, rounded)
    expected = ref.kda_decode(mixed, f, b, neg_a, dt_bias, theirs, slots, bound, rounded)
    if bound is not None:
        g = ref.kda_inputs(mixed, f, b, neg_a, dt_bias, bound, rounded)[3]
        assert bool((g < 0).all() and (g >= bound).all())  # (the bound: never more than e^bound of the state forgotten)
    atol, rtol = SUM_TOL[dtype]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    state_tol = (1e-5, 1e-4) if dtype == torch.float32 else (5e-3, 1e-2)
    torch.testing.assert_close(mine, theirs, atol=state_tol[0], rtol=state_tol[1])
    untouched = [s for s in range(7) if s not in slots.tolist()]
    assert torch.equal(mine[untouched], state[untouched])
    assert dispatch._KERNELS["kda_decode"] is tk.kda_decode


@pytest.mark.parametrize("rows,heads,vd,dtype", [(1, 2, 16, torch.float32), (5, 3, 24, torch.float32),
                                                  (3, 4, 128, torch.bfloat16), (0, 2, 16, torch.float32)])
def test_kda_gated_norm_kernel(rows, heads, vd, dtype):
    o = _rand(rows, heads, vd, seed=rows, dtype=dtype)
    gate = _rand(rows, heads * vd + 6, seed=rows + 1, dtype=dtype)[:, 2 : 2 + heads * vd]  # (strided rows)
    w = _rand(vd, seed=3, dtype=dtype)
    atol, rtol = NORM_TOL[dtype]
    torch.testing.assert_close(tk.kda_gated_norm(o, gate, w, 1e-5), ref.kda_gated_norm(o, gate, w, 1e-5),
                               atol=atol, rtol=rtol)
    assert dispatch._KERNELS["kda_gated_norm"] is tk.kda_gated_norm
