"""Sequence-length-aware activation allocator (TurboTransformers, PPoPP'21, Algorithm 1).

Intermediate tensors of a forward pass change size with every batch's token count. A caching
allocator keeps the largest footprint ever seen; allocating exactly per request costs time.
Instead, as soon as a batch's shape is known, we plan where every intermediate lives:

- each intermediate has a usage record (first op, last op, bytes) in the model's op order;
- records are placed largest first into chunks (2 MiB by default), best fit inside a chunk
  among the gaps left by tensors whose lifetimes overlap (greedy by size, offsets kept sorted:
  the paper's FindGapFromChunk is only correct with records visited in offset order);
- a tensor that fits in no chunk opens a new one of max(2 MiB, 1.2 x size);
- the plan is computed once per repeated layer (every encoder layer reuses it) and cached per
  shape; chunks no plan used are released immediately or after N idle inferences.

`plan_chunks` is the pure algorithm (no torch); `ActivationArena` owns the device memory.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

DEFAULT_CHUNK_BYTES = 2 * 1024 * 1024
NEW_CHUNK_SCALE = 1.2
ALIGN = 256  # bytes: every tensor starts on a boundary that vector loads and cuBLAS like


@dataclass(frozen=True)
class UsageRecord:
    name: str
    first_op: int
    last_op: int
    size: int  # bytes

    def overlaps(self, other: "UsageRecord") -> bool:
        return max(self.first_op, other.first_op) <= min(self.last_op, other.last_op)


@dataclass
class PlannedChunk:
    size: int
    placed: list[tuple[int, UsageRecord]] = field(default_factory=list)  # (offset, record), by offset

    def find_gap(self, t: UsageRecord) -> int | None:
        """Best-fit offset for `t` among tensors alive at the same time, or None."""
        smallest_gap, best, prev_end = None, None, 0
        for offset, x in self.placed:
            if not t.overlaps(x):
                continue
            gap = offset - prev_end
            if gap >= t.size and (smallest_gap is None or gap < smallest_gap):
                smallest_gap, best = gap, prev_end
            prev_end = max(prev_end, offset + x.size)
        if best is None and self.size - prev_end >= t.size:
            best = prev_end
        return best

    def place(self, offset: int, t: UsageRecord) -> None:
        self.placed.append((offset, t))
        self.placed.sort(key=lambda p: p[0])


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_chunks(
    records: list[UsageRecord], chunk_sizes: list[int], default_chunk: int = DEFAULT_CHUNK_BYTES
) -> tuple[dict[str, tuple[int, int]], list[int]]:
    """Algorithm 1 (MemAllocate). `chunk_sizes` are the chunks that exist already.

    Returns ({name: (chunk index, offset)}, sizes of all chunks after planning, new ones
    appended). Which existing chunks the plan leaves unused is for the caller to release."""
    chunks = [PlannedChunk(size) for size in chunk_sizes]
    where: dict[str, tuple[int, int]] = {}
    for t in sorted(records, key=lambda r: r.size, reverse=True):
        t = UsageRecord(t.name, t.first_op, t.last_op, _aligned(t.size))
        for i, chunk in enumerate(chunks):
            offset = chunk.find_gap(t)
            if offset is not None:
                chunk.place(offset, t)
                where[t.name] = (i, offset)
                break
        else:
            chunk = PlannedChunk(_aligned(max(default_chunk, int(t.size * NEW_CHUNK_SCALE))))
            chunk.place(0, t)
            chunks.append(chunk)
            where[t.name] = (len(chunks) - 1, 0)
    return where, [c.size for c in chunks]


def peak_live_bytes(records: list[UsageRecord]) -> int:
    """The most bytes alive at any one op: a lower bound on any plan's footprint."""
    if not records:
        return 0
    last = max(r.last_op for r in records)
    return max(sum(_aligned(r.size) for r in records if r.first_op <= op <= r.last_op) for op in range(last + 1))


@dataclass
class ArenaStats:
    reserved_bytes: int = 0
    in_use_bytes: int = 0  # bytes of the chunks the current plan uses
    plan_cache_hits: int = 0
    plan_cache_misses: int = 0
    planning_seconds: float = 0.0


