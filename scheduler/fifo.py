"""First-in-first-out batching for encoder requests.

The simple policy of the walking skeleton: take queued requests in arrival order while the
batch stays within a sequence cap and a token cap. A request's texts always run in the same
batch; a request larger than the caps on its own runs alone rather than never.
(The dynamic-programming length batcher replaces this policy; it plugs in at `take`.)
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol, Sequence


class EncoderWork(Protocol):
    @property
    def lengths(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class FifoBatchPolicy:
    max_sequences: int = 64
    max_tokens: int = 16384

    def __post_init__(self):
        if self.max_sequences < 1 or self.max_tokens < 1:
            raise ValueError("max_sequences and max_tokens must be >= 1")

    def ready(self, queue: deque, now: float) -> bool:
        return bool(queue)  # hungry: whenever the runtime is free and something waits

    def wait_timeout(self, queue: deque, now: float) -> float | None:
        return None

    def take(self, queue: deque, now: float = 0.0) -> list:
        """Pop the next batch off the front of `queue` (items have `.lengths`)."""
        batch: list = []
        n_seqs = n_tokens = 0
        while queue:
            item = queue[0]
            seqs, tokens = len(item.lengths), sum(item.lengths)
            fits = n_seqs + seqs <= self.max_sequences and n_tokens + tokens <= self.max_tokens
            if batch and not fits:
                break
            batch.append(queue.popleft())
            n_seqs += seqs
            n_tokens += tokens
        return batch
