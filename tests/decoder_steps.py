"""Drive a decoder model by hand, iteration by iteration, over a paged cache (no scheduler):
what the engine does, reduced to the model's contract, so tests can compare each step with
Hugging Face."""
from __future__ import annotations

import torch

from tritonformer.backend.decoder.batch import BatchEntry, build_batch
from tritonformer.scheduler.kv_blocks import BlockManager


class PagedSteps:
    def __init__(self, model, num_blocks: int = 128, block_size: int = 4):
        self.model = model
        self.cache = model.new_kv_cache(num_blocks, block_size)
        self.cache.state = model.new_state_cache(8)  # (a hybrid model's recurrent state: a slot per sequence)
        self.blocks = BlockManager(num_blocks, block_size)
        self.tables: dict = {}
        self.lengths: dict = {}
        self.slots: dict = {}

    def step(self, work: list[tuple[object, list[int]]]) -> torch.Tensor:
        """work: (sequence key, its new tokens) pairs. Returns each pair's last-token logits,
        in the order given (the batch itself puts one-token entries first, as the engine does)."""
        order = sorted(range(len(work)), key=lambda i: len(work[i][1]) != 1)
        entries = []
        for i in order:
            key, tokens = work[i]
            table = self.tables.setdefault(key, [])
            start = self.lengths.get(key, 0)
            self.blocks.grow(table, start + len(tokens))
            slot = -1
            if self.cache.state is not None:
                slot = self.slots.setdefault(key, len(self.slots))
                if start == 0:  # (what the runner does before a sequence's first token)
                    self.cache.state.reset([slot])
            entries.append(BatchEntry(list(tokens), start, table, True, slot))
        logits = self.model.forward(build_batch(entries, self.cache.block_size, self.model.device), self.cache)
        for key, tokens in work:
            self.lengths[key] = self.lengths.get(key, 0) + len(tokens)
        out = torch.empty_like(logits)
        out[order] = logits
        return out

    def greedy(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        """Greedy continuations of all prompts decoded together, one iteration per token."""
        outputs = [[] for _ in prompts]
        work = [(i, p) for i, p in enumerate(prompts)]
        for _ in range(new_tokens):
            nxt = self.step(work).argmax(-1).tolist()
            for out, t in zip(outputs, nxt):
                out.append(t)
            work = [(i, [t]) for i, t in enumerate(nxt)]
        return outputs


def check_joining_iterations_match(hf, model, prompts: list[list[int]]) -> None:
    """Three sequences join at different iterations, the third's prompt in two chunks, prefill
    chunks and decodes share iterations, keys cross block boundaries (4-token blocks); each
    step's last-token logits equal HF's on the whole sequence so far (fp32)."""
    first, second, third = prompts
    steps = [
        [(0, first)],
        [(0, [5]), (1, second), (2, third[:10])],
        [(0, [6]), (1, [7]), (2, third[10:])],
        [(1, [8]), (2, [9]), (0, [10])],
    ]
    run = PagedSteps(model, block_size=4)
    history = {0: [], 1: [], 2: []}
    for step in steps:
        logits = run.step(step)
        with torch.no_grad():
            for row, (seq, toks) in enumerate(step):
                history[seq] += toks
                ref = hf(torch.tensor([history[seq]])).logits[0, -1]
                torch.testing.assert_close(logits[row], ref, atol=1e-4, rtol=1e-4)
