"""Runs one scheduled decoder iteration on the model: by CUDA-graph replay when every entry is
a one-token decode that fits a captured bucket, eagerly otherwise (prompt chunks, CPU).

Nothing here waits for the GPU. The engine launches iteration i+1 before it reads iteration
i's tokens on the host (its scheduling and bookkeeping then overlap the GPU's work), so i+1's
inputs cannot hold those tokens yet: they name them as `fed_token(row)`, the row of the sample
in iteration i, and the first kernel of the forward (`feed_tokens`) reads them from
`last_ids`, where `sample` (or the decode graph's own argmax) left them on the device.

`run_steps` runs a round of several decode iterations in one go (the scheduler's
max_decode_steps): every row feeds itself its own sample from one iteration to the next, and
all the rounds' samples go to the host in one copy.
"""
from __future__ import annotations

import gc
from typing import NamedTuple

import numpy as np
import torch

from tritonformer import kernels
from tritonformer.backend.decoder.graphs import DecodeGraphs
from tritonformer.backend.decoder.batch import BatchEntry, build_batch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel
from tritonformer.backend.decoder.pinned_ring import PinnedRing
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.decoder.sampling import Sampler


MAX_DECODE_STEPS = 16  # iterations per round at most (sizes the pinned buffer of sampled ids)
DEFAULT_DECODE_STEPS = 4  # the served default (config parameter max_decode_steps), also the benchmarks'


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
    """The sampled ids of one launch (one iteration, or a round of `steps`), on their way to the
    host: `steps` rows of `stride` ids, the first `count` of each wanted. Without a ring, `ids`
    holds them already (`[count]`, or `[steps, count]`)."""

    def __init__(self, ids: torch.Tensor | None, count: int, ring: PinnedRing | None = None, index: int = 0,
                 steps: int = 1, stride: int = 0):
        self._ids, self._count, self._ring, self._index = ids, count, ring, index
        self._steps, self._stride = steps, stride
        if ring is not None:
            self._use = ring.uses[index]

    def wait(self) -> list[int]:
        """The first iteration's ids as Python ints (waits for the launch that produced them,
        and only it)."""
        return self.wait_steps()[0]

    def wait_steps(self) -> list[list[int]]:
        """Every iteration's ids: [j][row]."""
        ring, count = self._ring, self._count
        if count == 0:
            return [[]]
        if ring is None:
            ids = self._ids if self._steps > 1 else self._ids[None]
            return ids[:, :count].tolist()
        if ring.uses[self._index] != self._use:
            raise RuntimeError("sampled ids read after their host buffer was reused: read iteration i "
                               "before launching iteration i + 2")
        ring.events[self._index].synchronize()
        ids = ring.arrays[self._index].view(np.int64)
        if self._steps == 1:
            return [ids[:count].tolist()]
        return ids[: self._steps * self._stride].reshape(self._steps, self._stride)[:, :count].tolist()


