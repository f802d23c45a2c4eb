"""The engines without Triton: a fake response sink records what the Triton glue would send."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from tritonformer.backend.encoder.engine import EmbedderEngine, EmbedRequest
from tritonformer.backend.engine_loop import Overloaded, ShuttingDown
from tritonformer.backend.decoder.runner import DecoderRunner
from tritonformer.backend.decoder.engine import GeneratorEngine
from tritonformer.backend.models.bert import BertConfig, BertEncoder
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.tokenization import TextTokenizer
from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
from tritonformer.scheduler.fifo import FifoBatchPolicy
from tritonformer.scheduler.iteration import IterationScheduler
from tritonformer.scheduler.kv_blocks import BlockManager

CPU = torch.device("cpu")


class FakeSink:
    def __init__(self):
        self.responses: dict[object, list] = {}
        self.cancelled: set = set()
        self._cv = threading.Condition()

    def send(self, handle, outputs, error, final):
        with self._cv:
            got = self.responses.setdefault(handle, [])
            assert not (got and got[-1][2]), f"response after FINAL for {handle}"
            got.append((outputs, error, final))
            self._cv.notify_all()

    def is_cancelled(self, handle):
        return handle in self.cancelled

    def wait_final(self, handles, timeout=60.0):
        deadline = time.monotonic() + timeout
        with self._cv:
            while not all(self.responses.get(h) and self.responses[h][-1][2] for h in handles):
                assert self._cv.wait(deadline - time.monotonic()), "timed out waiting for final responses"
        return {h: self.responses[h] for h in handles}


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    model = BertEncoder(BertConfig.from_hf(load_config(minilm_dir)), load_state_dict(minilm_dir), CPU, torch.float32)
    return model, TextTokenizer(minilm_dir)


def test_embedder_answers_each_request_once_with_batch_invariant_results(minilm):
    model, tok = minilm
    sink = FakeSink()
    engine = EmbedderEngine(model, sink, FifoBatchPolicy(max_sequences=5, max_tokens=200), "mean", True)
    texts = [[f"request {i} text {j} " * (1 + (i * j) % 7) for j in range(1 + i % 3)] for i in range(12)]
    handles = [f"r{i}" for i in range(12)]
    for h, t in zip(handles, texts):
        engine.submit(EmbedRequest(h, tok.encode_batch(t)))
    engine.start()
    got = sink.wait_final(handles)
    engine.stop()
    for h, t in zip(handles, texts):
        (outputs, error, final), = got[h]  # exactly one response
        assert error is None and final
        emb = outputs["embedding"]
        assert emb.shape == (len(t), 384) and emb.dtype == np.float32
        alone = engine.embed(tok.encode_batch(t))
        np.testing.assert_allclose(emb, alone, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_embedder_queue_is_bounded_and_shutdown_answers_queued(minilm):
    model, tok = minilm
    sink = FakeSink()
    engine = EmbedderEngine(model, sink, FifoBatchPolicy(), max_queue=2)
    engine.submit(EmbedRequest("a", [[101, 102]]))
    engine.submit(EmbedRequest("b", [[101, 102]]))
    with pytest.raises(Overloaded, match="retry"):
        engine.submit(EmbedRequest("c", [[101, 102]]))
    engine.start()
    engine.stop()
    for h in ("a", "b"):
        (outputs, error, final), = sink.responses[h]
        assert final and (error is None or isinstance(error, ShuttingDown))
    with pytest.raises(ShuttingDown):
        engine.submit(EmbedRequest("d", [[101, 102]]))


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    model = load_decoder(load_config(smollm2_dir), load_state_dict(smollm2_dir), CPU, torch.float32)
    return model, TextTokenizer(smollm2_dir)


def fails_first_run():
    """A runner class: the real runner, except that its first call fails (e.g. out of memory)."""

    class Flaky(DecoderRunner):
        calls = 0

        def run(self, entries):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("simulated failure")
            return super().run(entries)

    return Flaky


def _generator(model, tok, sink, runner_cls=DecoderRunner, max_running=4, budget=256, block_size=16, **kwargs):
    """An engine over a paged cache just big enough for one longest sequence plus a little."""
    num_blocks = -(-model.config.max_position_embeddings // block_size) + 16
    scheduler = IterationScheduler(BlockManager(num_blocks, block_size), max_running, budget,
                                   max_seq_len=model.config.max_position_embeddings)
    runner = runner_cls(model, model.new_kv_cache(num_blocks, block_size), max_running)
    return GeneratorEngine(runner, tok, sink, scheduler, cancel_check_interval_s=0.0, **kwargs)


def _run_generation(model, tok, requests, cancel=(), stream_interval=1):
    """requests: list of (handle, prompt, SamplingParams, stream). Returns the sink."""
    sink = FakeSink()
    sink.cancelled.update(cancel)
    engine = _generator(model, tok, sink, stream_interval=stream_interval)
    for handle, prompt, params, stream in requests:
        engine.submit(engine.new_sequence(handle, tok.encode(prompt), params, stream))
    engine.start()
    sink.wait_final([r[0] for r in requests], timeout=120)
    engine.stop()
    return sink


def _joined(responses):
    text = "".join(o["text_output"][0].decode() for o, _, _ in responses)
    ids = [i for o, _, _ in responses for i in o["output_ids"].tolist()]
    return text, ids, responses[-1][0]["finish_reason"][0].decode()


def test_generator_streams_the_same_completion_it_returns_whole(smollm2):
    model, tok = smollm2
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,", "Le chat"]
    reqs = [(f"s{i}", p, SamplingParams(max_tokens=12), True) for i, p in enumerate(prompts)]
    reqs += [(f"n{i}", p, SamplingParams(max_tokens=12), False) for i, p in enumerate(prompts)]
    sink = _run_generation(model, tok, reqs)
    for i in range(len(prompts)):
        s_text, s_ids, s_finish = _joined(sink.responses[f"s{i}"])
        (whole, err, final), = sink.responses[f"n{i}"]
        assert err is None and final
        assert s_text == whole["text_output"][0].decode()
        assert s_ids == whole["output_ids"].tolist()
        assert s_finish == whole["finish_reason"][0].decode() in ("stop", "length")
        assert len(s_ids) <= 12 and s_text == tok.decode(s_ids)


def test_generator_stop_string_and_cancellation(smollm2):
    model, tok = smollm2
    # Greedy continuation of this prompt contains " Paris"; stopping at "Paris" cuts before it.
    reqs = [
        ("stop", "The capital of France is", SamplingParams(max_tokens=16, stop=["Paris"]), True),
        ("cancel", "Write a long story about a dragon.", SamplingParams(max_tokens=500, ignore_eos=True), True),
    ]
    sink = _run_generation(model, tok, reqs, cancel={"cancel"})
    text, ids, finish = _joined(sink.responses["stop"])
    assert finish == "stop" and "Paris" not in text
    assert sink.responses["cancel"][-1][0]["finish_reason"][0].decode() == "cancelled"
    assert len(sink.responses["cancel"]) <= 3  # dropped at its first check (one per round here)


def test_graph_bucketing_pads_without_changing_results(minilm):
    """The CUDA-graph path's padding (static buckets, a padding sequence, empty sequences,
    padding positions) checked eagerly on the CPU; on the GPU the same buffers are replayed."""
    from tritonformer.backend.cuda_graphs import EncoderGraphs

    model, tok = minilm
    graphs = EncoderGraphs(model, token_buckets=(16, 64, 1024), sequence_buckets=(2, 4, 8), capture=False)
    for texts in (["one short text"], ["a", "bb cc", "ddd eee fff " * 20], ["x " * 500]):
        seqs = tok.encode_batch(texts)
        lengths = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s])
        cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
        torch.testing.assert_close(graphs.forward(ids, lengths), model.forward(ids, cu), atol=1e-4, rtol=1e-4)
    assert graphs.replays == 3 and graphs.bucket(1025, 1) is None and graphs.bucket(10, 8) is None



def test_default_batch_limits_fit_a_graph_bucket():
    """Every batch the encoders' default limits allow replays a CUDA graph: the largest one (the
    token limit in the sequence limit's texts, plus the padding sequence) has a bucket, so no batch
    under load falls back to eager launches from Python. The limits are the served defaults (the
    model repository's encoder configs) and the engine spec's."""
    import re
    from pathlib import Path

    from tritonformer.backend.cuda_graphs import EncoderGraphs
    from tritonformer.backend.encoder.build import EncoderSpec

    fields = EncoderSpec.__dataclass_fields__
    tokens, texts = fields["max_batch_tokens"].default, fields["max_batch_sequences"].default
    repository = Path(__file__).resolve().parents[1] / "model_repository"
    for model in ("embedder", "reranker", "classifier"):
        config = (repository / model / "config.pbtxt").read_text()
        served = [int(re.search(rf'key: "{key}" value: {{ string_value: "(\d+)" }}', config).group(1))
                  for key in ("max_batch_tokens", "max_batch_sequences")]
        assert served == [tokens, texts], model
    graphs = EncoderGraphs(model=None, capture=False)
    assert graphs.bucket(tokens, texts) == (tokens, 2 * texts)  # 8192 tokens; 256 texts and the padding one
    assert graphs.bucket(tokens + 1, 1) is None  # past the limit: eager

class RecordingStats:
    def __init__(self):
        self.batches = []

    def batch_done(self, **kw):
        self.batches.append(kw)


def test_embedder_queue_discipline_cache_timeout_cancel(minilm):
    model, tok = minilm
    sink, stats = FakeSink(), RecordingStats()
    engine = EmbedderEngine(model, sink, FifoBatchPolicy(), cache_entries=8, cancel_check_after_s=0.0, stats=stats)
    ids = tok.encode_batch(["repeat me", "something else"])
    now = time.monotonic()
    engine.submit(EmbedRequest("first", [ids[0]]))
    engine.submit(EmbedRequest("expired", [ids[1]], deadline=now - 1.0))
    engine.submit(EmbedRequest("gone", [ids[1]]))
    sink.cancelled.add("gone")
    engine.start()
    sink.wait_final(["first", "expired", "gone"])
    engine.submit(EmbedRequest("again", [ids[0], ids[0]]))  # both from the cache
    sink.wait_final(["again"])
    engine.stop()
    assert "timed out" in str(sink.responses["expired"][0][1])
    assert "cancelled" in str(sink.responses["gone"][0][1])
    first = sink.responses["first"][0][0]["embedding"]
    again = sink.responses["again"][0][0]["embedding"]
    np.testing.assert_array_equal(again, np.concatenate([first, first]))
    assert engine.cache.hits == 2
    assert stats.batches[-1]["sequences"] == 0 and stats.batches[-1]["cache_hits"] == 2  # nothing computed
    assert stats.batches[0]["sequences"] == 1 and stats.batches[0]["tokens"] == len(ids[0])


def test_embedder_with_dp_policy_answers_everything(minilm):
    from tritonformer.scheduler.cost_model import GridCostModel
    from tritonformer.scheduler.dp_batcher import DpBatchPolicy, TriggerPolicy

    model, tok = minilm
    cost = GridCostModel.measure(lambda n, length: 0.001 + 1e-6 * n * length, {}, seqs=(1, 64), lengths=(8, 512))
    sink = FakeSink()
    policy = DpBatchPolicy(cost, max_sequences=8, max_tokens=2048, trigger=TriggerPolicy(mode="lazy", lazy_timeout_s=0.01))
    engine = EmbedderEngine(model, sink, policy)
    engine.start()
    texts = [("word " * (1 + (i * 37) % 120)).strip() for i in range(30)]
    for i, t in enumerate(texts):
        engine.submit(EmbedRequest(f"r{i}", tok.encode_batch([t])))
    got = sink.wait_final([f"r{i}" for i in range(30)])
    engine.stop()
    for i, t in enumerate(texts):
        (outputs, error, final), = got[f"r{i}"]
        np.testing.assert_allclose(outputs["embedding"], engine.embed(tok.encode_batch([t])), atol=1e-5)
    assert cost.observations > 0


def test_stream_interval_sends_fewer_larger_pieces(smollm2):
    model, tok = smollm2
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    sink = _run_generation(model, tok, [("s", "Once upon a time", params, True), ("n", "Once upon a time", params, False)],
                           stream_interval=4)
    pieces = sink.responses["s"]
    assert all(len(o["output_ids"]) >= 4 for o, _, _ in pieces[:-1])
    text, ids, finish = _joined(pieces)
    (whole, _, _), = sink.responses["n"]
    assert ids == whole["output_ids"].tolist() and text == whole["text_output"][0].decode() and finish == "length"


def test_a_failing_iteration_answers_its_sequences_once_and_the_engine_goes_on(smollm2):
    model, tok = smollm2

    Flaky = fails_first_run()
    sink = FakeSink()
    engine = _generator(model, tok, sink, runner_cls=Flaky)
    engine.submit(engine.new_sequence("doomed", tok.encode("Hello"), SamplingParams(max_tokens=3), True))
    engine.start()
    sink.wait_final(["doomed"])
    engine.submit(engine.new_sequence("fine", tok.encode("Hello"), SamplingParams(max_tokens=3), False))
    sink.wait_final(["fine"])
    engine.stop()
    (outputs, error, final), = sink.responses["doomed"]
    assert "simulated failure" in str(error) and final
    (outputs, error, final), = sink.responses["fine"]
    assert error is None and len(outputs["output_ids"]) == 3
    assert not engine.scheduler.has_work()
    assert engine.scheduler.blocks.num_used == 0  # the failed sequence's blocks came back


def test_many_streams_get_larger_pieces_after_the_first_token(smollm2):
    """Under a small response budget, pieces after the first grow (fewer responses, each an
    IPC call in Triton), and the joined stream still equals the whole completion."""
    model, tok = smollm2
    sink = FakeSink()
    # 8 streams, 4 responses/s in all: each stream at most one response per 2 s (an iteration
    # here takes ~0.1-0.3 s), so a stream's 13 tokens cannot leave one per response.
    engine = _generator(model, tok, sink, max_running=8, budget=512, max_stream_responses_per_s=4)
    params = SamplingParams(max_tokens=13, ignore_eos=True)
    handles = [f"s{i}" for i in range(7)]
    for h in handles:
        engine.submit(engine.new_sequence(h, tok.encode(f"Count with me: {h}"), params, True))
    engine.submit(engine.new_sequence("whole", tok.encode("Count with me: s0"), params, False))
    engine.start()
    sink.wait_final(handles + ["whole"])
    engine.stop()
    pieces = sink.responses["s0"]
    sizes = [len(o["output_ids"]) for o, _, _ in pieces]
    assert sizes[0] == 1 and len(pieces) < 13  # the first token at once, then coalesced
    text, ids, _ = _joined(pieces)
    (whole, _, _), = sink.responses["whole"]
    assert ids == whole["output_ids"].tolist() and text == whole["text_output"][0].decode()


def test_cancellation_checks_are_budgeted_round_robin(smollm2):
    """With more sequences than one round's quota, each round asks about a different slice (every
    ask is an IPC round trip in Triton), and a cancelled one is still found and answered."""
    from tritonformer.backend.decoder import engine as gen

    model, tok = smollm2
    sink = FakeSink()
    asked = []
    real_is_cancelled = sink.is_cancelled
    sink.is_cancelled = lambda handle: asked.append(handle) or real_is_cancelled(handle)
    engine = _generator(model, tok, sink, max_running=8, budget=512)
    engine.cancel_check_interval_s = 0.0
    old, gen.CANCEL_CHECKS_PER_S = gen.CANCEL_CHECKS_PER_S, 2000  # quota 2 per round (0.001 s floor)
    try:
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        handles = [f"r{i}" for i in range(6)]
        sink.cancelled.add("r5")
        for h in handles:
            engine.submit(engine.new_sequence(h, tok.encode(f"Tell me about {h}"), params, False))
        engine.start()
        sink.wait_final(handles)
        engine.stop()
    finally:
        gen.CANCEL_CHECKS_PER_S = old
    assert sink.responses["r5"][-1][0]["finish_reason"][0].decode() == "cancelled"
    assert {h for h in asked} >= set(handles[:5])  # every sequence got asked, in turns
    assert all(r[-1][0]["finish_reason"][0].decode() == "length" for h, r in sink.responses.items() if h != "r5")


def test_the_next_iteration_launches_before_the_last_ones_tokens_are_read(smollm2):
    """The host runs one iteration ahead: run(i+1) is called before the tokens of i are waited
    for, and a stop token found late still ends the output exactly at it (the token computed
    after it in the meantime is dropped) with every block returned."""
    model, tok = smollm2
    prompt = tok.encode("The capital of France is")
    events = []

    class Recording(DecoderRunner):
        def run(self, entries):
            events.append("run")
            return super().run(entries)

        def sample(self, forward, sampler, params, keys):
            tokens, n = super().sample(forward, sampler, params, keys), sum(e == "run" for e in events)

            class Logged:
                def wait_steps(self):
                    events.append(f"wait{n}")
                    return tokens.wait_steps()

            return Logged()

    sink = FakeSink()
    engine = _generator(model, tok, sink, runner_cls=Recording)
    engine.submit(engine.new_sequence("free", prompt, SamplingParams(max_tokens=8, ignore_eos=True), False))
    engine.start()
    sink.wait_final(["free"])
    (free, _, _), = sink.responses["free"]
    greedy = free["output_ids"].tolist()
    assert len(greedy) == 8
    assert events[:4] == ["run", "run", "wait1", "run"]  # iteration 2 launched before 1 was read

    stop_at = greedy[4]
    expected = greedy[: greedy.index(stop_at) + 1]
    engine.submit(engine.new_sequence("stop", prompt, SamplingParams(max_tokens=8, stop_token_ids=[stop_at]), True))
    sink.wait_final(["stop"])
    engine.stop()
    _, ids, finish = _joined(sink.responses["stop"])
    assert finish == "stop" and ids == expected
    assert not engine.has_work() and engine.scheduler.blocks.num_used == 0


def test_preemption_with_tokens_in_flight_gives_hf_greedy_outputs():
    """A KV pool too small for every sequence at once: sequences are preempted (their KV freed,
    recomputed later) while their latest token is still on its way from the previous iteration.
    Every output still equals Hugging Face's greedy generation for that prompt alone."""
    import transformers

    from tritonformer.backend.checkpoints.weights import strip_prefixes_of
    from tritonformer.client.engine_drive import CountingSink, IdsOnly
    from tritonformer.client.hf_reference import generate_greedy, left_pad

    cfg = transformers.GPT2Config(vocab_size=500, n_embd=64, n_layer=2, n_head=2, n_positions=64)
    torch.manual_seed(4)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    model = load_decoder(cfg.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32)
    block, blocks = 4, 24  # 96 tokens of KV for 5 sequences of up to 16 + 40 tokens
    scheduler = IterationScheduler(BlockManager(blocks, block), 5, 64, max_seq_len=cfg.n_positions)
    runner = DecoderRunner(model, model.new_kv_cache(blocks, block), 5)
    engine = GeneratorEngine(runner, IdsOnly(), CountingSink(), scheduler, cancel_check_interval_s=3600)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (16, 3, 9, 12, 5)]
    seqs = [engine.new_sequence(i, p, SamplingParams(max_tokens=40, ignore_eos=True), False)
            for i, p in enumerate(prompts)]
    engine.admit(seqs)
    while engine.has_work():
        engine.step()
    assert scheduler.num_preemptions > 0 and engine.sink.finished == len(prompts)
    assert scheduler.blocks.num_used == 0
    for seq, prompt in zip(seqs, prompts):
        ids, mask = left_pad([prompt], "cpu")
        assert seq.output_ids == generate_greedy(hf, ids, mask, 40)[0, len(prompt):].tolist()


