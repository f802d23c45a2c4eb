"""The mixture-of-experts ops: routing and the expert MLP (`reference.moe_route`, `reference.moe_mlp`)
against an independent dense formulation, the sort of routed rows (`reference.moe_align`) against
what it must hold, and the kernels (kernels/triton_moe.py: routing and sort in one program, the
grouped GEMMs) against the references.

Fresh seeded random inputs; without a GPU the kernel runs in Triton's CPU interpreter
(TRITON_INTERPRET=1, set by conftest.py), so shapes are small.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE, dtype)


def _dense_moe(x, router_logits, top_k, normalize, gate_up, down, act):
    """Every expert on every token in float64, weighted by a dense [T, E] routing matrix that is
    zero off each token's k largest softmax probabilities."""
    probs = torch.softmax(router_logits.double(), -1)
    keep = probs >= probs.topk(top_k, -1).values[:, -1:]
    route = torch.where(keep, probs, 0)
    if normalize:
        route = route / route.sum(-1, keepdim=True)
    inter = gate_up.shape[1] // 2
    h = torch.einsum("th,eih->tei", x.double(), gate_up.double())
    y = torch.einsum("tei,ehi->teh", act(h[..., :inter]) * h[..., inter:], down.double())
    return (route[..., None] * y).sum(1)


@pytest.mark.parametrize("normalize", [True, False])
def test_reference_moe_is_the_dense_weighted_sum_of_the_top_k_experts(normalize):
    tokens, hidden, inter, experts, top_k = 9, 16, 24, 6, 2
    x = _rand(tokens, hidden, seed=0)
    logits = _rand(tokens, experts, seed=1, scale=2.0)
    gate_up, down = _rand(experts, 2 * inter, hidden, seed=2, scale=0.3), _rand(experts, hidden, inter, seed=3, scale=0.3)
    weights, ids = ref.moe_route(logits, top_k, normalize)
    assert ids.shape == (tokens, top_k) and weights.dtype == torch.float32
    if normalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(tokens, device=DEVICE))
    got = ref.moe_mlp(x, logits, gate_up, down, top_k, normalize, None, "silu_mul")
    torch.testing.assert_close(got.double(), _dense_moe(x, logits, top_k, normalize, gate_up, down, F.silu),
                               atol=1e-5, rtol=1e-5)


def test_routing_weights_round_to_the_given_dtype():
    logits = _rand(5, 8, seed=4)
    w32, ids32 = ref.moe_route(logits, 3, False)
    w16, ids16 = ref.moe_route(logits, 3, False, torch.bfloat16)
    assert torch.equal(ids32, ids16) and w16.dtype == torch.float32
    assert torch.equal(w16, w32.to(torch.bfloat16).float()) and not torch.equal(w16, w32)


def test_sigmoid_routing_chooses_by_score_plus_bias_and_weighs_by_the_score():
    """GLM-4.5's (DeepSeek-V3's) routing, token by token in float64: sigmoid scores; the k experts
    of the largest score + bias; their scores (not score + bias) renormalised, times the scale."""
    tokens, experts, top_k, scale = 7, 12, 3, 2.5
    logits = _rand(tokens, experts, seed=5, scale=2.0)
    bias = _rand(experts, seed=6, scale=0.5)
    weights, ids = ref.moe_route(logits, top_k, True, None, "sigmoid", bias, scale)
    for t in range(tokens):
        scores = torch.sigmoid(logits[t].double())
        chosen = sorted((scores + bias.double()).argsort(descending=True)[:top_k].tolist())
        assert sorted(ids[t].tolist()) == chosen
        expected = scores[ids[t]] / scores[ids[t]].sum() * scale
        torch.testing.assert_close(weights[t].double(), expected, atol=1e-6, rtol=1e-6)
    assert not torch.equal(ids, ref.moe_route(logits, top_k, True, None, "sigmoid")[1])  # the bias did choose
    with pytest.raises(ValueError, match="scoring"):
        ref.moe_route(logits, top_k, True, None, "relu")


