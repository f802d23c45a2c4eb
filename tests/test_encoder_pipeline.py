"""The encoder engine keeps one batch in flight: it launches the next batch before it reads the
rows of the one before (on a GPU the host then answers requests while the GPU runs), and no
request is left behind by it: a batch answered from the cache goes at once, a batch in flight
is answered at shutdown, and a batching policy that wants to wait still waits."""
from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch

from tritonformer.backend.encoder.engine import EmbedRequest, EncoderEngine, PendingRows
from tritonformer.backend.engine_loop import ShuttingDown
from tritonformer.scheduler.fifo import FifoBatchPolicy

WIDTH = 3


class Sink:
    def __init__(self):
        self.answers: dict = {}

    def send(self, handle, outputs, error, final):
        assert final and handle not in self.answers, handle
        self.answers[handle] = error if error is not None else outputs["embedding"].copy()

    def is_cancelled(self, handle):
        return False


class Model:
    device = torch.device("cpu")


class Recorded(PendingRows):
    def __init__(self, rows, events, n):
        super().__init__(rows, time.perf_counter())
        self.events, self.n = events, n

    def wait(self):
        self.events.append(("wait", self.n))
        return super().wait()


class Engine(EncoderEngine):
    """Rows that say which sequence they are for; launches and waits recorded in order."""

    def __init__(self, policy, cache_entries=0):
        super().__init__(Model(), Sink(), policy, cuda_graphs=False, cache_entries=cache_entries)
        self.events: list = []

    def launch(self, sequences, token_types=None):
        n = sum(1 for e in self.events if e[0] == "launch")
        self.events.append(("launch", n))
        rows = torch.tensor([[s[0], len(s), 0.5] for s in sequences], dtype=torch.float32)
        return Recorded(rows, self.events, n)


def _queue(engine, count):
    engine.admit([EmbedRequest(i, [[i + 1] * (i + 2)]) for i in range(count)])


def test_the_next_batch_launches_before_the_last_ones_rows_are_read():
    engine = Engine(FifoBatchPolicy(max_sequences=2))
    _queue(engine, 5)
    while engine.has_work():
        engine.step()
    assert engine.events == [("launch", 0), ("launch", 1), ("wait", 0), ("launch", 2), ("wait", 1), ("wait", 2)]
    assert sorted(engine.sink.answers) == list(range(5))
    for i, rows in engine.sink.answers.items():
        np.testing.assert_array_equal(rows, [[i + 1, i + 2, 0.5]])
    assert engine.num_queued() == 0


def test_a_batch_from_the_cache_is_answered_in_its_own_step():
    engine = Engine(FifoBatchPolicy(max_sequences=8), cache_entries=16)
    _queue(engine, 3)
    while engine.has_work():
        engine.step()
    engine.admit([EmbedRequest("again", [[2, 2, 2]])])  # request 1's sequence
    engine.step()
    assert not engine.has_work() and engine.events == [("launch", 0), ("wait", 0)]
    np.testing.assert_array_equal(engine.sink.answers["again"], [[2, 3, 0.5]])


def test_a_mix_of_cached_and_computed_rows_keeps_each_requests_order():
    engine = Engine(FifoBatchPolicy(max_sequences=8), cache_entries=16)
    engine.admit([EmbedRequest("first", [[7, 7], [9]])])
    while engine.has_work():
        engine.step()
    engine.admit([EmbedRequest("mixed", [[4, 4, 4], [9], [7, 7]])])
    while engine.has_work():
        engine.step()
    np.testing.assert_array_equal(engine.sink.answers["mixed"], [[4, 3, 0.5], [9, 1, 0.5], [7, 2, 0.5]])


class Waiting(FifoBatchPolicy):
    """Ready only once `go` is set (a lazy trigger waiting for more requests)."""

    go = False

    def ready(self, queue: deque, now: float) -> bool:
        return bool(queue) and self.go


def test_a_batch_in_flight_does_not_make_a_waiting_policy_launch():
    policy = Waiting(max_sequences=1)
    engine = Engine(policy)
    _queue(engine, 2)
    engine.step()  # nothing in flight: launches request 0 as before
    assert engine.ready()  # the batch in flight must be finished without sleeping
    engine.step()  # finishes it; the policy is not ready for request 1
    assert engine.events == [("launch", 0), ("wait", 0)] and 0 in engine.sink.answers
    assert not engine.ready() and engine.has_work()
    policy.go = True
    engine.step()
    engine.step()
    assert sorted(engine.sink.answers) == [0, 1]


def test_shutdown_answers_the_batch_in_flight_with_its_rows_and_the_queue_with_an_error():
    engine = Engine(FifoBatchPolicy(max_sequences=1))
    _queue(engine, 3)
    engine.step()
    engine.abort_all(ShuttingDown("stopping"))
    np.testing.assert_array_equal(engine.sink.answers[0], [[1, 2, 0.5]])
    assert all(isinstance(engine.sink.answers[i], ShuttingDown) for i in (1, 2))
    assert not engine.has_work() and engine.num_queued() == 0
