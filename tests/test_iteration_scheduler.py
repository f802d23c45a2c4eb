"""Paged KV blocks and the iteration-level scheduler, driven by a fake engine (no model)."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonformer.scheduler.iteration import IterationScheduler, SequenceTooLong
from tritonformer.scheduler.kv_blocks import BlockManager, OutOfBlocks


@dataclass(eq=False)
class FakeSeq:
    arrival: int
    prompt: int
    target: int  # tokens to generate, then it finishes
    generated: int = 0
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    one_step: bool = False  # (a structured output's sequence: no rounds of several iterations)
    host_pending: bool = False

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated

    @property
    def token_limit(self) -> int:
        return self.prompt + self.target


# ---------------------------------------------------------------------------- BlockManager


def test_blocks_for_rounds_up():
    bm = BlockManager(10, 4)
    assert [bm.blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_grow_is_all_or_nothing():
    bm = BlockManager(3, 4)
    a, b = [], []
    bm.grow(a, 5)  # 2 blocks
    assert len(a) == 2 and bm.num_free == 1 and bm.num_used == 2
    assert not bm.can_grow(b, 9)
    with pytest.raises(OutOfBlocks):
        bm.grow(b, 9)  # needs 3, only 1 free: nothing taken
    assert b == [] and bm.num_free == 1
    bm.grow(a, 8)  # already covered: no-op
    assert len(a) == 2
    bm.grow(a, 9)
    assert len(a) == 3 and bm.num_free == 0 and len(set(a)) == 3


def test_free_returns_blocks_and_catches_double_free():
    bm = BlockManager(4, 2)
    a = []
    bm.grow(a, 7)
    copy = list(a)
    bm.free(a)
    assert a == [] and bm.num_free == 4 and bm.num_used == 0
    with pytest.raises(ValueError):
        bm.free(copy)  # freed twice
    with pytest.raises(ValueError):
        bm.free([99])  # never allocated
    b = []
    bm.grow(b, 2)
    with pytest.raises(ValueError):
        bm.free([b[0], b[0]])  # listed twice: nothing freed
    assert bm.num_used == 1


@pytest.mark.parametrize("args", [(0, 4), (4, 0)])
def test_block_manager_rejects_bad_sizes(args):
    with pytest.raises(ValueError):
        BlockManager(*args)


# ---------------------------------------------------------------------------- fake engine


def check_and_run(sched: IterationScheduler, seqs: list[FakeSeq], joined: list, finished: list) -> object:
    """One engine step with every invariant checked: schedule, check, commit, sample, finish."""
    bm = sched.blocks
    before_running = list(sched.running)
    before_waiting = list(sched.waiting)
    it = sched.schedule()
    assert it, "pending work always schedules something"
    entries = it.all()
    assert entries == it.decode + it.prefill
    assert all(e.num_new == 1 for e in it.decode) and all(e.num_new > 1 for e in it.prefill)
    assert sum(e.num_new for e in entries) <= sched.max_tokens_per_iteration
    assert it.num_tokens == sum(e.num_new * e.steps for e in entries)
    # Several iterations in a round only for decodes that sample, when nobody waits; each
    # within its own tokens left and the cap.
    assert it.steps == max(e.steps for e in entries)
    assert all(e.steps == 1 for e in it.prefill)
    if it.steps > 1:
        assert not it.prefill and not it.preempted and not sched.waiting and all(e.samples for e in it.decode)
        assert all(1 <= e.steps <= min(sched.max_decode_steps, e.seq.token_limit - 1 - e.start) for e in it.decode)
    assert len(sched.running) <= sched.max_running
    scheduled = [e.seq for e in entries]
    assert len(set(map(id, scheduled))) == len(scheduled)
    for e in entries:
        assert e.start == e.seq.num_computed and e.seq in sched.running
        assert bm.blocks_for(e.start + e.num_new * e.steps) <= len(e.seq.block_table) \
            <= bm.blocks_for(e.seq.num_tokens + e.steps - 1)
        if not e.samples:  # a partial prompt chunk only when it took all the budget left
            assert it.num_tokens == sched.max_tokens_per_iteration
    # Running sequences all run every iteration (decode never stalls behind a long prompt),
    # unless they were preempted.
    kept = [s for s in before_running if all(s is not p for p in it.preempted)]
    assert all(any(s is t for t in scheduled) for s in kept)
    assert not (it.preempted and len(sched.running) > len(before_running))  # no joins then
    for p in it.preempted:
        assert p.num_computed == 0 and p.block_table == [] and p in sched.waiting
    # FCFS, preempted ones included: running then waiting is always in arrival order.
    order = [s.arrival for s in sched.running + list(sched.waiting)]
    assert order == sorted(order)
    newly = [s for s in sched.running if all(s is not b for b in before_running)]
    assert newly == before_waiting[: len(newly)]  # joiners are the head of the queue, in order
    joined.extend(s for s in newly if all(s is not j for j in joined))
    check_blocks(sched, seqs)

    sched.commit(it)
    for e in entries:
        if e.samples:
            e.seq.generated += e.steps  # one token per iteration of the round
            assert e.seq.generated <= e.seq.target
            if e.seq.generated == e.seq.target:
                sched.finish(e.seq)
                finished.append(e.seq)
    check_blocks(sched, seqs)
    for s in sched.running:  # after commit the blocks cover the cache, never past known tokens
        assert bm.blocks_for(s.num_computed) <= len(s.block_table) <= bm.blocks_for(s.num_tokens)
    return it


def check_blocks(sched: IterationScheduler, seqs: list[FakeSeq]) -> None:
    held = [b for s in seqs for b in s.block_table]
    assert len(held) == len(set(held)) == sched.blocks.num_used  # no block shared, none leaked
    assert all(not s.block_table for s in sched.waiting)


def cancel(sched: IterationScheduler, seq: FakeSeq) -> None:
    used = sched.blocks.num_used
    held = len(seq.block_table)
    sched.finish(seq)
    assert sched.blocks.num_used == used - held and seq.block_table == []  # freed at once
    assert seq not in sched.running and seq not in sched.waiting


workloads = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 60), st.integers(1, 20)),  # arrival step, prompt, output
    min_size=1,
    max_size=20,
)


@given(
    work=workloads,
    block_size=st.integers(1, 8),
    spare_blocks=st.integers(0, 12),  # few spare blocks: preemption is frequent
    max_running=st.integers(1, 6),
    extra_budget=st.integers(0, 64),
    cancel_p=st.sampled_from([0.0, 0.05]),
    max_decode_steps=st.sampled_from([1, 1, 3]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=300, deadline=None)
def test_random_workloads_complete_fcfs_without_leaks(
    work, block_size, spare_blocks, max_running, extra_budget, cancel_p, max_decode_steps, seed
):
    rng = random.Random(seed)
    work = sorted(work, key=lambda w: w[0])
    seqs = [FakeSeq(i, p, t) for i, (_, p, t) in enumerate(work)]
    max_seq_len = max(p + t for _, p, t in work)
    bm = BlockManager(-(-max_seq_len // block_size) + spare_blocks, block_size)
    sched = IterationScheduler(bm, max_running, max_running + extra_budget, max_seq_len, max_decode_steps)
    joined, finished, cancelled = [], [], []
    preempted = 0
    pending = list(zip((w[0] for w in work), seqs))
    for step in range(5_000):
        while pending and pending[0][0] <= step:
            sched.add(pending.pop(0)[1])
        if not sched.has_work():
            if not pending:
                break
            continue
        if rng.random() < cancel_p:
            victim = rng.choice(sched.running + list(sched.waiting))
            cancel(sched, victim)
            cancelled.append(victim)
            if not sched.has_work():
                continue
        preempted += len(check_and_run(sched, seqs, joined, finished).preempted)
    else:
        pytest.fail("the workload did not finish")
    assert bm.num_free == bm.num_blocks and bm.num_used == 0
    assert sorted(s.arrival for s in finished + cancelled) == list(range(len(seqs)))
    assert all(s.generated == s.target for s in finished)
    assert [s.arrival for s in joined] == sorted(s.arrival for s in joined)  # first joins FCFS
    assert sched.num_preemptions == preempted


# ---------------------------------------------------------------------------- targeted cases


def drive(sched: IterationScheduler, seqs: list[FakeSeq], limit: int = 1_000) -> list:
    joined, finished, its = [], [], []
    while sched.has_work():
        its.append(check_and_run(sched, seqs, joined, finished))
        assert len(its) < limit
    assert len(finished) == len(seqs) and sched.blocks.num_free == sched.blocks.num_blocks
    return its


def test_long_prompt_is_chunked_while_others_decode():
    sched = IterationScheduler(BlockManager(64, 4), max_running=4, max_tokens_per_iteration=8)
    short = FakeSeq(0, prompt=3, target=30)
    long = FakeSeq(1, prompt=50, target=2)
    sched.add(short)
    first = sched.schedule()  # short's whole prompt
    assert [(e.seq, e.start, e.num_new) for e in first.prefill] == [(short, 0, 3)]
    sched.add(long)
    chunks = []
    # Each iteration after the first: `short` decodes 1 token, `long` takes the 7 left.
    for it in [first] + [None] * 8:
        it = it or sched.schedule()
        assert it.num_tokens <= 8
        if it is not first:
            assert [(e.seq, e.num_new) for e in it.decode][:1] == [(short, 1)]
        chunks += [(e.start, e.num_new) for e in it.all() if e.seq is long]
        sched.commit(it)
        for e in it.all():
            if e.samples:
                e.seq.generated += 1
    # 7 tokens at a time; the last chunk of one token runs with the decodes.
    assert chunks == [(0, 7), (7, 7), (14, 7), (21, 7), (28, 7), (35, 7), (42, 7), (49, 1)]
    assert long.num_computed == 50 and long.generated == 1


def test_whole_prompts_wait_for_the_budget_instead_of_running_in_chunks():
    """A model whose prompt attends both ways (CPM-Ant): a prompt that does not fit the budget left by the decoders
    waits (nothing behind it skips ahead) and runs whole once it fits; a budget short of the longest sequence is
    refused."""
    with pytest.raises(ValueError, match="prompts run whole"):
        IterationScheduler(BlockManager(64, 4), max_running=4, max_tokens_per_iteration=8, max_seq_len=16,
                           whole_prompts=True)
    sched = IterationScheduler(BlockManager(64, 4), max_running=4, max_tokens_per_iteration=8, max_seq_len=8,
                               whole_prompts=True)
    short, long, later = FakeSeq(0, prompt=3, target=3), FakeSeq(1, prompt=8, target=1), FakeSeq(2, prompt=1, target=1)
    for seq in (short, long, later):
        sched.add(seq)
    runs = []
    while sched.has_work():
        it = sched.schedule()
        runs.append([(e.seq.arrival, e.start, e.num_new) for e in it.all()])
        sched.commit(it)
        for e in it.all():
            if e.samples:
                e.seq.generated += 1
                if e.seq.generated == e.seq.target:
                    sched.finish(e.seq)
    # short's prompt, then its decodes, alone (long's 8 would not fit beside them; later waits behind it), then long's
    # prompt whole, then later's
    assert runs == [[(0, 0, 3)], [(0, 3, 1)], [(0, 4, 1)], [(1, 0, 8)], [(2, 0, 1)]]


def test_tiny_pool_preempts_newest_and_recomputes():
    # 4 blocks of 4 tokens; three sequences that each grow to 16 tokens cannot all fit.
    sched = IterationScheduler(BlockManager(4, 4), max_running=3, max_tokens_per_iteration=64, max_seq_len=16)
    seqs = [FakeSeq(i, prompt=4, target=12) for i in range(3)]
    for s in seqs:
        sched.add(s)
    its = drive(sched, seqs)
    assert sched.num_preemptions > 0
    victims = [p for it in its for p in it.preempted]
    assert seqs[0] not in victims  # the oldest always makes progress
    # A preempted sequence rejoins recomputing all its known tokens (prompt + generated).
    k = next(i for i, it in enumerate(its) if it.preempted)
    victim = its[k].preempted[0]
    rejoin = next(e for it in its[k + 1 :] for e in it.all() if e.seq is victim)
    assert rejoin.start == 0 and rejoin.samples and rejoin.num_new > victim.prompt


def test_preempted_rejoin_before_later_arrivals():
    sched = IterationScheduler(BlockManager(4, 2), max_running=4, max_tokens_per_iteration=16, max_seq_len=8)
    a, b, c = FakeSeq(0, 3, 5), FakeSeq(1, 3, 5), FakeSeq(2, 2, 1)
    sched.add(a)
    sched.add(b)
    joined, finished = [], []
    while not any(it.preempted for it in [check_and_run(sched, [a, b, c], joined, finished)]):
        pass
    sched.add(c)  # arrives after b was preempted
    assert list(sched.waiting) == [b, c]
    drive(sched, [a, b, c])


def test_sequence_too_long_for_the_pool_is_reported_not_looped():
    sched = IterationScheduler(BlockManager(2, 4), max_running=2, max_tokens_per_iteration=64)
    big = FakeSeq(0, prompt=20, target=1)
    sched.add(big)
    with pytest.raises(SequenceTooLong) as err:
        sched.schedule()
    assert err.value.seq is big and list(sched.waiting) == [big]
    sched.finish(big)
    assert not sched.has_work() and sched.blocks.num_free == 2


def test_finish_is_idempotent_and_removes_waiting():
    sched = IterationScheduler(BlockManager(8, 4), max_running=1, max_tokens_per_iteration=100)
    a, b = FakeSeq(0, 5, 1), FakeSeq(1, 5, 1)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    sched.finish(b)  # cancelled while waiting
    sched.finish(b)  # twice: no error
    assert list(sched.waiting) == [] and sched.running == [a]
    sched.finish(a)  # cancelled while running: blocks back at once
    assert sched.blocks.num_free == 8 and not sched.has_work()


def test_commit_twice_raises():
    sched = IterationScheduler(BlockManager(8, 4), max_running=1, max_tokens_per_iteration=100)
    sched.add(FakeSeq(0, 5, 3))
    it = sched.schedule()
    sched.commit(it)
    with pytest.raises(RuntimeError):
        sched.commit(it)


def _decoding(sched: IterationScheduler, seqs: list[FakeSeq]) -> None:
    """Run `seqs`' prompts and first tokens, one iteration each, so that they all decode."""
    for s in seqs:
        sched.add(s)
    while any(s.generated == 0 for s in seqs):
        it = sched.schedule()
        assert it.steps == 1  # prompts in the round, or someone waiting
        sched.commit(it)
        for e in it.all():
            e.seq.generated += e.samples