def test_softmax_routing_with_a_bias_chooses_by_probability_plus_bias():
    """ERNIE 4.5's routing, token by token in float64: softmax probabilities; the k experts of the
    largest probability + bias; their probabilities renormalised."""
    tokens, experts, top_k = 7, 12, 3
    logits = _rand(tokens, experts, seed=7, scale=2.0)
    bias = _rand(experts, seed=8, scale=0.2)
    weights, ids = ref.moe_route(logits, top_k, True, None, "softmax", bias)
    for t in range(tokens):
        probs = torch.softmax(logits[t].double(), -1)
        assert sorted(ids[t].tolist()) == sorted((probs + bias.double()).argsort(descending=True)[:top_k].tolist())
        torch.testing.assert_close(weights[t].double(), probs[ids[t]] / probs[ids[t]].sum(), atol=1e-6, rtol=1e-6)
    assert not torch.equal(ids, ref.moe_route(logits, top_k, True)[1])  # the bias did choose


def _hf_router(kind, experts, top_k, groups, kept, hidden=32, seed=0, **changes):
    """Hugging Face's DeepSeek-V3 (`noaux_tc`) or DeepSeek-V2 (`group_limited_greedy`) router on
    random weights (and a random choice bias), and its config."""
    import transformers
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    common = dict(hidden_size=hidden, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=experts,
                  num_experts_per_tok=top_k, n_group=groups, topk_group=kept, **changes)
    if kind == "v3":
        router = DeepseekV3TopkRouter(transformers.DeepseekV3Config(**common))
    else:
        router = DeepseekV2TopkRouter(transformers.DeepseekV2Config(topk_method="group_limited_greedy", **common))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.weight.copy_(torch.randn(experts, hidden, generator=g) * 0.5)
        if kind == "v3":
            router.e_score_correction_bias.copy_(torch.randn(experts, generator=g) * 0.3)
    return router


def _by_expert(weights, ids):
    """(weights, ids) with each token's k slots in expert order (routers differ in slot order)."""
    order = ids.argsort(-1)
    return weights.gather(-1, order), ids.gather(-1, order)


@pytest.mark.parametrize("experts,groups,kept,top_k,normalize,scale", [
    (64, 8, 4, 8, True, 2.5), (16, 4, 2, 4, True, 1.0), (16, 4, 2, 3, False, 1.5), (256, 8, 4, 8, True, 2.5)])
def test_group_limited_sigmoid_routing_is_deepseek_v3s(experts, groups, kept, top_k, normalize, scale):
    """DeepSeek-V3's router (Hugging Face's, GLM-4.5's the same) on random logits: the groups ranked
    by their two best score + bias, the k experts chosen among the kept groups'."""
    router = _hf_router("v3", experts, top_k, groups, kept, norm_topk_prob=normalize, routed_scaling_factor=scale,
                        seed=experts + top_k)
    x = torch.randn(37, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, hf_weights, hf_ids = router(x)
    weights, ids = ref.moe_route(logits, top_k, normalize, None, "sigmoid", router.e_score_correction_bias, scale,
                                 groups, kept, "top2_sum")
    hf_weights, hf_ids = _by_expert(hf_weights, hf_ids)
    weights, ids = _by_expert(weights, ids)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, atol=1e-6, rtol=1e-6)
    # the limit did choose: without it some token takes an expert of a group it drops
    plain = ref.moe_route(logits, top_k, normalize, None, "sigmoid", router.e_score_correction_bias, scale)[1]
    assert not torch.equal(plain.sort(-1).values, ids)


@pytest.mark.parametrize("experts,groups,kept,top_k,scale", [
    (64, 8, 3, 6, 1.0), (160, 8, 3, 6, 16.0), (20, 4, 2, 3, 2.0)])
def test_group_limited_softmax_routing_is_deepseek_v2s_greedy(experts, groups, kept, top_k, scale):
    """DeepSeek-V2's `group_limited_greedy` (Hugging Face's router) on random logits: softmax
    probabilities, the groups ranked by their most probable expert, no renormalisation; 160
    experts in 8 groups of 20 as DeepSeek-V2 has them."""
    router = _hf_router("v2", experts, top_k, groups, kept, routed_scaling_factor=scale, seed=experts)
    x = torch.randn(37, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, hf_weights, hf_ids = router(x)
    weights, ids = ref.moe_route(logits, top_k, False, None, "softmax", None, scale, groups, kept, "max")
    hf_weights, hf_ids = _by_expert(hf_weights, hf_ids)
    weights, ids = _by_expert(weights, ids)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, atol=1e-6, rtol=1e-6)
    assert not torch.equal(ref.moe_route(logits, top_k, False, None, "softmax", None, scale)[1].sort(-1).values, ids)


