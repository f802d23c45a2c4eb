"""CUDA graphs of decode iterations, one per batch-size bucket (Nimble's ahead-of-time idea).

A decode iteration of a small model would be launch-bound: GPT-2 runs 126 kernels for one
token per sequence, most of them a few microseconds of work, less than a launch from Python
costs. Every bucket (1, 2, 4, ... up to the
running-sequence cap) is captured once at start-up against static input buffers; an iteration
with n decoding sequences copies its indices into the smallest bucket >= n (decode_inputs.py)
and replays.
Padding rows have no keys (length 0) and write their key/value into the cache's scratch
block, so they change nothing a real sequence reads. The graph starts with `feed_tokens`, so a
token id may name a sample of the previous iteration still on the device (see DecoderRunner),
and ends with the greedy samples of its rows written to `last_ids`, where the next one reads,
then with the inputs of the next iteration of a multi-iteration round written in place
(kernels.advance_decode_inputs): such a round replays the same graph again without the host.
"""
from __future__ import annotations

import bisect

import torch

from tritonformer import kernels
from tritonformer.backend.cuda_graphs import capture_graph
from tritonformer.backend.decoder.graph_inputs import DecodeInputs
from tritonformer.backend.decoder.batch import BatchEntry, DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.kernels.gpu_info import sm_count


def decode_buckets(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    return [b for b in sizes if b < max_batch] + [max_batch]


# Decode attention programs per SM that key splits aim for (a benchmark comparing sets this).
FILL = 2


def key_splits(batch: int, kv_heads: int, sm_count: int) -> int:
    """Key splits for a decode launch of `batch` sequences: enough programs to fill the GPU
    FILL times over (flash-decoding), fixed per bucket because a graph cannot choose at replay.
    At most 32: a split's keys are a share of each sequence's current length, so the long
    contexts that need the most splits get them from the same graph, while at short ones the
    splits past the keys find none and exit (kernels/triton_attention.py, _split_decode_config,
    has the measurements)."""
    splits = 1
    while splits < 32 and batch * kv_heads * splits < FILL * sm_count:
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

    def run(self, entries: list[BatchEntry]) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the bucket of one-token `entries` (each samples). Returns the bucket's logits
        `[b, vocab]` (the model's dtype) and the argmax of each row `[b]`, which the replay also
        left in last_ids; rows from len(entries) on are padding."""
        replay, logits, greedy_ids = self.load(entries)
        replay()
        return logits, greedy_ids

    def load(self, entries: list[BatchEntry], steps: list[int] | None = None) -> tuple:
        """Send the inputs of one-token `entries` (each samples) to their bucket, each taking
        `steps[r]` iterations of a round (None: one). Returns (replay, logits, greedy_ids) as in
        `run`: each call of replay() runs the round's next iteration."""
        b = self.bucket(len(entries))
        graph, inputs, logits, greedy_ids, _ = self._graphs.get(b) or self._capture(b)
        inputs.pack(entries, steps)
        inputs.send()

        def replay() -> None:
            graph.replay()
            self.replays += 1

        return replay, logits, greedy_ids

    def _capture(self, b: int):
        dev = self.model.device
        state = self.cache.state
        inputs = DecodeInputs(b, self.width, self.cache.block_size, self.cache.scratch_slot, dev,
                              scratch_state=state.scratch_slot if state is not None else -1)
        batch = DecoderBatch(
            input_ids=inputs.input_ids, positions=inputs.positions, slot_mapping=inputs.slot_mapping,
            logits_index=torch.arange(b, device=dev), logits_every_row=True, num_decode=b,
            decode_tables=inputs.tables, decode_seqlens=inputs.seqlens,
            decode_cu_q=torch.arange(b + 1, dtype=torch.int32, device=dev),
            decode_splits=key_splits(b, self.model.config.num_kv_heads, sm_count(dev)),
            state_slots=inputs.state_slots if state is not None else None,
        )
        greedy_ids = self.last_ids[:b]

        def forward():
            kernels.feed_tokens(batch.input_ids, self.last_ids)
            # The logits in the model's dtype: the sampler converts the rows it samples.
            logits = self.model.forward(batch, self.cache, fp32_logits=False)
            # Greedy samples inside the graph, straight where the next iteration's feed_tokens
            # reads them: an all-greedy iteration then launches nothing after the replay but
            # the ids' copy to the host (each launch costs the host tens of microseconds).
            kernels.argmax_rows(logits, greedy_ids)
            kernels.advance_decode_inputs(batch.input_ids, batch.positions, batch.slot_mapping, batch.decode_seqlens,
                                          batch.decode_tables, inputs.steps_left, self.cache.block_size,
                                          self.cache.scratch_slot)
            return logits

        saved = self.last_ids.clone()  # forward runs here: keep the samples its argmax overwrites
        graph, logits = capture_graph(forward, self._pool)
        # One replay now, of padding only (the inputs start with no keys and scratch slots): a
        # graph's first launch uploads it to the device, which a request should not wait for.
        graph.replay()
        self.last_ids.copy_(saved)
        self._pool = graph.pool()
        # Keep `batch` alive with the graph: the replay reads its tensors (cu_q, logits_index)
        # at their captured addresses, which must not return to the allocator.
        self._graphs[b] = (graph, inputs, logits, greedy_ids, batch)
        return self._graphs[b]
