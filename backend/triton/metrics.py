"""Our engines' metrics on Triton's metrics port (`pb_utils.MetricFamily`).

Triton's own queue metrics cannot see our queues (execute() returns at once), so we publish
our own. Every metric update is an IPC round trip to the server: updates go through a queue to
a dedicated thread, never from an engine's hot loop.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

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

GENERATOR_METRICS = {
    "tritonformer_running_requests": ("GAUGE", "Sequences in the running batch", None),
    "tritonformer_waiting_requests": ("GAUGE", "Sequences waiting to join", None),
    "tritonformer_iterations_total": ("COUNTER", "Model iterations run by the decoder engine", None),
    "tritonformer_iteration_tokens": ("HISTOGRAM", "Tokens per iteration (prompts + one per decoding sequence)", _TOKEN_BUCKETS),
    "tritonformer_kv_cache_bytes": ("GAUGE", "Bytes of the KV blocks held by sequences", None),
    "tritonformer_kv_blocks_used": ("GAUGE", "KV cache blocks held by sequences", None),
    "tritonformer_kv_blocks_free": ("GAUGE", "KV cache blocks free", None),
    "tritonformer_preemptions_total": ("COUNTER", "Sequences preempted (blocks freed, recomputed later) for lack of KV blocks", None),
    "tritonformer_time_to_first_token_seconds": ("HISTOGRAM", "Arrival to first generated token", _SECONDS_BUCKETS),
    "tritonformer_prompt_queue_seconds": ("HISTOGRAM", "Arrival to the first iteration that runs the prompt (part of the time to first token)", _SECONDS_BUCKETS),
    "tritonformer_time_per_output_token_seconds": ("HISTOGRAM", "Mean time between output tokens, per request", _SECONDS_BUCKETS),
    "tritonformer_generated_tokens_total": ("COUNTER", "Output tokens generated", None),
    "tritonformer_prefix_cache_queries_total": ("COUNTER", "Sequences whose prompt was looked up in the prefix cache when they joined", None),
    "tritonformer_prefix_cache_hits_total": ("COUNTER", "Prefix-cache lookups that reused at least one KV block", None),
    "tritonformer_prefix_cache_hit_tokens_total": ("COUNTER", "Prompt tokens taken from the prefix cache instead of computed", None),
}


class _Publisher:
    """Metric families labelled with the model, updated from a background thread."""

    def __init__(self, spec: dict, model_name: str, version: str):
        self._metrics = {}
        self._families = []  # a family is unregistered when its Python object dies: keep them
        labels = {"model": model_name, "version": version}
        try:
            for name, (kind, description, buckets) in spec.items():
                family = pb_utils.MetricFamily(name=name, description=description, kind=getattr(pb_utils.MetricFamily, kind))
                self._families.append(family)
                self._metrics[name] = family.Metric(labels=labels, buckets=buckets) if buckets else family.Metric(labels=labels)
        except Exception as e:  # e.g. the server runs with metrics disabled
            log.warning("custom metrics disabled: %s", e)
            self._metrics = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="tritonformer-metrics", daemon=True)
        self._thread.start()

    def post(self, update: Callable[[dict], None]) -> None:
        """Run `update(metrics)` on the metrics thread (nothing when metrics are off)."""
        if self._metrics:
            self._queue.put(update)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            update = self._queue.get()
            if update is None:
                return
            try:
                update(self._metrics)
            except Exception as e:
                log.warning("could not update metrics: %s", e)


class EmbedderMetrics(_Publisher):
    """EmbedderStats published as Triton custom metrics."""

    def __init__(self, model_name: str, version: str):
        super().__init__(EMBEDDER_METRICS, model_name, version)

    def queue_depth(self, depth: int) -> None:
        self.post(lambda m: m["tritonformer_queue_depth"].set(depth))

    def batch_done(self, sequences, tokens, padded_tokens, queue_waits, compute_seconds, queue_depth, cost_error,
                   cache_hits) -> None:
        def update(m):
            m["tritonformer_queue_depth"].set(queue_depth)
            m["tritonformer_batches_total"].increment(1)
            if sequences:
                m["tritonformer_batch_sequences"].observe(sequences)
                m["tritonformer_batch_tokens"].observe(tokens)
                m["tritonformer_padding_ratio"].set(padded_tokens / (tokens + padded_tokens))
                m["tritonformer_batch_compute_seconds"].observe(compute_seconds)
            for wait in queue_waits:
                m["tritonformer_queue_wait_seconds"].observe(wait)
            m["tritonformer_cost_model_relative_error"].set(cost_error)
            if cache_hits:
                m["tritonformer_response_cache_hits_total"].increment(cache_hits)

        self.post(update)


class GeneratorMetrics(_Publisher):
    """GeneratorStats published as Triton custom metrics.

    The engine reports every iteration (thousands per second on a GPU), faster than metric
    updates (an IPC call each) can leave. Iteration counts and finished requests accumulate
    here and gauges keep only their latest value; at most one flush waits in the queue, so the
    queue stays bounded."""

    def __init__(self, model_name: str, version: str):
        super().__init__(GENERATOR_METRICS, model_name, version)
        self._lock = threading.Lock()
        self._iterations = 0
        self._iteration_tokens: list[int] = []
        self._preempted = 0
        self._occupancy: tuple | None = None
        self._requests: list[tuple] = []
        self._prefix_cache = [0, 0, 0]  # queries, hits, hit tokens since the last flush
        self._flush_queued = False

    def iteration_done(self, tokens: int, preempted: int) -> None:
        if not self._metrics:  # metrics off: nothing would ever flush
            return
        with self._lock:
            self._iterations += 1
            self._iteration_tokens.append(tokens)
            self._preempted += preempted
            self._queue_flush()

    def occupancy(self, running: int, waiting: int, kv_blocks_used: int, kv_blocks_free: int, kv_bytes: int) -> None:
        if not self._metrics:
            return
        with self._lock:
            self._occupancy = (running, waiting, kv_blocks_used, kv_blocks_free, kv_bytes)
            self._queue_flush()

    def _queue_flush(self) -> None:  # holding the lock
        if not self._flush_queued:
            self._flush_queued = True
            self.post(self._flush)

    def _flush(self, m) -> None:
        with self._lock:
            iterations, tokens, preempted, occupancy, requests, prefix_cache = (
                self._iterations, self._iteration_tokens, self._preempted, self._occupancy, self._requests,
                self._prefix_cache)
            self._iterations, self._iteration_tokens, self._preempted, self._prefix_cache = 0, [], 0, [0, 0, 0]
            self._occupancy, self._requests, self._flush_queued = None, [], False
        # Gauges first: a scrape that sees a finished request counted also sees the state
        # after it (the engine reports occupancy before the request).
        if occupancy is not None:
            names = ("running_requests", "waiting_requests", "kv_blocks_used", "kv_blocks_free", "kv_cache_bytes")
            for name, value in zip(names, occupancy):
                m[f"tritonformer_{name}"].set(value)
        if iterations:
            m["tritonformer_iterations_total"].increment(iterations)
            for n in tokens:
                m["tritonformer_iteration_tokens"].observe(n)
        if preempted:
            m["tritonformer_preemptions_total"].increment(preempted)
        for name, n in zip(("queries", "hits", "hit_tokens"), prefix_cache):
            if n:
                m[f"tritonformer_prefix_cache_{name}_total"].increment(n)
        for ttft, tpot, output_tokens, queue_wait in requests:
            if queue_wait is not None:
                m["tritonformer_prompt_queue_seconds"].observe(queue_wait)
            if ttft is not None:
                m["tritonformer_time_to_first_token_seconds"].observe(ttft)
            if tpot is not None:
                m["tritonformer_time_per_output_token_seconds"].observe(tpot)
            m["tritonformer_generated_tokens_total"].increment(output_tokens)

    def request_done(self, ttft: float | None, tpot: float | None, output_tokens: int,
                     queue_wait: float | None = None) -> None:
        if not self._metrics:
            return
        with self._lock:
            self._requests.append((ttft, tpot, output_tokens, queue_wait))
            self._queue_flush()

    def prefix_cache_lookups(self, queries: int, hits: int, hit_tokens: int) -> None:
        if not self._metrics:
            return
        with self._lock:
            counts = self._prefix_cache
            counts[0] += queries
            counts[1] += hits
            counts[2] += hit_tokens
            self._queue_flush()
