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


# ---------------------------------------------------------------- sliding window and soft-capping

def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def _explicit_attention_f64(q, k, v, lq, lk, causal, group, scale, window=None, softcap=None):
    """Independent formulation in float64: per sequence and head, the [Lq, Lk] score matrix, an
    explicit visibility mask written out element by element, softmax, then P @ V."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    oq = ok = 0
    for a, b in zip(lq, lk):
        visible = torch.ones(a, b, dtype=torch.bool)
        for i in range(a):
            pos = b - a + i  # queries aligned to the end of their keys
            for j in range(b):
                if causal and j > pos:
                    visible[i, j] = False
                if window is not None and j <= pos - window:
                    visible[i, j] = False
        for h in range(q.shape[1]):
            kv = h // group
            qs, ks, vs = (t.double() for t in (q[oq : oq + a, h], k[ok : ok + b, kv], v[ok : ok + b, kv]))
            s = qs @ ks.T * scale
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            p = torch.softmax(s.masked_fill(~visible, float("-inf")), -1).nan_to_num(0.0)
            out[oq : oq + a, h] = p @ vs
        oq, ok = oq + a, ok + b
    return out


@pytest.mark.parametrize("window", [None, 1, 3, 8, 50])
@pytest.mark.parametrize("softcap", [None, 1.5])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 1)])
def test_varlen_attention_window_softcap_against_explicit_mask(window, softcap, heads, kv_heads):
    """Prefill, chunked prefill and decode rows (and a sequence with more queries than keys,
    whose first query sees nothing) under a window and a soft cap."""
    g = torch.Generator().manual_seed(12)
    lq, lk = [9, 3, 1, 4, 5], [9, 13, 20, 4, 3]
    q = torch.randn(sum(lq), heads, 16, generator=g) * 2
    k = torch.randn(sum(lk), kv_heads, 16, generator=g)
    v = torch.randn(sum(lk), kv_heads, 16, generator=g)
    out = ref.varlen_attention(q, k, v, _cu(lq), _cu(lk), True, scale=0.3, window=window, softcap=softcap)
    expected = _explicit_attention_f64(q, k, v, lq, lk, True, heads // kv_heads, 0.3, window, softcap)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_softcap_without_causal_against_explicit_mask():
    g = torch.Generator().manual_seed(13)
    lq, lk = [3, 6], [7, 2]
    q, k, v = (torch.randn(n, 2, 16, generator=g) * 2 for n in (sum(lq), sum(lk), sum(lk)))
    out = ref.varlen_attention(q, k, v, _cu(lq), _cu(lk), False, softcap=2.0)
    expected = _explicit_attention_f64(q, k, v, lq, lk, False, 1, 16**-0.5, softcap=2.0)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_window_covering_every_key_is_plain_causal():
    g = torch.Generator().manual_seed(14)
    lq, lk = [5, 1], [5, 9]
    q, k, v = (torch.randn(n, 2, 16, generator=g) for n in (sum(lq), sum(lk), sum(lk)))
    plain = ref.varlen_attention(q, k, v, _cu(lq), _cu(lk), True)
    for window in (9, 10, 10**6):
        torch.testing.assert_close(ref.varlen_attention(q, k, v, _cu(lq), _cu(lk), True, window=window), plain,
                                   atol=0, rtol=0)


def test_window_rejects_bad_sizes():
    """(A window without causal is the symmetric one: tests/test_kernels_triton_attention.py.)"""
    q = k = v = torch.zeros(3, 1, 16)
    cu = _cu([3])
    for causal in (False, True):
        for window in (0, -1, 2.5):
            with pytest.raises(ValueError, match="window"):
                ref.varlen_attention(q, k, v, cu, cu, causal, window=window)
    with pytest.raises(ValueError, match="softcap"):
        ref.varlen_attention(q, k, v, cu, cu, True, softcap=-1.0)


@pytest.mark.parametrize("lq,lk,window", [
    (8, 8, 1), (8, 8, 3), (8, 8, 8), (8, 8, 20),  # prefill
    (3, 11, 4), (5, 12, 6),  # a chunk after cached keys
    (1, 11, 4), (1, 11, 1), (1, 4, 4), (1, 4, 9),  # decode
])
def test_window_is_hugging_faces_sliding_window(lq, lk, window):
    """Our window is Hugging Face's `sliding_window`: the keys each query attends to under our
    reference equal the mask transformers builds for a sliding-attention layer
    (masking_utils.sliding_window_causal_mask_function through sdpa_mask, queries offset to the
    end of the cache as a decode or chunked-prefill step has them). The keys a query sees are
    read off our output: with q = 0 every visible key has the same weight, and with V the
    identity the output row is that weight on each visible key and 0 elsewhere."""
    masking = pytest.importorskip("transformers.masking_utils")
    hf = masking.sdpa_mask(batch_size=1, q_length=lq, kv_length=lk, q_offset=lk - lq,
                           mask_function=masking.sliding_window_causal_mask_function(window),
                           allow_is_causal_skip=False, device="cpu")[0, 0]
    q = torch.zeros(lq, 1, lk)
    k = torch.randn(lk, 1, lk)
    v = torch.eye(lk).view(lk, 1, lk)
    out = ref.varlen_attention(q, k, v, _cu([lq]), _cu([lk]), True, window=window)[:, 0]
    assert torch.equal(out > 0, hf)
    # spelled out: query position p sees keys p - window < key <= p
    for i in range(lq):
        p = lk - lq + i
        assert (out[i] > 0).nonzero().flatten().tolist() == list(range(max(p - window + 1, 0), p + 1))


def test_window_softcap_match_gemma2_eager_attention():
    """Gemma 2's own attention (transformers' eager path: scale, tanh soft-cap, additive mask,
    fp32 softmax) under its sliding-window mask, against our reference on the same inputs."""
    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
    masking = pytest.importorskip("transformers.masking_utils")
    g = torch.Generator().manual_seed(15)
    heads, kv_heads, d, lq, lk, window, softcap, scale = 4, 2, 16, 6, 14, 5, 3.0, 0.4
    q = torch.randn(lq, heads, d, generator=g) * 2
    k = torch.randn(lk, kv_heads, d, generator=g)
    v = torch.randn(lk, kv_heads, d, generator=g)
    allowed = masking.sdpa_mask(batch_size=1, q_length=lq, kv_length=lk, q_offset=lk - lq,
                                mask_function=masking.sliding_window_causal_mask_function(window),
                                allow_is_causal_skip=False, device="cpu")
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads
    hf_out, _ = gemma2.eager_attention_forward(
        module, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], additive,
        scaling=scale, softcap=softcap,
    )
    out = ref.varlen_attention(q, k, v, _cu([lq]), _cu([lk]), True, scale=scale, window=window, softcap=softcap)
    torch.testing.assert_close(out, hf_out[0], atol=1e-5, rtol=1e-5)


# ---- the linear/norm pieces of the newer decoder families (Gemma 2/3, Qwen3), against the way
# Hugging Face's modules compute them (their formulas, and the modules themselves where installed)

def _gemma_rms(x, w, eps):
    """Gemma's RMSNorm as Hugging Face computes it: fp32 statistics, times (1 + w) in fp32,
    rounded once to x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).to(x.dtype)


