"""The request traces and length distributions (client/traces.py): reproducible, within their
ranges, free of special tokens."""
from __future__ import annotations

import numpy as np

from tritonformer.client.traces import fixed_trace, lengths_for, orca_trace

VOCAB = 1000


def test_orca_trace_reproduces_issue_numbers():
    trace = orca_trace(256)
    assert len(trace) == 256
    assert sum(r.max_new_tokens for r in trace) == 17193
    assert all(32 <= len(r.prompt_ids) <= 512 and 1 <= r.max_new_tokens <= 128 for r in trace)
    assert all(0 <= t < 50256 for r in trace for t in r.prompt_ids)  # no <|endoftext|>
    again = orca_trace(256)
    assert [r.prompt_ids for r in again[:3]] == [r.prompt_ids for r in trace[:3]]


def test_fixed_trace():
    trace = fixed_trace(16, 5, 3, vocab_size=VOCAB)
    assert [(len(r.prompt_ids), r.max_new_tokens) for r in trace] == [(16, 5)] * 3
    assert all(0 <= t < VOCAB for r in trace for t in r.prompt_ids)


def test_lengths_follow_their_distributions():
    rng = np.random.default_rng(0)
    assert (lengths_for("constant", 5, rng) == 128).all()
    u = lengths_for("u5-500", 2000, rng)
    assert u.min() >= 5 and u.max() <= 500
    mixed = lengths_for("mixed", 4000, rng)
    assert 0.2 < (mixed >= 128).mean() < 0.4 and np.median(mixed) < 128
