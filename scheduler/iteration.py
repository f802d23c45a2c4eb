"""Iteration-level scheduling for decoders (Orca's shape, simple policy).

Every model iteration the scheduler picks which sequences run: all running sequences decode one
token, and waiting sequences join first-come-first-served while there is room (a cap on running
sequences and a token budget per iteration, so a burst of long prompts cannot stall decoding
for long). Sequences join and leave between iterations. Pure Python: the engine supplies the
sequences (anything with `num_prompt_tokens`) and runs the model.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol


class DecoderWork(Protocol):
    @property
    def num_prompt_tokens(self) -> int: ...


@dataclass
class Iteration:
    prefill: list = field(default_factory=list)  # join this iteration: run their whole prompt
    decode: list = field(default_factory=list)  # already running: one new token each

    @property
    def num_tokens(self) -> int:
        return sum(s.num_prompt_tokens for s in self.prefill) + len(self.decode)

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)


class IterationScheduler:
    def __init__(self, max_running: int = 32, max_tokens_per_iteration: int = 4096):
        if max_running < 1 or max_tokens_per_iteration < 1:
            raise ValueError("max_running and max_tokens_per_iteration must be >= 1")
        self.max_running = max_running
        self.max_tokens_per_iteration = max_tokens_per_iteration
        self.waiting: deque = deque()
        self.running: list = []

    def add(self, seq) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Iteration:
        it = Iteration(decode=list(self.running))
        budget = self.max_tokens_per_iteration - len(it.decode)
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting[0]
            # FCFS: never skip ahead of the oldest waiting sequence. A prompt longer than the
            # whole budget still runs, alone, so it cannot wait forever.
            too_big = seq.num_prompt_tokens > budget
            if too_big and (it.prefill or it.decode):
                break
            self.waiting.popleft()
            self.running.append(seq)
            it.prefill.append(seq)
            budget -= seq.num_prompt_tokens
        return it

    def finish(self, seq) -> None:
        """Remove a sequence that finished, failed or was cancelled (running or waiting)."""
        if seq in self.running:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
