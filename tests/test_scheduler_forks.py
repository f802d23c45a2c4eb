"""n > 1 samples of one prompt in the iteration scheduler: reference-counted KV blocks, forks that
share the leader's full prompt blocks, driven by a fake engine (no model). Property: no block is
freed while a table holds it, no shared block is ever written, every sample finishes, nothing
leaks, under preemption and cancellation."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonformer.scheduler.iteration import IterationScheduler
from tritonformer.scheduler.kv_blocks import BlockManager


@dataclass(eq=False)
class FakeSeq:
    arrival: int
    prompt: int
    target: int
    generated: int = 0
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    one_step: bool = False  # (a structured output's sequence: no rounds of several iterations)

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated

    @property
    def token_limit(self) -> int:
        return self.prompt + self.target


def test_share_counts_references_and_frees_on_the_last_holder():
    bm = BlockManager(6, 4)
    a = []
    bm.grow(a, 10)  # 3 blocks
    b = bm.share(a, 2)
    assert b == a[:2] and [bm.refcount(x) for x in a] == [2, 2, 1] and bm.num_used == 3
    bm.grow(b, 12)  # its own third block
    assert bm.num_used == 4 and b[2] != a[2]
    bm.free(a)
    assert [bm.refcount(x) for x in b] == [1, 1, 1] and bm.num_free == 3  # a's third block only
    with pytest.raises(ValueError):
        bm.free([b[0], b[0]])
    bm.free(b)
    assert bm.num_free == 6 and bm.num_used == 0
    with pytest.raises(ValueError):
        bm.share([0], 1)  # not allocated


def test_forks_join_after_the_leaders_full_prompt_blocks_and_compute_only_the_tail():
    sched = IterationScheduler(BlockManager(32, 4), max_running=4, max_tokens_per_iteration=7)
    leader, forks = FakeSeq(0, prompt=11, target=3), [FakeSeq(0, 11, 3), FakeSeq(0, 11, 3)]
    sched.add(leader)
    sched.add_forks(leader, forks, 11)
    assert sched.pending_forks() == forks and not sched.waiting.__contains__(forks[0])
    it = sched.schedule()  # 7 of the leader's 11 prompt tokens: not yet at its 8 shared ones
    sched.commit(it)
    assert sched.pending_forks() == forks
    it = sched.schedule()  # the other 4: the leader's first two blocks are full
    sched.commit(it)
    assert sched.pending_forks() == [] and list(sched.waiting) == forks
    for f in forks:
        assert f.num_computed == 8 and f.block_table == leader.block_table[:2]
    assert [sched.blocks.refcount(b) for b in leader.block_table] == [3, 3, 1]
    leader.generated = 1
    it = sched.schedule()  # the leader decodes; each fork computes its 3 tail tokens and samples
    assert [(e.seq, e.start, e.num_new, e.samples) for e in it.prefill] == [(f, 8, 3, True) for f in forks]
    assert all(e.seq.block_table[2] not in leader.block_table for e in it.prefill)  # own tail blocks


@pytest.mark.parametrize("prompt,shared", [(3, 0), (4, 0), (8, 4), (9, 8)])
def test_fork_point_leaves_the_last_prompt_token_to_compute(prompt, shared):
    sched = IterationScheduler(BlockManager(32, 4), max_running=8, max_tokens_per_iteration=64)
    leader, fork = FakeSeq(0, prompt, 2), FakeSeq(0, prompt, 2)
    sched.add(leader)
    sched.add_forks(leader, [fork], prompt)
    if shared == 0:  # no full block to share: it waits as a sequence of its own at once
        assert list(sched.waiting) == [leader, fork] and not sched.pending_forks()
        return
    sched.commit(sched.schedule())
    assert fork in sched.waiting and fork.num_computed == shared and len(fork.block_table) == shared // 4


def test_a_leader_leaving_before_the_fork_point_lets_its_forks_go_alone():
    sched = IterationScheduler(BlockManager(32, 4), max_running=4, max_tokens_per_iteration=4)
    leader, forks = FakeSeq(0, 20, 3), [FakeSeq(0, 20, 3), FakeSeq(0, 20, 3)]
    sched.add(leader)
    sched.add_forks(leader, forks, 20)
    sched.commit(sched.schedule())
    sched.finish(leader)  # cancelled with 4 of 20 prompt tokens computed
    assert list(sched.waiting) == forks and all(f.num_computed == 0 and not f.block_table for f in forks)
    sched.finish(forks[0])
    assert list(sched.waiting) == forks[1:]
    assert sched.blocks.num_used == 0


@given(
    groups=st.lists(st.tuples(st.integers(0, 20), st.integers(1, 40), st.integers(1, 12), st.integers(1, 4)),
                    min_size=1, max_size=8),  # arrival step, prompt, output, n
    block_size=st.integers(1, 6),
    spare_blocks=st.integers(0, 10),
    max_running=st.integers(1, 6),
    extra_budget=st.integers(0, 40),
    cancel_p=st.sampled_from([0.0, 0.05]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=200, deadline=None)
def test_random_groups_finish_without_freeing_a_held_block(groups, block_size, spare_blocks, max_running,
                                                            extra_budget, cancel_p, seed):
    rng = random.Random(seed)
    groups = sorted(groups, key=lambda g: g[0])
    max_seq_len = max(p + t for _, p, t, _ in groups)
    bm = BlockManager(-(-max_seq_len // block_size) + spare_blocks, block_size)
    sched = IterationScheduler(bm, max_running, max_running + extra_budget, max_seq_len)
    members = []
    pending = []
    for g, (at, prompt, target, n) in enumerate(groups):
        seqs = [FakeSeq(g, prompt, target) for _ in range(n)]
        members += seqs
        pending.append((at, seqs))
    done = []
    for step in range(5_000):
        while pending and pending[0][0] <= step:
            leader, *forks = pending.pop(0)[1]
            sched.add(leader)
            if forks:
                sched.add_forks(leader, forks, leader.prompt)
        if not sched.has_work():
            if not pending:
                break
            continue
        if rng.random() < cancel_p:
            victim = rng.choice(sched.running + list(sched.waiting))
            sched.finish(victim)
            done.append(victim)
            check(sched, members)
            if not sched.has_work():
                continue
        it = sched.schedule()
        check(sched, members)
        for e in it.all():  # nothing is written into a block another table holds
            for pos in range(e.start, e.start + e.num_new * e.steps):
                assert bm.refcount(e.seq.block_table[pos // block_size]) == 1, "a shared block is written"
        sched.commit(it)
        for e in it.all():
            if e.samples:
                e.seq.generated += e.steps
                if e.seq.generated == e.seq.target:
                    sched.finish(e.seq)
                    done.append(e.seq)
        check(sched, members)
    else:
        pytest.fail("the workload did not finish")
    assert len(done) == len(members) and len(set(map(id, done))) == len(members)
    assert bm.num_free == bm.num_blocks and bm.num_used == 0 and not sched.pending_forks()


def check(sched: IterationScheduler, members: list[FakeSeq]) -> None:
    """Each block's reference count is the number of tables holding it; a held block is never
    free; waiting sequences hold only shared prompt blocks (forks), never their own."""
    bm = sched.blocks
    holders: dict[int, int] = {}
    for s in members:
        assert len(set(s.block_table)) == len(s.block_table)
        for b in s.block_table:
            holders[b] = holders.get(b, 0) + 1
    assert holders == {b: bm.refcount(b) for b in holders} and bm.num_used == len(holders)
    assert not set(holders) & set(bm._free)
    for s in sched.waiting:
        assert s.num_computed == len(s.block_table) * bm.block_size
