"""Runs one scheduled decoder iteration on the model: by CUDA-graph replay when every entry is
a one-token decode that fits a captured bucket, eagerly otherwise (prompt chunks, CPU).

Nothing here waits for the GPU. The engine launches iteration i+1 before it reads iteration
i's tokens on the host (its scheduling and bookkeeping then overlap the GPU's work), so i+1's
inputs cannot hold those tokens yet: they name them as `fed_token(row)`, the row of the sample
in iteration i, and the first kernel of the forward (`feed_tokens`) reads them from
`last_ids`, where `sample` (or the decode graph's own argmax) left them on the device.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from tritonformer import kernels
from tritonformer.backend.decode_graphs import DecodeGraphs
from tritonformer.backend.decoder_batch import BatchEntry, build_batch
from tritonformer.backend.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel
from tritonformer.backend.pinned_ring import PinnedRing
from tritonformer.backend.sampling import Sampler, SamplingParams


def fed_token(row: int) -> int:
    """The input id that stands for the previous iteration's sample in row `row`."""
    return -1 - row


class Forward(NamedTuple):
    """A launched forward: logits, one row per sampling entry in entry order (fp32; a graph
    replay's are in the model's dtype, with rows past them where the bucket padded the batch);
    `greedy_ids` (a graph replay only) is every row's argmax, already in last_ids."""

    logits: torch.Tensor
    greedy_ids: torch.Tensor | None = None


class SampledTokens:
    """One iteration's sampled ids, on their way to the host."""

    def __init__(self, ids: torch.Tensor | None, count: int, ring: PinnedRing | None = None, index: int = 0):
        self._ids, self._count, self._ring, self._index = ids, count, ring, index
        if ring is not None:
            self._use = ring.uses[index]

    def wait(self) -> list[int]:
        """The first `count` ids as Python ints (waits for the iteration that produced them, and
        only it)."""
        ring = self._ring
        if self._count == 0:
            return []
        if ring is None:
            return self._ids[: self._count].tolist()
        if ring.uses[self._index] != self._use:
            raise RuntimeError("sampled ids read after their host buffer was reused: read iteration i "
                               "before launching iteration i + 2")
        ring.events[self._index].synchronize()
        return ring.arrays[self._index].view(np.int64)[: self._count].tolist()


class DecoderRunner:
    def __init__(self, model: DecoderModel, cache: PagedKVCache, max_running: int, cuda_graphs: bool = True):
        self.model = model
        self.cache = cache
        # The last iteration's samples (at most one per running sequence), for fed tokens.
        self.last_ids = torch.zeros(max_running, dtype=torch.long, device=model.device)
        self.graphs = None
        self._to_host = None
        if model.device.type == "cuda":
            self._to_host = PinnedRing(self.last_ids.numel() * self.last_ids.element_size())
            self._host_views: dict[tuple[int, int], torch.Tensor] = {}
            if cuda_graphs:
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
    def run(self, entries: list[BatchEntry]) -> Forward:
        """Launch the forward of `entries` (one logits row per entry with `sample`). Token ids
        may be `fed_token(row)`s of the last iteration's samples."""
        if self.graphs is not None and all(len(e.tokens) == 1 and e.sample for e in entries):
            if self.graphs.bucket(len(entries)) is not None:
                return Forward(*self.graphs.run(entries))
        batch = build_batch(entries, self.cache.block_size, self.model.device)
        kernels.feed_tokens(batch.input_ids, self.last_ids)
        return Forward(self.model.forward(batch, self.cache))

    @torch.inference_mode()
    def sample(self, forward: Forward, sampler: Sampler, params: list[SamplingParams], keys: list[int]) -> SampledTokens:
        """Sample one id per row of `params`, keep them on the device for the next iteration's
        fed tokens, and start their copy to the host."""
        n = len(params)
        if n == 0:  # only prompt chunks that do not reach their end
            return SampledTokens(None, 0)
        if forward.greedy_ids is not None and all(p.greedy for p in params):
            return self._start_copy(forward.greedy_ids, n)  # the replay sampled them already
        ids = sampler.sample_ids(forward.logits[:n], params, keys)
        self.last_ids[:n].copy_(ids)
        return self._start_copy(ids, n)

    def _start_copy(self, ids: torch.Tensor, count: int) -> SampledTokens:
        """Copy `ids` (count of them wanted) to the host without waiting for them."""
        ring = self._to_host
        if ring is None:
            return SampledTokens(ids, count)
        i = ring.take()
        key = (i, ids.numel())
        view = self._host_views.get(key)
        if view is None:  # one view per buffer and size (the graph buckets): no slicing per copy
            view = self._host_views[key] = ring.buffers[i].view(torch.int64)[: ids.numel()]
        view.copy_(ids, non_blocking=True)
        ring.copied(i)
        return SampledTokens(None, count, ring, i)
