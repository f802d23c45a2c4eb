"""Sort-window batching (what the infinity embedding server does), as a comparison policy.

Look at the oldest `window` queued requests only, order them by length, cut that order into
consecutive batches within the caps, and run the batch that holds the oldest request: similar
lengths go together (less padding on a padded runtime), the oldest request is never passed over,
and nothing outside the window is considered (a bounded, cheap decision).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice


@dataclass(frozen=True)
class SortWindowPolicy:
    window: int = 64
    max_sequences: int = 64
    max_tokens: int = 16384

    def __post_init__(self):
        if self.window < 1 or self.max_sequences < 1 or self.max_tokens < 1:
            raise ValueError("window, max_sequences and max_tokens must be >= 1")

    def ready(self, queue: deque, now: float) -> bool:
        return bool(queue)  # hungry, like the FIFO policy

    def wait_timeout(self, queue: deque, now: float) -> float | None:
        return None

    def take(self, queue: deque, now: float = 0.0) -> list:
        """Pop the batch holding the oldest request (items have `.lengths`)."""
        head = list(islice(queue, self.window))
        order = sorted(range(len(head)), key=lambda i: max(head[i].lengths, default=0))
        batches: list[list[int]] = [[]]
        seqs = tokens = 0
        for i in order:
            n, t = len(head[i].lengths), sum(head[i].lengths)
            if batches[-1] and (seqs + n > self.max_sequences or tokens + t > self.max_tokens):
                batches.append([])
                seqs = tokens = 0
            batches[-1].append(i)
            seqs += n
            tokens += t
        chosen = next(b for b in batches if 0 in b)
        picked = {id(head[i]) for i in chosen}
        batch = [item for item in head if id(item) in picked]  # arrival order within the batch
        rest = [item for item in queue if id(item) not in picked]
        queue.clear()
        queue.extend(rest)
        return batch
