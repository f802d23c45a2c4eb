"""A decode graph's inputs, packed incrementally, equal a fresh packing after every iteration.

The mirror rewrites only rows whose block table changed; these runs change batches the ways
the engine does (sequences grow a block, join, leave, and a preempted sequence's table is
freed and filled again in the same list) and check every buffer against a from-scratch packing.
"""
import random

import numpy as np
import pytest
import torch

from tritonformer.backend.decoder.graph_inputs import DecodeInputs
from tritonformer.backend.decoder.batch import BatchEntry

BLOCK, WIDTH, SCRATCH = 4, 8, 999 * 4


def expected(entries, rows):
    """Every buffer of the bucket, packed from nothing."""
    n = len(entries)
    ids = [e.tokens[0] for e in entries] + [0] * (rows - n)
    pos = [e.start for e in entries] + [0] * (rows - n)
    slots = [e.block_table[e.start // BLOCK] * BLOCK + e.start % BLOCK for e in entries] + [SCRATCH] * (rows - n)
    seqlens = [e.start + 1 for e in entries] + [0] * (rows - n)
    return ids, pos, slots, seqlens


def check(inputs, entries):
    inputs.pack(entries)
    inputs.send()
    ids, pos, slots, seqlens = expected(entries, inputs.rows)
    assert inputs.input_ids.tolist() == ids
    assert inputs.positions.tolist() == pos
    assert inputs.slot_mapping.tolist() == slots
    assert inputs.seqlens.tolist() == seqlens
    for row, e in enumerate(entries):  # padding rows' tables are never read (no keys)
        assert inputs.tables[row, : len(e.block_table)].tolist() == e.block_table


class Seq:
    def __init__(self, free_blocks, start):
        self.start, self.table, self.free = start, [], free_blocks
        self.grow()

    def grow(self):
        while len(self.table) * BLOCK < self.start + 1:
            self.table.append(self.free.pop())

    def entry(self, row):
        return BatchEntry([-1 - row if random.random() < 0.8 else random.randrange(50_000)], self.start, self.table, True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_packing_equals_packing_from_scratch(seed):
    random.seed(seed)
    rows = 8
    free = list(range(200))
    random.shuffle(free)
    inputs = DecodeInputs(rows, WIDTH, BLOCK, SCRATCH, torch.device("cpu"))
    running = [Seq(free, random.randrange(20)) for _ in range(5)]
    for _ in range(60):
        check(inputs, [s.entry(row) for row, s in enumerate(running)])
        for s in running:  # the iteration ran: every sequence is one token longer
            s.start += 1
            s.grow()
        action = random.random()
        if action < 0.15 and len(running) > 1:  # one finishes: later rows shift up
            gone = running.pop(random.randrange(len(running)))
            free.extend(gone.table)
        elif action < 0.3 and len(running) < rows:  # one joins
            running.insert(random.randrange(len(running) + 1), Seq(free, random.randrange(20)))
        elif action < 0.45:  # preempted and recomputed: same list object, freed and filled again
            s = random.choice(running)
            free.extend(s.table)
            random.shuffle(free)
            s.table.clear()
            s.grow()
        running = [s for s in running if s.start < WIDTH * BLOCK - 1] or [Seq(free, 0)]


def test_a_table_refilled_to_the_same_length_is_rewritten():
    """The row cache compares tables by value: a list cleared and refilled in place (as the
    block manager frees a preempted sequence's table) with other blocks of the same count."""
    inputs = DecodeInputs(2, WIDTH, BLOCK, SCRATCH, torch.device("cpu"))
    table = [5, 6]
    check(inputs, [BatchEntry([1], 6, table, True)])
    table.clear()
    table.extend([9, 3])
    check(inputs, [BatchEntry([1], 6, table, True)])
    assert inputs.slot_mapping[0].item() == 3 * BLOCK + 2


def test_too_many_entries_for_the_bucket_is_an_error():
    inputs = DecodeInputs(2, WIDTH, BLOCK, SCRATCH, torch.device("cpu"))
    with pytest.raises(ValueError, match="3 entries for a decode bucket of 2 rows"):
        inputs.pack([BatchEntry([1], 0, [0], True)] * 3)
    assert np.all(inputs.slot_mapping.numpy() == SCRATCH)  # nothing half-written


@pytest.mark.parametrize("seed", [0, 1])
def test_a_round_advanced_on_the_device_equals_packing_each_iteration(seed):
    """A round of several iterations: packed once with each row's steps, then moved on by the
    graph's last op (its reference here) after every iteration. Each iteration's inputs equal a
    packing from scratch of the rows still taking part, each on its own sample (`-1 - row`);
    rows whose steps are done are padding. The next pack (one iteration) starts clean."""
    from tritonformer.kernels import reference

    random.seed(seed)
    rows, free = 8, list(range(200))
    random.shuffle(free)
    inputs = DecodeInputs(rows, WIDTH, BLOCK, SCRATCH, torch.device("cpu"))
    seqs = [Seq(free, random.randrange(30)) for _ in range(6)]
    steps = [random.randint(1, 5) for _ in seqs]
    for s, n in zip(seqs, steps):  # the scheduler grows each table for its steps ahead
        s.start += n - 1
        s.grow()
        s.start -= n - 1
    entries = [s.entry(row) for row, s in enumerate(seqs)]
    check(inputs, [s.entry(row) for row, s in enumerate(seqs)])  # a plain pack before: rows held
    inputs.pack(entries, steps)
    inputs.send()
    for j in range(max(steps)):
        if j:
            reference.advance_decode_inputs(inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.seqlens,
                                            inputs.tables, inputs.steps_left, BLOCK, SCRATCH)
        live = [BatchEntry(e.tokens if j == 0 else [-1 - row], e.start + j, e.block_table, True)
                for row, e in enumerate(entries) if steps[row] > j]
        ids, pos, slots, seqlens = expected(live, rows)
        gone = [row for row in range(len(entries)) if steps[row] <= j]
        for row in gone:  # padding in place, not moved to the end: rows keep their places
            for values, pad in ((ids, 0), (pos, 0), (slots, SCRATCH), (seqlens, 0)):
                values.insert(row, pad)
                values.pop()
        assert inputs.input_ids.tolist() == ids
        assert inputs.positions.tolist() == pos
        assert inputs.slot_mapping.tolist() == slots
        assert inputs.seqlens.tolist() == seqlens
    check(inputs, [s.entry(row) for row, s in enumerate(seqs[:3])])
    assert inputs.steps_left.tolist() == [0] * rows