def test_decode_rounds_take_several_iterations_within_each_sequences_tokens():
    sched = IterationScheduler(BlockManager(64, 4), max_running=4, max_tokens_per_iteration=64, max_decode_steps=4)
    a, b = FakeSeq(0, prompt=5, target=20), FakeSeq(1, prompt=3, target=3)
    _decoding(sched, [a, b])
    it = sched.schedule()
    # b has 2 tokens left: it takes 2 iterations of the round; a all 4, with blocks for them.
    assert it.steps == 4 and [(e.seq, e.steps) for e in it.decode] == [(a, 4), (b, 2)]
    assert len(a.block_table) == sched.blocks.blocks_for(a.num_computed + 4)
    sched.commit(it)
    assert (a.num_computed, b.num_computed) == (5 + 4, 3 + 2)


def test_a_waiting_request_or_short_pool_keeps_rounds_to_one_iteration():
    sched = IterationScheduler(BlockManager(64, 4), max_running=1, max_tokens_per_iteration=64, max_decode_steps=4)
    a = FakeSeq(0, prompt=5, target=20)
    _decoding(sched, [a])
    sched.add(FakeSeq(1, prompt=5, target=2))  # cannot join (max_running) but waits: join soon
    assert sched.schedule().steps == 1
    # Two blocks of 4 in all: a holds 2 (tokens 0..5 and its next); 4 steps ahead needs a third.
    tight = IterationScheduler(BlockManager(2, 4), max_running=1, max_tokens_per_iteration=64, max_decode_steps=4)
    c = FakeSeq(0, prompt=5, target=20)
    _decoding(tight, [c])
    it = tight.schedule()
    assert it.steps == 1 and not it.preempted and tight.blocks.num_free == 0


