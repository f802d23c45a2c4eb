"""Our queue's metrics on Triton's metrics port (`pb_utils.MetricFamily`).

Triton's own queue metrics cannot see our queue (execute() returns at once), so we publish
our own. Every metric update is an IPC round trip to the server: updates go through a queue to
a dedicated thread, never from the engine's hot loop.
"""
from __future__ import annotations

import logging
import queue
import threading

import triton_python_backend_utils as pb_utils

log = logging.getLogger("tritonformer")

_SIZE_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
_TOKEN_BUCKETS = [16, 64, 256, 1024, 4096, 16384, 65536]
_SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]

# name: (kind, description, histogram buckets or None)
EMBEDDER_METRICS = {
    "tritonformer_queue_depth": ("GAUGE", "Requests waiting in tritonformer's own queue", None),
    "tritonformer_batches_total": ("COUNTER", "Batches run by the encoder engine", None),
    "tritonformer_batch_sequences": ("HISTOGRAM", "Sequences per batch", _SIZE_BUCKETS),
    "tritonformer_batch_tokens": ("HISTOGRAM", "Real tokens per batch", _TOKEN_BUCKETS),
    "tritonformer_padding_ratio": ("GAUGE", "Padded share of the last batch's token slots (CUDA-graph buckets pad)", None),
    "tritonformer_queue_wait_seconds": ("HISTOGRAM", "Time from arrival to dispatch, per request", _SECONDS_BUCKETS),
    "tritonformer_batch_compute_seconds": ("HISTOGRAM", "Time to run one batch", _SECONDS_BUCKETS),
    "tritonformer_cost_model_relative_error": ("GAUGE", "Mean |observed - predicted| / observed batch latency", None),
    "tritonformer_response_cache_hits_total": ("COUNTER", "Sequences answered from the response cache", None),
}


class EmbedderMetrics:
    """EmbedderStats published as Triton custom metrics, labelled with the model's name."""

    def __init__(self, model_name: str, version: str):
        self._metrics = {}
        self._families = []  # a family is unregistered when its Python object dies: keep them
        labels = {"model": model_name, "version": version}
        try:
            for name, (kind, description, buckets) in EMBEDDER_METRICS.items():
                family = pb_utils.MetricFamily(name=name, description=description, kind=getattr(pb_utils.MetricFamily, kind))
                self._families.append(family)
                self._metrics[name] = family.Metric(labels=labels, buckets=buckets) if buckets else family.Metric(labels=labels)
        except Exception as e:  # e.g. the server runs with metrics disabled
            log.warning("custom metrics disabled: %s", e)
            self._metrics = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="tritonformer-metrics", daemon=True)
        self._thread.start()

    def batch_done(self, sequences, tokens, padded_tokens, queue_waits, compute_seconds, queue_depth, cost_error,
                   cache_hits) -> None:
        if self._metrics:
            self._queue.put((sequences, tokens, padded_tokens, queue_waits, compute_seconds, queue_depth, cost_error,
                             cache_hits))

    def queue_depth(self, depth: int) -> None:
        if self._metrics:
            self._queue.put(depth)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(5)

    def _run(self) -> None:
        m = self._metrics
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if isinstance(item, int):
                    m["tritonformer_queue_depth"].set(item)
                    continue
                sequences, tokens, padded, waits, compute, depth, cost_error, cache_hits = item
                m["tritonformer_queue_depth"].set(depth)
                m["tritonformer_batches_total"].increment(1)
                if sequences:
                    m["tritonformer_batch_sequences"].observe(sequences)
                    m["tritonformer_batch_tokens"].observe(tokens)
                    m["tritonformer_padding_ratio"].set(padded / (tokens + padded))
                    m["tritonformer_batch_compute_seconds"].observe(compute)
                for w in waits:
                    m["tritonformer_queue_wait_seconds"].observe(w)
                m["tritonformer_cost_model_relative_error"].set(cost_error)
                if cache_hits:
                    m["tritonformer_response_cache_hits_total"].increment(cache_hits)
            except Exception as e:
                log.warning("could not update metrics: %s", e)
