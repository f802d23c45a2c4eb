"""CUDA graphs of decode iterations, one per batch-size bucket (Nimble's ahead-of-time idea).

A decode iteration of a small model would be launch-bound: GPT-2 runs 126 kernels for one
token per sequence, most of them a few microseconds of work, less than a launch from Python
costs. Every bucket (1, 2, 4, ... up to the
running-sequence cap) is captured once at start-up against static input buffers; an iteration
with n decoding sequences copies its indices into the smallest bucket >= n and replays.
Padding rows have no keys (length 0) and write their key/value into the cache's scratch
block, so they change nothing a real sequence reads. The graph starts with `feed_tokens`, so a
token id may name a sample of the previous iteration still on the device (see DecoderRunner).
"""
from __future__ import annotations

import bisect

import numpy as np
import torch

from tritonformer import kernels
from tritonformer.backend.cuda_graphs import capture_graph
from tritonformer.backend.decoder_batch import BatchEntry, DecoderBatch
from tritonformer.backend.device import copy_to_device_
from tritonformer.backend.kv_cache import PagedKVCache
from tritonformer.kernels.gpu_info import sm_count


def decode_buckets(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    return [b for b in sizes if b < max_batch] + [max_batch]


def key_splits(batch: int, kv_heads: int, sm_count: int) -> int:
    """Key splits for a decode launch of `batch` sequences: enough programs to fill the GPU
    twice over (flash-decoding), fixed per bucket because a graph cannot choose at replay."""
    splits = 1
    while splits < 16 and batch * kv_heads * splits < 2 * sm_count:
        splits *= 2
    return splits


class DecodeGraphs:
    def __init__(self, model, cache: PagedKVCache, max_batch: int, max_blocks_per_seq: int, last_ids: torch.Tensor):
        self.model = model
        self.cache = cache
        self.last_ids = last_ids  # the previous iteration's samples, read by feed_tokens
        self.width = max_blocks_per_seq
        self.buckets = decode_buckets(max_batch)
        self._graphs: dict[int, tuple] = {}
        self._pool = None  # one memory pool shared by all graphs: they never run at once
        self.replays = 0

    def bucket(self, num_seqs: int) -> int | None:
        i = bisect.bisect_left(self.buckets, num_seqs)
        return self.buckets[i] if i < len(self.buckets) else None

    def warm_up(self) -> int:
        """Capture every bucket now, at start-up (largest first, so the shared pool is sized by
        it), not on a request's critical path. Returns the number of graphs."""
        for b in reversed(self.buckets):
            if b not in self._graphs:
                self._capture(b)
        return len(self._graphs)

    def run(self, entries: list[BatchEntry]) -> torch.Tensor:
        """Logits `[len(entries), vocab]` of one-token entries (each samples), by replay."""
        n = len(entries)
        b = self.bucket(n)
        graph, long_buf, int_buf, logits, _ = self._graphs.get(b) or self._capture(b)
        long_host, int_host = self.host_inputs(entries, b)
        copy_to_device_(long_buf, torch.from_numpy(long_host))
        copy_to_device_(int_buf, torch.from_numpy(int_host))
        graph.replay()
        self.replays += 1
        return logits[:n]

    def host_inputs(self, entries: list[BatchEntry], b: int) -> tuple[np.ndarray, np.ndarray]:
        """The static buffers' contents for `entries` padded to bucket `b`: token ids, positions
        and cache slots (int64), key counts and block tables (int32)."""
        n = len(entries)
        bs = self.cache.block_size
        positions = [e.start for e in entries]
        long_host = np.empty(3 * b, dtype=np.int64)
        long_host[:n] = [e.tokens[0] for e in entries]
        long_host[n:b] = 0
        long_host[b : b + n] = positions
        long_host[b + n : 2 * b] = 0
        long_host[2 * b : 2 * b + n] = [e.block_table[p // bs] * bs + p % bs for e, p in zip(entries, positions)]
        long_host[2 * b + n :] = self.cache.scratch_slot
        int_host = np.zeros(b + b * self.width, dtype=np.int32)
        int_host[:n] = positions
        int_host[:n] += 1  # keys per sequence, this token's included
        tables = int_host[b:].reshape(b, self.width)
        for row, e in zip(tables, entries):
            row[: len(e.block_table)] = e.block_table
        return long_host, int_host

    def _capture(self, b: int):
        dev = self.model.device
        long_buf = torch.zeros(3 * b, dtype=torch.long, device=dev)
        long_buf[2 * b :] = self.cache.scratch_slot
        int_buf = torch.zeros(b + b * self.width, dtype=torch.int32, device=dev)
        batch = DecoderBatch(
            input_ids=long_buf[:b], positions=long_buf[b : 2 * b], slot_mapping=long_buf[2 * b :],
            logits_index=torch.arange(b, device=dev), logits_every_row=True, num_decode=b,
            decode_tables=int_buf[b:].view(b, self.width), decode_seqlens=int_buf[:b],
            decode_cu_q=torch.arange(b + 1, dtype=torch.int32, device=dev),
            decode_splits=key_splits(b, self.model.config.num_kv_heads, sm_count(dev)),
        )

        def forward():
            kernels.feed_tokens(batch.input_ids, self.last_ids)
            return self.model.forward(batch, self.cache)

        graph, logits = capture_graph(forward, self._pool)
        self._pool = graph.pool()
        # Keep `batch` alive with the graph: the replay reads its tensors (cu_q, logits_index)
        # at their captured addresses, which must not return to the allocator.
        self._graphs[b] = (graph, long_buf, int_buf, logits, batch)
        return self._graphs[b]
