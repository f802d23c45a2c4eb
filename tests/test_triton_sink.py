"""TritonSink's sender threads, with a stand-in for Triton's Python-backend module: a request's
responses leave in order from one thread, each request gets one final, and several threads keep
several sends in flight (each real send is a round trip that releases the GIL). Through a real
tritonserver the same sink serves every integration test."""
from __future__ import annotations

import importlib
import sys
import threading
import time
import types

import numpy as np
import pytest


class _Response:
    def __init__(self, output_tensors=None, error=None):
        self.outputs = {t.name: t.value for t in output_tensors or []}
        self.error = error


class _Tensor:
    def __init__(self, name, value):
        self.name, self.value = name, value


@pytest.fixture()
def glue(monkeypatch):
    fake = types.ModuleType("triton_python_backend_utils")
    fake.InferenceResponse = _Response
    fake.Tensor = _Tensor
    fake.TritonError = lambda message, code=0: (message, code)
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.delitem(sys.modules, "tritonformer.backend.triton.glue", raising=False)
    module = importlib.import_module("tritonformer.backend.triton.glue")
    yield module
    sys.modules.pop("tritonformer.backend.triton.glue", None)


class Sender:
    """An InferenceResponseSender that takes SEND_S per send, as the IPC round trip does, and
    counts how many sends are in flight at once across all senders."""

    SEND_S = 0.002
    lock = threading.Lock()
    in_flight = 0
    most_in_flight = 0

    def __init__(self, name):
        self.name = name
        self.received: list[tuple[dict, int]] = []
        self.threads: set[str] = set()

    def send(self, response, flags=0):
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        time.sleep(self.SEND_S)
        with cls.lock:
            cls.in_flight -= 1
        assert not (self.received and self.received[-1][1]), f"{self.name}: a response after the final"
        self.received.append((response.outputs, flags))
        self.threads.add(threading.current_thread().name)


def _stream(glue, threads: int, requests: int = 24, pieces: int = 5):
    Sender.in_flight = Sender.most_in_flight = 0
    sink = glue.TritonSink("test", threads=threads)
    senders = [Sender(f"r{i}") for i in range(requests)]
    for step in range(pieces):
        for s in senders:
            outputs = {"output_ids": np.array([step]), "text_output": np.array([str(step)], dtype=np.object_)}
            sink.send(s, outputs, None, step == pieces - 1)
    sink.close(timeout=30)
    return senders


@pytest.mark.parametrize("threads", [1, 4])
def test_each_stream_arrives_whole_and_in_order_from_one_thread(glue, threads):
    for s in _stream(glue, threads):
        ids = np.concatenate([outputs["output_ids"] for outputs, _ in s.received]).tolist()
        assert ids == [0, 1, 2, 3, 4], s.name  # coalesced or not, in order
        assert [flags for _, flags in s.received][-1] == 1 and sum(f for _, f in s.received) == 1
        assert len(s.threads) == 1


def test_several_threads_keep_several_sends_in_flight(glue):
    _stream(glue, threads=1)
    assert Sender.most_in_flight == 1
    senders = _stream(glue, threads=4)
    assert Sender.most_in_flight > 1
    assert len(set().union(*(s.threads for s in senders))) > 1  # the requests spread over the threads


def test_a_sink_needs_a_thread(glue):
    with pytest.raises(ValueError, match="at least one"):
        glue.TritonSink("test", threads=0)
