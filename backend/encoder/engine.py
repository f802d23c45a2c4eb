"""The encoder engine: batches queued requests of the `embedder`, `reranker` and `classifier`
models through one length-aware queue and runs the encoder over packed batches.

What a model reads off the last hidden state is the engine's `head` (pooled embeddings, or a
classification head's logits): one row per sequence. A queue item is a request's sequences
that run together (an embedder request's texts); a reranker request is split into one item per
(query, text) pair, so its pairs may run in different batches, and is answered once all its
rows are back (`SplitRequest`).

On a GPU the engine keeps one batch in flight: a step queues the next batch's forward and a
copy of its rows into pinned memory, then answers the batch before it while the GPU runs. The
host's share of a batch (the queue, the response cache, answering every request) then overlaps
the GPU's instead of adding to it.
"""
from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

import torch

from tritonformer import kernels
from tritonformer.backend.encoder.activation_arena import ActivationArena
from tritonformer.backend.cuda_graphs import EncoderGraphs
from tritonformer.backend.device import to_device_async
from tritonformer.backend.engine_loop import EngineLoop, RequestCancelled, RequestTimedOut, log
from tritonformer.backend.models.encoder import Encoder
from tritonformer.backend.responses import ResponseSink
from tritonformer.scheduler.dp_batcher import DpBatchPolicy
from tritonformer.scheduler.fifo import FifoBatchPolicy

# rows `[n, width]` of one request, in its sequences' order -> the response's output tensors
Outputs = Callable[[np.ndarray], dict]


def embedding_outputs(rows: np.ndarray) -> dict:
    return {"embedding": rows}


@dataclass
class EmbedRequest:
    """One queue item: sequences that run in the same batch. On its own it is a whole request
    (answered with `outputs(rows)`); with `split` set it is one part of a split request."""

    handle: Any  # opaque to the engine: the glue's way to answer this request
    sequences: list[list[int]]
    arrival: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # monotonic seconds; None: no client timeout
    outputs: Outputs = embedding_outputs
    token_types: list[list[int]] | None = None  # per-token segment ids (text pairs); None: segment 0
    split: "SplitRequest | None" = None
    first_row: int = 0  # with `split`: this item's first sequence's index in the request

    @property
    def lengths(self) -> list[int]:
        return [len(s) for s in self.sequences]


@dataclass
class SplitRequest:
    """A request whose sequences queue one by one (a reranker's pairs): the length-aware policy
    may put them in different batches, and the response leaves when the last row is back."""

    handle: Any
    sequences: list[list[int]]
    outputs: Outputs
    token_types: list[list[int]] | None = None
    arrival: float = field(default_factory=time.monotonic)
    deadline: float | None = None
    rows: list = field(default_factory=list)
    remaining: int = 0
    answered: bool = False  # an error (cancelled, timed out, failed) already went out

    def parts(self) -> list[EmbedRequest]:
        self.rows = [None] * len(self.sequences)
        self.remaining = len(self.sequences)
        types = self.token_types or [None] * len(self.sequences)
        return [EmbedRequest(self.handle, [ids], self.arrival, self.deadline, self.outputs,
                             None if t is None else [t], split=self, first_row=i)
                for i, (ids, t) in enumerate(zip(self.sequences, types))]


class EmbedderStats(Protocol):
    """Where the engine reports what it did (Triton metrics in the glue; nothing in tests)."""

    def batch_done(self, sequences: int, tokens: int, padded_tokens: int, queue_waits: list[float],
                   compute_seconds: float, queue_depth: int, cost_error: float, cache_hits: int) -> None: ...