def test_starting_an_engine_freezes_what_start_up_created(smollm2):
    """Objects from loading and warm-up are out of the collector's reach once the engine runs
    (a full collection walking them stalled every stream)."""
    import gc

    model, tok = smollm2
    gc.unfreeze()
    engine = _generator(model, tok, FakeSink())
    assert gc.get_freeze_count() == 0
    engine.start()
    try:
        assert gc.get_freeze_count() > 10_000  # torch, the model and the tokenizer among them
    finally:
        engine.stop()


def test_no_cancellation_poll_after_an_n_request_failed(smollm2):
    """A request of n samples whose first iteration fails gets one error, its FINAL; its other
    samples, still waiting, are dropped without asking Triton about the ended request (Triton
    frees a request once its final response is sent: a poll then reads freed memory)."""
    model, tok = smollm2

    Flaky = fails_first_run()
    class StrictSink(FakeSink):
        polled_after_final = []

        def is_cancelled(self, handle):
            got = self.responses.get(handle)
            if got and got[-1][2]:
                self.polled_after_final.append(handle)
            return super().is_cancelled(handle)

    sink = StrictSink()
    engine = _generator(model, tok, sink, runner_cls=Flaky)
    prompt = tok.encode("The samples of one request share its prompt's full blocks, so they wait for its prefill. " * 2)
    assert len(prompt) > 2 * 16  # (the forks wait aside for the leader's first full blocks)
    engine.submit(engine.new_sequence("doomed", prompt, SamplingParams(max_tokens=8, n=3, temperature=1.0, seed=1),
                                      True))
    engine.start()
    sink.wait_final(["doomed"])
    engine.submit(engine.new_sequence("fine", tok.encode("Hello"), SamplingParams(max_tokens=3), False))
    sink.wait_final(["fine"])
    engine.stop()
    (outputs, error, final), = sink.responses["doomed"]
    assert "simulated failure" in str(error) and final
    assert sink.polled_after_final == []
    assert not engine.scheduler.has_work() and engine.scheduler.blocks.num_used == 0
