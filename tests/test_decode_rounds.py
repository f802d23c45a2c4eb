"""Rounds of several decode iterations per launch (the scheduler's max_decode_steps), end to end
on the CPU path: the same requests give the same tokens, finish reasons and streamed text as
one iteration per launch, greedy ones equal Hugging Face's greedy generation, and nothing is
left behind in the KV pool."""
from __future__ import annotations

import pytest
import torch
import transformers

from tritonformer.backend.decoder.runner import DecoderRunner
from tritonformer.backend.decoder.engine import GeneratorEngine
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.client.hf_reference import generate_greedy, left_pad
from tritonformer.scheduler.iteration import IterationScheduler
from tritonformer.scheduler.kv_blocks import BlockManager

CPU = torch.device("cpu")
VOCAB = 300


class RecordingSink:
    def __init__(self):
        self.responses: dict[object, list] = {}

    def send(self, handle, outputs, error, final):
        assert error is None, error
        self.responses.setdefault(handle, []).append((outputs, final))

    def is_cancelled(self, handle):
        return False


class TagTokenizer:
    """Each id reads as `<id>`: stop strings can name a token, and streamed text shows every one."""

    def decode(self, ids) -> str:
        return "".join(f"<{i}>" for i in ids)


@pytest.fixture(scope="module")
def tiny_gpt2():
    # A wide initialisation: a small random model then writes varied tokens, not one repeated.
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2, n_positions=96,
                                  initializer_range=0.5, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    torch.manual_seed(11)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    return hf, load_decoder(cfg.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32)


def _greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids, mask = left_pad([prompt], "cpu")
    return generate_greedy(hf, ids, mask, n)[0, len(prompt):].tolist()


def _serve(model, requests, max_decode_steps: int, blocks: int = 64, block: int = 4) -> tuple[dict, int, object]:
    """Run `requests` (handle, prompt, params, stream) to the end; returns (responses, rounds of
    more than one iteration, scheduler)."""
    scheduler = IterationScheduler(BlockManager(blocks, block), 8, 64, max_seq_len=model.config.max_position_embeddings,
                                   max_decode_steps=max_decode_steps)
    runner = DecoderRunner(model, model.new_kv_cache(blocks, block), 8)
    rounds = 0
    plain_run_steps = runner.run_steps

    def counted(*args, **kwargs):
        nonlocal rounds
        rounds += 1
        return plain_run_steps(*args, **kwargs)

    runner.run_steps = counted
    sink = RecordingSink()
    engine = GeneratorEngine(runner, TagTokenizer(), sink, scheduler, cancel_check_interval_s=3600)
    engine.admit([engine.new_sequence(h, p, params, stream) for h, p, params, stream in requests])
    while engine.has_work():
        engine.step()
    assert scheduler.blocks.num_used == 0 and not scheduler.running
    return sink.responses, rounds, scheduler


def _result(responses) -> tuple[str, list[int], str]:
    text = "".join(o["text_output"][0].decode() for o, _ in responses)
    ids = [i for o, _ in responses for i in o["output_ids"].tolist()]
    assert [final for _, final in responses][-1] and not any(final for _, final in responses[:-1])
    return text, ids, responses[-1][0]["finish_reason"][0].decode()


def test_rounds_give_the_tokens_of_single_iterations(tiny_gpt2):
    hf, model = tiny_gpt2
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (9, 4, 13, 6, 7, 11, 5, 8)]
    reference = _greedy(hf, prompts[5], 20)
    stop_token = reference[6]
    stop_string = f"<{reference[9]}>"
    requests = [
        ("greedy", prompts[0], SamplingParams(max_tokens=30, ignore_eos=True), False),
        ("one", prompts[1], SamplingParams(max_tokens=1, ignore_eos=True), False),
        ("two", prompts[2], SamplingParams(max_tokens=2, ignore_eos=True), True),
        ("five", prompts[3], SamplingParams(max_tokens=5, ignore_eos=True), True),  # ends mid-round
        ("seeded", prompts[4], SamplingParams(max_tokens=17, temperature=0.9, top_k=40, seed=7, ignore_eos=True),
         True),
        ("stop_id", prompts[5], SamplingParams(max_tokens=20, stop_token_ids=[stop_token], ignore_eos=True), True),
        ("stop_str", prompts[5], SamplingParams(max_tokens=20, stop=[stop_string], ignore_eos=True), False),
        ("top_p", prompts[7], SamplingParams(max_tokens=23, temperature=1.1, top_p=0.8, seed=2, ignore_eos=True),
         False),
    ]
    single, none, _ = _serve(model, requests, max_decode_steps=1)
    assert none == 0
    for steps in (3, 4):
        several, rounds, _ = _serve(model, requests, max_decode_steps=steps)
        assert rounds > 0
        for handle, *_ in requests:
            assert _result(several[handle]) == _result(single[handle]), (steps, handle)

    for handle, prompt, params, _ in requests[:4]:
        assert _result(single[handle])[1] == _greedy(hf, prompt, params.max_tokens)
    text, ids, finish = _result(single["stop_id"])
    assert finish == "stop" and ids == reference[: reference.index(stop_token) + 1]
    text, ids, finish = _result(single["stop_str"])
    assert finish == "stop" and text == "".join(f"<{i}>" for i in reference[:9])


def test_rounds_fall_back_to_single_iterations_when_blocks_are_short(tiny_gpt2):
    """A pool that holds the sequences but not several tokens ahead of each: preemption and
    single iterations, still Hugging Face's greedy tokens."""
    hf, model = tiny_gpt2
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (16, 3, 9, 12, 5)]
    requests = [(i, p, SamplingParams(max_tokens=40, ignore_eos=True), False) for i, p in enumerate(prompts)]
    responses, rounds, scheduler = _serve(model, requests, max_decode_steps=4, blocks=24, block=4)
    assert rounds > 0 and scheduler.num_preemptions > 0
    for handle, prompt, params, _ in requests:
        assert _result(responses[handle])[1] == _greedy(hf, prompt, 40)


def test_more_iterations_per_round_than_the_runner_holds_is_a_load_error(tiny_gpt2):
    _, model = tiny_gpt2
    scheduler = IterationScheduler(BlockManager(64, 4), 8, 64, max_decode_steps=17)
    runner = DecoderRunner(model, model.new_kv_cache(64, 4), 8)
    with pytest.raises(ValueError, match="max_decode_steps must be <= 16, got 17"):
        GeneratorEngine(runner, TagTokenizer(), RecordingSink(), scheduler)