class ResponseCache:
    """Head rows (embeddings, logits) of recently seen token sequences (TurboTransformers'
    response cache): repeated inputs are answered without running the model. Keyed by the ids
    and, for text pairs, their segment ids. Bounded, least recently used out."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._rows: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.hits = 0

    def get(self, key: tuple) -> np.ndarray | None:
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
            self.hits += 1
        return row

    def put(self, key: tuple, row: np.ndarray) -> None:
        if self.max_entries <= 0:
            return
        self._rows[key] = row
        self._rows.move_to_end(key)
        while len(self._rows) > self.max_entries:
            self._rows.popitem(last=False)


class PendingRows:
    """A batch's head rows on their way to the host. On a GPU the forward is queued and a
    non-blocking copy into pinned memory follows it; `wait` blocks on that copy alone (the GIL
    released meanwhile). On the CPU the rows are already there."""

    def __init__(self, rows: torch.Tensor, started: float):
        self._started = started  # perf_counter() when the batch was handed to the device
        if rows.is_cuda:
            self._host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
            self._host.copy_(rows, non_blocking=True)  # on the rows' device's current stream
            self._done = torch.cuda.Event()
            self._done.record(torch.cuda.current_stream(rows.device))
        else:
            self._host, self._done = rows, None
            self.seconds = time.perf_counter() - started

    def wait(self) -> np.ndarray:
        if self._done is not None:
            self._done.synchronize()
            self._done = None
            # From the launch to the copy's end: the batch's latency as the cost model sees it
            # (with a batch in flight before it, that includes waiting for the GPU).
            self.seconds = time.perf_counter() - self._started
        return self._host.numpy()


@dataclass
class _Batch:
    """A step's batch between its launch and its answers."""

    items: list  # EmbedRequest, in batch order
    keys: list  # the response cache's key of each sequence (flattened over the items)
    cached: dict  # index into the flattened sequences -> head row from the cache
    todo: list  # indices run on the model, in `pending`'s row order
    todo_sequences: list
    pending: PendingRows | None  # None: every row came from the cache
    taken_at: float
    cache_hits: int


