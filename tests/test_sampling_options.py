"""The sampling options users set (vLLM's keys, as Triton's OpenAI frontend forwards them): the
parser accepts every key with its default and refuses what is not implemented by name; each
option is checked against a plain-PyTorch statement of its math on the same logits; seeded
requests stay batch-invariant with them; the penalty kernel matches its reference."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

from tritonformer.backend.decoder.sampling import Sampler, sample_seed
from tritonformer.backend.decoder.sampling_params import SamplingParams, parse_sampling_parameters
from tritonformer.backend.errors import InvalidRequest
from tritonformer.kernels import reference as ref

VOCAB = 64
EOS = 3


def parse(obj) -> SamplingParams:
    return parse_sampling_parameters(json.dumps(obj), max_tokens_limit=4096, vocab_size=1000)


# ---- the keys ---------------------------------------------------------------------------------

def test_what_the_openai_frontend_forwards_is_accepted():
    # Completions (best_of from older releases), then chat (older releases: "logprobs": false).
    completion = {"best_of": 1, "frequency_penalty": 0, "ignore_eos": False, "n": 1, "presence_penalty": 0,
                  "temperature": 1, "top_p": 1, "max_tokens": 16}
    chat = {"frequency_penalty": 0, "ignore_eos": False, "logprobs": False, "n": 1, "presence_penalty": 0,
            "temperature": 0.7, "top_p": 1, "max_tokens": 16, "min_tokens": 2, "seed": -5, "stop": ["\n"]}
    p = parse(completion)
    assert (p.n, p.temperature, p.max_tokens, p.logprobs) == (1, 1.0, 16, None) and p.argmax is False
    p = parse(chat)
    assert (p.seed, p.min_tokens, p.stop, p.logprobs) == (-5, 2, ["\n"], None)
    p = parse({"logprobs": 2, "logit_bias": {"7": -100, "9": 5}, "n": 3, "best_of": 3, "repetition_penalty": 1.2,
               "top_k": -1, "min_p": 0, "skip_special_tokens": True, "lora_name": None})
    assert (p.logprobs, p.logit_bias, p.n, p.repetition_penalty, p.top_k) == (2, {7: -100.0, 9: 5.0}, 3, 1.2, 0)


@pytest.mark.parametrize("bad,key", [
    ({"best_of": 3}, "best_of"), ({"min_p": 0.1}, "min_p"), ({"use_beam_search": True}, "use_beam_search"),
    ({"lora_name": "a"}, "lora_name"), ({"guided_decoding": "{}"}, "guided_decoding"),
    ({"structured_outputs": "{}"}, "structured_outputs"), ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"include_stop_str_in_output": True}, "include_stop_str_in_output"), ({"n": 0}, "n"), ({"n": 17}, "n"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"), ({"presence_penalty": "x"}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_tokens": 100, "max_tokens": 10}, "min_tokens"),
    ({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {"5000": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logprobs": 21}, "logprobs"), ({"logprobs": -1}, "logprobs"),
    ({"skip_special_tokens": False}, "skip_special_tokens"), ({"best_of": True}, "best_of"),
])
def test_unimplemented_or_bad_values_are_refused_by_name(bad, key):
    with pytest.raises(InvalidRequest, match=key):
        parse(bad)


def test_only_plain_greedy_takes_the_fast_path():
    assert SamplingParams().greedy and SamplingParams(temperature=0.5, top_k=1).greedy
    for p in (SamplingParams(frequency_penalty=0.5), SamplingParams(repetition_penalty=1.1),
              SamplingParams(logit_bias={1: 2.0}), SamplingParams(min_tokens=1), SamplingParams(logprobs=0)):
        assert not p.greedy and p.argmax


# ---- each option against its math --------------------------------------------------------------

def expected_logits(raw: torch.Tensor, p: SamplingParams, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """The option math written out per token, independently of the sampler: bias, min_tokens
    mask, HF repetition (prompt + generated), OpenAI frequency / presence (generated)."""
    x = raw.clone().double()
    for t, b in p.logit_bias.items():
        x[t] += b
    if len(generated) < p.min_tokens:
        for t in set(p.stop_token_ids) | ({EOS} if not p.ignore_eos else set()):
            x[t] = -math.inf
    for t in range(len(x)):
        if t in prompt or t in generated:
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        c = generated.count(t)
        x[t] -= p.frequency_penalty * c + p.presence_penalty * (c > 0)
    return x


def logits_at(step: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * seed + step)
    return torch.randn(VOCAB, generator=gen) * 3


@pytest.mark.parametrize("p", [
    SamplingParams(frequency_penalty=1.5),
    SamplingParams(presence_penalty=2.0),
    SamplingParams(frequency_penalty=-0.7, presence_penalty=0.9),
    SamplingParams(repetition_penalty=1.8),
    SamplingParams(repetition_penalty=0.6, frequency_penalty=0.4),
    SamplingParams(logit_bias={5: 7.5, 9: -100.0}),
    SamplingParams(min_tokens=4, stop_token_ids=[11]),
    SamplingParams(min_tokens=4, ignore_eos=True, stop_token_ids=[11]),
    SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, logit_bias={2: 3.0}, min_tokens=2),
], ids=lambda p: ",".join(f"{k}={v}" for k, v in vars(p).items() if v != getattr(SamplingParams(), k)))
def test_greedy_with_options_picks_the_argmax_of_their_math(p):
    """Over 12 steps (counts accumulating from the sampler's own picks), each pick is the argmax
    of the options' math applied to the same raw logits."""
    prompt = [1, 2, 5, 40, 41]
    sampler = Sampler(eos_token_ids=[EOS])
    sampler.register(0, p, prompt)
    generated = []
    for step in range(12):
        raw = logits_at(step)
        if step < 6:
            raw[EOS] = raw[11] = 50.0  # the ends would win, unless masked
        raw[generated[-1] if generated else 0] += 4.0  # tempt repeats
        got = sampler.sample(raw[None], [p], [0])[0]
        want = int(expected_logits(raw, p, prompt, generated).argmax())
        assert got == want, (step, got, want)
        generated.append(got)
    if p.min_tokens:
        assert EOS not in generated[: p.min_tokens] or p.ignore_eos
        assert 11 not in generated[: p.min_tokens] or 11 not in p.stop_token_ids


def test_sampled_row_draws_from_softmax_of_the_processed_logits():
    """With temperature, the picks follow softmax(processed / T): chi-square on 8,000 draws."""
    raw = torch.tensor([1.0, 0.5, 0.2, -0.3, 0.8, 0.0])
    p = SamplingParams(temperature=0.8, logit_bias={4: -1.0, 2: 1.5}, repetition_penalty=1.4)
    prompt = [0, 3]
    sampler = Sampler()
    counts = torch.zeros(6)
    for rep in range(4):
        rows = [SamplingParams(**{**vars(p), "seed": rep * 2000 + s}) for s in range(2000)]
        keys = [rep * 10_000 + s for s in range(2000)]
        for key, row in zip(keys, rows):
            sampler.register(key, row, prompt)
        ids = sampler.sample(raw.expand(2000, -1), rows, keys)
        counts += torch.bincount(torch.tensor(ids), minlength=6)
    expected = torch.softmax(expected_logits(raw, p, prompt, []).float() / 0.8, -1) * counts.sum()
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 20.5  # 5 degrees of freedom, p = 0.001


def test_logprobs_are_the_raw_distribution_with_ranks():
    raw = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(3)) * 2
    params = [SamplingParams(logprobs=3, frequency_penalty=2.0, temperature=0.9, seed=1),
              SamplingParams(),  # plain greedy beside them
              SamplingParams(logprobs=0, logit_bias={7: 100.0})]
    sampler = Sampler()
    ids = sampler.sample(raw, params, [0, 1, 2])
    want = torch.log_softmax(raw.double(), -1)  # before bias, penalties and temperature
    for row, key, k in ((0, 0, 3), (2, 2, 0)):
        got = sampler.take_logprobs(key, k)
        token = ids[row]
        assert list(got)[0] == token
        lp, rank = got[token]
        assert lp == pytest.approx(want[row, token].item(), abs=1e-5)
        assert rank == int((want[row] >= want[row, token]).sum())
        top = want[row].topk(k).indices.tolist()
        assert [t for t in got if t != token or k and t in top][: len(top)] == top or set(top) <= set(got)
        for j, t in enumerate(top):
            assert got[t][1] == j + 1 and got[t][0] == pytest.approx(want[row, t].item(), abs=1e-5)
        assert len(got) == len(set(top) | {token})
    assert ids[2] == 7  # the bias moved the pick, not the reported distribution
    assert 1 not in sampler._logprobs  # the greedy row keeps nothing


