"""The encoder engine: batches queued embedding requests and runs the BERT encoder."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from tritonformer.backend.allocator import ActivationArena
from tritonformer.backend.cuda_graphs import EncoderGraphs
from tritonformer.backend.engine_loop import EngineLoop, log
from tritonformer.backend.models.bert import BertEncoder, pool
from tritonformer.backend.responses import ResponseSink
from tritonformer.scheduler.dp_batcher import DpBatchPolicy
from tritonformer.scheduler.fifo import FifoBatchPolicy


@dataclass
class EmbedRequest:
    handle: Any  # opaque to the engine: the glue's way to answer this request
    sequences: list[list[int]]
    arrival: float = field(default_factory=time.monotonic)

    @property
    def lengths(self) -> list[int]:
        return [len(s) for s in self.sequences]


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
        batch = self.policy.take(self._queue, time.monotonic())
        sequences = [s for r in batch for s in r.sequences]
        try:
            start = time.perf_counter()
            embeddings = self.embed(sequences)
            elapsed = time.perf_counter() - start
            cost = getattr(self.policy, "cost", None)
            if cost is not None:  # learn from what really ran
                lengths = [len(s) for s in sequences]
                cost.observe(len(lengths), max(lengths), sum(lengths), elapsed)
        except Exception as e:
            log.exception("embedding batch failed")
            for r in batch:
                self.sink.send(r.handle, None, RuntimeError(f"embedding failed: {e}"), final=True)
            return
        offset = 0
        for r in batch:
            n = len(r.sequences)
            self.sink.send(r.handle, {"embedding": embeddings[offset : offset + n]}, None, final=True)
            offset += n

    def embed(self, sequences: list[list[int]]):
        """Embeddings `[n, hidden]` float32 numpy for token-id sequences, as one packed batch."""
        device = self.model.device
        lengths = [len(s) for s in sequences]
        ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long, device=device)
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
        cu = cu.to(device)
        if self.graphs is not None and self.graphs.bucket(len(ids), len(lengths)) is not None:
            hidden = self.graphs.forward(ids, lengths)
        else:
            hidden = self.model.forward(ids, cu, max(lengths), arena=self.arena)
        return pool(hidden, cu, self.pooling, self.normalize).cpu().numpy()

    def abort_all(self, error: Exception) -> None:
        while self._queue:
            self.sink.send(self._queue.popleft().handle, None, error, final=True)
