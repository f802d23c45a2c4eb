"""The encoders' engine in a process of its own (engine_process true): on the CPU with the bundled
all-MiniLM-L6-v2, first without tritonserver (the stub's side runs here with stand-in senders),
then through a real tritonserver, against the same model served on a thread of its stub.

Rows equal the in-process engine's, whole requests and split ones; a client timeout that has
passed is answered as in process; two instances share one engine process; an engine process that
dies has the request in flight answered with an error, and readiness and `tritonformer health`
say so within 5 s. (The reranker and classifier through an engine process are checked against
Hugging Face in test_integration_reranker_classifier.py.)"""
from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tritonformer.backend.encoder.build import EncoderSpec, item_args
from tritonformer.backend.encoder.engine import EmbedRequest, SplitRequest
from tritonformer.backend.engine_loop import RequestTimedOut
from tritonformer.backend.engine_process.client import EngineClient
from tritonformer.backend.tokenization import TextTokenizer

from helpers import exit_code

TEXTS = ["The quick brown fox jumps over the lazy dog.", "short", "Привет, как дела?",
         "A very long sentence about transformers and batching, " * 12, "naïve café 東京 🚀"]


class Sender:
    """A Triton response sender's stand-in."""

    def __init__(self):
        self.responses: list[tuple] = []  # (outputs, error, final)
        self.done = threading.Event()


class Sink:
    def send(self, handle, outputs, error, final):
        assert not handle.done.is_set(), "a second final response"
        handle.responses.append((outputs, error, final))
        if final:
            handle.done.set()

    def is_cancelled(self, handle):
        return False


def spec(checkpoint, **settings) -> EncoderSpec:
    return EncoderSpec("embedder", str(checkpoint), "cpu", "float32", **settings)


def test_rows_equal_the_in_process_engine_and_a_passed_timeout_is_answered(minilm_dir):
    ids = TextTokenizer(minilm_dir).encode_batch(TEXTS)
    engine, _, info = spec(minilm_dir, warm_up=False).build(Sink())
    expected = engine.embed(ids)
    assert info.vocab_size == 30522 and info.max_tokens == 512 and info.labels is None
    assert not info.token_types and info.pid == os.getpid()

    client = EngineClient.connect(spec(minilm_dir, warm_up=False), Sink(), name="embedder")
    try:
        assert client.info.pid != os.getpid() and client.info.max_tokens == 512
        whole, split, late = Sender(), Sender(), Sender()
        client.submit([
            (whole, *item_args(EmbedRequest(None, ids))),
            (split, *item_args(SplitRequest(None, ids[::-1], outputs=None))),
            (late, *item_args(EmbedRequest(None, ids[:1], deadline=time.monotonic() - 1.0))),
        ])
        for sender in (whole, split, late):
            assert sender.done.wait(60)
        ((rows, error, final),) = whole.responses
        assert error is None and final
        np.testing.assert_allclose(rows["rows"], expected, atol=1e-5)
        ((rows, error, _),) = split.responses
        np.testing.assert_allclose(rows["rows"], expected[::-1], atol=1e-5)
        ((rows, error, _),) = late.responses
        assert rows is None and isinstance(error, RequestTimedOut)
    finally:
        client.close(timeout=10)
    assert exit_code(client.process, 10.0) == 0


# ---- through a real tritonserver ----------------------------------------------------------------
SERVED = {"embedder_inproc": ("false", 1), "embedder": ("true", 2)}  # name: (engine_process, instances)
# (the engine process's is named "embedder" for `tritonformer health`'s probe)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tritonformer.client.config_variants import copy_model
    from helpers import serving

    repo = tmp_path_factory.mktemp("encoder_engine_process") / "repository"
    source = Path(__file__).resolve().parents[1] / "model_repository" / "embedder"
    for name, (engine_process, instances) in SERVED.items():
        copy_model(source, repo / name, {"engine_process": engine_process}, instances=instances)
    with serving(repo, list(SERVED), timeout=600) as server:
        yield server


def _embed(server, model: str, texts: list[str]):
    import tritonclient.http as client

    with client.InferenceServerClient(server.http_url) as c:
        inp = client.InferInput("text_input", [len(texts)], "BYTES")
        inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
        return c.infer(model, [inp]).as_numpy("embedding")


@pytest.mark.server
@pytest.mark.slow
def test_served_engine_process_equals_in_process_and_fails_loudly(served):
    import tritonclient.http as client

    from helpers import engine_processes
    from tritonformer.client.health import check

    expected = _embed(served, "embedder_inproc", TEXTS)
    np.testing.assert_allclose(_embed(served, "embedder", TEXTS), expected, atol=1e-5)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # both instances, one at a time and at once
        got = list(pool.map(lambda i: _embed(served, "embedder", [TEXTS[i % len(TEXTS)]]), range(20)))
    for i, rows in enumerate(got):
        np.testing.assert_allclose(rows[0], expected[i % len(TEXTS)], atol=1e-5)
    assert len(engine_processes(served, "embedder")) == 1, "two instances, one engine process"
    assert check(served.http_url, ["embedder"], timeout=30) == []

    # The engine process dies with a request in flight (held still first, so that the request
    # cannot be answered before the kill): the request gets an error, health says so within 5 s.
    (engine_pid,) = engine_processes(served, "embedder")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        os.kill(engine_pid, signal.SIGSTOP)
        pending = pool.submit(_embed, served, "embedder", TEXTS)
        time.sleep(0.5)
        killed = time.monotonic()
        os.kill(engine_pid, signal.SIGKILL)
        with pytest.raises(client.InferenceServerException, match="engine process failed"):
            pending.result(timeout=10)
    problems = check(served.http_url, ["embedder"], timeout=10)
    assert problems and "engine process failed" in problems[0], problems
    assert time.monotonic() - killed < 5.0
    np.testing.assert_allclose(_embed(served, "embedder_inproc", TEXTS), expected, atol=1e-5)  # the other is untouched
