"""Pure-Python scheduling policies: FIFO encoder batches and the iteration-level scheduler."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonformer.scheduler.fifo import FifoBatchPolicy
from tritonformer.scheduler.iteration import IterationScheduler


@dataclass(eq=False)
class Req:
    lengths: list[int]


@given(
    requests=st.lists(st.lists(st.integers(1, 600), min_size=1, max_size=5), min_size=1, max_size=40),
    max_sequences=st.integers(1, 16),
    max_tokens=st.integers(1, 2000),
)
@settings(max_examples=200, deadline=None)
def test_fifo_batches_keep_order_and_caps(requests, max_sequences, max_tokens):
    policy = FifoBatchPolicy(max_sequences, max_tokens)
    queue = deque(Req(r) for r in requests)
    original = list(queue)
    seen = []
    while queue:
        batch = policy.take(queue)
        assert batch, "a non-empty queue always yields a batch"
        seqs = sum(len(r.lengths) for r in batch)
        tokens = sum(sum(r.lengths) for r in batch)
        # Caps hold, except for a single request that is too big on its own.
        assert len(batch) == 1 or (seqs <= max_sequences and tokens <= max_tokens)
        seen.extend(batch)
    assert seen == original  # FIFO, nothing lost, nothing twice


def test_fifo_rejects_bad_caps():
    with pytest.raises(ValueError):
        FifoBatchPolicy(0, 10)


@dataclass(eq=False)
class Seq:
    num_prompt_tokens: int
    remaining: int  # decode steps until it finishes


@given(
    seqs=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 20)), min_size=1, max_size=30),
    max_running=st.integers(1, 8),
    budget=st.integers(1, 512),
)
@settings(max_examples=150, deadline=None)
def test_iteration_scheduler_fcfs_caps_and_completion(seqs, max_running, budget):
    sched = IterationScheduler(max_running, budget)
    items = [Seq(p, d) for p, d in seqs]
    for s in items:
        sched.add(s)
    join_order, finished = [], []
    for _ in range(10_000):
        if not sched.has_work():
            break
        it = sched.schedule()
        assert it, "work pending always schedules something"
        assert len(sched.running) <= max_running
        # Token budget holds unless one prompt alone exceeds it (it then runs without others).
        assert it.num_tokens <= budget or (len(it.prefill) == 1 and not it.decode)
        join_order.extend(it.prefill)
        for s in it.decode:
            s.remaining -= 1
            if s.remaining == 0:
                sched.finish(s)
                finished.append(s)
    assert join_order == items  # first come, first served
    assert sorted(map(id, finished)) == sorted(map(id, items))  # every sequence finished


def test_finish_removes_waiting_sequence():
    sched = IterationScheduler(1, 100)
    a, b = Seq(5, 1), Seq(5, 1)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    sched.finish(b)  # cancelled while waiting
    assert list(sched.waiting) == [] and sched.running == [a]
