"""KV cache block accounting (vLLM's PagedAttention, the bookkeeping half).

The KV cache is one pool of fixed-size blocks of `block_size` token slots each. A sequence owns
a *block table*: the list of block ids that hold its keys/values, in token order. Blocks are
handed out one at a time as the sequence grows, so memory is reserved for tokens that exist,
not for the longest possible output: waste is at most one partly filled block per sequence,
and many more sequences fit in the same memory than with one contiguous max-length buffer each.

Blocks are reference-counted: the n samples of one request (n > 1) share the blocks that hold
their common prompt (`share`), so it is computed and stored once. A shared block is always a
full one that nobody writes again; a block returns to the pool when its last holder frees it.

This module only decides *which* block ids a sequence owns; the backend owns the tensors and
indexes them with the block table. Pure Python, no torch.
"""
from __future__ import annotations


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

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._refs)

    def refcount(self, block: int) -> int:
        """How many block tables hold `block` (0: free)."""
        return self._refs.get(block, 0)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def _missing(self, table: list[int], num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(table))

    def can_grow(self, table: list[int], num_tokens: int) -> bool:
        """Whether enough blocks are free for `table` to cover `num_tokens` tokens."""
        return self._missing(table, num_tokens) <= len(self._free)

    def grow(self, table: list[int], num_tokens: int) -> None:
        """Append free block ids to `table` (in place) until it covers `num_tokens` tokens.

        All or nothing: if the pool is short, raise OutOfBlocks and leave `table` and the pool
        untouched, so the caller can preempt someone and retry without undoing half a growth.
        """
        missing = self._missing(table, num_tokens)
        if missing > len(self._free):
            raise OutOfBlocks(f"need {missing} blocks, {len(self._free)} free")
        for _ in range(missing):
            block = self._free.pop()
            self._refs[block] = 1
            table.append(block)

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

    def free(self, table: list[int]) -> None:
        """Drop `table`'s hold on each of its blocks and clear the list in place; a block nobody
        else holds goes back to the pool.

        Raises ValueError (and frees nothing) on a block that is not currently allocated, or
        listed twice: either means two owners think they hold the same block.
        """
        if len(set(table)) != len(table) or any(b not in self._refs for b in table):
            bad = [b for b in table if b not in self._refs] or table
            raise ValueError(f"freeing blocks not allocated (or listed twice): {bad}")
        for block in table:
            left = self._refs[block] - 1
            if left:
                self._refs[block] = left
            else:
                del self._refs[block]
                self._free.append(block)
        table.clear()
