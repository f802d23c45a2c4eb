"""Automatic prefix caching: a new request reuses the KV blocks of a prompt prefix already
computed (vLLM's automatic prefix caching; SGLang's RadixAttention does the same with a tree).

Chat and RAG traffic repeats long prefixes: a system prompt, few-shot examples, a retrieved
document. The keys/values of a token depend only on it and the tokens before it, so a block of
`block_size` prompt tokens computed for one request holds exactly what another request with the
same first tokens would compute. Each *full* prompt block gets a key: a hash of its tokens and
of every token before them (a chain: SHA-256 over the prompt up to the block's end, so equal
keys mean equal prefixes, whoever sends them). When a sequence joins, the longest run of its
leading blocks whose keys are cached is taken (the blocks' reference counts go up, see
kv_blocks.py), `num_computed` starts past them, and only the rest of the prompt runs.

Rules that keep it exact:

- A block is offered to others (given its key) only once its keys/values are computed: at
  `commit`, after the engine ran the iteration that filled it, never while its tokens are still
  to run. Later iterations read it after that one on the device's stream.
- A cached block is full and never written again: a sequence writes only past `num_computed`,
  which starts at a block boundary after a hit, and its last known token always runs (it gives
  the logits of the next sample), so a prompt that is all full blocks reuses all but its last.
- Only prompt blocks are cached. A generated token reaches the host one iteration after its
  keys/values are written (the engine runs one iteration ahead), so a block of generated tokens
  is not known in time to be keyed; a preempted sequence still finds its prompt again.
- Nobody's blocks are freed while held; idle cached blocks (held by nobody) stay until the
  pool runs out of never-used ones, and are then evicted least recently released first, their
  keys forgotten before they are handed out (kv_blocks.py), so an overwritten block is never
  matched.

Pure Python (hashlib, no torch): the scheduler calls it; the engine only reads its counts.
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Any

from .kv_blocks import BlockManager


class _PromptKeys:
    """The keys of one prompt's full blocks, hashed as far as needed so far (a sequence that
    matches nothing past its first block, or is cancelled early, never pays for the rest)."""

    __slots__ = ("owner", "data", "hasher", "keys", "num_full", "registered")

    def __init__(self, owner: Any, prompt_ids: list[int], block_size: int):
        self.owner = owner  # the sequence (kept by id: a dead sequence's id may be reused)
        self.num_full = len(prompt_ids) // block_size
        # int64 bytes of the prompt: equal token lists give equal bytes, whatever the vocabulary.
        self.data = memoryview(array("q", prompt_ids[: self.num_full * block_size]).tobytes())
        self.hasher = hashlib.sha256()
        self.keys: list[bytes] = []
        self.registered = 0  # the first blocks of the sequence's table known to be in the cache

    def key(self, index: int, block_size: int) -> bytes:
        """Key of full block `index` (< num_full): SHA-256 of the prompt's first (index+1) blocks."""
        keys, step = self.keys, 8 * block_size
        while len(keys) <= index:
            n = len(keys)
            self.hasher.update(self.data[n * step : (n + 1) * step])
            keys.append(self.hasher.copy().digest())
        return keys[index]


class PrefixCache:
    """Matches sequences' prompts against the cached blocks of a BlockManager and offers their
    own full prompt blocks once computed. Counts queries, hits and hit tokens (totals)."""

    def __init__(self, blocks: BlockManager):
        self.blocks = blocks
        self._prompts: dict[int, _PromptKeys] = {}  # id(seq) -> its prompt's keys, until `forget`
        # Sequences with full prompt blocks computed or still to compute that are not yet in
        # the cache; commit looks at these only (none once every prompt is in: decoding is free).
        self._filling: dict[int, Any] = {}
        self.queries = 0  # sequences looked up (each admission; a preempted one again)
        self.hits = 0  # of them, those that reused at least one block
        self.hit_tokens = 0  # prompt tokens not computed thanks to the cache

    def _keys(self, seq: Any) -> _PromptKeys:
        keys = self._prompts.get(id(seq))
        if keys is None or keys.owner is not seq:
            keys = self._prompts[id(seq)] = _PromptKeys(seq, seq.prompt_ids, self.blocks.block_size)
        return keys

    def match(self, seq: Any) -> list[int]:
        """The cached blocks holding `seq`'s longest cached prefix, leaving at least its last
        known token to compute (nothing is taken yet: see `admit`)."""
        keys, block_size = self._keys(seq), self.blocks.block_size
        limit = min(keys.num_full, (seq.num_tokens - 1) // block_size)
        found = []
        for i in range(limit):
            block = self.blocks.lookup(keys.key(i, block_size))
            if block is None:
                break
            found.append(block)
        return found

    def admit(self, seq: Any, cached: list[int]) -> int:
        """`seq` (holding no blocks) joins with the blocks `match` found: it holds them and
        starts past them. Returns the tokens reused (0: a miss)."""
        keys = self._keys(seq)
        seq.block_table = self.blocks.take(cached)
        seq.num_computed = reused = len(cached) * self.blocks.block_size
        keys.registered = len(cached)
        if keys.registered < keys.num_full:
            self._filling[id(seq)] = seq
        self.queries += 1
        if reused:
            self.hits += 1
            self.hit_tokens += reused
        return reused

    def commit(self) -> None:
        """The engine ran an iteration: every full prompt block now computed joins the cache."""
        if not self._filling:
            return
        block_size, done = self.blocks.block_size, []
        for key, seq in self._filling.items():
            keys = self._prompts[key]
            computed = min(seq.num_computed // block_size, keys.num_full, len(seq.block_table))
            for i in range(keys.registered, computed):
                self.blocks.cache(seq.block_table[i], keys.key(i, block_size))
            if computed > keys.registered:
                keys.registered = computed
            if keys.registered == keys.num_full:
                done.append(key)
        for key in done:
            del self._filling[key]

    def preempted(self, seq: Any) -> None:
        """`seq` lost its blocks (preempted, or a fork unshared): nothing to offer until it
        joins again (its keys are kept: it looks its prompt up again then)."""
        self._filling.pop(id(seq), None)

    def forget(self, seq: Any) -> None:
        """`seq` left the scheduler: drop what is kept about it (its blocks stay cached)."""
        self._prompts.pop(id(seq), None)
        self._filling.pop(id(seq), None)
