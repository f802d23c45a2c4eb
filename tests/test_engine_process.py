"""The generator's engine in a process of its own (backend/engine_process/), on the CPU with a tiny
random Llama, without tritonserver: the stub's side runs here with fake Triton senders.

Tokens equal the in-process engine's; cancellations and overload come back as they do in
process; a second stub attaches to the same engine; an engine process that dies or freezes has
every pending request answered with an error within seconds; a stub that goes away (closed, or
killed) takes the engine process with it."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from tritonformer.backend.decoder.build import EngineOptions, ModelSource, build_engine, load_model
from tritonformer.backend.decoder.outputs import ResponseOptions
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.engine_loop import EngineFailed, Overloaded
from tritonformer.backend.engine_process.client import EngineClient
from tritonformer.backend.engine_process.protocol import GeneratorSpec
from tritonformer.backend.engine_process.rendezvous import Rendezvous
from tritonformer.backend.spawn import SILENCE_S, spawned_by
from tritonformer.backend.tokenization import TextTokenizer

from helpers import exit_code

VOCAB = 320
OPTIONS = EngineOptions(max_running_sequences=8, max_tokens_per_iteration=64, kv_cache_tokens="2048",
                        kv_block_size=8, cuda_graphs=False, max_queue_requests=16, cancel_check_interval_s=0.02)


def make_checkpoint(folder, hidden: int = 128, heads: int = 8):
    """A tiny random Llama saved as Hugging Face does, with a word-level tokenizer whose words
    are "t1" .. "t319" (so texts and ids map one to one). 8 heads, 2 KV heads: it splits over two ranks."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from tritonformer.client.model_shapes import shrunk

    cfg = shrunk("llama-3.1-8b", layers=2, hidden=hidden, heads=heads, vocab=VOCAB)
    torch.manual_seed(11)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg),
                                                          torch_dtype=torch.float32).eval()
    model.save_pretrained(folder, safe_serialization=True)
    vocab = {"[UNK]": 0, **{f"t{i}": i for i in range(1, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({}))
    return folder


class Sender:
    """A Triton response sender's stand-in: what was sent to it, and whether its client cancelled."""

    def __init__(self, name):
        self.name = name
        self.responses: list[tuple] = []  # (outputs, error, final)
        self.cancelled = False
        self.done = threading.Event()
        self.final_at: float | None = None


class Sink:
    """TritonSink's stand-in on the stub's side (records instead of sending to Triton)."""

    def send(self, handle, outputs, error, final):
        handle.responses.append((outputs, error, final))
        if final:
            assert not handle.done.is_set(), f"{handle.name}: a second final response"
            handle.final_at = time.monotonic()
            handle.done.set()

    def is_cancelled(self, handle):
        return handle.cancelled


class Stats:
    def __init__(self):
        self.calls: list[str] = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append(name)


def ids_of(sender) -> dict[int, list[int]]:
    """Output ids per sample index."""
    out: dict[int, list[int]] = {}
    for outputs, error, _ in sender.responses:
        assert error is None, error
        index = int(outputs["index"][0]) if "index" in outputs else 0
        out.setdefault(index, []).extend(outputs["output_ids"].tolist())
    return out


def text_of(sender) -> str:
    return "".join(o["text_output"][0].decode() for o, _, _ in sender.responses if o is not None)


def wait_all(senders, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for s in senders:
        assert s.done.wait(max(0.0, deadline - time.monotonic())), f"{s.name} was not answered"


REQUESTS = [  # (prompt, params, stream)
    ([5, 9, 17, 33, 2, 71], SamplingParams(max_tokens=12, ignore_eos=True), True),
    ([100, 3], SamplingParams(max_tokens=7, ignore_eos=True), False),
    (list(range(20, 61)), SamplingParams(max_tokens=20, ignore_eos=True), True),
    ([7], SamplingParams(max_tokens=9, ignore_eos=True, temperature=0.8, top_p=0.9, seed=5), True),
    ([8, 8, 8], SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.0, seed=3, n=2), True),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("engine_process") / "llama")


def spec(checkpoint, options=OPTIONS, size: int = 1) -> GeneratorSpec:
    return GeneratorSpec(ModelSource(str(checkpoint), "cpu", 0, "float32", size), options)


@pytest.fixture(scope="module")
def engine(checkpoint, tmp_path_factory):
    """One engine process for the module's quick tests: (client, sink, stats, rendezvous)."""
    place = Rendezvous.for_key("test-engine", root=tmp_path_factory.mktemp("rendezvous"))
    sink, stats = Sink(), Stats()
    client = EngineClient.connect(spec(checkpoint), sink, stats, rendezvous=place,
                                  cancel_check_interval_s=OPTIONS.cancel_check_interval_s)
    yield client, sink, stats, place
    client.close()


def in_process(checkpoint) -> list:
    """The same requests through the engine in this process (stepped here, no thread)."""
    model, _ = load_model(ModelSource(str(checkpoint), "cpu", 0, "float32"))
    engine = build_engine(model, TextTokenizer(checkpoint), Sink(), OPTIONS)
    senders = [Sender(i) for i in range(len(REQUESTS))]
    engine.admit([engine.new_sequence(s, p, params, stream, ResponseOptions(num_output_tokens=True))
                  for s, (p, params, stream) in zip(senders, REQUESTS)])
    while engine.has_work():
        engine.step()
    return senders


def test_tokens_and_texts_equal_the_in_process_engine(engine, checkpoint):
    client, sink, stats, _ = engine
    assert client.info.vocab_size == VOCAB and client.info.pid != os.getpid()
    senders = [Sender(i) for i in range(len(REQUESTS))]
    client.submit([(s, p, params, stream, ResponseOptions(num_output_tokens=True))
                   for s, (p, params, stream) in zip(senders, REQUESTS)])
    wait_all(senders, 30)
    expected = in_process(checkpoint)
    for got, want in zip(senders, expected):
        assert ids_of(got) == ids_of(want), got.name
        assert text_of(got) == text_of(want)
        assert got.responses[-1][0]["finish_reason"][0] == b"length"
    assert len(senders[0].responses) > 1 and len(senders[1].responses) == 1  # streamed / whole
    assert sorted(ids_of(senders[4])) == [0, 1]
    deadline = time.monotonic() + 5  # the engine's stats replayed on the stub's metrics
    while "request_done" not in stats.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {"iteration_done", "occupancy", "request_done"} <= set(stats.calls)
    assert client.num_pending() == 0


def test_cancelled_requests_finish_as_cancelled(engine):
    client, *_ = engine
    senders = [Sender(f"long{i}") for i in range(3)]
    client.submit([(s, [4, 5, 6], SamplingParams(max_tokens=200, ignore_eos=True), True, ResponseOptions())
                   for s in senders])
    time.sleep(0.3)
    for s in senders[:2]:
        s.cancelled = True
    wait_all(senders[:2], 5)
    for s in senders[:2]:
        outputs, error, final = s.responses[-1]
        assert error is None and final and outputs["finish_reason"][0] == b"cancelled"
        assert len(ids_of(s)[0]) < 200
    wait_all(senders[2:], 60)
    assert len(ids_of(senders[2])[0]) == 200


def test_overload_is_answered_with_overloaded(engine):
    client, *_ = engine
    senders = [Sender(f"many{i}") for i in range(OPTIONS.max_queue_requests + 4)]
    client.submit([(s, [3, 4], SamplingParams(max_tokens=30, ignore_eos=True), True, ResponseOptions())
                   for s in senders])
    wait_all(senders, 60)
    errors = [s.responses[-1][1] for s in senders]
    refused = [e for e in errors if e is not None]
    assert len(refused) == 4 and all(isinstance(e, Overloaded) for e in refused)


def test_a_second_stub_attaches_to_the_same_engine(engine, checkpoint):
    client, _, _, place = engine
    other_sink = Sink()
    other = EngineClient.connect(spec(checkpoint), other_sink, None, rendezvous=place)
    try:
        assert other.process is None and other.info.pid == client.info.pid  # attached, not started
        a, b = Sender("a"), Sender("b")
        params = SamplingParams(max_tokens=10, ignore_eos=True)
        client.submit([(a, [11, 12, 13], params, True, ResponseOptions())])
        other.submit([(b, [11, 12, 13], params, True, ResponseOptions())])
        wait_all([a, b], 30)
        assert ids_of(a) == ids_of(b) and len(ids_of(a)[0]) == 10
    finally:
        other.close()
    c = Sender("c")  # the engine still serves the first stub
    client.submit([(c, [1, 2], SamplingParams(max_tokens=3, ignore_eos=True), True, ResponseOptions())])
    wait_all([c], 30)


def test_a_stub_whose_message_fails_is_cut_off_and_the_others_are_still_served(engine, checkpoint):
    """One thread reads every stub: a message it cannot handle closes that stub's connection
    (the stub fails loudly), not the reader for the others."""
    client, _, _, place = engine
    other = EngineClient.connect(spec(checkpoint), Sink(), None, rendezvous=place)
    try:
        other.conn.send(("cancel", None))  # not a list of request ids
        deadline = time.monotonic() + 10
        while other.failure is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert other.failure is not None and "closed its connection" in other.failure
    finally:
        other.close()
    c = Sender("c")
    client.submit([(c, [1, 2], SamplingParams(max_tokens=3, ignore_eos=True), True, ResponseOptions())])
    wait_all([c], 30)
    assert len(ids_of(c)[0]) == 3

class TritonLikeSink:
    """Sends from a thread of its own, as TritonSink does, with Triton's rule for a sender: once
    its final response has been sent, tritonserver has freed the request's response factory and
    `is_cancelled` on it reads freed memory (the server dies with SIGSEGV). A poll costs an IPC
    round trip (here 0.3 ms) during which the final must not be sent either."""

    POLL_S = 0.0003

    def __init__(self):
        import queue

        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.violations: list[str] = []
        self.polls = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def send(self, handle, outputs, error, final):
        self.queue.put((handle, outputs, error, final))

    def _run(self):
        while True:
            handle, outputs, error, final = self.queue.get()
            if final:
                if getattr(handle, "polling", False):
                    self.violations.append(f"{handle.name}: final sent during a cancellation poll")
                handle.closed = True
            Sink.send(self, handle, outputs, error, final)

    def is_cancelled(self, handle):
        self.polls += 1
        if getattr(handle, "closed", False):
            self.violations.append(f"{handle.name}: polled after its final was sent")
        handle.polling = True
        time.sleep(self.POLL_S)
        handle.polling = False
        return handle.cancelled


def test_no_cancellation_poll_meets_or_follows_a_final_response(engine, checkpoint):
    """Many short streams finishing while the stub's watcher polls cancellations: a poll of a
    request whose final has left crashed tritonserver under load (engine_process=true, 1,000
    req/s on the H100: 108 of 256 streams cut off)."""
    client, _, _, place = engine
    sink = TritonLikeSink()
    stub = EngineClient.connect(spec(checkpoint), sink, None, rendezvous=place, cancel_check_interval_s=0.002)
    try:
        g = torch.Generator().manual_seed(3)
        deadline = time.monotonic() + 20
        waves = 0
        while time.monotonic() < deadline and waves < 20 and not sink.violations:
            senders = [Sender(f"w{waves}r{i}") for i in range(OPTIONS.max_running_sequences)]
            stub.submit([(s, torch.randint(3, VOCAB, (4,), generator=g).tolist(),
                          SamplingParams(max_tokens=int(torch.randint(1, 6, (1,), generator=g)), ignore_eos=True),
                          True, ResponseOptions()) for s in senders])
            wait_all(senders, 30)
            assert all(s.responses[-1][1] is None for s in senders)
            waves += 1
        assert sink.polls > 0
        assert not sink.violations, sink.violations[:5]
    finally:
        stub.close()


def test_outputs_cross_as_plain_lists_and_come_back_as_the_same_arrays():
    import numpy as np

    from tritonformer.backend.engine_process.protocol import pack_outputs, unpack_outputs

    outputs = {"text_output": np.array(["é ok".encode()], dtype=np.object_), "output_ids": np.array([], np.int32),
               "num_output_tokens": np.array([3], np.uint32), "logprobs": np.array([b"null"], dtype=np.object_)}
    packed = pack_outputs(outputs)
    assert all(type(values) is list for _, values in packed.values())
    back = unpack_outputs(packed)
    for name, array in outputs.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        assert back[name].tolist() == array.tolist()
    assert pack_outputs(None) is None and unpack_outputs(None) is None


def test_large_arrays_cross_gathered_into_one_per_dtype_and_row_shape():
    import pickle

    import numpy as np

    from tritonformer.backend.engine_process.protocol import gather_arrays, pack_outputs, unpack_outputs

    rng = np.random.default_rng(0)
    outputs = [{"rows": rng.random((n, 80), dtype=np.float32)} for n in (1, 3, 2)]
    outputs.append({"rows": rng.random((2, 70)).astype(np.float64), "num": np.array([5], np.uint32)})
    responses = [(i, pack_outputs(o), None, True) for i, o in enumerate(outputs)]
    responses.insert(2, (9, None, RuntimeError("no"), True))
    gathered, arrays = pickle.loads(pickle.dumps(gather_arrays(responses)))
    assert [a.shape for a in arrays] == [(6, 80), (2, 70)]  # one array per dtype and row shape
    back = {rid: unpack_outputs(packed, arrays) for rid, packed, _, _ in gathered}
    assert back[9] is None and [rid for rid, *_ in gathered] == [0, 1, 9, 2, 3]
    for i, o in enumerate(outputs):
        for name, array in o.items():
            assert back[i][name].dtype == array.dtype
            np.testing.assert_array_equal(back[i][name], array)

def _serving_long_requests(client, count: int) -> list[Sender]:
    senders = [Sender(f"held{i}") for i in range(count)]
    client.submit([(s, [4, 5, 6, 7], SamplingParams(max_tokens=220, ignore_eos=True), True, ResponseOptions())
                   for s in senders])
    time.sleep(0.5)
    return senders


def _assert_failed_fast(client, senders, since: float, within: float, error=EngineFailed) -> None:
    wait_all(senders, within + 2)
    for s in senders:
        assert isinstance(s.responses[-1][1], error), s.responses[-1]
        assert s.final_at - since < within, f"{s.name} answered after {s.final_at - since:.1f} s"
    while client.failure is None and time.monotonic() - since < within:
        time.sleep(0.02)
    assert client.failure is not None, f"the failure was not noticed within {within} s"
    with pytest.raises(EngineFailed):
        client.submit([(Sender("late"), [1], SamplingParams(max_tokens=1), True, ResponseOptions())])


def test_a_killed_engine_process_fails_every_pending_request_within_seconds(checkpoint):
    sink = Sink()
    client = EngineClient.connect(spec(checkpoint), sink)
    try:
        senders = _serving_long_requests(client, 12)  # more than run at once: some wait in the queue
        killed = time.monotonic()
        os.kill(client.info.pid, signal.SIGKILL)
        _assert_failed_fast(client, senders, killed, 5.0)
        assert "exited" in client.failure or "closed" in client.failure
    finally:
        client.close()


def test_a_frozen_engine_process_is_noticed_by_its_silent_heartbeat(checkpoint):
    client = EngineClient.connect(spec(checkpoint), Sink())
    try:
        senders = _serving_long_requests(client, 4)
        stopped = time.monotonic()
        os.kill(client.info.pid, signal.SIGSTOP)
        _assert_failed_fast(client, senders, stopped, SILENCE_S + 2.0)
        assert "no heartbeat" in client.failure
        deadline = time.monotonic() + 5.0  # (the client's monitor reaps it: poll, don't race its join)
        while client.process.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.process.exitcode == -signal.SIGKILL  # frozen: the stub that started it killed it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(client.info.pid, signal.SIGKILL)
        client.close(timeout=5)


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a child of this process: reap it (else it stays a zombie, and kill(pid, 0) works)
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def test_closing_the_stub_stops_the_engine_process(checkpoint):
    client = EngineClient.connect(spec(checkpoint), Sink())
    senders = _serving_long_requests(client, 2)
    pid = client.info.pid
    client.close()
    assert _gone(pid, 5.0)
    assert all(isinstance(s.responses[-1][1], Exception) for s in senders)  # answered (ShuttingDown)


def test_a_killed_stub_takes_its_engine_process_with_it(checkpoint, tmp_path):
    """The stub is a process of its own here, killed with SIGKILL (no finalize, no atexit)."""
    script = textwrap.dedent(f"""
        import sys, time
        from tritonformer.backend.decoder.build import EngineOptions, ModelSource
        from tritonformer.backend.engine_process.client import EngineClient
        from tritonformer.backend.engine_process.protocol import GeneratorSpec

        class Sink:
            def send(self, *a): pass
            def is_cancelled(self, h): return False

        options = EngineOptions(kv_cache_tokens="1024", kv_block_size=8, cuda_graphs=False, max_running_sequences=4)
        source = ModelSource({str(checkpoint)!r}, "cpu", 0, "float32")
        client = EngineClient.connect(GeneratorSpec(source, options), Sink())
        print(client.info.pid, flush=True)
        time.sleep(600)
    """)
    stub = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = stub.stdout.readline()
        assert line.strip().isdigit(), line
        pid = int(line)
        os.kill(stub.pid, signal.SIGKILL)
        stub.wait(5)
        assert _gone(pid, 5.0), "the engine process outlived its stub"
    finally:
        if stub.poll() is None:
            stub.kill()


def test_tensor_parallel_ranks_are_the_engine_process_workers(checkpoint):
    """tensor_parallel_size 2: the engine process is rank 0 and starts the worker (gloo here);
    the greedy tokens are the unsplit model's; a dead rank fails the engine, every request is
    answered with an error within seconds, and the engine process leaves."""
    client = EngineClient.connect(spec(checkpoint, size=2), Sink())
    try:
        (worker,) = spawned_by({client.info.pid})
        senders = [Sender(i) for i in range(3)]
        client.submit([(s, p, params, stream, ResponseOptions(num_output_tokens=True))
                       for s, (p, params, stream) in zip(senders, REQUESTS[:3])])  # (the greedy ones)
        wait_all(senders, 60)
        assert [ids_of(s) for s in senders] == [ids_of(s) for s in in_process(checkpoint)[:3]]

        senders = _serving_long_requests(client, 6)
        killed = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        # (a running request fails in its collective: "generation failed"; a queued one: EngineFailed)
        _assert_failed_fast(client, senders, killed, 5.0, error=Exception)
        assert "rank 1" in client.failure, client.failure
        assert exit_code(client.process, 10.0) == 0  # it left by itself
        assert _gone(worker, 1.0)
    finally:
        client.close(timeout=5)


# ---- through a real tritonserver ----------------------------------------------------------------
SERVED = {  # model name: (engine_process, tensor_parallel_size, instances)
    "gen_inproc": ("false", "1", 1),
    "generator": ("true", "1", 2),  # two instances, one engine process (named for `tritonformer health`)
    "gen_tp2": ("true", "2", 1),  # the engine process is rank 0 and starts the worker (gloo)
}


@pytest.fixture(scope="module")
def served(checkpoint, tmp_path_factory):
    from tritonformer.client.config_variants import copy_model
    from helpers import serving

    repo = tmp_path_factory.mktemp("served") / "repository"
    source = os.path.join(os.path.dirname(__file__), "..", "model_repository", "generator")
    for name, (engine_process, size, instances) in SERVED.items():
        copy_model(source, repo / name, {"checkpoint": str(checkpoint), "kv_cache_tokens": "2048",
                                         "engine_process": engine_process, "tensor_parallel_size": size,
                                         "max_running_sequences": "8", "cancel_check_interval_ms": "20"},
                   instances=instances)
    with serving(repo, list(SERVED), timeout=600) as server:
        yield server


def _generate(server, model: str, body: dict) -> dict:
    from helpers import http_post

    status, answer = http_post(server, f"/v2/models/{model}/generate", body)
    assert status == 200, (model, answer)
    return answer


@pytest.mark.server
@pytest.mark.slow
def test_served_engine_process_equals_in_process_streams_and_fails_loudly(served):
    import concurrent.futures

    import numpy as np

    from helpers import engine_processes, grpc_stream
    from tritonformer.client.health import check

    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 21, 40, 7)]
    body = {"stream": False, "max_tokens": 24, "ignore_eos": True}
    expected = [_generate(served, "gen_inproc", {**body, "input_ids": p})["output_ids"] for p in prompts]
    assert all(len(e) == 24 for e in expected)
    # Greedy tokens: the engine process (two instances at once), and split over two ranks inside it.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: _generate(served, "generator", {**body, "input_ids": p})["output_ids"],
                            prompts * 2))
    assert got == expected * 2
    assert [_generate(served, "gen_tp2", {**body, "input_ids": p})["output_ids"] for p in prompts] == expected
    assert len(engine_processes(served, "generator")) == 1, "two instances, one engine process"
    # Text in (tokenized in the stub), streamed over gRPC.
    text = " ".join(f"t{i}" for i in prompts[1])
    whole = _generate(served, "gen_inproc", {**body, "text_input": text})
    results, error = grpc_stream(served, "generator", {
        "text_input": (np.array([text.encode()], dtype=np.object_), "BYTES"),
        "stream": (np.array([True]), "BOOL"),
        "sampling_parameters": (np.array([json.dumps({"max_tokens": 24, "ignore_eos": True}).encode()],
                                         dtype=np.object_), "BYTES"),
    })
    assert error is None, error
    assert len(results) > 1
    assert [i for r in results for i in r.as_numpy("output_ids").tolist()] == whole["output_ids"] == expected[1]
    # The vLLM contract's outputs (echo, counts, log-probabilities) and an invalid request, alike.
    extra = {**body, "text_input": text, "exclude_input_in_output": False, "return_num_output_tokens": True,
             "return_logprobs": True, "logprobs": 2}
    answers = [_generate(served, m, extra) for m in ("gen_inproc", "generator")]
    assert answers[0]["text_output"].startswith(text) and answers[0]["logprobs"]
    assert {k: v for k, v in answers[0].items() if k != "model_name"} == \
        {k: v for k, v in answers[1].items() if k != "model_name"}
    from helpers import http_post

    bad = {**body, "input_ids": [VOCAB + 5]}
    assert [http_post(served, f"/v2/models/{m}/generate", bad) for m in ("gen_inproc", "generator")] \
        == [http_post(served, "/v2/models/gen_inproc/generate", bad)] * 2
    assert check(served.http_url, ["generator"], timeout=30) == []

    # The engine process dies with a request in flight (held still first, so that the request
    # cannot finish before the kill): the request gets an error, health says so within 5 s.
    (engine_pid,) = engine_processes(served, "generator")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        os.kill(engine_pid, signal.SIGSTOP)
        long = pool.submit(http_post, served, "/v2/models/generator/generate",
                           {"input_ids": prompts[0], "stream": False, "max_tokens": 220, "ignore_eos": True})
        time.sleep(0.5)
        killed = time.monotonic()
        os.kill(engine_pid, signal.SIGKILL)
        status, answer = long.result(timeout=10)
    # (Triton's /generate answers a decoupled model's error response with 400, whatever its code)
    assert status != 200 and "engine process failed" in answer["error"], (status, answer)
    problems = check(served.http_url, ["generator"], timeout=10)
    assert problems and "engine process failed" in problems[0], problems
    assert time.monotonic() - killed < 5.0
    # The other models are untouched.
    assert _generate(served, "gen_inproc", {**body, "input_ids": prompts[0]})["output_ids"] == expected[0]