def test_group_limited_routing_chooses_only_in_the_kept_groups_and_checks_its_groups():
    """Token by token: every chosen expert lies in one of the `kept` groups of the largest group
    score; every group kept (kept >= groups) is the routing without groups; groups that cannot
    route are refused."""
    tokens, experts, groups, kept, top_k = 9, 24, 6, 2, 5
    logits = _rand(tokens, experts, seed=70, scale=2.0)
    bias = _rand(experts, seed=71, scale=0.5)
    _, ids = ref.moe_route(logits, top_k, True, None, "sigmoid", bias, 1.0, groups, kept)
    choice = (torch.sigmoid(logits.double()) + bias.double()).view(tokens, groups, -1)
    best = choice.topk(2, -1).values.sum(-1).topk(kept, -1).indices
    for t in range(tokens):
        assert set((ids[t] // (experts // groups)).tolist()) <= set(best[t].tolist())
    for all_kept in ((1, 1), (groups, groups), (groups, groups + 1)):
        assert torch.equal(ref.moe_route(logits, top_k, True, None, "sigmoid", bias, 1.0, *all_kept)[1],
                           ref.moe_route(logits, top_k, True, None, "sigmoid", bias)[1])
    for bad, match in (((5, 2, "top2_sum"), "equal groups"), ((24, 2, "top2_sum"), "equal groups"),
                       ((6, 1, "top2_sum"), "kept groups"), ((6, 2, "sum"), "group score")):
        with pytest.raises(ValueError, match=match):
            ref.moe_route(logits, top_k, True, None, "sigmoid", bias, 1.0, *bad)


def _sparsemixer_logits(tokens, experts, seed):
    """Router logits whose runners-up sit at every distance from the best: some inside
    sparsemixer's 2 * eps band (relative to max(|logit|, best)), some outside, some negative."""
    logits = _rand(tokens, experts, seed=seed, scale=0.05)
    return logits + _rand(tokens, 1, seed=seed + 1, scale=1.0)


@pytest.mark.parametrize("eps", [0.01, 0.05])
def test_reference_sparsemixer_routing_is_phimoe_at_inference(eps):
    """Hugging Face's Phi-3.5-MoE router (`sparsemixer`, not training): the same two experts per
    token and the same masked-softmax weights, in fp32 and rounded to bf16; its masks do drop
    experts (the weights differ from plain softmax's)."""
    phimoe = pytest.importorskip("transformers.models.phimoe.modeling_phimoe")
    logits = _sparsemixer_logits(40, 16, seed=60)
    hf_weights, hf_ids = phimoe.sparsemixer(logits, jitter_eps=eps, training=False)
    weights, ids = ref.moe_route(logits, 2, False, None, "sparsemixer", mask_eps=eps)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, atol=1e-6, rtol=1e-6)
    hf16 = phimoe.sparsemixer(logits.bfloat16(), jitter_eps=eps, training=False)
    w16, ids16 = ref.moe_route(logits.bfloat16(), 2, False, torch.bfloat16, "sparsemixer", mask_eps=eps)
    assert torch.equal(ids16, hf16[1]) and torch.equal(w16, hf16[0].float())
    plain = ref.moe_route(logits, 2, False)[0]
    assert not torch.allclose(weights, plain, atol=1e-3)
    assert (weights > 0.999).any() and (weights < 0.9).any()  # some tokens with no near runner-up, some with


def _oai_expert(x, gate_up, gate_up_bias, down, down_bias):
    """One gpt-oss expert on one token, as Hugging Face's GptOssExperts writes it (float64; the
    gate/up rows here [gate; up], not its interleaved columns)."""
    inter = gate_up.shape[0] // 2
    gu = gate_up.double() @ x.double() + gate_up_bias.double()
    gate, up = gu[:inter].clamp(max=7.0), gu[inter:].clamp(min=-7.0, max=7.0)
    return down.double() @ ((up + 1) * (gate * torch.sigmoid(gate * 1.702))) + down_bias.double()


def _oai_moe_inputs(tokens, hidden, inter, experts, seed):
    """_moe_inputs and expert biases large enough that the gate and up pre-activations reach past
    +-7, where the clamps act."""
    return (*_moe_inputs(tokens, hidden, inter, experts, seed), _rand(experts, 2 * inter, seed=seed + 4, scale=4.0),
            _rand(experts, hidden, seed=seed + 5, scale=0.5))


def test_reference_moe_with_expert_biases_is_gpt_oss_token_by_token():
    """Hugging Face's gpt-oss MoE layer, token by token: the top k of the router logits, a softmax
    over those k, each chosen expert biased before the clamped SwiGLU and after its down
    projection, weighted by its routing weight."""
    tokens, hidden, inter, experts, top_k = 6, 16, 12, 5, 2
    x, logits, gate_up, down, gate_up_bias, down_bias = _oai_moe_inputs(tokens, hidden, inter, experts, seed=40)
    got = ref.moe_mlp(x, logits, gate_up, down, top_k, True, None, "swiglu_oai", gate_up_bias=gate_up_bias,
                      down_bias=down_bias)
    expected = torch.zeros(tokens, hidden, dtype=torch.float64, device=DEVICE)
    pre = []
    for t in range(tokens):
        top = logits[t].double().topk(top_k)
        for weight, e in zip(torch.softmax(top.values, -1), top.indices.tolist()):
            expected[t] += weight * _oai_expert(x[t], gate_up[e], gate_up_bias[e], down[e], down_bias[e])
            pre.append(gate_up[e] @ x[t] + gate_up_bias[e])
    pre = torch.stack(pre)
    assert (pre[:, :inter] > 7).any() and (pre[:, inter:] > 7).any() and (pre[:, inter:] < -7).any()
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    # one bias at a time is the same expert with the other bias zero
    no_down = ref.moe_mlp(x, logits, gate_up, down, top_k, True, None, "swiglu_oai", gate_up_bias=gate_up_bias)
    torch.testing.assert_close(no_down, ref.moe_mlp(x, logits, gate_up, down, top_k, True, None, "swiglu_oai",
                                                    gate_up_bias=gate_up_bias, down_bias=torch.zeros_like(down_bias)))


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernel cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels.reference import moe_align  # noqa: E402
from tritonformer.kernels.triton_moe import moe_mlp, route_align  # noqa: E402


@pytest.mark.parametrize("tokens,top_k,experts,block_m", [(1, 2, 8, 16), (7, 3, 5, 4), (40, 2, 8, 16), (3, 8, 64, 16)])
def test_align_puts_every_routed_pair_once_in_a_block_of_its_expert(tokens, top_k, experts, block_m):
    ids = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(t))[:top_k]
                       for t in range(tokens)]).to(DEVICE)
    pairs, owners = moe_align(ids, experts, block_m)
    n = tokens * top_k
    assert owners.numel() == -(-n // block_m) + min(experts, n) and pairs.numel() == owners.numel() * block_m
    flat = ids.reshape(-1).cpu()
    pairs, owners = pairs.cpu().view(-1, block_m), owners.cpu()
    real = pairs[pairs < n]
    assert sorted(real.tolist()) == list(range(n))  # each pair exactly once
    for block, owner in zip(pairs, owners):
        inside = block[block < n]
        if owner < 0:
            assert inside.numel() == 0
        else:
            assert inside.numel() > 0 and (flat[inside.long()] == owner).all()
    used = owners[owners >= 0]
    assert torch.equal(used, used.sort().values)  # experts in order, the unused blocks last
    assert (owners[used.numel():] == -1).all()


def test_reference_identity_experts_add_their_weighted_input_token_by_token():
    """LongCat-Flash's zero-computation experts: softmax over the E computing and Z identity experts' logits,
    the k of the largest probability + bias, weighted by probability times the scale, unnormalised; an identity
    expert's output is its input. Against that written out token by token in float64."""
    tokens, hidden, inter, experts, zero, top_k, scale = 9, 16, 24, 6, 3, 4, 6.0
    x = _rand(tokens, hidden, seed=70)
    logits, bias = _rand(tokens, experts + zero, seed=71, scale=2.0), _rand(experts + zero, seed=72, scale=0.1)
    gate_up, down = _rand(experts, 2 * inter, hidden, seed=73, scale=0.3), _rand(experts, hidden, inter, seed=74,
                                                                                scale=0.3)
    got = ref.moe_mlp(x, logits, gate_up, down, top_k, False, None, "silu_mul", "softmax", bias, scale,
                      identity_experts=zero)
    hit = set()
    for t in range(tokens):
        probs = torch.softmax(logits[t].double(), -1)
        expected = torch.zeros(hidden, dtype=torch.float64, device=DEVICE)
        for e in (probs + bias.double()).argsort(descending=True)[:top_k].tolist():
            hit.add(e >= experts)
            row = x[t].double()
            if e < experts:
                h = gate_up[e].double() @ row
                row = down[e].double() @ (F.silu(h[:inter]) * h[inter:])
            expected += probs[e] * scale * row
        torch.testing.assert_close(got[t].double(), expected, atol=1e-5, rtol=1e-5)
    assert hit == {True, False}  # (both kinds of expert were routed to)
    with pytest.raises(ValueError, match="identity experts"):
        ref.moe_mlp(x, logits, gate_up, down, top_k, False, identity_experts=zero + 1)


def _moe_inputs(tokens, hidden, inter, experts, seed):
    """x, router logits, [gate; up] and down weights of a MoE layer, fresh from `seed`."""
    return (_rand(tokens, hidden, seed=seed), _rand(tokens, experts, seed=seed + 1, scale=2.0),
            _rand(experts, 2 * inter, hidden, seed=seed + 2, scale=0.2),
            _rand(experts, hidden, inter, seed=seed + 3, scale=0.2))


@pytest.mark.parametrize("tokens,hidden,inter,experts,top_k,activation", [
    (1, 32, 48, 8, 2, "silu_mul"),  # a decode row; I not a multiple of the column tile
    (6, 64, 40, 4, 2, "gelu_tanh_mul"),
    (45, 32, 24, 6, 3, "silu_mul"),
    (140, 16, 16, 8, 2, "silu_mul"),  # > 256 pairs: the prefill's row blocks
    (300, 16, 24, 4, 2, "silu_mul"),  # >= 64 pairs per expert: a long prefill's 128-row tiles
])
def test_kernel_matches_reference(tokens, hidden, inter, experts, top_k, activation):
    x, logits, gate_up, down = _moe_inputs(tokens, hidden, inter, experts, seed=10)
    expected = ref.moe_mlp(x, logits, gate_up, down, top_k, True, None, activation)
    got = moe_mlp(x, logits, gate_up, down, top_k, True, None, activation)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)
    if DEVICE == "cuda":  # and the dispatcher picks the kernel there
        assert dispatch._KERNELS["moe_mlp"] is moe_mlp


