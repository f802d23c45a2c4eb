"""Iteration-level scheduling for decoders: Orca's loop over vLLM's paged KV blocks.

Orca (OSDI'22): schedule one model *iteration* at a time, not one batch of requests to the end.
Sequences join and leave between iterations, so a short answer never waits for the longest one
in its batch, and a new request starts at the next iteration instead of the next batch.

vLLM (SOSP'23): the KV cache is paged (see kv_blocks.py). A sequence takes blocks only as it
grows; when the pool runs dry the *newest* running sequence is preempted: its blocks are freed
and it is requeued at the front of the waiting queue, to recompute its KV (prompt plus the
tokens generated so far) when it rejoins. Recompute rather than swap: a prefill over known
tokens is one fast batched pass, and it needs no host memory or copy engine.

Chunked prefill (Sarathi / vLLM): every iteration has a token budget. Running sequences go first
(one token each while decoding), then waiting sequences join with what budget is left; a prompt
longer than that runs in chunks over several iterations. A burst of long prompts therefore never
stalls the decoding of running sequences, and the iteration size, hence its latency, is capped.

Several decode iterations per round (vLLM's multi-step scheduling): when nobody waits and every
running sequence is decoding, a round may cover up to `max_decode_steps` iterations, each
sequence taking as many of them as it has tokens left (the engine runs them without the host in
between). A serving engine's host work per round (scheduling, inputs, bookkeeping for every
sequence) is then shared by several iterations. A request that arrives meanwhile joins at the
next round, at most max_decode_steps - 1 iterations later; a round with a waiting sequence,
a prompt chunk or a preemption is one iteration, as above.

Several samples of one prompt (n > 1): the first (the leader) is scheduled as any sequence; the
others (forks) wait aside until the leader's prompt is in the cache up to its last full block,
then join the waiting queue's front holding those blocks too (reference-counted, see
kv_blocks.py), with only the prompt's tail (under one block) and their own tokens to compute.
Sharing only full blocks, never written again, needs no copy-on-write. A fork that is preempted
recomputes alone; a leader that leaves before the fork point lets its forks go unshared.

Prefix caching (optional, prefix_cache.py): a sequence that joins holding no blocks first takes
the cached blocks of its prompt's longest cached prefix and runs only the rest; every full
prompt block is offered to later requests once an iteration has computed it (`commit`). Cached
blocks nobody holds stay in the pool as free-but-reusable until grown sequences evict them, so
admission and preemption count them as free.

Recurrent state (hybrid models: linear attention, Mamba, short convolutions; backend/decoder/
state_cache.py): each running sequence also holds one of `max_running` state slots, taken when
it joins and given back when it leaves or is preempted (it recomputes from its first token).
Such a state sums the whole prefix, so a sequence cannot start from blocks computed by another:
neither prefix caching nor forks that share their leader's prompt blocks apply.

Pure Python: the engine supplies the sequences and runs the model; this module only decides.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from .kv_blocks import BlockManager, OutOfBlocks
from .prefix_cache import PrefixCache


class DecoderWork(Protocol):
    """What the scheduler needs from a sequence (the engine's own object)."""

    num_tokens: int  # prompt + generated tokens known so far
    num_computed: int  # tokens whose KV is in the cache; the scheduler advances/resets it
    block_table: list[int]  # its KV blocks, grown and freed by the scheduler
    # Tokens the sequence will ever hold (prompt + the most output tokens); the last of them is
    # never computed (nothing follows it). Bounds how many iterations of a round it takes.
    token_limit: int
    prompt_ids: list[int]  # read only with prefix caching: its full blocks are what is matched and cached
    one_step: bool  # its next sample needs its previous token on the host: never in a round of several,
    host_pending: bool  # and (read only where one_step) not scheduled while that token is on its way
    state_slot: int  # with recurrent_state: its slot while running (-1 otherwise); the scheduler sets it


class SequenceTooLong(OutOfBlocks):
    """One sequence needs more blocks than the whole pool: it can never run, so fail it.

    Raised instead of looping forever; `seq` stays where it was (running or waiting), so the
    engine can `finish(err.seq)` with an error response and go on. Cannot happen when `max_seq_len` is
    given and the engine stops every sequence at that length.
    """

    def __init__(self, seq: Any, num_tokens: int):
        super().__init__(f"a sequence of {num_tokens} tokens does not fit in the KV pool")
        self.seq = seq


class Scheduled:
    """Tokens `start .. start+num_new-1` of `seq` run this iteration.

    A plain class with slots, not a dataclass: one is made per running sequence per iteration,
    on the path the GPU waits for at large batches."""

    __slots__ = ("seq", "start", "num_new", "samples", "steps")

    def __init__(self, seq: Any, num_new: int):
        self.seq = seq
        self.start = start = seq.num_computed
        self.num_new = num_new
        self.steps = 1  # iterations of the round it runs in (one token each); > 1 for decodes only
        # Whether the last known token runs, so the engine samples the next one. Fixed when
        # scheduled: once the engine appends the sampled token, recomputing it would say False.
        self.samples = start + num_new == seq.num_tokens

    def __repr__(self) -> str:
        return f"Scheduled(start={self.start}, num_new={self.num_new}, samples={self.samples}, steps={self.steps})"


@dataclass
class Iteration:
    decode: list[Scheduled] = field(default_factory=list)  # num_new == 1: the decode attention launch
    prefill: list[Scheduled] = field(default_factory=list)  # num_new > 1: prompt chunks or recompute
    preempted: list = field(default_factory=list)  # sequences preempted while building this one
    admitted: list = field(default_factory=list)  # sequences that joined the running batch in this one
    steps: int = 1  # model iterations in this round: the most `steps` of its decode entries
    # Prefix caching: for each sequence that joined this iteration after a lookup, the prompt
    # tokens it found cached (0: a miss). Empty without prefix caching.
    cache_lookups: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(e.num_new * e.steps for e in self.all())

    def __bool__(self) -> bool:
        return bool(self.decode or self.prefill)

    def all(self) -> list[Scheduled]:
        """Decode entries first, then prefill: the order the engine packs its inputs in."""
        return self.decode + self.prefill

    def _add(self, seq: Any, num_new: int) -> None:
        (self.decode if num_new == 1 else self.prefill).append(Scheduled(seq, num_new))


class IterationScheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_running: int = 32,
        max_tokens_per_iteration: int = 4096,
        max_seq_len: int | None = None,
        max_decode_steps: int = 1,
        prefix_caching: bool = False,
        recurrent_state: bool = False,
        whole_prompts: bool = False,
    ):
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        if max_decode_steps < 1:
            raise ValueError(f"max_decode_steps must be >= 1, got {max_decode_steps}")
        if max_tokens_per_iteration < max_running:
            # Every running sequence must be able to decode every iteration, or a full
            # house of decoders would starve some of them.
            raise ValueError(
                f"max_tokens_per_iteration ({max_tokens_per_iteration}) must be >= max_running ({max_running})"
            )
        if recurrent_state and prefix_caching:
            raise ValueError("prefix caching does not apply to a model with recurrent state (its state sums the "
                             "whole prefix): set prefix_caching false")
        if max_seq_len is not None and blocks.blocks_for(max_seq_len) > blocks.num_blocks:
            # The oldest sequence must always be able to grow by preempting all the others;
            # one that cannot fit even alone would never finish.
            raise ValueError(
                f"max_seq_len {max_seq_len} needs {blocks.blocks_for(max_seq_len)} blocks, the pool has {blocks.num_blocks}"
            )
        if whole_prompts and max_seq_len is not None and max_tokens_per_iteration < max_seq_len:
            raise ValueError(f"max_tokens_per_iteration ({max_tokens_per_iteration}) must be >= max_seq_len "
                             f"({max_seq_len}): this model's prompts run whole, in one iteration")
        self.blocks = blocks
        self.max_running = max_running
        # A prompt (and a preempted sequence's recompute) runs in one iteration, never in chunks: for a model
        # whose prompt attends both ways (CPM-Ant). It waits for an iteration with the budget for all of it.
        self.whole_prompts = whole_prompts
        self.max_tokens_per_iteration = max_tokens_per_iteration
        self.max_seq_len = max_seq_len
        self.max_decode_steps = max_decode_steps
        self.waiting: deque = deque()
        self.running: list = []  # oldest first: preemption takes from the tail
        self.num_preemptions = 0
        self.prefix_cache = PrefixCache(blocks) if prefix_caching else None
        # id(leader) -> (leader, forks, shared tokens): forks waiting for the leader's prompt.
        self._forking: dict[int, tuple[Any, list, int]] = {}
        # With recurrent state: the state slots no running sequence holds (None: no such state).
        self.free_state_slots: list[int] | None = list(range(max_running - 1, -1, -1)) if recurrent_state else None

    def add(self, seq: DecoderWork) -> None:
        if self.max_seq_len is not None and seq.num_tokens > self.max_seq_len:
            raise ValueError(f"sequence of {seq.num_tokens} tokens exceeds max_seq_len {self.max_seq_len}")
        self.waiting.append(seq)

    def add_forks(self, leader: DecoderWork, forks: list, prompt_tokens: int) -> None:
        """`forks` are more samples of `leader`'s prompt (`prompt_tokens` long, each fork's
        first tokens): they join once the leader has computed the prompt's full blocks, sharing
        them (see the module docstring). Call after `add(leader)`."""
        shared = prompt_tokens // self.blocks.block_size * self.blocks.block_size
        if self.free_state_slots is not None:  # (a fork's state cannot start where its leader's is)
            shared = 0
        if prompt_tokens - shared == 0 and shared:
            shared -= self.blocks.block_size  # the last prompt token must run: it gives the first sample
        if shared <= 0:  # no full block to share: they are sequences of their own
            self.waiting.extend(forks)
            return
        self._forking[id(leader)] = (leader, list(forks), shared)

    def pending_forks(self) -> list:
        """Forks not yet in the waiting queue (they hold no blocks)."""
        return [f for _, forks, _ in self._forking.values() for f in forks]

    def _fork(self, leader: Any) -> None:
        """The leader's shared prompt is in the cache: its forks take those blocks and join the
        waiting queue's front (they arrived with it, before anything now waiting)."""
        _, forks, shared = self._forking.pop(id(leader))
        num_blocks = shared // self.blocks.block_size
        for fork in reversed(forks):
            fork.block_table = self.blocks.share(leader.block_table, num_blocks)
            fork.num_computed = shared
            self.waiting.appendleft(fork)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Iteration:
        """Pick what runs in the next iteration (see the module docstring for the policy)."""
        it = Iteration()
        budget = self.max_tokens_per_iteration
        block_size = self.blocks.block_size
        decode, prefill = it.decode, it.prefill
        # (Preemption pops from the tail of `running` during this loop; a list iterator just
        # stops earlier then.) The loop body runs for every running sequence every iteration,
        # so it avoids calls it does not need (min, a method per entry).
        for seq in self.running:
            if budget <= 0:
                break
            if seq.one_step and seq.host_pending:  # (its sample's mask waits for its last token)
                continue
            computed = seq.num_computed
            num_new = seq.num_tokens - computed
            if num_new > budget:
                num_new = budget
            if num_new <= 0:
                continue
            need = computed + num_new
            if len(seq.block_table) * block_size < need:  # most decode steps: room in its last block
                if not self._make_room(seq, need, it):
                    break  # seq preempted itself: it was the tail, nothing after it is left
                self.blocks.grow(seq.block_table, need)
            (decode if num_new == 1 else prefill).append(Scheduled(seq, num_new))
            budget -= num_new
        if not it.preempted:  # short of blocks already: admitting more would only thrash
            self._admit(it, budget)
            if self.max_decode_steps > 1 and decode and not prefill and not self.waiting:
                self._steps_ahead(it)
        return it

    def _steps_ahead(self, it: Iteration) -> None:
        """Let a round of decodes run several iterations (see the module docstring): each
        sequence as many as it has tokens left, up to max_decode_steps, with the blocks they
        need taken now. Only from free blocks: if they are short, the round stays one
        iteration (looking ahead never preempts anyone)."""
        cap, block_size = self.max_decode_steps, self.blocks.block_size
        longest, extra, growing, fits = 1, 0, [], True
        for e in it.decode:  # (every running sequence, every round: no calls it can do without)
            if not e.samples or e.seq.one_step:  # a one-token piece of a prompt: its next token is not its
                fits = False  # sample; or a sequence that samples under a grammar, one token at a time
                break
            steps = e.seq.token_limit - 1 - e.start  # positions start .. token_limit - 2 are computed
            if steps > cap:
                steps = cap
            short = e.start + steps - len(e.seq.block_table) * block_size  # tokens past its blocks
            if short > 0:
                extra += -(-short // block_size)
                growing.append(e)
            if steps > longest:
                longest = steps
            e.steps = steps
        if not fits or extra > self.blocks.num_free:
            for e in it.decode:
                e.steps = 1
            return
        for e in growing:
            self.blocks.grow(e.seq.block_table, e.start + e.steps)
        it.steps = longest

    def _make_room(self, seq: Any, num_tokens: int, it: Iteration) -> bool:
        """Preempt newest-first until `seq` can cover `num_tokens`; False if `seq` itself went."""
        while not self.blocks.can_grow(seq.block_table, num_tokens):
            if len(self.running) == 1:  # alone with the pool and still short
                if self._unshare_waiting():
                    continue
                raise SequenceTooLong(seq, num_tokens)
            victim = self.running.pop()
            self._leave(victim)
            self.blocks.free(victim.block_table)
            victim.num_computed = 0  # its KV is gone: recompute everything when it rejoins
            if self.prefix_cache is not None:  # (its prompt blocks stay cached: it may find them again)
                self.prefix_cache.preempted(victim)
            # Tail first + appendleft: several preempted sequences keep their arrival order,
            # ahead of every later arrival.
            self.waiting.appendleft(victim)
            it.preempted.append(victim)
            self.num_preemptions += 1
            if victim is seq:
                return False
        return True

    def _leave(self, seq: Any) -> None:
        """`seq` leaves the running batch: its state slot (if any) is free again."""
        if self.free_state_slots is not None:
            self.free_state_slots.append(seq.state_slot)
            seq.state_slot = -1

    def _unshare_waiting(self) -> bool:
        """Waiting forks drop the shared prompt blocks they hold (to recompute them later), so a
        sequence that needs the whole pool gets it; whether any were held."""
        released = False
        for seq in self.waiting:
            if seq.block_table:
                self.blocks.free(seq.block_table)
                seq.num_computed = 0
                if self.prefix_cache is not None:
                    self.prefix_cache.preempted(seq)
                released = True
        return released

    def _admit(self, it: Iteration, budget: int) -> None:
        """Waiting sequences join first-come-first-served, as chunks when the budget is short;
        with prefix caching, one holding no blocks starts past its prompt's cached prefix."""
        cache, block_size = self.prefix_cache, self.blocks.block_size
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            seq = self.waiting[0]
            # (A fork holds its leader's blocks already: it is not looked up.)
            cached = cache.match(seq) if cache is not None and not seq.block_table else None
            start = len(cached) * block_size if cached else seq.num_computed
            num_new = min(seq.num_tokens - start, budget)
            if self.whole_prompts and num_new < seq.num_tokens - start:
                break  # (a later iteration has the budget: never skip ahead of the oldest waiting sequence)
            if cached:
                fits = self.blocks.can_take(cached, start + num_new)
            else:
                fits = self.blocks.can_grow(seq.block_table, start + num_new)
            if not fits:
                if not self.running and not self._unshare_waiting():  # the whole pool is free and still too small
                    raise SequenceTooLong(seq, start + num_new)
                if not self.running:
                    continue
                break  # never skip ahead of the oldest waiting sequence
            self.waiting.popleft()
            if cached is not None:
                it.cache_lookups.append(cache.admit(seq, cached))
            self.blocks.grow(seq.block_table, seq.num_computed + num_new)
            self.running.append(seq)
            if self.free_state_slots is not None:
                seq.state_slot = self.free_state_slots.pop()
            it.admitted.append(seq)
            it._add(seq, num_new)
            budget -= num_new

    def commit(self, it: Iteration) -> None:
        """The engine ran `it`: the KV of every scheduled token is now in the cache."""
        for e in it.all():
            if e.seq.num_computed != e.start:
                raise RuntimeError("iteration committed twice, or a stale iteration")
            e.seq.num_computed += e.num_new * e.steps
        if self.prefix_cache is not None:
            self.prefix_cache.commit()  # full prompt blocks computed by `it` can be reused from now on
        if self._forking:
            for e in it.prefill + it.decode:
                entry = self._forking.get(id(e.seq))
                if entry is not None and e.seq.num_computed >= entry[2]:
                    self._fork(e.seq)

    def finish(self, seq: Any) -> None:
        """Remove a sequence that finished, failed or was cancelled, and free its blocks now."""
        # By identity: the engine's sequences may be dataclasses that compare equal by value.
        if any(s is seq for s in self.running):
            self._leave(seq)
        self.running = [s for s in self.running if s is not seq]
        self.waiting = deque(s for s in self.waiting if s is not seq)
        self.blocks.free(seq.block_table)
        if self.prefix_cache is not None:
            self.prefix_cache.forget(seq)
        if self._forking:
            entry = self._forking.pop(id(seq), None)
            if entry is not None:  # it left before its prompt was shared: its forks go alone
                self.waiting.extendleft(reversed(entry[1]))
            for key, (leader, forks, shared) in list(self._forking.items()):
                if any(f is seq for f in forks):  # a fork that leaves before it forked
                    forks[:] = [f for f in forks if f is not seq]
                    if not forks:
                        del self._forking[key]