class ActivationArena:
    """Device memory in chunks, handed out as views according to cached plans.

    `release_after_idle`: 0 releases a chunk as soon as an inference does not use it (the
    paper's policy); N > 0 keeps it for N more inferences (fewer re-allocations when lengths
    bounce around).
    """

    def __init__(self, device, release_after_idle: int = 0, default_chunk: int = DEFAULT_CHUNK_BYTES):
        import torch

        self._torch = torch
        self.device = device
        self.release_after_idle = release_after_idle
        self.default_chunk = default_chunk
        self._chunks: dict[int, object] = {}  # chunk id -> uint8 tensor, in creation order
        self._idle: dict[int, int] = {}  # chunk id -> inferences since it was last used
        self._next_id = 0
        self._plans: dict[tuple, dict[str, tuple[int, int]]] = {}  # name -> (chunk id, offset)
        self.stats = ArenaStats()

    def plan(self, records: list[UsageRecord]) -> dict[str, tuple[int, int]]:
        """Where each record lives, from the cache when this shape was planned before and its
        chunks still exist. Counts as one inference for the release policy."""
        key = tuple((r.name, r.first_op, r.last_op, r.size) for r in records)
        plan = self._plans.get(key)
        if plan is not None:
            self.stats.plan_cache_hits += 1
        else:
            start = time.perf_counter()
            # A chunk far larger than this plan's peak demand is not offered to it: otherwise one
            # long request's chunk would stay pinned by every short one after it, and never be
            # released (the paper's first fit over all chunks keeps it forever).
            limit = 2 * max(self.default_chunk, peak_live_bytes(records))
            ids = [c for c, t in self._chunks.items() if t.numel() <= limit]
            where, sizes = plan_chunks(records, [self._chunks[i].numel() for i in ids], self.default_chunk)
            for size in sizes[len(ids) :]:
                ids.append(self._next_id)
                self._chunks[self._next_id] = self._torch.empty(size, dtype=self._torch.uint8, device=self.device)
                self._idle[self._next_id] = 0
                self._next_id += 1
            plan = {name: (ids[index], offset) for name, (index, offset) in where.items()}
            self._plans[key] = plan
            self.stats.plan_cache_misses += 1
            self.stats.planning_seconds += time.perf_counter() - start
        self._after_inference({chunk for chunk, _ in plan.values()})
        return plan

    def view(self, plan: dict[str, tuple[int, int]], name: str, shape: tuple[int, ...], dtype):
        chunk, offset = plan[name]
        nbytes = math.prod(shape) * dtype.itemsize
        return self._chunks[chunk][offset : offset + nbytes].view(dtype).view(shape)

    def _after_inference(self, used: set[int]) -> None:
        for chunk in self._chunks:
            self._idle[chunk] = 0 if chunk in used else self._idle[chunk] + 1
        stale = [c for c, idle in self._idle.items() if idle > self.release_after_idle]
        for chunk in stale:
            del self._chunks[chunk], self._idle[chunk]
        if stale:  # plans that point into a released chunk are planned again when next needed
            self._plans = {k: p for k, p in self._plans.items() if all(c in self._chunks for c, _ in p.values())}
        self.stats.reserved_bytes = sum(t.numel() for t in self._chunks.values())
        self.stats.in_use_bytes = sum(self._chunks[c].numel() for c in used if c in self._chunks)


def buffer_getter(arena: ActivationArena | None, records: list[UsageRecord], widths: dict[str, int], rows: int,
                  device, dtype):
    """A forward's intermediates by name, each `[rows, width]`: views of the arena's plan for `records`, or,
    without an arena, tensors of their own. Returns the getter, `name -> tensor`."""
    if arena is None:
        import torch  # (this module's planning needs none)

        return lambda name: torch.empty((rows, widths[name]), device=device, dtype=dtype)
    plan = arena.plan(records)
    views = {name: arena.view(plan, name, (rows, width), dtype) for name, width in widths.items()}
    return views.__getitem__