@pytest.mark.parametrize("tokens,inter,experts,top_k", [(1, 40, 8, 2), (9, 24, 12, 6), (140, 16, 8, 2)])
def test_kernel_with_plain_experts_matches_reference(tokens, inter, experts, top_k):
    """Experts of up, squared ReLU, down (no gate: Nemotron-H's), gate_up holding the up projection `[E, I, H]`
    alone, routed by sigmoid scores with a bias, groups and a scale; a decode row, a few tokens, a prefill's blocks."""
    x, logits, up, down = _moe_inputs(tokens, 32, inter, experts, seed=50)
    up = up[:, :inter].contiguous()
    bias = _rand(experts, seed=55, scale=0.5)
    routing = dict(scoring="sigmoid", score_bias=bias, scale=2.5, groups=2, kept_groups=1)
    expected = ref.moe_mlp(x, logits, up, down, top_k, True, None, "relu2", **routing)
    weights, ids = ref.moe_route(logits, top_k, True, None, "sigmoid", bias, 2.5, 2, 1)
    dense = torch.zeros(tokens, 32, dtype=torch.float64, device=DEVICE)
    for slot in range(top_k):  # (each routed expert's up, relu^2, down, by its weight)
        h = torch.relu(torch.einsum("th,tih->ti", x.double(), up[ids[:, slot]].double())).square()
        dense += weights[:, slot, None].double() * torch.einsum("ti,thi->th", h, down[ids[:, slot]].double())
    torch.testing.assert_close(expected.double(), dense, atol=1e-5, rtol=1e-5)
    got = moe_mlp(x, logits, up, down, top_k, True, None, "relu2", **routing)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)