def _tanh_gelu(g):
    return 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g.pow(3))))


def test_gated_gelu_tanh_is_gemmas_geglu_mlp():
    """linear_act "gelu_tanh_mul" on [gate; up] = gelu_tanh(x W_gate^T) * (x W_up^T): the first
    half of Gemma's MLP (down(act(gate(x)) * up(x)), act = gelu_pytorch_tanh)."""
    g = torch.Generator().manual_seed(21)
    x, gate_w, up_w = (torch.randn(*s, generator=g) for s in ((5, 24), (16, 24), (16, 24)))
    expected = _tanh_gelu(x @ gate_w.T) * (x @ up_w.T)
    got = ref.linear_act(x, torch.cat([gate_w, up_w]), None, "gelu_tanh_mul")
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    gate_up = torch.randn(7, 2 * 20, generator=g) * 4
    torch.testing.assert_close(ref.gated_act(gate_up, "gelu_tanh_mul"), _tanh_gelu(gate_up[:, :20]) * gate_up[:, 20:])
    torch.testing.assert_close(ref.gated_act(gate_up, "silu_mul"), ref.silu_and_mul(gate_up), atol=0, rtol=0)
    activations = pytest.importorskip("transformers.activations")
    torch.testing.assert_close(ref.gated_act(gate_up, "gelu_tanh_mul"),
                               activations.ACT2FN["gelu_pytorch_tanh"](gate_up[:, :20]) * gate_up[:, 20:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_post_norm_prenorm_is_gemmas_sandwich(dtype):
    """PreNorm with x_norm at a Gemma 2/3 block boundary: the closing post-norm of the block's
    output, the residual add, the next block's pre-norm. Norm weights are (1 + w) in fp32."""
    g = torch.Generator().manual_seed(22)
    eps = 1e-6
    out = (torch.randn(4, 32, generator=g) * 3).to(dtype)  # the attention or MLP block's output
    residual = torch.randn(4, 32, generator=g).to(dtype)
    post_w, pre_w = torch.randn(32, generator=g) * 0.3, torch.randn(32, generator=g) * 0.3
    h = residual + _gemma_rms(out, post_w, eps)  # Hugging Face adds in the activation dtype
    expected = _gemma_rms(h, pre_w, eps)
    p = ref.PreNorm(1.0 + pre_w, None, eps, residual=residual, sum_out=torch.empty_like(residual), x_norm=1.0 + post_w)
    got = ref.apply_prenorm(out, p, dtype)
    assert torch.equal(p.sum_out, h)
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    else:  # we normalise the fp32 sum, Hugging Face its bf16 rounding
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=1.6e-2)
    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
    norm = gemma2.Gemma2RMSNorm(32, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(post_w)
    torch.testing.assert_close(ref.apply_prenorm(out, ref.PreNorm(1.0 + post_w, None, eps), dtype),
                               norm(out), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scaled_embeddings_are_gemmas(dtype):
    """Gemma multiplies its embeddings by a tensor of sqrt(hidden) in the activation dtype; the
    first layer's input norm sees those rounded rows."""
    g = torch.Generator().manual_seed(23)
    hidden = 40  # sqrt(40) is not exact in any dtype
    table, w = torch.randn(50, hidden, generator=g).to(dtype), torch.randn(hidden, generator=g) * 0.3
    ids = torch.randint(0, 50, (9,), generator=g)
    rows = torch.nn.functional.embedding(ids, table) * torch.tensor(hidden ** 0.5, dtype=dtype)
    normed, got_rows = ref.embedding_rms_norm(ids, table, 1.0 + w, 1e-6, scale=hidden ** 0.5)
    assert got_rows.dtype == dtype and torch.equal(got_rows, rows)
    assert torch.equal(normed, _gemma_rms(rows, w, 1e-6))  # the fp32 (1 + w) weight: the same arithmetic


def _rotate_half_rope(x, cos, sin):
    """Rotary as Hugging Face's rotate_half layout computes it, on `[T, heads, D]`, with cos/sin
    `[T, D / 2]` repeated over both halves."""
    c, s = torch.cat([cos, cos], -1)[:, None, :], torch.cat([sin, sin], -1)[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * c + rotated * s


def test_whole_width_head_norm_is_olmo2s():
    """OLMo 2's q_norm: one RMSNorm over the token's whole q projection (all heads), written out;
    a [D] weight keeps the per-head norm, and where H is 1 the two agree."""
    g = torch.Generator().manual_seed(25)
    t, heads, d = 3, 4, 8
    q = torch.randn(t, heads, d, generator=g)
    w_whole, w_head = torch.randn(heads * d, generator=g) + 1, torch.randn(d, generator=g) + 1
    flat = q.reshape(t, -1)
    want = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6) * w_whole
    torch.testing.assert_close(ref.head_norm(q, w_whole, 1e-6), want.view(t, heads, d))
    torch.testing.assert_close(ref.head_norm(q, w_head, 1e-6), ref.rms_norm(q, w_head, 1e-6)[0])
    one = q[:, 0]
    torch.testing.assert_close(ref.head_norm(q[:, :1], w_head, 1e-6),
                               (one * torch.rsqrt(one.pow(2).mean(-1, keepdim=True) + 1e-6) * w_head)[:, None])
    with pytest.raises(ValueError, match="head norm's weight"):
        ref.head_norm(q, torch.ones(d + 1), 1e-6)


@pytest.mark.parametrize("with_bias", [False, True])
def test_qk_norm_before_rotary_is_qwen3s(with_bias):
    """Qwen3's attention input: q_proj(x) viewed as heads, RMSNorm per head with q_norm, then
    rotary; k alike with k_norm; v as it is; k and v land in the cache's slots."""
    g = torch.Generator().manual_seed(24)
    t, k_dim, heads, kv_heads, d = 5, 24, 4, 2, 16
    x = torch.randn(t, k_dim, generator=g)
    wq, wk, wv = (torch.randn(h * d, k_dim, generator=g) * 0.3 for h in (heads, kv_heads, kv_heads))
    bias = torch.randn((heads + 2 * kv_heads) * d, generator=g) if with_bias else None
    q_w, k_w = torch.randn(d, generator=g) * 0.3 + 1, torch.randn(d, generator=g) * 0.3 + 1
    cos, sin = ref.rotary_cos_sin(torch.tensor([0, 3, 4, 9, 17]), d, 10000.0)

    def proj(w, part):
        y = x @ w.T
        return y if bias is None else y + bias[part]

    def head_rms(y, w):
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    sq, sk = heads * d, kv_heads * d
    q = _rotate_half_rope(head_rms(proj(wq, slice(0, sq)).view(t, heads, d), q_w), cos, sin)
    k = _rotate_half_rope(head_rms(proj(wk, slice(sq, sq + sk)).view(t, kv_heads, d), k_w), cos, sin)
    v = proj(wv, slice(sq + sk, sq + 2 * sk)).view(t, kv_heads, d)
    kc, vc = torch.zeros(3, 4, kv_heads, d), torch.zeros(3, 4, kv_heads, d)
    slots = torch.tensor([7, 0, 11, 2, 5])
    got = ref.prenorm_qkv_to_cache(x, None, torch.cat([wq, wk, wv]), bias, heads, kv_heads, d, cos, sin, kc, vc,
                                   slots, q_norm=q_w, k_norm=k_w, norm_eps=1e-6)
    torch.testing.assert_close(got, q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kc.view(-1, kv_heads, d)[slots], k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(vc.view(-1, kv_heads, d)[slots], v, atol=1e-5, rtol=1e-5)
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    norm = qwen3.Qwen3RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(q_w)
    # [T, heads, D] with cos/sin [T, D]: the default unsqueeze over the heads dim broadcasts
    hf_q, _ = qwen3.apply_rotary_pos_emb(norm(proj(wq, slice(0, sq)).view(t, heads, d)), k,
                                         torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))
    torch.testing.assert_close(got, hf_q, atol=1e-5, rtol=1e-5)


def test_fp32_norm_weight_beside_bf16_activations_is_gemmas_rmsnorm():
    """Gemma's 1 + w kept once in fp32 (never rounded to bf16): rms_norm with it is Gemma's
    RMSNorm bit for bit; rounded to bf16 first it would not be."""
    g = torch.Generator().manual_seed(25)
    x, w = torch.randn(6, 64, generator=g).to(torch.bfloat16), torch.randn(64, generator=g) * 0.3
    assert torch.equal(ref.rms_norm(x, 1.0 + w, 1e-6)[0], _gemma_rms(x, w, 1e-6))
    assert not torch.equal(ref.rms_norm(x, (1.0 + w).to(torch.bfloat16), 1e-6)[0], _gemma_rms(x, w, 1e-6))
