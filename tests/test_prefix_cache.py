"""Automatic prefix caching in the iteration scheduler (scheduler/prefix_cache.py, the cached
blocks of kv_blocks.py), driven by a fake engine that writes a fake KV cache: every slot holds
what a real key/value depends on (its position and every token up to it), so a block reused
with other contents, or evicted and overwritten while still matched, shows as a wrong slot.
Properties: no block freed while a table holds it, no stale reuse, every sequence finishes,
nothing leaks, under preemption, cancellation, chunked prefill, n > 1 forks and decode rounds.
Then the real engine on a tiny model: outputs with caching equal those without and Hugging
Face's greedy ones."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonformer.client.hf_reference import tiny_hf
from tritonformer.scheduler.iteration import IterationScheduler
from tritonformer.scheduler.kv_blocks import BlockManager
from tritonformer.scheduler.prefix_cache import PrefixCache


@dataclass(eq=False)
class FakeSeq:
    arrival: int
    prompt_ids: list[int]
    target: int  # tokens to generate
    outputs: list[int] = field(default_factory=list)  # the tokens it will generate, fixed up front
    generated: int = 0
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    one_step: bool = False  # (a structured output's sequence: no rounds of several iterations)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + self.generated

    @property
    def token_limit(self) -> int:
        return len(self.prompt_ids) + self.target

    def token(self, pos: int) -> int:
        p = len(self.prompt_ids)
        return self.prompt_ids[pos] if pos < p else self.outputs[pos - p]


def seq_of(arrival: int, prompt: list[int], target: int, rng: random.Random | None = None) -> FakeSeq:
    rng = rng or random.Random(arrival)
    return FakeSeq(arrival, list(prompt), target, [rng.randrange(1000, 2000) for _ in range(target)])


class FakeKV:
    """What each slot of the paged cache would hold: (position, every token up to it)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.slots: dict[tuple[int, int], tuple] = {}

    @staticmethod
    def content(seq: FakeSeq, pos: int) -> tuple:
        return pos, tuple(seq.token(i) for i in range(pos + 1))

    def write(self, it) -> None:
        """The engine ran `it`: each scheduled token's key/value is written."""
        b = self.block_size
        for e in it.all():
            for pos in range(e.start, e.start + e.num_new * e.steps):
                self.slots[(e.seq.block_table[pos // b], pos % b)] = self.content(e.seq, pos)

    def check_context(self, it) -> None:
        """Every token a scheduled sequence attends to, before its new ones, holds its own
        prefix's keys/values (a cache hit, a fork's share or its own earlier iterations)."""
        b = self.block_size
        for e in it.all():
            for pos in range(e.start):
                got = self.slots.get((e.seq.block_table[pos // b], pos % b))
                assert got == self.content(e.seq, pos), f"stale KV at position {pos} of a sequence"


def run_step(sched: IterationScheduler, kv: FakeKV, finished: list):
    it = sched.schedule()
    kv.check_context(it)
    bm = sched.blocks
    for e in it.all():  # nothing is written into a block another table holds, or one that is cached
        for pos in range(e.start, e.start + e.num_new * e.steps):
            block = e.seq.block_table[pos // bm.block_size]
            assert bm.refcount(block) == 1 and block not in bm._key_of, "a shared or cached block is written"
    kv.write(it)
    sched.commit(it)
    for e in it.all():
        if e.samples:
            e.seq.generated += e.steps
            if e.seq.generated == e.seq.target:
                sched.finish(e.seq)
                finished.append(e.seq)
    return it


def check(sched: IterationScheduler, members: list[FakeSeq]) -> None:
    """Each block's reference count is the number of tables holding it; a held block is never
    free nor idle (so never evicted); idle blocks are cached; keys and blocks agree."""
    bm = sched.blocks
    holders: dict[int, int] = {}
    for s in members:
        assert len(set(s.block_table)) == len(s.block_table)
        for b in s.block_table:
            holders[b] = holders.get(b, 0) + 1
    assert holders == {b: bm.refcount(b) for b in holders} and bm.num_used == len(holders)
    assert not set(holders) & set(bm._free) and not set(holders) & set(bm._idle)
    assert set(bm._idle) <= set(bm._key_of) and not set(bm._idle) & set(bm._free)
    assert len(bm._free) + len(bm._idle) + bm.num_used == bm.num_blocks
    assert {k: b for b, k in bm._key_of.items()} == bm._block_of
    for s in sched.waiting:  # waiting: nothing held but a fork's shared prompt
        assert s.num_computed == len(s.block_table) * bm.block_size


# ---------------------------------------------------------------------------- BlockManager


def test_a_cached_block_stays_idle_after_its_last_holder_and_is_evicted_only_when_free_ones_run_out():
    bm = BlockManager(4, 2)
    a = []
    bm.grow(a, 4)  # blocks 0, 1
    assert bm.cache(a[0], "k0") and bm.cache(a[1], "k1")
    assert not bm.cache(a[1], "other")  # it has a key already
    with pytest.raises(ValueError):
        bm.cache(3, "k3")  # not allocated
    b = []
    bm.grow(b, 2)
    assert not bm.cache(b[0], "k0")  # the key is taken: the first block offered stays
    bm.free(a)
    assert bm.num_used == 1 and bm.num_free == 3 and bm.num_idle == 2 and bm.num_cached == 2
    assert bm.lookup("k0") == 0 and bm.lookup("k1") == 1 and bm.refcount(0) == 0
    c = []
    bm.grow(c, 2)  # a never-used block goes before an idle one
    assert c == [3] and bm.lookup("k0") == 0 and bm.lookup("k1") == 1 and bm.num_evicted == 0
    d = []
    bm.grow(d, 2)  # none left: the least recently released idle block: a's tail first
    assert d == [1] and bm.lookup("k1") is None and bm.lookup("k0") == 0 and bm.num_evicted == 1
    with pytest.raises(ValueError):
        bm.free([0])  # idle, not held by anyone


def test_take_holds_idle_and_held_cached_blocks_and_can_take_counts_the_idle_ones_it_takes():
    bm = BlockManager(3, 2)
    a = []
    bm.grow(a, 4)
    bm.cache(a[0], "k0")
    bm.cache(a[1], "k1")
    shared = bm.take([a[0]])  # held by a: the count goes up
    assert shared == [a[0]] and bm.refcount(a[0]) == 2
    bm.free(a)
    assert bm.refcount(0) == 1 and bm.num_idle == 1  # block 1 is idle, block 0 still held
    # Taking idle block 1 leaves one free block (2): one more block fits, two do not, though
    # the pool counts block 1 as free too.
    assert bm.num_free == 2 and bm.can_take([1], 2 * 2) and not bm.can_take([1], 2 * 3)
    again = bm.take([1])
    assert bm.refcount(1) == 1 and bm.num_idle == 0 and bm.num_free == 1
    with pytest.raises(ValueError):
        bm.take([2])  # never cached
    bm.free(shared)
    bm.free(again)
    assert bm.num_used == 0 and bm.num_free == 3 and bm.num_idle == 2


def test_evict_idle_forgets_the_idle_cached_blocks_and_keeps_the_held_ones():
    bm = BlockManager(4, 2)
    a, b = [], []
    bm.grow(a, 4)
    bm.grow(b, 2)
    bm.cache(a[0], "k0"), bm.cache(a[1], "k1"), bm.cache(b[0], "kb")
    bm.free(a)  # a's two blocks idle, b's held
    assert bm.evict_idle() == 2
    assert bm.lookup("k0") is None and bm.lookup("k1") is None and bm.lookup("kb") == b[0]
    assert bm.num_idle == 0 and bm.num_free == 3 and bm.num_cached == 1 and bm.num_evicted == 0
    c = []
    bm.grow(c, 6)  # the forgotten blocks are plain free ones again
    assert sorted(c) == [0, 1, 3] and bm.evict_idle() == 0


def test_keys_chain_every_token_before_the_block():
    block = 4
    prompt = list(range(10, 22))  # 3 full blocks
    seqs = [seq_of(0, prompt, 1), seq_of(1, prompt[:8] + [99, 98, 97, 96], 1),
            seq_of(2, [0] + prompt[1:], 1), seq_of(3, prompt + [5, 6], 1)]
    cache = PrefixCache(BlockManager(8, block))
    keys = [[cache._keys(s).key(i, block) for i in range(cache._keys(s).num_full)] for s in seqs]
    assert keys[1][:2] == keys[0][:2] and keys[1][2] != keys[0][2]  # differ from the differing block on
    assert all(k2 != k0 for k2, k0 in zip(keys[2], keys[0]))  # one early token changes every later key
    assert keys[3] == keys[0]  # a partial last block has no key
    assert len(set(keys[0])) == 3


# ---------------------------------------------------------------------------- scheduler, targeted


def test_a_later_request_reuses_the_committed_prefix_and_computes_only_the_rest():
    sched = IterationScheduler(BlockManager(32, 4), max_running=4, max_tokens_per_iteration=64, prefix_caching=True)
    kv, finished = FakeKV(4), []
    shared = list(range(100, 112))  # 3 blocks
    a, b = seq_of(0, shared + [1, 2], 3), seq_of(1, shared + [7, 8, 9, 10, 11], 3)
    sched.add(a)
    sched.add(b)
    it = run_step(sched, kv, finished)  # both join the same iteration: nothing is committed yet
    assert [(e.seq, e.start) for e in it.prefill] == [(a, 0), (b, 0)] and it.cache_lookups == [0, 0]
    assert set(a.block_table).isdisjoint(b.block_table)
    c = seq_of(2, shared + [3, 4, 5], 3)
    sched.add(c)
    it = run_step(sched, kv, finished)
    (entry,) = it.prefill
    assert (entry.seq, entry.start, entry.num_new) == (c, 12, 3) and it.cache_lookups == [12]
    assert c.block_table[:3] == a.block_table[:3]  # a offered its blocks first; b's copies are its own
    assert [sched.blocks.refcount(x) for x in a.block_table[:3]] == [2, 2, 2]
    pc = sched.prefix_cache
    assert (pc.queries, pc.hits, pc.hit_tokens) == (3, 1, 12)
    while sched.has_work():
        run_step(sched, kv, finished)
    assert len(finished) == 3 and sched.blocks.num_used == 0
    # a's three prompt blocks, b's last full one (8..11 + 7) and c's none (its blocks are a's):
    # cached and idle, still free to take.
    assert sched.blocks.num_idle == sched.blocks.num_cached == 4 and sched.blocks.num_free == 32


@pytest.mark.parametrize("prompt_len,reused", [(12, 8), (13, 12), (3, 0), (4, 0)])
def test_the_last_known_token_always_runs(prompt_len, reused):
    """A prompt that is all full blocks reuses all but its last block: its last token gives
    the logits of the first sample, and a cached block is never written."""
    sched = IterationScheduler(BlockManager(32, 4), max_running=4, max_tokens_per_iteration=64, prefix_caching=True)
    kv, finished = FakeKV(4), []
    prompt = list(range(50, 50 + prompt_len))
    sched.add(seq_of(0, prompt, 2))
    while sched.has_work():
        run_step(sched, kv, finished)
    again = seq_of(1, prompt, 2)
    sched.add(again)
    it = run_step(sched, kv, finished)
    (entry,) = it.all()
    assert entry.start == reused and entry.samples and it.cache_lookups == [reused]


def test_a_preempted_sequence_finds_its_prompt_again_and_eviction_forgets_what_it_overwrites():
    # 6 blocks of 4: a (prompt 8 + 8 out) and b (prompt 8 + 8 out) cannot both reach 16 tokens.
    sched = IterationScheduler(BlockManager(6, 4), max_running=2, max_tokens_per_iteration=64, max_seq_len=16,
                               prefix_caching=True)
    kv, finished = FakeKV(4), []
    a, b = seq_of(0, list(range(8)), 8), seq_of(1, list(range(20, 28)), 8)
    sched.add(a)
    sched.add(b)
    lookups = []
    while sched.has_work():
        lookups += run_step(sched, kv, finished).cache_lookups
        check(sched, [a, b])
    assert sched.num_preemptions > 0 and len(finished) == 2
    assert any(lookups[2:]), "the preempted sequence rejoined without finding its prompt blocks"
    assert sched.blocks.num_used == 0 and sched.blocks.num_free == 6
    # A third prompt needs every block: the cached ones are evicted, their keys forgotten.
    c = seq_of(2, list(range(40, 48)), 8)
    sched.add(c)
    while sched.has_work():
        run_step(sched, kv, finished)
    assert sched.blocks.num_evicted > 0
    d = seq_of(3, list(range(8)), 1)  # a's prompt again: whatever it finds must still hold a's tokens
    sched.add(d)
    run_step(sched, kv, finished)  # (FakeKV.check_context would fail on a stale block)


def test_a_cancelled_leaders_computed_blocks_serve_its_forks():
    sched = IterationScheduler(BlockManager(32, 4), max_running=4, max_tokens_per_iteration=8, prefix_caching=True)
    kv, finished = FakeKV(4), []
    prompt = list(range(60, 80))  # 5 blocks; the fork point is 16 tokens
    leader, forks = seq_of(0, prompt, 3), [seq_of(0, prompt, 3, random.Random(i)) for i in (1, 2)]
    sched.add(leader)
    sched.add_forks(leader, forks, len(prompt))
    run_step(sched, kv, finished)  # 8 of the leader's 20 prompt tokens: two blocks, now cached
    sched.finish(leader)  # cancelled before the fork point: its forks go alone...
    it = run_step(sched, kv, finished)
    assert it.cache_lookups[0] == 8  # ...but the first finds the leader's two blocks
    while sched.has_work():
        run_step(sched, kv, finished)
    assert len(finished) == 2 and sched.blocks.num_used == 0


def test_without_prefix_caching_nothing_is_looked_up_or_kept():
    sched = IterationScheduler(BlockManager(16, 4), max_running=4, max_tokens_per_iteration=64)
    kv, finished = FakeKV(4), []
    for i in range(2):
        sched.add(seq_of(i, list(range(12)), 2))
        while sched.has_work():
            assert run_step(sched, kv, finished).cache_lookups == []
    assert sched.prefix_cache is None and sched.blocks.num_cached == 0 and sched.blocks.num_free == 16


# ---------------------------------------------------------------------------- scheduler, property


def run_workload(requests, block_size, spare_blocks, max_running, extra_budget, max_decode_steps, cancel_p,
                 seed) -> tuple[list[int], IterationScheduler]:
    """Requests drawn from three shared prefixes (or none) arrive, some with n > 1 samples, some
    cancelled, in a pool with few spare blocks; every step checked. Returns the lookups' hits
    and the scheduler."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 6) for _ in range(24)] for _ in range(3)]  # few distinct tokens: many matches
    arrivals = []
    for i, (at, which, plen, own, target, n) in enumerate(sorted(requests, key=lambda r: r[0])):
        prompt = (prefixes[which][:plen] if which >= 0 else []) + [rng.randrange(1, 6) for _ in range(own)]
        prompt = prompt or [rng.randrange(1, 6)]
        arrivals.append((at, [seq_of(i, prompt, target, random.Random(rng.random())) for _ in range(n)]))
    members = [s for _, group in arrivals for s in group]
    max_seq_len = max(s.token_limit for s in members)
    bm = BlockManager(-(-max_seq_len // block_size) + spare_blocks, block_size)
    sched = IterationScheduler(bm, max_running, max_running + extra_budget, max_seq_len, max_decode_steps,
                               prefix_caching=True)
    kv, finished, cancelled, lookups = FakeKV(block_size), [], [], []
    for step in range(5_000):
        while arrivals and arrivals[0][0] <= step:
            leader, *forks = arrivals.pop(0)[1]
            sched.add(leader)
            if forks:
                sched.add_forks(leader, forks, len(leader.prompt_ids))
        if not sched.has_work():
            if not arrivals:
                break
            continue
        if rng.random() < cancel_p:
            victim = rng.choice(sched.running + list(sched.waiting))
            sched.finish(victim)
            cancelled.append(victim)
            check(sched, members)
            if not sched.has_work():
                continue
        it = run_step(sched, kv, finished)
        lookups += it.cache_lookups
        check(sched, members)
    else:
        pytest.fail("the workload did not finish")
    assert len(finished) + len(cancelled) == len(members)
    assert all(s.generated == s.target for s in finished)
    assert bm.num_used == 0 and bm.num_free == bm.num_blocks and not sched.pending_forks()
    pc = sched.prefix_cache
    assert pc.queries == len(lookups) and pc.hits == sum(1 for n in lookups if n) and pc.hit_tokens == sum(lookups)
    assert all(n % block_size == 0 for n in lookups)
    assert not pc._filling and not pc._prompts  # nothing kept about sequences that left
    return lookups, sched


@given(
    # arrival step, which shared prefix (or none), prefix length, own tokens, output, n
    requests=st.lists(st.tuples(st.integers(0, 25), st.integers(-1, 2), st.integers(0, 24), st.integers(0, 10),
                                st.integers(1, 10), st.sampled_from([1, 1, 1, 2, 3])), min_size=1, max_size=12),
    block_size=st.integers(1, 5),
    spare_blocks=st.integers(0, 12),  # few: preemption and eviction are frequent
    max_running=st.integers(1, 6),
    extra_budget=st.integers(0, 40),
    max_decode_steps=st.sampled_from([1, 1, 3]),
    cancel_p=st.sampled_from([0.0, 0.05]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=250, deadline=None)
def test_random_shared_prefix_workloads_finish_without_stale_reuse(requests, block_size, spare_blocks, max_running,
                                                                    extra_budget, max_decode_steps, cancel_p, seed):
    run_workload(requests, block_size, spare_blocks, max_running, extra_budget, max_decode_steps, cancel_p, seed)


def test_the_random_workload_reuses_and_evicts_blocks():
    """The workload above is not vacuous: requests over the shared prefixes in a tight pool hit
    the cache, and blocks are evicted and preempted sequences rejoin meanwhile."""
    requests = [(i // 3, i % 3, 20, i % 4, 6, 1 + (i % 5 == 0)) for i in range(12)]
    lookups, sched = run_workload(requests, 4, 12, 4, 12, 1, 0.05, seed=3)
    assert sum(1 for n in lookups if n >= 16) >= 6
    assert sched.blocks.num_evicted > 0 and sched.num_preemptions > 0


# ---------------------------------------------------------------------------- the real engine


def _engine(hf, prefix_caching: bool, blocks: int = 40, block: int = 4, budget: int = 24, max_decode_steps: int = 1):
    from tritonformer.backend.checkpoints.weights import strip_prefixes_of
    from tritonformer.backend.decoder.engine import GeneratorEngine
    from tritonformer.backend.decoder.runner import DecoderRunner
    from tritonformer.backend.models.decoder import load_decoder
    from tritonformer.client.engine_drive import CountingSink, IdsOnly

    model = load_decoder(hf.config.to_dict(), strip_prefixes_of(hf.state_dict()), torch.device("cpu"), torch.float32)
    scheduler = IterationScheduler(BlockManager(blocks, block), 4, budget, max_seq_len=hf.config.max_position_embeddings,
                                   max_decode_steps=max_decode_steps, prefix_caching=prefix_caching)
    runner = DecoderRunner(model, model.new_kv_cache(blocks, block), 4)
    return GeneratorEngine(runner, IdsOnly(), CountingSink(), scheduler, cancel_check_interval_s=3600)


def _generate(engine, prompts, new_tokens, waves=2, n=1):
    """Requests in waves (a later wave joins after the earlier one's prompts are committed),
    greedy, EOS ignored; returns every sample's output ids in request order."""
    from tritonformer.backend.decoder.sampling_params import SamplingParams

    seqs = [engine.new_sequence(i, p, SamplingParams(max_tokens=new_tokens, ignore_eos=True, n=n), False)
            for i, p in enumerate(prompts)]
    size = -(-len(seqs) // waves)
    for start in range(0, len(seqs), size):
        engine.admit(seqs[start : start + size])
        for _ in range(3):
            engine.step()
    while engine.has_work():
        engine.step()
    assert engine.sink.finished == len(prompts) and not engine.sink.errors
    return [s.output_ids for seq in seqs for s in (seq, *seq.forks)]


def _shared_prompts(seed: int, count: int, prefix_len: int = 21):
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, 320, (prefix_len,), generator=gen).tolist()
    return [prefix + torch.randint(3, 320, (int(k),), generator=gen).tolist()
            for k in torch.randint(1, 9, (count,), generator=gen)]


@pytest.mark.parametrize("shape,changes", [("llama-3.1-8b", {}), ("gemma-3-1b", {"sliding_window_pattern": 2})],
                         ids=["llama", "gemma3-windowed"])
def test_engine_outputs_with_caching_equal_those_without_and_hf_greedy(shape, changes):
    """Shared 21-token prefix, 4-token blocks, prompts chunked (budget 24 for up to 4 sequences),
    a second wave that finds the first's blocks cached (Gemma 3: half the layers attend to an
    8-token window only); greedy outputs equal the engine's without caching and Hugging Face's
    for each prompt alone."""
    hf = tiny_hf(shape, **changes)
    prompts = _shared_prompts(11, 5)
    cached_engine = _engine(hf, prefix_caching=True)
    with_cache = _generate(cached_engine, prompts, 8)
    without = _generate(_engine(hf, prefix_caching=False), prompts, 8)
    pc = cached_engine.scheduler.prefix_cache
    assert pc.hits >= 2 and pc.hit_tokens >= 2 * 20, "the second wave did not reuse the prefix"
    assert with_cache == without
    for prompt, out in zip(prompts, with_cache):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert out == ref[0, len(prompt):].tolist()


def test_engine_with_caching_under_preemption_forks_and_decode_rounds_matches_without():
    """A pool too small for all (preemption; the preempted find their prompts again), n = 2
    samples sharing the leader's blocks, decode rounds of 3 iterations: outputs unchanged."""
    hf = tiny_hf()
    prompts = _shared_prompts(12, 4, prefix_len=17)
    runs = {}
    for caching in (True, False):
        engine = _engine(hf, prefix_caching=caching, blocks=16, budget=32, max_decode_steps=3)
        runs[caching] = _generate(engine, prompts, 12, n=2)
        assert engine.scheduler.num_preemptions > 0 and engine.scheduler.blocks.num_used == 0
        if caching:
            assert engine.scheduler.prefix_cache.hits > 0
    assert runs[True] == runs[False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prefix_caching_on_gpu_reuses_the_prefix_and_picks_hf_greedy_tokens():
    """On the GPU (Triton kernels, decode graphs, fp16): prompts sharing a 300-token prefix in
    two waves, the second finding the first's blocks cached; every token picked, with caching
    and without, is HF's greedy choice given the same history up to fp16 near-ties."""
    import transformers

    from tritonformer.backend.decoder.sampling_params import SamplingParams
    from tritonformer.client.engine_drive import our_engine

    cuda = torch.device("cuda")
    torch.manual_seed(9)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=4)).eval().to(cuda).half()
    gen = torch.Generator().manual_seed(21)
    prefix = torch.randint(0, 50256, (300,), generator=gen).tolist()
    prompts = [prefix + torch.randint(0, 50256, (n,), generator=gen).tolist() for n in (1, 16, 40, 7, 64, 3)]
    outputs = {}
    for caching in (False, True):
        engine, sink = our_engine(hf, cuda, torch.float16, max_running=8, token_budget=512, kv_fraction=0.05,
                                  prefix_caching=caching)
        seqs = [engine.new_sequence(i, p, SamplingParams(max_tokens=16, ignore_eos=True), False)
                for i, p in enumerate(prompts)]
        engine.admit(seqs[:1])
        for _ in range(3):
            engine.step()
        engine.admit(seqs[1:])  # after the first prompt's blocks are committed
        while engine.has_work():
            engine.step()
        assert sink.finished == len(prompts) and not sink.errors and engine.scheduler.blocks.num_used == 0
        if caching:
            pc = engine.scheduler.prefix_cache
            assert pc.hits == len(prompts) - 1 and pc.hit_tokens == (len(prompts) - 1) * 288
        outputs[caching] = [s.output_ids for s in seqs]
        del engine
    hf.float()
    with torch.inference_mode():
        for caching, outs in outputs.items():
            for prompt, out in zip(prompts, outs):
                full = torch.tensor([prompt + out], device=cuda)
                logits = hf(full).logits[0, len(prompt) - 1 : -1].float()
                chosen = logits.gather(1, torch.tensor(out, device=cuda)[:, None]).squeeze(1)
                shortfall = logits.max(-1).values - chosen  # 0 where ours is HF's argmax
                assert shortfall.max().item() < 2e-2, (caching, shortfall.tolist())
    same = sum(a == b for a, b in zip(outputs[True], outputs[False]))
    print(f"identical outputs with and without prefix caching: {same} of {len(prompts)}")