def test_kernel_with_sigmoid_routing_matches_reference():
    x, logits, gate_up, down = _moe_inputs(5, 32, 24, 16, seed=30)
    bias = _rand(16, seed=34, scale=0.5)
    expected = ref.moe_mlp(x, logits, gate_up, down, 4, True, None, "silu_mul", "sigmoid", bias, 2.5)
    got = moe_mlp(x, logits, gate_up, down, 4, True, None, "silu_mul", "sigmoid", bias, 2.5)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("tokens,experts,top_k,normalize,block_m", [
    (1, 8, 2, True, 16), (3, 128, 8, True, 16), (5, 60, 4, False, 16), (17, 6, 1, False, 4), (90, 3, 1, False, 16),
    # past FUSED_MAX_PAIRS: chunks of tokens (one partly filled), the offsets, the scatter
    (64, 16, 8, True, 64), (65, 8, 2, True, 64), (100, 60, 4, False, 16), (203, 128, 8, True, 128),
    (300, 16, 4, True, 64)])  # (more chunks than the offsets program reads at once)
def test_the_kernels_route_and_sort_as_the_tensor_ops_do(tokens, experts, top_k, normalize, block_m):
    logits = _rand(tokens, experts, seed=tokens + experts, scale=2.0)
    weights, pairs, owners = route_align(logits, top_k, normalize, None, block_m)
    expected_weights, expected_pairs, expected_owners = ref.moe_route_align(logits, top_k, normalize, None, block_m)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    assert torch.equal(pairs, expected_pairs) and torch.equal(owners, expected_owners)


