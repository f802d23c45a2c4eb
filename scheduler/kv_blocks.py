"""KV cache block accounting (vLLM's PagedAttention, the bookkeeping half).

The KV cache is one pool of fixed-size blocks of `block_size` token slots each. A sequence owns
a *block table*: the list of block ids that hold its keys/values, in token order. Blocks are
handed out one at a time as the sequence grows, so memory is reserved for tokens that exist,
not for the longest possible output: waste is at most one partly filled block per sequence,
and many more sequences fit in the same memory than with one contiguous max-length buffer each.

Blocks are reference-counted: the n samples of one request (n > 1) share the blocks that hold
their common prompt (`share`), so it is computed and stored once. A shared block is always a
full one that nobody writes again; a block returns to the pool when its last holder frees it.

Prefix caching (see prefix_cache.py) adds *cached* blocks: a full, computed block may be given
a key (`cache`) that says which tokens it holds; a later sequence finds it by that key
(`lookup`) and holds it too (`take`). When its last holder frees a cached block it is not
returned to the pool at once but kept *idle*, its keys/values intact, for a later request to
reuse. Idle blocks still count as free: when the pool has no other free block, `grow` evicts
the least recently released idle block (its key is forgotten first, so nothing can match the
old contents once new ones are written). A block held by anyone is never evicted.

This module only decides *which* block ids a sequence owns; the backend owns the tensors and
indexes them with the block table. Pure Python, no torch.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class OutOfBlocks(RuntimeError):
    """The pool has too few free blocks for the requested growth (nothing was allocated)."""


class BlockManager:
    """Fixed-size KV blocks (ids 0..num_blocks-1) handed to sequences on demand."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # A stack of free ids: O(1) per block, and the most recently freed block is reused
        # first (its cache lines are the likeliest to be warm). Reversed so that a fresh pool
        # hands out 0, 1, 2, ... which makes tests and logs easy to read.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # block -> how many block tables hold it. Also catches bugs: freeing a block more often
        # than it was handed out would give it to two sequences later, and they would silently
        # overwrite each other's keys/values.
        self._refs: dict[int, int] = {}
        # Cached blocks (prefix caching): block <-> key, and those nobody holds, in the order
        # they are to be evicted (least recently released first). Empty without prefix caching.
        self._key_of: dict[int, Hashable] = {}
        self._block_of: dict[Hashable, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()
        self.num_evicted = 0  # idle cached blocks handed out again (their contents overwritten)

    @property
    def num_free(self) -> int:
        """Blocks a sequence may take: never handed out, or idle cached ones (evicted on demand)."""
        return len(self._free) + len(self._idle)

    @property
    def num_used(self) -> int:
        return len(self._refs)

    @property
    def num_cached(self) -> int:
        """Blocks with a key, held or idle."""
        return len(self._key_of)

    @property
    def num_idle(self) -> int:
        """Cached blocks nobody holds (part of num_free)."""
        return len(self._idle)

    def refcount(self, block: int) -> int:
        """How many block tables hold `block` (0: free, or idle in the cache)."""
        return self._refs.get(block, 0)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def _missing(self, table: list[int], num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(table))

    def can_grow(self, table: list[int], num_tokens: int) -> bool:
        """Whether enough blocks are free for `table` to cover `num_tokens` tokens."""
        return self._missing(table, num_tokens) <= len(self._free) + len(self._idle)

    def grow(self, table: list[int], num_tokens: int) -> None:
        """Append free block ids to `table` (in place) until it covers `num_tokens` tokens.

        All or nothing: if the pool is short, raise OutOfBlocks and leave `table` and the pool
        untouched, so the caller can preempt someone and retry without undoing half a growth.
        Never-used blocks go first; idle cached ones are evicted only when those run out.
        """
        missing = self._missing(table, num_tokens)
        if missing > len(self._free) + len(self._idle):
            raise OutOfBlocks(f"need {missing} blocks, {self.num_free} free")
        for _ in range(missing):
            block = self._free.pop() if self._free else self._evict()
            self._refs[block] = 1
            table.append(block)

    def _evict(self) -> int:
        """The least recently released idle cached block, its key forgotten."""
        block, _ = self._idle.popitem(last=False)
        del self._block_of[self._key_of.pop(block)]
        self.num_evicted += 1
        return block

    def share(self, table: list[int], num_blocks: int) -> list[int]:
        """A new block table holding the first `num_blocks` blocks of `table` too (their
        reference counts go up): another sequence reads the same keys/values. Only full blocks
        that nobody writes again may be shared (the caller's rule)."""
        if num_blocks > len(table):
            raise ValueError(f"cannot share {num_blocks} blocks of a table of {len(table)}")
        shared = table[:num_blocks]
        for block in shared:
            if block not in self._refs:
                raise ValueError(f"sharing block {block}, which is not allocated")
            self._refs[block] += 1
        return shared

    # ---- cached blocks (prefix caching) -------------------------------------------------
    def lookup(self, key: Hashable) -> int | None:
        """The cached block with `key`, held or idle; None if there is none (never cached, or
        evicted)."""
        return self._block_of.get(key)

    def cache(self, block: int, key: Hashable) -> bool:
        """Give a held, full, computed block `key`, so that `lookup(key)` finds it from now on.
        False (and nothing changes) if another block already has `key` (two sequences computed
        the same tokens at once: the first to offer it stays) or this block already has a key."""
        if block not in self._refs:
            raise ValueError(f"caching block {block}, which is not allocated")
        if key in self._block_of or block in self._key_of:
            return False
        self._block_of[key] = block
        self._key_of[block] = key
        return True

    def evict_idle(self) -> int:
        """Forget every cached block nobody holds (they become plain free blocks); returns how
        many. Held cached blocks keep their keys. For a measurement that must start with an
        empty cache on a warm engine (a timed pass after an untimed one of the same prompts)."""
        count = len(self._idle)
        while self._idle:
            self._free.append(self._evict())
        self.num_evicted -= count  # dropped on request, not evicted for want of blocks
        return count

    def can_take(self, cached: list[int], num_tokens: int) -> bool:
        """Whether a new table holding the cached blocks `cached` could grow to `num_tokens`
        tokens (an idle one among them stops being free once taken)."""
        idle = sum(1 for block in cached if block in self._idle)
        return self.blocks_for(num_tokens) - len(cached) <= len(self._free) + len(self._idle) - idle

    def take(self, cached: list[int]) -> list[int]:
        """A new block table holding the cached blocks `cached` (found by `lookup`): their
        reference counts go up, idle ones are held again and can no longer be evicted."""
        for block in cached:
            if block not in self._key_of:
                raise ValueError(f"taking block {block}, which is not cached")
        for block in cached:
            if block in self._refs:
                self._refs[block] += 1
            else:
                del self._idle[block]
                self._refs[block] = 1
        return list(cached)

    def free(self, table: list[int]) -> None:
        """Drop `table`'s hold on each of its blocks and clear the list in place; a block nobody
        else holds goes back to the pool (a cached one stays idle, see the module docstring).

        Raises ValueError (and frees nothing) on a block that is not currently allocated, or
        listed twice: either means two owners think they hold the same block.
        """
        if len(set(table)) != len(table) or any(b not in self._refs for b in table):
            bad = [b for b in table if b not in self._refs] or table
            raise ValueError(f"freeing blocks not allocated (or listed twice): {bad}")
        released = None
        for block in table:
            left = self._refs[block] - 1
            if left:
                self._refs[block] = left
            else:
                del self._refs[block]
                if block in self._key_of:
                    (released := released or []).append(block)
                else:
                    self._free.append(block)
        if released:
            # A table's later blocks are evicted before its earlier ones: a block is only
            # reachable through the blocks before it, so the chain's head is the most worth keeping.
            for block in reversed(released):
                self._idle[block] = None
        table.clear()
