"""The encoder engine: batches queued embedding requests and runs the BERT encoder."""
from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

import torch

from tritonformer import kernels
from tritonformer.backend.encoder.activation_arena import ActivationArena
from tritonformer.backend.cuda_graphs import EncoderGraphs
from tritonformer.backend.device import to_device_async
from tritonformer.backend.engine_loop import EngineLoop, RequestCancelled, RequestTimedOut, log
from tritonformer.backend.models.bert import BertEncoder
from tritonformer.backend.responses import ResponseSink
from tritonformer.scheduler.dp_batcher import DpBatchPolicy
from tritonformer.scheduler.fifo import FifoBatchPolicy


@dataclass
class EmbedRequest:
    handle: Any  # opaque to the engine: the glue's way to answer this request
    sequences: list[list[int]]
    arrival: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # monotonic seconds; None: no client timeout

    @property
    def lengths(self) -> list[int]:
        return [len(s) for s in self.sequences]


class EmbedderStats(Protocol):
    """Where the engine reports what it did (Triton metrics in the glue; nothing in tests)."""

    def batch_done(self, sequences: int, tokens: int, padded_tokens: int, queue_waits: list[float],
                   compute_seconds: float, queue_depth: int, cost_error: float, cache_hits: int) -> None: ...


class ResponseCache:
    """Embeddings of recently seen token sequences (TurboTransformers' response cache):
    repeated inputs are answered without running the model. Bounded, least recently used out."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._rows: OrderedDict[tuple[int, ...], np.ndarray] = OrderedDict()
        self.hits = 0

    def get(self, ids: list[int]) -> np.ndarray | None:
        key = tuple(ids)
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
            self.hits += 1
        return row

    def put(self, ids: list[int], row: np.ndarray) -> None:
        if self.max_entries <= 0:
            return
        self._rows[tuple(ids)] = row
        self._rows.move_to_end(tuple(ids))
        while len(self._rows) > self.max_entries:
            self._rows.popitem(last=False)


class EmbedderEngine(EngineLoop):
    def __init__(
        self,
        model: BertEncoder,
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
    ):
        super().__init__("tritonformer-embedder", max_queue)
        # Small batches replay captured CUDA graphs (launch-bound otherwise); GPU only.
        self.graphs = EncoderGraphs(model) if cuda_graphs and model.device.type == "cuda" else None
        # Larger ones run eagerly with their intermediates in the length-aware arena.
        self.arena = arena
        self.model = model
        self.sink = sink
        self.policy = policy
        self.pooling = pooling
        self.normalize = normalize
        self.cache = ResponseCache(cache_entries)
        # Asking Triton whether a request was cancelled is an IPC round trip: only ask for
        # requests that have waited long enough for a client to give up.
        self.cancel_check_after_s = cancel_check_after_s
        self.stats = stats
        self._queue: deque[EmbedRequest] = deque()

    def admit(self, items: list[EmbedRequest]) -> None:
        self._queue.extend(items)

    def has_work(self) -> bool:
        return bool(self._queue)

    def num_queued(self) -> int:
        return len(self._queue)

    def ready(self) -> bool:
        return self.policy.ready(self._queue, time.monotonic())

    def wait_timeout(self) -> float | None:
        return self.policy.wait_timeout(self._queue, time.monotonic())

    def step(self) -> None:
        now = time.monotonic()
        batch = [r for r in self.policy.take(self._queue, now) if self._still_wanted(r, now)]
        if not batch:
            return
        hits_before = self.cache.hits
        rows: dict[int, np.ndarray] = {}  # index into the flattened sequences -> embedding
        todo: list[int] = []
        flat = [s for r in batch for s in r.sequences]
        for i, ids in enumerate(flat):
            row = self.cache.get(ids)
            if row is None:
                todo.append(i)
            else:
                rows[i] = row
        start = time.perf_counter()
        try:
            if todo:
                computed = self.embed([flat[i] for i in todo])
                for i, row in zip(todo, computed):
                    rows[i] = row
                    self.cache.put(flat[i], row.copy())  # not a view: it would pin the whole batch
        except Exception as e:
            log.exception("embedding batch failed")
            for r in batch:
                self.sink.send(r.handle, None, RuntimeError(f"embedding failed: {e}"), final=True)
            return
        elapsed = time.perf_counter() - start
        offset = 0
        for r in batch:
            n = len(r.sequences)
            out = np.stack([rows[offset + j] for j in range(n)])
            self.sink.send(r.handle, {"embedding": out}, None, final=True)
            offset += n
        self._report(batch, [flat[i] for i in todo], elapsed, now, self.cache.hits - hits_before)

    def _still_wanted(self, r: EmbedRequest, now: float) -> bool:
        """Drop a request whose client timeout passed or who cancelled, before it costs compute."""
        if r.deadline is not None and now > r.deadline:
            self.sink.send(r.handle, None, RequestTimedOut("request timed out in the queue"), final=True)
            return False
        if now - r.arrival >= self.cancel_check_after_s and self.sink.is_cancelled(r.handle):
            self.sink.send(r.handle, None, RequestCancelled("request cancelled"), final=True)
            return False
        return True

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

    def embed(self, sequences: list[list[int]]):
        """Embeddings `[n, hidden]` float32 numpy for token-id sequences, as one packed batch."""
        device = self.model.device
        lengths = [len(s) for s in sequences]
        flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=sum(lengths))
        cu_host = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu_host[1:])
        # Pinned copies that do not wait for the stream (the result's .cpu() is the one sync).
        ids = to_device_async(torch.from_numpy(flat), device)
        cu = to_device_async(torch.from_numpy(cu_host), device)
        if self.graphs is not None and self.graphs.bucket(len(ids), len(lengths)) is not None:
            hidden = self.graphs.forward(ids, lengths)
        else:
            hidden = self.model.forward(ids, cu, max(lengths), arena=self.arena)
        return kernels.pool_sequences(hidden, cu, self.pooling, self.normalize).cpu().numpy()

    def abort_all(self, error: Exception) -> None:
        while self._queue:
            self.sink.send(self._queue.popleft().handle, None, error, final=True)
