"""sampling_parameters parsing (every bad value is a clear error) and the sampler."""
from __future__ import annotations

import json
import random

import pytest
import torch

from tritonformer.backend.decoder import sampling
from tritonformer.backend.errors import InvalidRequest
from tritonformer.backend.decoder.sampling_params import SamplingParams, parse_sampling_parameters
from tritonformer.backend.decoder.sampling import Sampler


def parse(obj) -> SamplingParams:
    raw = obj if isinstance(obj, str) else json.dumps(obj)
    return parse_sampling_parameters(raw, max_tokens_limit=4096, vocab_size=1000)


def test_defaults_and_full_object():
    assert parse("") == SamplingParams()
    p = parse(
        {"max_tokens": 7, "temperature": 0.5, "top_k": 3, "top_p": 0.9, "seed": 1, "stop": "\n",
         "stop_token_ids": [2], "ignore_eos": True, "apply_chat_template": True}
    )
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.seed) == (7, 0.5, 3, 0.9, 1)
    assert p.stop == ["\n"] and p.stop_token_ids == [2] and p.ignore_eos and p.apply_chat_template


@pytest.mark.parametrize(
    "bad,match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ({"max_token": 5}, "unknown key"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**9}, "max_tokens"),
        ({"max_tokens": 5.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": 2**64}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"stop": ""}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stop_token_ids": [5000]}, "stop_token_ids"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_bad_values_are_invalid_requests(bad, match):
    with pytest.raises(InvalidRequest, match=match):
        parse(bad)


def test_greedy_rows_take_argmax_and_sampling_is_seeded():
    logits = torch.randn(3, 50)
    logits[2] = logits[1]
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=5), SamplingParams(temperature=1.0, seed=5)]
    a = Sampler().sample(logits, params, keys=[0, 1, 2])
    b = Sampler().sample(logits, params, keys=[0, 1, 2])
    assert a[0] == int(logits[0].argmax())
    assert a == b  # same seeds, same draws
    assert a[1] == a[2]  # same logits and seed in two sequences


def test_top_k_and_top_p_restrict_the_candidates():
    logits = torch.tensor([[5.0, 4.0, 3.0, -10.0, -10.0]])
    sampler = Sampler()
    seen_k = {sampler.sample(logits, [SamplingParams(temperature=5.0, top_k=2, seed=i)], [i])[0] for i in range(60)}
    assert seen_k == {0, 1}
    # probs at T=1: ~[0.665, 0.245, 0.09, ...]: top_p=0.7 keeps the first two only.
    seen_p = {sampler.sample(logits, [SamplingParams(temperature=1.0, top_p=0.7, seed=i)], [100 + i])[0] for i in range(80)}
    assert seen_p == {0, 1}


# ---- the vectorised, counter-based sampler -------------------------------------------------

def draw_many(logits_row: torch.Tensor, params: SamplingParams, n_keys: int = 2000, steps: int = 10) -> torch.Tensor:
    """Token counts from n_keys * steps draws: n_keys sequences (seeds 0..n_keys-1) in one batch."""
    sampler = Sampler()
    batch = logits_row.expand(n_keys, -1)
    keys = list(range(n_keys))
    rows = [SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=k)
            for k in keys]
    counts = torch.zeros(logits_row.shape[-1])
    for _ in range(steps):
        ids = sampler.sample(batch, rows, keys)
        counts += torch.bincount(torch.tensor(ids), minlength=logits_row.shape[-1])
    return counts


def test_mixer_matches_the_exact_uint64_reference():
    # torch int64: multiply wraps, but >> is arithmetic on negatives; the mixer must still equal
    # unsigned splitmix64 for every bit pattern, including those with the top bit set.
    rng = random.Random(0)
    vals = [0, 1, 2**63 - 1, 2**63, 2**64 - 1] + [rng.getrandbits(64) for _ in range(2000)]
    got = sampling._mix64_(torch.tensor([sampling._as_i64(v) for v in vals], dtype=torch.int64))
    assert got.tolist() == [sampling._as_i64(sampling._mix64(v)) for v in vals]
    # splitmix64's published outputs for seed 1234567 (state += golden gamma, then the finaliser).
    state, outputs = 1234567, []
    for _ in range(3):
        state += sampling._GOLDEN
        outputs.append(sampling._mix64(state))
    assert outputs == [6457827717110365317, 3203168211198807973, 9817491932198370423]


