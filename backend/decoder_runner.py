"""Runs one scheduled decoder iteration on the model: by CUDA-graph replay when every entry is
a one-token decode that fits a captured bucket, eagerly otherwise (prompt chunks, CPU)."""
from __future__ import annotations

import torch

from tritonformer.backend.decode_graphs import DecodeGraphs
from tritonformer.backend.decoder_batch import BatchEntry, build_batch
from tritonformer.backend.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel


class DecoderRunner:
    def __init__(self, model: DecoderModel, cache: PagedKVCache, max_running: int, cuda_graphs: bool = True):
        self.model = model
        self.cache = cache
        self.graphs = None
        if cuda_graphs and model.device.type == "cuda":
            max_blocks = -(-model.config.max_position_embeddings // cache.block_size)
            self.graphs = DecodeGraphs(model, cache, max_running, max_blocks)

    def warm_up(self) -> None:
        """First-call costs before the model reports READY, not on a request: kernel compilation
        for each attention launch configuration (chunks of a few, tens, hundreds of queries;
        decode rows beside a chunk) and the capture of every decode graph. Uses the first blocks
        of the pool, which no sequence holds yet."""
        bs = self.cache.block_size
        longest = self.model.config.max_position_embeddings - 1
        for n in (2, 20, 40, 100, 600):
            n = min(n, longest)
            self.run([BatchEntry([0] * n, 0, list(range(-(-n // bs))), True)])
        self.run([BatchEntry([0], 1, [0], True), BatchEntry([0] * 20, 0, list(range(1, 1 + -(-20 // bs))), True)])
        if self.graphs is not None:
            self.graphs.warm_up()

    @torch.inference_mode()
    def run(self, entries: list[BatchEntry]) -> torch.Tensor:
        """fp32 logits `[S, vocab]`, one row per entry with `sample`, in entry order."""
        if self.graphs is not None and all(len(e.tokens) == 1 and e.sample for e in entries):
            if self.graphs.bucket(len(entries)) is not None:
                return self.graphs.run(entries)
        return self.model.forward(build_batch(entries, self.cache.block_size, self.model.device), self.cache)