class EncoderEngine(EngineLoop):
    """`head(hidden [T, hidden], cu_seqlens) -> [B, width]` fp32 reads each sequence's row off
    the last hidden state; without one, rows are embeddings pooled by `pooling` / `normalize`."""

    def __init__(
        self,
        model: Encoder,
        sink: ResponseSink,
        policy: FifoBatchPolicy | DpBatchPolicy,
        pooling: str = "mean",
        normalize: bool = True,
        max_queue: int = 1024,
        cuda_graphs: bool = True,
        arena: ActivationArena | None = None,
        cache_entries: int = 0,
        cancel_check_after_s: float = 0.02,
        stats: EmbedderStats | None = None,
        head: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        token_types: bool = False,
        name: str = "tritonformer-embedder",
    ):
        """`token_types`: requests carry segment ids (text pairs on a model with more than one
        token type); the CUDA graphs then carry them too."""
        super().__init__(name, max_queue)
        # Small batches replay captured CUDA graphs (launch-bound otherwise); GPU only.
        self.token_types = token_types
        self.graphs = (EncoderGraphs(model, token_types=token_types)
                       if cuda_graphs and model.device.type == "cuda" else None)
        # Larger ones run eagerly with their intermediates in the length-aware arena.
        self.arena = arena
        self.model = model
        self.sink = sink
        self.policy = policy
        self.pooling = pooling
        self.normalize = normalize
        self.head = head or (lambda hidden, cu: kernels.pool_sequences(hidden, cu, self.pooling, self.normalize))
        self.cache = ResponseCache(cache_entries)
        # Asking Triton whether a request was cancelled is an IPC round trip: only ask for
        # requests that have waited long enough for a client to give up.
        self.cancel_check_after_s = cancel_check_after_s
        self.stats = stats
        self._queue: deque[EmbedRequest] = deque()
        self._open_requests = 0  # admitted, not yet answered: what max_queue bounds
        self._in_flight: _Batch | None = None  # launched, not yet answered

    def admit(self, items: list) -> None:
        for item in items:
            self._queue.extend(item.parts() if isinstance(item, SplitRequest) else (item,))
        self._open_requests += len(items)

    def has_work(self) -> bool:
        return bool(self._queue) or self._in_flight is not None

    def num_queued(self) -> int:
        return self._open_requests

    def ready(self) -> bool:
        return self._in_flight is not None or self.policy.ready(self._queue, time.monotonic())

    def wait_timeout(self) -> float | None:
        return 0.0 if self._in_flight is not None else self.policy.wait_timeout(self._queue, time.monotonic())

    def step(self) -> None:
        """Launch the next batch (with a batch in flight, only once the policy is ready for one),
        then answer the batch that was in flight."""
        previous = self._in_flight
        launched = None
        if self._queue and (previous is None or self.policy.ready(self._queue, time.monotonic())):
            launched = self._launch_batch()
        self._in_flight = launched
        if previous is not None:
            self._finish(previous)
        if launched is not None and launched.pending is None:  # all from the cache: answer now
            self._in_flight = None
            self._finish(launched)

    def _launch_batch(self) -> _Batch | None:
        now = time.monotonic()
        checked: dict[int, bool] = {}  # id(split request) -> still wanted, asked once per step
        items = [r for r in self.policy.take(self._queue, now) if self._still_wanted(r, now, checked)]
        if not items:
            return None
        hits_before = self.cache.hits
        flat = [s for r in items for s in r.sequences]
        flat_types = [t for r in items for t in (r.token_types or [None] * len(r.sequences))]
        keys = [tuple(ids) if t is None else (tuple(ids), tuple(t)) for ids, t in zip(flat, flat_types)]
        cached: dict[int, np.ndarray] = {}
        todo: list[int] = []
        for i, key in enumerate(keys):
            row = self.cache.get(key)
            if row is None:
                todo.append(i)
            else:
                cached[i] = row
        sequences = [flat[i] for i in todo]
        pending = None
        try:
            if todo:
                pending = self.launch(sequences, [flat_types[i] for i in todo] if self.token_types else None)
        except Exception as e:
            log.exception("encoder batch failed")
            for r in items:
                self._answer_error(r, RuntimeError(f"encoder failed: {e}"))
            return None
        return _Batch(items, keys, cached, todo, sequences, pending, now, self.cache.hits - hits_before)

    def _finish(self, b: _Batch) -> None:
        """Wait for `b`'s rows, fill the response cache, answer its requests."""
        try:
            computed = b.pending.wait() if b.pending is not None else None
        except Exception as e:
            log.exception("encoder batch failed")
            for r in b.items:
                self._answer_error(r, RuntimeError(f"encoder failed: {e}"))
            return
        if not b.cached:  # every row computed, in order: the requests' rows are views of it
            rows = computed
        else:
            width = next(iter(b.cached.values())).shape[-1]
            rows = np.empty((len(b.keys), width), dtype=np.float32)
            for i, row in b.cached.items():
                rows[i] = row
            if computed is not None:
                rows[b.todo] = computed
        if self.cache.max_entries > 0:
            for i in b.todo:
                self.cache.put(b.keys[i], rows[i].copy())  # not a view: it would pin the whole batch
        offset = 0
        for r in b.items:
            n = len(r.sequences)
            self._deliver(r, rows[offset:offset + n])
            offset += n
        self._report(b.items, b.todo_sequences, b.pending.seconds if b.pending is not None else 0.0,
                     b.taken_at, b.cache_hits)

    def _deliver(self, r: EmbedRequest, rows: np.ndarray) -> None:
        """Answer a whole request, or file a split request's rows and answer it when complete."""
        whole = r.split
        if whole is None:
            self._answer(r.handle, r.outputs, rows)
            return
        if whole.answered:
            return
        whole.rows[r.first_row : r.first_row + len(rows)] = list(rows)
        whole.remaining -= len(rows)
        if whole.remaining == 0:
            self._answer(whole.handle, whole.outputs, np.stack(whole.rows))

    def _answer(self, handle, outputs: Outputs, rows: np.ndarray) -> None:
        self._open_requests -= 1
        try:
            result = outputs(rows)
        except Exception as e:  # a bug in an output function must still answer the request
            log.exception("building the response failed")
            self.sink.send(handle, None, RuntimeError(f"building the response failed: {e}"), final=True)
            return
        self.sink.send(handle, result, None, final=True)

    def _answer_error(self, r: EmbedRequest, error: Exception) -> None:
        """Answer `r`'s request with `error`, once (a split request's other parts are then dropped
        when their turn comes, without running)."""
        if r.split is not None:
            if r.split.answered:
                return
            r.split.answered = True
        self._open_requests -= 1
        self.sink.send(r.handle, None, error, final=True)

    def _still_wanted(self, r: EmbedRequest, now: float, checked: dict[int, bool]) -> bool:
        """Drop a request whose client timeout passed or who cancelled, before it costs compute."""
        if r.split is not None:
            if r.split.answered:
                return False
            if id(r.split) in checked:  # one cancellation IPC per split request and batch
                return checked[id(r.split)]
        wanted = True
        if r.deadline is not None and now > r.deadline:
            self._answer_error(r, RequestTimedOut("request timed out in the queue"))
            wanted = False
        elif now - r.arrival >= self.cancel_check_after_s and self.sink.is_cancelled(r.handle):
            self._answer_error(r, RequestCancelled("request cancelled"))
            wanted = False
        if r.split is not None:
            checked[id(r.split)] = wanted
        return wanted

    def _report(self, batch, computed: list[list[int]], elapsed: float, now: float, cache_hits: int) -> None:
        lengths = [len(s) for s in computed]
        cost = getattr(self.policy, "cost", None)
        if cost is not None and lengths:  # learn from what really ran
            cost.observe(len(lengths), max(lengths), sum(lengths), elapsed)
        if self.stats is None:
            return
        padded = 0
        bucket = self.graphs.bucket(sum(lengths), len(lengths)) if self.graphs is not None and lengths else None
        if bucket is not None:  # a CUDA-graph bucket pads the batch to its static size
            padded = bucket[0] - sum(lengths)
        self.stats.batch_done(
            sequences=len(lengths), tokens=sum(lengths), padded_tokens=padded,
            queue_waits=[now - r.arrival for r in batch], compute_seconds=elapsed, queue_depth=len(self._queue),
            cost_error=cost.mean_relative_error if cost is not None else 0.0, cache_hits=cache_hits,
        )

    def embed(self, sequences: list[list[int]], token_types: list[list[int] | None] | None = None):
        """Head rows `[n, width]` float32 numpy (embeddings, or logits) for token-id sequences,
        as one packed batch. `token_types`: per-sequence segment ids (None entries: segment 0),
        used when the engine was built with `token_types`."""
        return self.launch(sequences, token_types).wait()

    def launch(self, sequences: list[list[int]], token_types: list[list[int] | None] | None = None) -> PendingRows:
        """`embed` without waiting for the GPU: the rows, once `wait()` returns them."""
        started = time.perf_counter()
        device = self.model.device
        lengths = [len(s) for s in sequences]
        flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=sum(lengths))
        cu_host = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu_host[1:])
        # Pinned copies that do not wait for the stream (the result's .cpu() is the one sync).
        ids = to_device_async(torch.from_numpy(flat), device)
        cu = to_device_async(torch.from_numpy(cu_host), device)
        types = None
        if self.token_types:
            segments = token_types or [None] * len(sequences)
            types_host = np.fromiter(
                itertools.chain.from_iterable(t if t is not None else itertools.repeat(0, n)
                                              for t, n in zip(segments, lengths)),
                dtype=np.int64, count=sum(lengths))
            types = to_device_async(torch.from_numpy(types_host), device)
        if self.graphs is not None and self.graphs.bucket(len(ids), len(lengths)) is not None:
            hidden = self.graphs.forward(ids, lengths, types)
        else:
            hidden = self.model.forward(ids, cu, max(lengths), arena=self.arena, token_type_ids=types)
        return PendingRows(self.head(hidden, cu), started)

    def abort_all(self, error: Exception) -> None:
        if self._in_flight is not None:  # computed already: answered with its rows
            batch, self._in_flight = self._in_flight, None
            self._finish(batch)
        while self._queue:
            r = self._queue.popleft()
            self._answer_error(r, error)


# The embedder's engine: the name its callers (benchmarks, tests) know it by.
EmbedderEngine = EncoderEngine