def test_gumbel_noise_is_uniformish_and_finite():
    keys = torch.tensor([sampling._row_key(s, 0) for s in range(200)])
    g = sampling._gumbel_noise(keys, torch.arange(1000).expand(200, 1000))
    assert g.dtype == torch.float32 and torch.isfinite(g).all()
    assert abs(g.mean().item() - 0.5772) < 0.01 and abs(g.var().item() - torch.pi**2 / 6) < 0.03


def test_all_greedy_batch_is_argmax_with_one_sync(monkeypatch):
    logits = torch.randn(6, 100)
    params = [SamplingParams(), SamplingParams(temperature=0.7, top_k=1), SamplingParams(temperature=0.0, seed=3)] * 2
    calls = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(1) or real_tolist(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: pytest.fail("item() is a per-row sync"))
    sampler = Sampler()
    assert sampler.sample(logits, params, list(range(6))) == logits.argmax(-1).tolist()
    assert len(calls) == 2  # ours, plus the expected value's
    assert sampler._state == {}  # greedy rows keep no RNG state


def test_mixed_batch_keeps_greedy_rows_argmax_and_syncs_once(monkeypatch):
    logits = torch.randn(5, 64)
    params = [SamplingParams(temperature=1.5, top_p=0.9, seed=1), SamplingParams(), SamplingParams(temperature=2.0, top_k=5),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)]
    expected_greedy = logits.argmax(-1).tolist()
    calls = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(1) or real_tolist(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: pytest.fail("item() is a per-row sync"))
    out = Sampler().sample(logits, params, list(range(5)))
    assert len(calls) == 1
    assert out[1] == expected_greedy[1] and out[3] == expected_greedy[3]
    assert all(isinstance(t, int) and 0 <= t < 64 for t in out)
    assert out[2] in torch.topk(logits[2], 5).indices.tolist()


def test_top_k_only_yields_the_k_largest_logits():
    torch.manual_seed(0)
    logits = torch.randn(40) * 2
    counts = draw_many(logits, SamplingParams(temperature=3.0, top_k=4), n_keys=500, steps=4)
    seen = set(torch.nonzero(counts).flatten().tolist())
    assert seen == set(torch.topk(logits, 4).indices.tolist())


def test_top_p_only_yields_the_nucleus():
    # Probabilities 0.4, 0.3, 0.2, 0.06, 0.04 at shuffled vocab positions. Mass ranked above each:
    # 0, 0.4, 0.7, 0.9, 0.96. top_p=0.65 keeps the first two; 0.8 the first three; 0.3 the first.
    probs = torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04])
    perm = torch.tensor([3, 0, 4, 1, 2])  # rank r sits at vocab id perm[r]
    logits = torch.empty(5)
    logits[perm] = probs.log()
    for top_p, nucleus in ((0.65, 2), (0.8, 3), (0.3, 1), (1.0, 5)):
        counts = draw_many(logits, SamplingParams(temperature=1.0, top_p=top_p), n_keys=400, steps=4)
        assert set(torch.nonzero(counts).flatten().tolist()) == set(perm[:nucleus].tolist()), top_p
        kept = probs[:nucleus] / probs[:nucleus].sum()  # renormalised over the nucleus
        assert (counts[perm[:nucleus]] / counts.sum() - kept).abs().max() < 0.03, top_p


def test_top_k_then_top_p_on_the_renormalised_top_k():
    probs = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1])
    # top_k=3 renormalises to 0.4, 0.333, 0.267: mass above the third is 0.733 >= 0.7, so it goes.
    counts = draw_many(probs.log(), SamplingParams(temperature=1.0, top_k=3, top_p=0.7), n_keys=300, steps=3)
    assert set(torch.nonzero(counts).flatten().tolist()) == {0, 1}


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_frequencies_match_softmax_of_scaled_logits(temperature):
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.5, 0.7, 1.3])
    counts = draw_many(logits, SamplingParams(temperature=temperature))  # 20k draws
    n = counts.sum()
    expected = torch.softmax(logits / temperature, dim=-1)
    assert (counts / n - expected).abs().max() < 0.012
    chi2 = ((counts - n * expected) ** 2 / (n * expected)).sum().item()
    assert chi2 < 24.3  # chi-square, 7 degrees of freedom, p = 0.001


