"""Runs one scheduled decoder iteration on the model: by CUDA-graph replay when every entry is
a one-token decode that fits a captured bucket, eagerly otherwise (prompt chunks, CPU).

Nothing here waits for the GPU. The engine launches iteration i+1 before it reads iteration
i's tokens on the host (its scheduling and bookkeeping then overlap the GPU's work), so i+1's
inputs cannot hold those tokens yet: they name them as `fed_token(row)`, the row of the sample
in iteration i, and the first kernel of the forward (`feed_tokens`) reads them from
`last_ids`, where `publish` left them on the device.
"""
from __future__ import annotations

import torch

from tritonformer import kernels
from tritonformer.backend.decode_graphs import DecodeGraphs
from tritonformer.backend.decoder_batch import BatchEntry, build_batch
from tritonformer.backend.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel


def fed_token(row: int) -> int:
    """The input id that stands for the previous iteration's sample in row `row`."""
    return -1 - row


class SampledTokens:
    """One iteration's sampled ids, on their way to the host."""

    def __init__(self, ids: torch.Tensor):
        if ids.is_cuda:
            self._host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self._host.copy_(ids, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()
        else:
            self._host, self._done = ids, None

    def wait(self) -> list[int]:
        """The ids as Python ints (waits for the iteration that produced them, and only it)."""
        if self._done is not None:
            self._done.synchronize()
        return self._host.tolist()


class DecoderRunner:
    def __init__(self, model: DecoderModel, cache: PagedKVCache, max_running: int, cuda_graphs: bool = True):
        self.model = model
        self.cache = cache
        # The last iteration's samples (at most one per running sequence), for fed tokens.
        self.last_ids = torch.zeros(max_running, dtype=torch.long, device=model.device)
        self.graphs = None
        if cuda_graphs and model.device.type == "cuda":
            max_blocks = -(-model.config.max_position_embeddings // cache.block_size)
            self.graphs = DecodeGraphs(model, cache, max_running, max_blocks, self.last_ids)

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
        """fp32 logits `[S, vocab]`, one row per entry with `sample`, in entry order. Token ids
        may be `fed_token(row)`s of the last `publish`ed samples."""
        if self.graphs is not None and all(len(e.tokens) == 1 and e.sample for e in entries):
            if self.graphs.bucket(len(entries)) is not None:
                return self.graphs.run(entries)
        batch = build_batch(entries, self.cache.block_size, self.model.device)
        kernels.feed_tokens(batch.input_ids, self.last_ids)
        return self.model.forward(batch, self.cache)

    @torch.inference_mode()
    def publish(self, ids: torch.Tensor) -> SampledTokens:
        """Keep this iteration's samples `[S]` on the device for the next iteration's fed tokens
        and start their copy to the host."""
        self.last_ids[: ids.numel()].copy_(ids)
        return SampledTokens(ids)
