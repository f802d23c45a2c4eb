"""The reference ops against independent formulations, on fresh random inputs.

(The Triton-language kernels are checked against these references in their own tests.)
"""
from __future__ import annotations

import math

import pytest
import torch

from tritonformer.kernels import reference as ref


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_bias_residual_layer_norm(dtype):
    x, res, bias = rand(7, 96, dtype=dtype), rand(7, 96, dtype=dtype), rand(96, dtype=dtype)
    w, b = rand(96), rand(96)
    ln = torch.nn.LayerNorm(96, eps=1e-6)
    with torch.no_grad():
        ln.weight.copy_(w)
        ln.bias.copy_(b)
        expected = ln((x.float() + bias.float() + res.float())).to(dtype)
    torch.testing.assert_close(ref.add_bias_residual_layer_norm(x, bias, res, w, b, 1e-6), expected)


def test_rms_norm_returns_sum_for_next_residual():
    x, res, w = rand(5, 64), rand(5, 64), rand(64)
    out, new_res = ref.rms_norm(x, w, 1e-5, res)
    h = x + res
    expected = h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(new_res, h)


def test_bias_gelu_variants():
    x, b = rand(4, 32), rand(32)
    erf = 0.5 * (x + b) * (1 + torch.erf((x + b) / math.sqrt(2)))
    torch.testing.assert_close(ref.bias_gelu(x, b, "none"), erf)
    h = x + b
    tanh = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    torch.testing.assert_close(ref.bias_gelu(x, b, "tanh"), tanh)


def test_silu_and_mul_and_softmax():
    gu = rand(3, 2 * 16)
    g, u = gu[:, :16], gu[:, 16:]
    torch.testing.assert_close(ref.silu_and_mul(gu), g * torch.sigmoid(g) * u)
    x = rand(6, 50)
    e = torch.exp(0.3 * x - (0.3 * x).max(-1, keepdim=True).values)
    torch.testing.assert_close(ref.softmax(x, 0.3), e / e.sum(-1, keepdim=True))


def test_feed_tokens_takes_negative_ids_from_the_previous_samples():
    gen = torch.Generator().manual_seed(3)
    last = torch.randint(0, 50_000, (9,), generator=gen)
    ids = torch.randint(0, 50_000, (12,), generator=gen)
    rows = torch.randperm(9, generator=gen)[:5]
    where = torch.randperm(12, generator=gen)[:5]
    ids[where] = -1 - rows
    expected = ids.clone()
    expected[where] = last[rows]
    assert ref.feed_tokens(ids, last) is ids
    assert torch.equal(ids, expected)


def test_rotary_matches_complex_rotation():
    pos = torch.tensor([0, 1, 5, 17])
    cos, sin = ref.rotary_cos_sin(pos, 8, 10000.0)
    x = rand(4, 3, 8)
    out = ref.apply_rotary(x, cos, sin)
    # rotate-half layout: pair (i, i + D/2) is a complex number rotated by pos * theta^(-2i/D)
    z = torch.complex(x[..., :4], x[..., 4:])
    angle = pos[:, None].float() * (10000.0 ** (-torch.arange(0, 8, 2).float() / 8))[None, :]
    rz = z * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    torch.testing.assert_close(out, torch.cat([rz.real, rz.imag], -1), atol=1e-5, rtol=1e-5)


def test_qkv_split():
    qkv, bias = rand(5, (4 + 2 * 2) * 8), rand((4 + 2 * 2) * 8)
    q, k, v = ref.qkv_split(qkv, bias, 4, 2, 8)
    full = qkv + bias
    torch.testing.assert_close(q.reshape(5, -1), full[:, :32])
    torch.testing.assert_close(k.reshape(5, -1), full[:, 32:48])
    torch.testing.assert_close(v.reshape(5, -1), full[:, 48:])


def _padded_attention(q, k, v, lq, lk, causal, group):
    """Independent formulation: one padded batch with an additive mask, plain matmuls."""
    b = len(lq)
    h, d = q.shape[1], q.shape[2]
    mq, mk = max(lq), max(lk)
    Q = torch.zeros(b, h, mq, d)
    K = torch.zeros(b, h, mk, d)
    V = torch.zeros(b, h, mk, d)
    mask = torch.full((b, 1, mq, mk), float("-inf"))
    oq = ok = 0
    for i in range(b):
        Q[i, :, : lq[i]] = q[oq : oq + lq[i]].transpose(0, 1)
        K[i, :, : lk[i]] = k[ok : ok + lk[i]].repeat_interleave(group, 1).transpose(0, 1)
        V[i, :, : lk[i]] = v[ok : ok + lk[i]].repeat_interleave(group, 1).transpose(0, 1)
        for a in range(lq[i]):
            limit = lk[i] - lq[i] + a + 1 if causal else lk[i]
            mask[i, 0, a, :limit] = 0
        oq, ok = oq + lq[i], ok + lk[i]
    P = torch.softmax(Q @ K.transpose(-1, -2) / math.sqrt(d) + mask, -1).nan_to_num()
    O = P @ V
    return torch.cat([O[i, :, : lq[i]].transpose(0, 1) for i in range(b)])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_varlen_attention_against_padded_masked(causal, heads, kv_heads):
    g = torch.Generator().manual_seed(11)
    lk = [5, 1, 13, 8]
    lq = lk if not causal else [5, 1, 3, 1]  # causal: prefill, chunked prefill and decode
    q = torch.randn(sum(lq), heads, 16, generator=g)
    k = torch.randn(sum(lk), kv_heads, 16, generator=g)
    v = torch.randn(sum(lk), kv_heads, 16, generator=g)
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32)  # noqa: E731
    out = ref.varlen_attention(q, k, v, cu(lq), cu(lk), causal)
    expected = _padded_attention(q, k, v, lq, lk, causal, heads // kv_heads)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_dispatcher_uses_reference_on_cpu():
    from tritonformer import kernels

    x, w = rand(3, 8), rand(8)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-6)[0], ref.rms_norm(x, w, 1e-6)[0])


def test_qkv_split_rotary_is_split_then_rotate():
    qkv, pos = rand(6, (4 + 2 * 2) * 8), torch.arange(6)
    cos, sin = ref.rotary_cos_sin(pos, 8, 10000.0)
    q, k, v = ref.qkv_split_rotary(qkv, None, 4, 2, 8, cos, sin)
    q0, k0, v0 = ref.qkv_split(qkv, None, 4, 2, 8)
    torch.testing.assert_close(q, ref.apply_rotary(q0, cos, sin))
    torch.testing.assert_close(k, ref.apply_rotary(k0, cos, sin))
    torch.testing.assert_close(v, v0)
