"""TritonPythonModel for the `embedder` model (not decoupled).

execute() validates, tokenizes and queues each request, then returns None; the engine thread
answers every request exactly once, later (Triton >= 24.06 allows that for non-decoupled
models), so plain HTTP/gRPC `infer` and perf_analyzer work against it.
"""
from __future__ import annotations

import logging
import time

from tritonformer.backend.triton import inputs
from tritonformer.backend.encoder.activation_arena import ActivationArena
from tritonformer.backend.checkpoints import cache_dir, minilm_dir
from tritonformer.backend.encoder.cost_measure import cost_model_key, load_or_measure
from tritonformer.backend.encoder.engine import EmbedderEngine, EmbedRequest
from tritonformer.backend.models.bert import BertConfig, BertEncoder, pooling_from_checkpoint
from tritonformer.backend.tokenization import TextTokenizer
from tritonformer.backend.triton.metrics import EmbedderMetrics
from tritonformer.backend.triton.glue import (
    TritonSink,
    bool_parameter,
    input_array,
    reject,
    request_parameters,
    checkpoint_weights,
    load_settings,
    one_item_batches,
    uses_triton_batching,
)
from tritonformer.backend.checkpoints.weights import load_config
from tritonformer.scheduler.dp_batcher import OBJECTIVES, DpBatchPolicy, TriggerPolicy
from tritonformer.scheduler.fifo import FifoBatchPolicy

PARAMETERS = {
    "checkpoint": "",  # a BERT/RoBERTa/MiniLM folder; empty = the bundled all-MiniLM-L6-v2
    "allow_pickle_checkpoint": "false",  # true: load pickle .bin weights (weights_only) if no safetensors
    "device": "auto",  # auto | cpu | cuda
    "dtype": "auto",  # auto (fp16 on GPU, fp32 on CPU) | float32 | float16 | bfloat16
    "pooling": "auto",  # auto (from the checkpoint) | mean | cls
    "normalize": "auto",  # auto (from the checkpoint) | true | false
    "max_batch_sequences": "256",
    "max_batch_tokens": "16384",
    "max_queue_requests": "1024",
    "max_texts_per_request": "256",
    "max_text_bytes": "100000",
    "cuda_graphs": "true",  # replay captured CUDA graphs for small batches (GPU only)
    "activation_arena": "false",  # auto (on GPU) | true | false: length-aware activation allocator
    "arena_release_after_idle": "0",  # release an unused arena chunk after N idle batches
    "batch_policy": "fifo",  # fifo (arrival order up to the caps) | dp (length-aware dynamic programming)
    "dp_objective": "throughput",  # throughput | latency (mean completion time)
    "batch_trigger": "hungry",  # hungry | lazy | slo
    "lazy_timeout_ms": "2",
    "lazy_max_queue": "64",
    "slo_ms": "50",  # latency budget the slo trigger and the DP's oldest-first rule aim for
    "max_wait_ms": "500",  # starvation bound: nobody waits longer behind shorter requests
    "response_cache_size": "1024",  # embeddings of recent token sequences kept for repeats; 0 = off
    "cancel_check_after_ms": "20",  # ask Triton about cancellation only for requests this old
}

log = logging.getLogger("tritonformer")