@pytest.mark.parametrize("tokens,experts,top_k,normalize", [(3, 16, 4, True), (9, 40, 8, False), (70, 24, 4, True)])
def test_the_kernels_route_by_sigmoid_scores_and_a_bias_as_the_reference(tokens, experts, top_k, normalize):
    """GLM-4.5's routing in one program (up to 128 pairs) and in the chunked launches (past it)."""
    logits = _rand(tokens, experts, seed=tokens, scale=2.0)
    bias = _rand(experts, seed=tokens + 1, scale=0.5)
    got = route_align(logits, top_k, normalize, None, 16, "sigmoid", bias, 2.5)
    expected = ref.moe_route_align(logits, top_k, normalize, None, 16, "sigmoid", bias, 2.5)
    torch.testing.assert_close(got[0], expected[0], atol=1e-6, rtol=1e-5)
    assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])


@pytest.mark.parametrize("tokens,experts,top_k,normalize", [(3, 16, 4, True), (9, 40, 6, False), (70, 24, 4, True)])
def test_logits_kept_for_the_chosen_route_by_logit_plus_bias_weighted_by_sigmoid(tokens, experts, top_k, normalize):
    """Kolibri-1's router (moe.chosen_by_logit, then sigmoid routing without a bias): the k of the largest
    logit + bias, weighted by sigmoid(logit), renormalised or not; the kernels (one program and chunked) as the
    reference on those logits."""
    from tritonformer.backend.models.moe import chosen_by_logit

    logits = _rand(tokens, experts, seed=tokens + 5, scale=2.0)
    bias = _rand(experts, seed=tokens + 6, scale=1.0)
    kept = chosen_by_logit(logits, top_k, bias)
    ids = (logits + bias).topk(top_k, dim=-1).indices
    weights = torch.sigmoid(logits).gather(1, ids)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    got_weights, got_ids = ref.moe_route(kept, top_k, normalize, None, "sigmoid")
    order = got_ids.sort(-1).indices, ids.sort(-1).indices
    assert torch.equal(got_ids.gather(1, order[0]), ids.gather(1, order[1]))
    torch.testing.assert_close(got_weights.gather(1, order[0]), weights.gather(1, order[1]), atol=1e-6, rtol=1e-5)
    got = route_align(kept, top_k, normalize, None, 16, "sigmoid")
    expected = ref.moe_route_align(kept, top_k, normalize, None, 16, "sigmoid")
    torch.testing.assert_close(got[0], expected[0], atol=1e-6, rtol=1e-5)
    assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])


@pytest.mark.parametrize("tokens,experts,groups,kept,top_k,scoring,biased,group_score", [
    (3, 64, 8, 4, 8, "sigmoid", True, "top2_sum"),  # DeepSeek-V3's groups, one program
    (1, 64, 8, 4, 8, "sigmoid", False, "top2_sum"),  # a decode row, no choice bias
    (40, 64, 8, 4, 8, "sigmoid", True, "top2_sum"),  # past FUSED_MAX_PAIRS: the chunked launches
    (5, 16, 4, 2, 4, "sigmoid", True, "top2_sum"),
    (20, 16, 4, 2, 4, "sigmoid", False, "top2_sum"),
    (6, 16, 4, 1, 3, "softmax", True, "top2_sum"),
    (4, 20, 4, 2, 3, "softmax", False, "max"),  # DeepSeek-V2's greedy over groups of 5 (not a power of two)
    (50, 160, 8, 3, 6, "softmax", False, "max"),  # DeepSeek-V2's shape, chunked
])
def test_the_kernels_route_group_limited_as_the_reference(tokens, experts, groups, kept, top_k, scoring, biased,
                                                          group_score):
    logits = _rand(tokens, experts, seed=tokens + experts + 80, scale=2.0)
    bias = _rand(experts, seed=tokens + 81, scale=0.5) if biased else None
    args = (logits, top_k, True, None, 16, scoring, bias, 2.5, groups, kept, group_score)
    got, expected = route_align(*args), ref.moe_route_align(*args)
    torch.testing.assert_close(got[0], expected[0], atol=1e-6, rtol=1e-5)
    assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])
    ungrouped = ref.moe_route_align(*args[:8])
    assert not torch.equal(got[1], ungrouped[1])  # the limit did choose


