"""CUDA graphs for encoder batches (Nimble's ahead-of-time idea).

A small batch is launch-bound: a 12-layer encoder issues ~100 kernels whose launch costs more
than their work. Capturing the whole forward once per shape bucket and replaying it removes
that. Graphs need static shapes, so a batch is rounded up to a bucket (total tokens, number of
sequences): its tokens are copied into static buffers and one extra padding sequence absorbs
the unused token slots (its result is ignored). Sequences past the real ones are empty.
"""
from __future__ import annotations

import bisect
import gc

import numpy as np
import torch

from tritonformer.backend.device import copy_to_device_

TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# The largest buckets hold the encoders' default batch limits (max_batch_tokens 8192,
# max_batch_sequences 256 plus the padding sequence): every batch the default policies form
# replays a graph. An eager batch's ~100 kernel launches from Python cost the host about what the
# batch costs the GPU, and under load the queue grows its batches past the graphs: on an H200 one
# engine process for four instances was 20-26% GPU busy at saturation with a 16,384-token limit
# (docs/benchmarks/serving.md, "Batches that fit a CUDA graph").
SEQUENCE_BUCKETS = (2, 4, 8, 16, 32, 64, 128, 256, 512)  # includes the padding sequence


class EncoderGraphs:
    def __init__(self, model, token_buckets=TOKEN_BUCKETS, sequence_buckets=SEQUENCE_BUCKETS, capture: bool = True,
                 token_types: bool = False):
        """`token_types`: every graph also reads per-token segment ids (text pairs)."""
        self.model = model
        self.token_types = token_types
        self.capture = capture  # False: run the padded shapes eagerly (for tests without a GPU)
        self.token_buckets = token_buckets
        self.sequence_buckets = sequence_buckets
        self._graphs: dict[tuple[int, int], tuple] = {}
        self._pool = None  # one memory pool shared by all graphs: they never run at once
        self.replays = 0

    def bucket(self, total_tokens: int, num_seqs: int) -> tuple[int, int] | None:
        """The smallest bucket that holds the batch plus a padding sequence (empty when the
        tokens fill the bucket exactly), or None."""
        t = bisect.bisect_left(self.token_buckets, total_tokens)
        s = bisect.bisect_left(self.sequence_buckets, num_seqs + 1)
        if t == len(self.token_buckets) or s == len(self.sequence_buckets):
            return None
        return self.token_buckets[t], self.sequence_buckets[s]

    def warm_up(self, max_tokens: int | None = None) -> int:
        """Capture every bucket now (at start-up), not on a request's critical path: a capture
        (and the first compile of its kernels) costs ~0.1 s, which under load would overflow the
        queue. Returns the number of graphs."""
        for tokens in self.token_buckets:
            if max_tokens is not None and tokens > max_tokens:
                continue
            for seqs in self.sequence_buckets:
                if seqs <= tokens + 1 and (tokens, seqs) not in self._graphs:
                    self._capture(tokens, seqs)
        return len(self._graphs)

    def forward(self, input_ids: torch.Tensor, lengths: list[int], token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states `[sum(lengths), hidden]` from the bucket's graph (callers check `bucket`
        first and run the model eagerly when none fits)."""
        total = sum(lengths)
        key = self.bucket(total, len(lengths))
        if key is None:
            raise ValueError(f"no CUDA-graph bucket holds {total} tokens in {len(lengths)} sequences")
        graph, ids_buf, cu_buf, pos_buf, out, types_buf = self._graphs.get(key) or self._capture(*key)
        ids_buf[:total].copy_(input_ids)
        if types_buf is not None:
            if token_type_ids is None:
                types_buf.zero_()
            else:
                types_buf[:total].copy_(token_type_ids)
                types_buf[total:].zero_()
        # Real sequences, then one padding sequence over the unused slots, then empty ones. The
        # padding tokens get position 0, so a bucket may be longer than the position table.
        n = len(lengths)
        cu = np.full(key[1] + 1, key[0], dtype=np.int32)
        cu[0] = 0
        np.cumsum(lengths, out=cu[1 : n + 1])
        offset = self.model.config.position_offset
        pos = np.full(key[0], offset, dtype=np.int64)
        pos[:total] += np.arange(total) - np.repeat(cu[:n], lengths)
        # Pinned, not waiting for the stream: a pageable copy would stall the host until the GPU
        # drained, between the copies and the replay.
        copy_to_device_(cu_buf, torch.from_numpy(cu))
        copy_to_device_(pos_buf, torch.from_numpy(pos))
        if self.capture:
            graph.replay()
        else:  # same padded static shapes, run eagerly (CPU tests of the bucketing)
            out.copy_(self.model.forward(ids_buf, cu_buf, key[0], pos_buf, token_type_ids=types_buf))
        self.replays += 1
        return out[:total]

    def _capture(self, tokens: int, seqs: int):
        dev = self.model.device
        ids_buf = torch.zeros(tokens, dtype=torch.long, device=dev)
        cu_buf = torch.tensor([0] + [tokens] * seqs, dtype=torch.int32, device=dev)
        pos_buf = torch.zeros(tokens, dtype=torch.long, device=dev)
        types_buf = torch.zeros(tokens, dtype=torch.long, device=dev) if self.token_types else None
        graph = None
        if self.capture:
            graph, out = capture_graph(lambda: self.model.forward(ids_buf, cu_buf, tokens, pos_buf, token_type_ids=types_buf),
                                       self._pool)
            self._pool = graph.pool()
        else:
            out = torch.empty(tokens, self.model.config.hidden_size, device=dev, dtype=self.model.dtype)
        self._graphs[(tokens, seqs)] = (graph, ids_buf, cu_buf, pos_buf, out, types_buf)
        return self._graphs[(tokens, seqs)]



def capture_graph(fn, pool=None):
    """Capture `fn()` (which reads and writes only static tensors) as a CUDA graph sharing the
    memory `pool`; returns (graph, fn's output). A first run on a side stream does the one-off
    work a capture cannot contain (kernel compilation, cuBLAS handles, allocations)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # No garbage collection while capturing: a collection may free an older engine's graphs or
    # events (an engine is a reference cycle, through its thread), and destroying those is not
    # permitted during a capture, which then fails.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
    finally:
        if collecting:
            gc.enable()
    return graph, out
