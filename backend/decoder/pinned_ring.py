"""Pinned host buffers, pinned once and used in turn, for the copies of every decode iteration.

An asynchronous copy between the host and the GPU must use pinned memory: from pageable
memory it synchronises the stream, which would undo the engine's one-iteration-ahead overlap.
Pinning a fresh buffer per copy (torch's `pin_memory()`, or `torch.empty(pin_memory=True)`)
costs tens of microseconds of host time on a server CPU, several times per iteration; at
batch 64 the host's share of an iteration is what the GPU waits for. So each copy direction
owns a few buffers pinned at start-up and takes them in turn.

A buffer is handed out again only after the event recorded with its last copy has completed
(in the engine that is long done: two iterations have passed), so a queued copy never sees
its buffer change under it. `uses` counts hand-outs, so a reader can check that what it reads
was not handed out again since.
"""
from __future__ import annotations

import torch


class PinnedRing:
    def __init__(self, nbytes: int, depth: int = 2):
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(depth)]
        self.arrays = [b.numpy() for b in self.buffers]  # the same memory, for numpy writes and reads
        self.events = [torch.cuda.Event() for _ in range(depth)]
        self.uses = [0] * depth
        self._next = 0

    def take(self) -> int:
        """The index of the next buffer, once its last copy has run."""
        i = self._next
        self._next = (i + 1) % len(self.buffers)
        self.events[i].synchronize()  # (an event never recorded returns at once)
        self.uses[i] += 1
        return i

    def copied(self, i: int) -> None:
        """A copy from or to buffer `i` was just queued on the current stream."""
        self.events[i].record()
