"""The request traces and length distributions (client/traces.py): reproducible, within their
ranges, free of special tokens."""
from __future__ import annotations

import numpy as np

from tritonformer.client.traces import fixed_trace, lengths_for, orca_trace, shifted_prompts, warm_up_copy

VOCAB = 1000


def test_orca_trace_reproduces_issue_numbers():
    trace = orca_trace(256)
    assert len(trace) == 256
    assert sum(r.max_new_tokens for r in trace) == 17193
    assert all(32 <= len(r.prompt_ids) <= 512 and 1 <= r.max_new_tokens <= 128 for r in trace)
    assert all(0 <= t < 50256 for r in trace for t in r.prompt_ids)  # no <|endoftext|>
    again = orca_trace(256)
    assert [r.prompt_ids for r in again[:3]] == [r.prompt_ids for r in trace[:3]]


def blocks(trace, size=16):
    """Every full 16-token block of every prompt, keyed by all the tokens up to its end (as the
    prefix cache keys them)."""
    return {tuple(r.prompt_ids[: end]) for r in trace for end in range(size, len(r.prompt_ids) + 1, size)}


def test_a_warm_up_copy_or_a_shifted_trace_has_the_same_work_and_no_block_of_the_trace():
    trace = orca_trace(64, vocab_size=VOCAB)
    warm, moved = warm_up_copy(trace, 8), shifted_prompts(trace, 1, VOCAB)
    assert [(len(r.prompt_ids), r.max_new_tokens) for r in warm] == [(len(r.prompt_ids), r.max_new_tokens)
                                                                      for r in trace[:8]]
    assert [(len(r.prompt_ids), r.max_new_tokens) for r in moved] == [(len(r.prompt_ids), r.max_new_tokens)
                                                                       for r in trace]
    assert not blocks(warm) & blocks(trace) and not blocks(moved) & blocks(trace)
    assert all(0 <= t < VOCAB for r in moved for t in r.prompt_ids)
    assert shifted_prompts(trace, 0, VOCAB) == trace and len(warm_up_copy(trace)) == 64


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