def run_request(p: SamplingParams, steps: int, others: int, position: int) -> list[int]:
    """One request's tokens over `steps` steps, batched with `others` rows of other options."""
    sampler = Sampler(eos_token_ids=[EOS])
    sampler.register(7, p, [1, 2, 3])
    neighbours = [SamplingParams(temperature=0.5 + j, frequency_penalty=0.3 * j, repetition_penalty=1.0 + 0.1 * j,
                                 seed=j, logit_bias={j: 1.0}) if j % 2 else SamplingParams() for j in range(others)]
    for j, q in enumerate(neighbours):
        sampler.register(100 + j, q, [j, j + 1])
    out = []
    for step in range(steps):
        batch = [logits_at(step, seed=50 + j) for j in range(others)]
        params, keys = list(neighbours), [100 + j for j in range(others)]
        batch.insert(position, logits_at(step))
        params.insert(position, p)
        keys.insert(position, 7)
        out.append(sampler.sample(torch.stack(batch), params, keys)[position])
    return out


@pytest.mark.parametrize("p", [SamplingParams(temperature=1.0, seed=-9, frequency_penalty=0.8, presence_penalty=0.4),
                               SamplingParams(temperature=0.7, top_p=0.9, seed=2**64 - 1, repetition_penalty=1.5,
                                              logit_bias={4: 2.0}, min_tokens=3)])