@pytest.mark.parametrize("tokens,experts", [(1, 16), (5, 16), (70, 16), (9, 12)])  # decode, prefill, chunked, E odd
def test_the_kernels_route_sparsemixer_as_the_reference(tokens, experts):
    logits = _sparsemixer_logits(tokens, experts, seed=tokens + 100)
    for dtype in (None, torch.bfloat16):
        args = (logits, 2, False, dtype, 16, "sparsemixer", None, 1.0, 1, 1, "top2_sum", 0.01)
        got, expected = route_align(*args), ref.moe_route_align(*args)
        # (bf16: within one step; Triton's interpreter converts by truncation, the GPU rounds to nearest)
        torch.testing.assert_close(got[0], expected[0], atol=1e-6, rtol=1e-5 if dtype is None else 2 ** -7)
        assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])
    x, _, gate_up, down = _moe_inputs(tokens, 32, 24, experts, seed=tokens + 110)
    routing = dict(scoring="sparsemixer", mask_eps=0.01)
    torch.testing.assert_close(moe_mlp(x, logits, gate_up, down, 2, False, None, "silu_mul", **routing),
                               ref.moe_mlp(x, logits, gate_up, down, 2, False, None, "silu_mul", **routing),
                               atol=2e-4, rtol=2e-4)


def test_kernel_with_group_limited_routing_matches_reference():
    x, logits, gate_up, down = _moe_inputs(6, 32, 24, 16, seed=90)
    bias = _rand(16, seed=94, scale=0.5)
    groups = dict(groups=4, kept_groups=2, group_score="top2_sum")
    expected = ref.moe_mlp(x, logits, gate_up, down, 4, True, None, "silu_mul", "sigmoid", bias, 2.5, **groups)
    got = moe_mlp(x, logits, gate_up, down, 4, True, None, "silu_mul", "sigmoid", bias, 2.5, **groups)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)
    ungrouped = ref.moe_mlp(x, logits, gate_up, down, 4, True, None, "silu_mul", "sigmoid", bias, 2.5)
    assert not torch.allclose(got, ungrouped, atol=1e-3)


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 64, 6), (70, 24, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_kernels_route_by_probability_and_a_bias_rounding_fp32_weights(tokens, experts, top_k, dtype):
    """ERNIE 4.5's routing (fp32 logits, the choice by probability + bias, the weights rounded to
    the activations' dtype) in one program and in the chunked launches."""
    logits = _rand(tokens, experts, seed=tokens + 2, scale=2.0)
    bias = _rand(experts, seed=tokens + 3, scale=0.05)
    got = route_align(logits, top_k, True, dtype, 16, "softmax", bias)
    expected = ref.moe_route_align(logits, top_k, True, dtype, 16, "softmax", bias)
    assert torch.equal(got[0], got[0].to(dtype).float())  # rounded to the dtype's values
    # within one step of the dtype (Triton's interpreter converts by truncation, the GPU rounds to nearest)
    torch.testing.assert_close(got[0], expected[0], atol=0, rtol=2 ** -7 if dtype == torch.bfloat16 else 2 ** -10)
    assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])


def test_one_program_rounds_the_weights_to_the_logits_dtype():
    logits = _rand(4, 16, seed=3, scale=2.0, dtype=torch.bfloat16)
    weights, _, _ = route_align(logits, 4, False, torch.bfloat16, 16)
    expected, _ = ref.moe_route(logits, 4, False, torch.bfloat16)
    assert torch.equal(weights, weights.to(torch.bfloat16).float())  # bf16 values
    # within one bf16 step (Triton's interpreter converts by truncation, the GPU rounds to nearest)
    torch.testing.assert_close(weights, expected, atol=0, rtol=2 ** -7)


