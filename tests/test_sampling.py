"""sampling_parameters parsing (every bad value is a clear error) and the sampler."""
from __future__ import annotations

import json

import pytest
import torch

from tritonformer.backend.sampling import InvalidRequest, Sampler, SamplingParams, parse_sampling_parameters


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
        ({"seed": -3}, "seed"),
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