def test_seeded_request_with_options_is_batch_invariant(p):
    alone = run_request(p, 10, 0, 0)
    assert len(set(alone)) > 3
    for others, position in ((1, 1), (4, 2), (7, 0)):
        assert run_request(p, 10, others, position) == alone, (others, position)


def test_n_samples_have_their_own_streams_and_sample_0_is_n_1():
    assert sample_seed(42, 0) == 42
    seeds = {sample_seed(42, i) for i in range(8)}
    assert len(seeds) == 8 and sample_seed(-42, 1) != sample_seed(42, 1)
    draws = [run_request(SamplingParams(temperature=1.0, seed=sample_seed(5, i)), 8, 0, 0) for i in range(3)]
    assert len({tuple(d) for d in draws}) == 3


def test_release_frees_the_penalty_row_for_reuse():
    sampler = Sampler()
    p = SamplingParams(frequency_penalty=1.0)
    for key in range(20):  # more than the pool's first size: it grows, rows come back
        sampler.sample(logits_at(key)[None], [p], [key])
        if key % 2:
            sampler.release(key)
    state = sampler._penalties
    assert len(state.slots) == 10 and state.counts.shape[0] >= 10
    assert int(state.counts[state.slots[0]].sum()) == 1
    sampler.release(0)
    sampler.sample(logits_at(99)[None], [p], [500])  # a fresh row starts from zero counts
    assert int(state.counts[state.slots[500]].sum()) == 1


# ---- the penalty op: reference against the math, kernel against the reference -----------------

def random_penalty_case(rows: int, vocab: int, pool: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    counts = torch.randint(0, 3, (pool, vocab), generator=gen, dtype=torch.int32) * (torch.rand(pool, vocab, generator=gen) < 0.2)
    in_prompt = torch.rand(pool, vocab, generator=gen) < 0.1
    slots = torch.randperm(pool, generator=gen)[:rows]
    freq = torch.rand(rows, generator=gen) * 4 - 2
    pres = torch.rand(rows, generator=gen) * 4 - 2
    rep = torch.rand(rows, generator=gen) * 1.5 + 0.5
    return logits, counts.to(torch.int32), in_prompt, slots, freq, pres, rep


def test_reference_penalties_match_the_math():
    logits, counts, in_prompt, slots, freq, pres, rep = random_penalty_case(4, 30, 6, 0)
    got = ref.apply_penalties(logits.clone(), counts, in_prompt, slots, freq, pres, rep)
    for r in range(4):
        s = int(slots[r])
        p = SamplingParams(frequency_penalty=float(freq[r]), presence_penalty=float(pres[r]),
                           repetition_penalty=float(rep[r]))
        generated = [t for t in range(30) for _ in range(int(counts[s, t]))]
        prompt = [t for t in range(30) if in_prompt[s, t]]
        assert torch.allclose(got[r].double(), expected_logits(logits[r], p, prompt, generated), atol=1e-5)


@pytest.mark.parametrize("rows,vocab", [(1, 5), (3, 37), (4, 300)])
def test_penalty_kernel_matches_reference(rows, vocab, monkeypatch):
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from tritonformer.kernels import triton_sampling as ts

    monkeypatch.setattr(ts, "_PENALTY_BLOCK", 64)  # several blocks per row, the last partial
    case = [t.to(device) for t in random_penalty_case(rows, vocab, rows + 3, rows * vocab)]
    want = ref.apply_penalties(case[0].clone(), *case[1:])
    got = ts.apply_penalties(case[0].clone(), *case[1:])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_penalty_kernel_matches_reference_at_vocab_size_on_gpu():
    from tritonformer.kernels import triton_sampling as ts

    case = [t.cuda() for t in random_penalty_case(64, 151_936, 80, 1)]
    want = ref.apply_penalties(case[0].clone(), *case[1:])
    torch.testing.assert_close(ts.apply_penalties(case[0].clone(), *case[1:]), want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_sampler_with_options_matches_cpu_and_never_syncs_before_the_result():
    params = [SamplingParams(), SamplingParams(temperature=0.9, seed=1, frequency_penalty=1.0, presence_penalty=0.5),
              SamplingParams(repetition_penalty=1.3, logprobs=5), SamplingParams(temperature=1.2, top_k=50, seed=2,
                                                                                 logit_bias={7: 5.0}, min_tokens=3),
              SamplingParams(temperature=0.7, top_p=0.9, seed=3, repetition_penalty=0.8)]
    keys = list(range(len(params)))
    samplers = {"cpu": Sampler(eos_token_ids=[EOS]), "cuda": Sampler(eos_token_ids=[EOS])}
    picks = {}
    for device, sampler in samplers.items():
        for key, p in zip(keys, params):
            sampler.register(key, p, [1, 2, 3, 4])
        out = []
        for step in range(6):
            logits = torch.stack([torch.randn(32000, generator=torch.Generator().manual_seed(step * 10 + r)) * 3
                                  for r in keys]).to(device)
            torch.cuda.synchronize()
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("error")
            try:
                ids = sampler.sample_ids(logits, params, keys)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            out.append(ids.tolist())
        picks[device] = out
    assert picks["cuda"] == picks["cpu"]