def test_temperature_sharpens_and_flattens():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    cold = draw_many(logits, SamplingParams(temperature=0.3), n_keys=500, steps=4)
    hot = draw_many(logits, SamplingParams(temperature=5.0), n_keys=500, steps=4)
    assert cold[0] / cold.sum() > 0.95  # softmax(logits/0.3)[0] ~ 0.96
    assert 0.3 < hot[0] / hot.sum() < 0.4 and hot[3] / hot.sum() > 0.15  # ~0.35 and ~0.2


def run_request(sampler: Sampler, key: int, params: SamplingParams, steps: int, vocab: int,
                others: int = 0, position: int = 0, other_seed: int = 0) -> list[int]:
    """Sample `steps` tokens for one request (logits a fixed function of the step), batched with
    `others` unrelated rows (mixed greedy / sampled, random logits), the request at `position`."""
    gen = torch.Generator().manual_seed(other_seed)
    out = []
    for step in range(steps):
        ours = torch.sin(torch.arange(vocab) * (step + 1.0)) * 3
        batch = [torch.randn(vocab, generator=gen) for _ in range(others)]
        batch_params = [SamplingParams(temperature=0.0) if j % 3 == 0 else
                        SamplingParams(temperature=0.5 + j, top_k=j % 4 * 5, top_p=1.0 - 0.1 * (j % 2), seed=j)
                        for j in range(others)]
        batch_keys = [10_000 + other_seed * 100 + j for j in range(others)]
        pos = min(position, others)
        batch.insert(pos, ours)
        batch_params.insert(pos, params)
        batch_keys.insert(pos, key)
        out.append(sampler.sample(torch.stack(batch), batch_params, batch_keys)[pos])
    return out


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, seed=123),
                                    SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=2**63 - 1)])
def test_seeded_request_is_batch_invariant(params):
    vocab, steps = 257, 12
    alone = run_request(Sampler(), 7, params, steps, vocab)
    assert len(set(alone)) > 3  # really sampling, not stuck on one token
    for others, position, other_seed in ((1, 0, 1), (5, 2, 2), (9, 9, 3), (16, 0, 4)):
        batched = run_request(Sampler(), 7, params, steps, vocab, others, position, other_seed)
        assert batched == alone, (others, position)
    # The key does not matter, only the seed.
    assert run_request(Sampler(), 99, params, steps, vocab, 3, 1) == alone


def test_different_seeds_differ_and_unseeded_requests_differ():
    vocab, steps = 257, 12
    a = run_request(Sampler(), 1, SamplingParams(temperature=1.0, seed=1), steps, vocab)
    b = run_request(Sampler(), 1, SamplingParams(temperature=1.0, seed=2), steps, vocab)
    assert a != b
    sampler = Sampler()
    c = run_request(sampler, 1, SamplingParams(temperature=1.0), steps, vocab)
    d = run_request(sampler, 2, SamplingParams(temperature=1.0), steps, vocab)
    assert c != d  # each unseeded sequence draws its own random seed


def test_release_resets_the_step_counter():
    vocab = 257
    params = SamplingParams(temperature=1.0, seed=42)
    sampler = Sampler()
    first = run_request(sampler, 5, params, 8, vocab)
    continued = run_request(sampler, 5, params, 8, vocab)  # same key, not released: steps 8..15
    assert continued != first
    sampler.release(5)
    assert 5 not in sampler._state
    assert run_request(sampler, 5, params, 8, vocab) == first
    sampler.release(12345)  # unknown keys are fine


def test_sample_ids_stays_on_the_logits_device():
    logits = torch.randn(3, 30)
    ids = Sampler().sample_ids(logits, [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams()], [0, 1, 2])
    assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int64 and ids.shape == (3,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_and_never_syncs_before_the_result():
    torch.manual_seed(0)
    logits = torch.randn(8, 32000) * 3
    params = [SamplingParams(), SamplingParams(temperature=0.9, seed=1), SamplingParams(temperature=1.3, top_k=50, seed=2),
              SamplingParams(temperature=0.7, top_p=0.9, seed=3), SamplingParams(temperature=1.0, top_k=1),
              SamplingParams(temperature=1.1, top_k=100, top_p=0.8, seed=4), SamplingParams(temperature=2.0, seed=5),
              SamplingParams(temperature=0.5, seed=6)]
    keys = list(range(8))
    cpu = Sampler().sample(logits, params, keys)
    gpu_logits = logits.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids = Sampler().sample_ids(gpu_logits, params, keys)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ids.tolist() == cpu