class DecoderRunner:
    def __init__(self, model: DecoderModel, cache: PagedKVCache, max_running: int, cuda_graphs: bool = True):
        self.model = model
        self.cache = cache
        # The last iteration's samples (at most one per running sequence), for fed tokens.
        self.last_ids = torch.zeros(max_running, dtype=torch.long, device=model.device)
        self.graphs = None
        self._to_host = None
        if model.device.type == "cuda":
            self._to_host = PinnedRing(MAX_DECODE_STEPS * self.last_ids.numel() * self.last_ids.element_size())
            self._host_views: dict[tuple[int, int], torch.Tensor] = {}
            # (a model may opt out: one whose decode step, captured at every table width up to its longest
            # sequence, would hold more memory in the graphs' pools than the GPU has: CPM-Ant's, in PyTorch ops)
            if cuda_graphs and getattr(model, "decode_graphs", True):
                max_blocks = -(-model.config.max_position_embeddings // cache.block_size)
                self.graphs = DecodeGraphs(model, cache, max_running, max_blocks, self.last_ids)

    def close(self) -> None:
        """Let go of what outlives requests: the decode graphs, then, for a split model, this
        rank's process group. In that order: NCCL lets a communicator go only once every CUDA
        graph that captured one of its collectives is destroyed, and waits for that (unloading
        a TP=2 model on two H100s hung there while the graphs lived)."""
        if self.graphs is not None:
            torch.cuda.synchronize(self.model.device)  # no replay still running
            self.graphs = None
            gc.collect()  # graphs held in reference cycles go now, not at some later collection
        tp = getattr(self.model, "tp", None)
        if tp is not None:
            tp.leave()

    def warm_up(self) -> None:
        """First-call costs before the model reports READY, not on a request: kernel compilation
        for each attention launch configuration (chunks of a few, tens, hundreds of queries;
        decode rows beside a chunk) and the capture of every decode graph. Uses the first blocks
        of the pool, which no sequence holds yet."""
        bs = self.cache.block_size
        longest = self.model.config.max_position_embeddings - 1
        slot = self.cache.state.scratch_slot if self.cache.state is not None else -1  # (a state no sequence holds)
        for n in (2, 20, 40, 100, 600):
            n = min(n, longest)
            self.run([BatchEntry([0] * n, 0, list(range(-(-n // bs))), True, slot)])
        self.run([BatchEntry([0], 1, [0], True, slot),
                  BatchEntry([0] * 20, 0, list(range(1, 1 + -(-20 // bs))), True, slot)])
        if self.graphs is not None:
            self.graphs.warm_up()

    @torch.inference_mode()
    def run(self, entries: list[BatchEntry]) -> Forward:
        """Launch the forward of `entries` (one logits row per entry with `sample`). Token ids
        may be `fed_token(row)`s of the last iteration's samples."""
        self._reset_states(entries)
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
        return self._start_copy(self._sample_into_last(forward.logits[:n], sampler, params, keys), n)

    @torch.inference_mode()
    def run_steps(self, entries: list[BatchEntry], steps: list[int], sampler: Sampler, params: list[SamplingParams],
                  keys: list[int]) -> SampledTokens:
        """Launch a round of max(steps) decode iterations of one-token `entries` (each samples):
        row r takes steps[r] of them, each on its sample of the one before. The result holds
        iteration j's sample of row r at [j][r] (undefined once r's steps are done)."""
        n, rounds = len(entries), max(steps)
        if rounds > MAX_DECODE_STEPS:
            raise ValueError(f"{rounds} iterations in a round; at most {MAX_DECODE_STEPS}")
        greedy = all(p.greedy for p in params)
        if self.graphs is not None and self.graphs.bucket(n) is not None:
            self._reset_states(entries)  # (the eager path below resets in run)
            replay, logits, greedy_ids = self.graphs.load(entries, steps)
            ring = self._to_host
            i = ring.take()
            for j in range(rounds):  # the graph itself moves every row on to its next token
                replay()
                ids = greedy_ids if greedy else self._sample_into_last(logits[:n], sampler, params, keys)
                self._host_view(i, j, ids.numel()).copy_(ids, non_blocking=True)  # before the next replay
            ring.copied(i)
            return SampledTokens(None, n, ring, i, steps=rounds, stride=ids.numel())
        # Eagerly (CPU, or more rows than any graph): one forward per iteration over the rows
        # still taking part; each keeps its place in last_ids, so its fed token finds it.
        out = torch.zeros(rounds, n, dtype=torch.long, device=self.model.device)
        for j in range(rounds):
            live = [r for r in range(n) if steps[r] > j]
            now = [BatchEntry(entries[r].tokens if j == 0 else [fed_token(r)], entries[r].start + j,
                              entries[r].block_table, True, entries[r].state_slot) for r in live]
            forward = self.run(now)
            ids = self._sample_ids(forward.logits[: len(live)], sampler, [params[r] for r in live], [keys[r] for r in live])
            rows = torch.tensor(live, device=self.model.device)
            self.last_ids.index_copy_(0, rows, ids)
            out[j].index_copy_(0, rows, ids)
        return self._start_copy(out, n)

    def _reset_states(self, entries: list[BatchEntry]) -> None:
        """Zero the recurrent state of the sequences whose first token runs now (new ones, and
        preempted ones that recompute), before their forward (decoder/state_cache.py)."""
        if self.cache.state is not None:
            fresh = [e.state_slot for e in entries if e.start == 0]
            if fresh:
                self.cache.state.reset(fresh)

    def _sample_into_last(self, logits: torch.Tensor, sampler: Sampler, params: list[SamplingParams],
                          keys: list[int]) -> torch.Tensor:
        ids = self._sample_ids(logits, sampler, params, keys)
        self.last_ids[: len(ids)].copy_(ids)
        return ids

    def _sample_ids(self, logits: torch.Tensor, sampler: Sampler, params: list[SamplingParams],
                    keys: list[int]) -> torch.Tensor:
        """One id per row of `params`. On a tensor-parallel model only rank 0 samples (its
        sampler holds the requests' state) and the other ranks receive its ids, so every rank
        feeds the same tokens to the next iteration."""
        tp = self.model.tp
        if tp is None or tp.rank == 0:
            ids = sampler.sample_ids(logits, params, keys)
        else:
            ids = torch.empty(len(params), dtype=torch.long, device=self.model.device)
        return ids if tp is None else tp.broadcast(ids)

    def _start_copy(self, ids: torch.Tensor, count: int) -> SampledTokens:
        """Copy `ids` (`[stride]`, or `[steps, stride]` for a round; count of each wanted) to the
        host without waiting for them."""
        ring = self._to_host
        steps, stride = (1, ids.numel()) if ids.dim() == 1 else ids.shape
        if ring is None:
            return SampledTokens(ids, count, steps=steps)
        i = ring.take()
        self._host_view(i, 0, ids.numel()).copy_(ids.view(-1), non_blocking=True)
        ring.copied(i)
        return SampledTokens(None, count, ring, i, steps=steps, stride=stride)

    def _host_view(self, i: int, j: int, size: int) -> torch.Tensor:
        """Ids j * size .. (j + 1) * size - 1 of pinned buffer i, made once per buffer, place and
        size (the graph buckets): no slicing per copy."""
        key = (i, j, size)
        view = self._host_views.get(key)
        if view is None:
            view = self._host_views[key] = self._to_host.buffers[i].view(torch.int64)[j * size : (j + 1) * size]
        return view