@pytest.mark.parametrize("tokens,top_k,experts", [
    (1, 2, 8),  # a decode row: one routing program, 16-row blocks
    (3, 4, 8),
    (140, 2, 8),  # a prefill: chunked routing, > 256 pairs in 64-row blocks
])
def test_kernel_with_expert_biases_and_swiglu_oai_matches_reference(tokens, top_k, experts):
    x, logits, gate_up, down, gate_up_bias, down_bias = _oai_moe_inputs(tokens, 16, 24, experts, seed=50)
    kwargs = dict(gate_up_bias=gate_up_bias, down_bias=down_bias)
    expected = ref.moe_mlp(x, logits, gate_up, down, top_k, True, None, "swiglu_oai", **kwargs)
    got = moe_mlp(x, logits, gate_up, down, top_k, True, None, "swiglu_oai", **kwargs)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)


def test_kernel_with_one_bias_or_none_is_the_unbiased_path():
    """Each bias alone reaches its own GEMM; biases None run the kernels without a bias (as
    before there were biases) and give what zero biases give."""
    x, logits, gate_up, down, gate_up_bias, down_bias = _oai_moe_inputs(4, 16, 24, 6, seed=60)
    plain = moe_mlp(x, logits, gate_up, down, 2, True, None, "silu_mul")
    assert torch.equal(moe_mlp(x, logits, gate_up, down, 2, True, None, "silu_mul", gate_up_bias=None,
                               down_bias=None), plain)
    torch.testing.assert_close(plain, ref.moe_mlp(x, logits, gate_up, down, 2, True, None, "silu_mul"),
                               atol=2e-4, rtol=2e-4)
    zeros = moe_mlp(x, logits, gate_up, down, 2, True, None, "silu_mul", gate_up_bias=torch.zeros_like(gate_up_bias),
                    down_bias=torch.zeros_like(down_bias))
    torch.testing.assert_close(zeros, plain, atol=1e-6, rtol=1e-6)
    for kwargs in (dict(gate_up_bias=gate_up_bias), dict(down_bias=down_bias)):
        expected = ref.moe_mlp(x, logits, gate_up, down, 2, True, None, "silu_mul", **kwargs)
        torch.testing.assert_close(moe_mlp(x, logits, gate_up, down, 2, True, None, "silu_mul", **kwargs), expected,
                                   atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("tokens", [1, 9, 70])
def test_kernel_top_1_of_a_scaled_input_is_llama4s_moe(tokens):
    """Llama 4's experts (moe.py's scale_input): the top 1 by logit, its input x * sigmoid(logit); run as
    that input routed top 1 by softmax renormalised, whose weight is exactly 1. Against the math
    written out token by token: down_e(silu(gate_e(s x)) * up_e(s x)), e the argmax."""
    x, logits, gate_up, down = _moe_inputs(tokens, 32, 24, 16, seed=40)
    best, chosen = logits.max(dim=-1, keepdim=True)
    scaled = x * torch.sigmoid(best)
    weights, _ = ref.moe_route(logits, 1, True)
    assert torch.equal(weights, torch.ones_like(weights))
    expected = torch.stack([F.linear(F.silu(F.linear(row, gate_up[e, :24])) * F.linear(row, gate_up[e, 24:]), down[e])
                            for row, e in zip(scaled, chosen[:, 0].tolist())])
    torch.testing.assert_close(moe_mlp(scaled, logits, gate_up, down, 1, True, None, "silu_mul"), expected,
                               atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(ref.moe_mlp(scaled, logits, gate_up, down, 1, True, None, "silu_mul"), expected,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens", [1, 9, 140])
def test_kernel_identity_experts_match_reference(tokens):
    """The kernel's identity experts (their pairs' rows written before the GEMMs, which skip those ids) give the
    reference's sums: a decode row, a few rows, and more than 256 pairs (the prefill's row blocks)."""
    experts, zero, top_k = 6, 4, 3
    x, _, gate_up, down = _moe_inputs(tokens, 32, 24, experts, seed=80)
    logits, bias = _rand(tokens, experts + zero, seed=85, scale=2.0), _rand(experts + zero, seed=86, scale=0.1)
    args = (x, logits, gate_up, down, top_k, False, None, "silu_mul", "softmax", bias, 6.0)
    expected = ref.moe_mlp(*args, identity_experts=zero)
    torch.testing.assert_close(moe_mlp(*args, identity_experts=zero), expected, atol=2e-4, rtol=2e-4)
