"""FIFO encoder batches (the iteration-level scheduler is tested in test_iteration_scheduler.py)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonformer.scheduler.fifo import FifoBatchPolicy


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


@given(
    requests=st.lists(st.lists(st.integers(1, 600), min_size=1, max_size=4), min_size=1, max_size=50),
    window=st.integers(1, 20),
    max_sequences=st.integers(1, 16),
    max_tokens=st.integers(1, 3000),
)
@settings(max_examples=200, deadline=None)
def test_sort_window_takes_the_oldest_with_similar_lengths_within_caps(requests, window, max_sequences, max_tokens):
    from tritonformer.scheduler.sort_window import SortWindowPolicy

    policy = SortWindowPolicy(window, max_sequences, max_tokens)
    queue = deque(Req(r) for r in requests)
    original = list(queue)
    seen = []
    while queue:
        oldest, head = queue[0], list(queue)[:window]
        batch = policy.take(queue)
        assert batch and batch[0] is oldest  # never passes over the oldest request
        assert all(any(item is h for h in head) for item in batch)  # only from the window
        seqs = sum(len(r.lengths) for r in batch)
        tokens = sum(sum(r.lengths) for r in batch)
        assert len(batch) == 1 or (seqs <= max_sequences and tokens <= max_tokens)
        seen.extend(batch)
    assert sorted(map(id, seen)) == sorted(map(id, original))  # nothing lost, nothing twice
