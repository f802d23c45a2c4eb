"""Kimi Delta Attention's rule (backend/models/kda.py) on random inputs, CPU fp32: its chunked form (prompt chunks,
reference.kda_chunk) against its own one-token recurrence (decode rows, reference.kda_step), and both against
transformers' torch fallbacks (chunk_kimi_delta_attention, recurrent_kimi_delta_attention). The family tests
(test_decoder_families.py) check whole models against HF."""
from __future__ import annotations

import pytest
import torch

from tritonformer.kernels.reference import kda_chunk, kda_step

transformers = pytest.importorskip("transformers")


def _inputs(heads: int, length: int, dim: int, seed: int):
    """Raw q, k (not normalised), v, per-channel log decays g (some heads' strong, each channel its own), beta,
    and a nonzero starting state."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(heads, length, dim, generator=gen) for _ in range(3))
    rates = torch.tensor([0.05, 0.5, 2.0, 8.0])[:heads, None, None]
    g = -torch.rand(heads, length, dim, generator=gen) * rates
    beta = torch.rand(heads, length, generator=gen)
    state = torch.randn(heads, dim, dim, generator=gen) * 0.5
    return q, k, v, g, beta, state


def _normalised(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    l2 = lambda t: t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    return l2(q) * q.shape[-1] ** -0.5, l2(k)


def chunked_rule(state, q, k, v, g, beta):
    """The chunked form (reference.kda_chunk, the prompt chunks' op) on one sequence held per head first: state
    `[H, K, V]`, q, k, g `[H, T, K]`, v `[H, T, V]`, beta `[H, T]`; returns (o `[H, T, V]`, the state after the last
    token)."""
    held = state[None].clone()
    o = kda_chunk(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.transpose(0, 1), beta.t(), held,
                  torch.zeros(1, dtype=torch.long))
    return o.transpose(0, 1), held[0]


def _recurrent(state, q, k, v, g, beta):
    """The rule one token at a time (kda_step over a batch of one)."""
    out, s = [], state[None]
    for t in range(k.shape[1]):
        o, s = kda_step(s, q[None, :, t], k[None, :, t], v[None, :, t], g[None, :, t], beta[None, :, t])
        out.append(o[0])
    return torch.stack(out, 1), s[0]


@pytest.mark.parametrize("length", [1, 37, 64, 150])
def test_chunked_form_equals_the_recurrence_and_continues_from_its_state(length):
    q, k, v, g, beta, state = _inputs(4, length, 16, seed=length)
    q, k = _normalised(q, k)
    want, want_state = _recurrent(state, q, k, v, g, beta)
    got, got_state = chunked_rule(state, q, k, v, g, beta)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_state, want_state, atol=1e-5, rtol=1e-5)
    cut = length // 3  # a prompt in two chunks: the second from the state the first left
    first, mid = chunked_rule(state, q[:, :cut], k[:, :cut], v[:, :cut], g[:, :cut], beta[:, :cut])
    second, end = chunked_rule(mid, q[:, cut:], k[:, cut:], v[:, cut:], g[:, cut:], beta[:, cut:])
    torch.testing.assert_close(torch.cat([first, second], 1), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(end, want_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [5, 100])
def test_chunked_form_and_recurrence_equal_transformers_fallbacks(length):
    """transformers' chunked and recurrent torch paths (which normalise q and k themselves, `[B, T, H, K]`) from the
    same starting state give our outputs and final state."""
    from transformers.models.kimi_linear import modeling_kimi_linear as hf

    q, k, v, g, beta, state = _inputs(3, length, 24, seed=length + 1)
    qn, kn = _normalised(q, k)
    ours, ours_state = chunked_rule(state, qn, kn, v, g, beta)
    batch = [t.transpose(0, 1)[None] for t in (q, k, v, g)] + [beta.t()[None]]
    for fallback in (hf.chunk_kimi_delta_attention, hf.recurrent_kimi_delta_attention):
        out, final = fallback(*batch[:3], g=batch[3], beta=batch[4], initial_state=state[None].clone(),
                              output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out[0].transpose(0, 1), ours, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(final[0], ours_state, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("safe,dtype", [(True, torch.float32), (False, torch.float32), (True, torch.bfloat16)])
def test_ling_decay_equals_transformers_forget_gate(safe, dtype):
    """Ling 3.0's log decay (reference.kda_inputs with `lower_bound` and `round_decay`, bailing_hybrid.py) against
    transformers' BailingHybridForgetGate on the same weights: the bounded form where kda_safe_gate, else Kimi's
    softplus one, rounded to the model's dtype (bf16: equal to the rounding; fp32's softplus as log(1 + exp(x)), where
    transformers' F.softplus differs in the last bits)."""
    from transformers.models.bailing_hybrid import modeling_bailing_hybrid as hf
    from tritonformer.kernels.reference import kda_inputs

    heads, dim, hidden, rows = 3, 8, 16, 5
    config = transformers.BailingHybridConfig(hidden_size=hidden, num_attention_heads=heads, head_dim=dim,
                                              kda_safe_gate=safe, kda_lower_bound=-3.0, num_hidden_layers=1)
    gate = hf.BailingHybridForgetGate(config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        gate.A_log.copy_(torch.rand(heads, generator=gen).mul(3.0).log())
        gate.dt_bias.copy_(torch.randn(heads * dim, generator=gen))
        gate.f_proj.weight.copy_(torch.randn(heads * dim, hidden, generator=gen))
        x = torch.randn(1, rows, hidden, generator=gen).to(dtype)
        gate.f_proj.to(dtype)  # (A_log and dt_bias stay fp32, as transformers keeps them)
        theirs = gate(x)[0]
        f = gate.f_proj(x)[0]
    assert theirs.dtype == dtype
    mixed = torch.zeros(rows, 3 * heads * dim, dtype=dtype)
    g = kda_inputs(mixed, f, torch.zeros(rows, heads, dtype=dtype), -gate.A_log.detach().exp(),
                   gate.dt_bias.detach(), -3.0 if safe else None, True)[3]
    torch.testing.assert_close(g, theirs.float(), atol=0 if dtype == torch.bfloat16 else 1e-6, rtol=1e-6)