class TritonPythonModel:
    def initialize(self, args):
        p, checkpoint, device, dtype = load_settings(args, PARAMETERS, minilm_dir)

        config = BertConfig.from_hf(load_config(checkpoint))
        model = BertEncoder(config, checkpoint_weights(p, checkpoint), device, dtype)
        self.tokenizer = TextTokenizer(checkpoint)
        self.max_tokens = min(config.max_tokens_per_sequence, self.tokenizer.config.get("model_max_length", 10**9))
        mode, normalize = pooling_from_checkpoint(checkpoint)
        if p.choice("pooling", ("auto", "mean", "cls")) != "auto":
            mode = p.str("pooling")
        if p.choice("normalize", ("auto", "true", "false")) != "auto":
            normalize = p.str("normalize") == "true"
        self.max_texts = p.int("max_texts_per_request")
        self.max_text_bytes = p.int("max_text_bytes")
        self.vocab_size = config.vocab_size

        # Behind Triton's batcher (config.pbtxt max_batch_size > 0, see the README), one execute()
        # call carries every request queued meanwhile: fewer IPC round trips per request.
        self.batched = uses_triton_batching(args)
        self.sink = TritonSink("embedder", batch_axis=self.batched)
        graphs = p.choice("cuda_graphs", ("true", "false")) == "true"
        arena = _arena(p, device)
        self.metrics = EmbedderMetrics(args["model_name"], args.get("model_version", "1"))
        self.engine = EmbedderEngine(
            model, self.sink, FifoBatchPolicy(p.int("max_batch_sequences"), p.int("max_batch_tokens")),
            mode, normalize, p.int("max_queue_requests"), cuda_graphs=graphs, arena=arena,
            cache_entries=p.int("response_cache_size", minimum=0),
            cancel_check_after_s=p.int("cancel_check_after_ms", minimum=0) / 1000, stats=self.metrics,
        )
        self.engine.embed([self.tokenizer.encode("warm up")])  # first-call costs before READY
        if self.engine.graphs is not None:
            n = self.engine.graphs.warm_up()
            log.info("captured %d CUDA graphs for small batches", n)
        if device.type == "cuda":
            _warm_up_large_batches(self.engine, p.int("max_batch_tokens"), p.int("max_batch_sequences"),
                                   self.max_tokens)
        if p.choice("batch_policy", ("dp", "fifo")) == "dp":
            key = cost_model_key(device, checkpoint, dtype, {"cuda_graphs": graphs, "arena": arena is not None})
            cost = load_or_measure(self.engine.embed, key, cache_dir(), config.vocab_size, self.max_tokens, device)
            self.engine.policy = DpBatchPolicy(
                cost, p.int("max_batch_sequences"), p.int("max_batch_tokens"),
                p.choice("dp_objective", OBJECTIVES), _trigger(p),
            )
        self.engine.start()
        log.info(
            "embedder ready: %s on %s (%s), pooling=%s normalize=%s, max %d tokens per text, %s batching",
            checkpoint, device, dtype, mode, normalize, self.max_tokens, p.str("batch_policy"),
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                # Triton passes the client's timeout in microseconds (0: none).
                timeout_us = request.timeout()
                deadline = time.monotonic() + timeout_us / 1e6 if timeout_us else None
                self.engine.submit(EmbedRequest(sender, self._sequences(request), deadline=deadline))
            except Exception as e:
                reject(sender, e)
        self.metrics.queue_depth(self.engine.num_queued())
        return None

    def _sequences(self, request) -> list[list[int]]:
        if self.batched:
            one_item_batches(request, ("text_input", "input_ids"))
        arrays = {name: input_array(request, name) for name in ("text_input", "input_ids")}
        truncate = bool_parameter(request_parameters(request), "truncate", False)
        if inputs.exactly_one(arrays, ("text_input", "input_ids")) == "input_ids":
            ids = inputs.token_ids(arrays["input_ids"], "input_ids", self.vocab_size)
            return [inputs.fit_length(ids, self.max_tokens, truncate, "input_ids")]
        texts = inputs.decode_texts(arrays["text_input"], "text_input", self.max_texts, self.max_text_bytes)
        encoded = self.tokenizer.encode_batch(texts)
        return [inputs.fit_length(ids, self.max_tokens, truncate, f"text_input[{i}]") for i, ids in enumerate(encoded)]

    def finalize(self):
        self.engine.stop()
        self.sink.close()
        self.metrics.close()


def _trigger(p) -> TriggerPolicy:
    return TriggerPolicy(
        mode=p.choice("batch_trigger", ("hungry", "lazy", "slo")),
        lazy_timeout_s=p.int("lazy_timeout_ms", minimum=0) / 1000,
        lazy_max_queue=p.int("lazy_max_queue"),
        slo_s=p.int("slo_ms") / 1000,
        max_wait_s=p.int("max_wait_ms") / 1000,
    )


def _arena(p, device) -> ActivationArena | None:
    setting = p.choice("activation_arena", ("auto", "true", "false"))
    if setting == "false" or (setting == "auto" and device.type != "cuda"):
        return None
    return ActivationArena(device, release_after_idle=p.int("arena_release_after_idle", minimum=0))


def _warm_up_large_batches(engine, max_batch_tokens: int, max_batch_sequences: int, max_text_tokens: int) -> None:
    """Run the largest batches the policy can form (above the biggest CUDA-graph bucket they run
    eagerly) once before READY: long texts and many short ones. Their first run compiles kernel
    variants and grows the allocator; measured under load on an H100, that put a ~100 ms p99 on
    the first seconds after start-up."""
    for length in (max_text_tokens, 64):
        count = max(1, min(max_batch_sequences, max_batch_tokens // length))
        engine.embed([[5] * length] * count)  # any valid ids: only the shapes matter here