def test_a_sequence_sampling_under_a_grammar_keeps_rounds_to_one_iteration_and_waits_for_its_token():
    sched = IterationScheduler(BlockManager(64, 4), max_running=4, max_tokens_per_iteration=64, max_decode_steps=4)
    a, b = FakeSeq(0, prompt=5, target=20), FakeSeq(1, prompt=3, target=20, one_step=True)
    _decoding(sched, [a, b])
    it = sched.schedule()
    assert it.steps == 1 and all(e.steps == 1 for e in it.decode)
    sched.commit(it)
    b.host_pending = True  # its token of that iteration is still on its way: it sits this one out
    a.generated += 1
    assert [e.seq for e in sched.schedule().decode] == [a]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_running=0, max_tokens_per_iteration=10),
        dict(max_running=1, max_tokens_per_iteration=10, max_decode_steps=0),
        dict(max_running=8, max_tokens_per_iteration=7),  # a full house could not all decode
        dict(max_running=1, max_tokens_per_iteration=10, max_seq_len=41),  # 11 blocks > 10
    ],
)
def test_constructor_rejects_bad_limits(kwargs):
    with pytest.raises(ValueError):
        IterationScheduler(BlockManager(10, 4), **kwargs)


def test_add_rejects_sequence_over_max_seq_len():
    sched = IterationScheduler(BlockManager(10, 4), max_running=1, max_tokens_per_iteration=10, max_seq_len=40)
    with pytest.raises(ValueError):
        sched.add(FakeSeq(0, prompt=41, target=1))
