"""What the `embedder`, `reranker` and `classifier` TritonPythonModels share (none is decoupled).

initialize() reads config.pbtxt into an EncoderSpec (backend/encoder/build.py), which loads the
checkpoint's encoder family and builds one engine with its length-aware queue (fifo or dp),
warmed up. With `engine_process` false the engine runs on a thread of this stub's process; with
true it runs in a process of its own, one per GPU, shared by every instance of the model
(backend/engine_process/). execute() validates, tokenizes and queues each request, then returns
None; the engine answers every request exactly once, later (Triton >= 24.06 allows that for
non-decoupled models), so plain HTTP/gRPC `infer` and perf_analyzer work. A subclass says which
checkpoint it serves by default, what its requests need of the model (`configure`), and how a
request becomes a queue item (`parse`).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from tritonformer.backend.encoder.build import EncoderInfo, EncoderSpec, item_args
from tritonformer.backend.engine_process.client import EngineClient
from tritonformer.backend.engine_process.rendezvous import instance_key
from tritonformer.backend.errors import ModelNotConfigured
from tritonformer.backend.tokenization import TextTokenizer
from tritonformer.backend.triton.glue import TritonSink, load_settings, reject, setup_logging, uses_triton_batching
from tritonformer.backend.triton.metrics import EmbedderMetrics
from tritonformer.backend.triton.params import ModelParameters
from tritonformer.kernels.reference import POOLING_MODES
from tritonformer.scheduler.dp_batcher import OBJECTIVES, TriggerPolicy

log = logging.getLogger("tritonformer")

# The parameters every encoder model takes (README: "Set parameters in each config.pbtxt").
ENCODER_PARAMETERS = {
    "checkpoint": "",  # a checkpoint folder (config.json + *.safetensors + tokenizer.json)
    "allow_pickle_checkpoint": "false",  # true: load pickle .bin weights (weights_only) if no safetensors
    "device": "auto",  # auto | cpu | cuda
    "dtype": "auto",  # auto (fp16 on GPU, fp32 on CPU) | float32 | float16 | bfloat16
    "quantization": "none",  # none | fp8: FP8 linears (GPU compute capability >= 8.9); FP8 checkpoints load as FP8
    "max_batch_sequences": "256",
    "max_batch_tokens": "8192",  # the largest CUDA-graph bucket: larger batches run eagerly
    "max_queue_requests": "1024",
    "max_texts_per_request": "256",
    "max_text_bytes": "100000",
    "cuda_graphs": "true",  # replay captured CUDA graphs, batches up to 8192 tokens and 256 texts (GPU only)
    "activation_arena": "false",  # auto (on GPU) | true | false: length-aware activation allocator
    "arena_release_after_idle": "0",  # release an unused arena chunk after N idle batches
    "batch_policy": "fifo",  # fifo (arrival order up to the caps) | dp (length-aware dynamic programming)
    "dp_objective": "throughput",  # throughput | latency (mean completion time)
    "batch_trigger": "hungry",  # hungry | lazy | slo
    "lazy_timeout_ms": "2",
    "lazy_max_queue": "64",
    "slo_ms": "50",  # latency budget the slo trigger and the DP's oldest-first rule aim for
    "max_wait_ms": "500",  # starvation bound: nobody waits longer behind shorter requests
    "response_cache_size": "1024",  # head rows of recent token sequences kept for repeats; 0 = off
    "cancel_check_after_ms": "20",  # ask Triton about cancellation only for requests this old
    # true: the engine runs in a process of its own, one per GPU, shared by this model's instances
    # (one queue and one copy of the weights for all of them); false: on a thread of each instance
    "engine_process": "false",
    "response_threads": "4",  # threads sending responses to Triton (each send is an IPC round trip)
}


class EncoderTritonModel:
    """The shared TritonPythonModel body; subclasses fill in the class attributes and hooks."""

    KIND = "encoder"  # the model's role in log lines and the cost table's key
    PARAMETERS = ENCODER_PARAMETERS
    # The environment variable naming a checkpoint when the `checkpoint` parameter is empty
    # (how `tritonformer serve --reranker-checkpoint` reaches the model); None: no such variable.
    CHECKPOINT_ENV: str | None = None

    # ---- hooks ----------------------------------------------------------------------------
    def default_checkpoint(self) -> Path | None:
        """The folder served when the `checkpoint` parameter is empty: the environment variable
        CHECKPOINT_ENV names; None: serve nothing (ModelNotConfigured for every request)."""
        value = os.environ.get(self.CHECKPOINT_ENV, "").strip() if self.CHECKPOINT_ENV else ""
        return Path(value) if value else None

    def configure(self, p, checkpoint: Path, info: EncoderInfo) -> None:
        """Read the model's own parameters and what its requests need of the model (a pair
        tokenizer, the labels' names); the engine itself is built from `spec`."""

    def parse(self, request, sender, deadline: float | None):
        """A request -> one queue item for EncoderEngine.submit, answered through `sender` (raise
        InvalidRequest on bad input)."""
        raise NotImplementedError

    def not_configured_message(self) -> str:
        return f"the {self.name} model has no checkpoint"

    # ---- Triton's entry points ------------------------------------------------------------
    def initialize(self, args):
        self.name = args["model_name"]
        self.engine = self.client = None
        setup_logging()
        if not ModelParameters.from_args(args, self.PARAMETERS).str("checkpoint") and self.default_checkpoint() is None:
            # Ready, and answering UNAVAILABLE with how to name a checkpoint: a model folder
            # without one must never stop a server (--exit-on-error, strict readiness) from serving
            # the others. Decided before picking a device: an idle model holds no CUDA context.
            log.warning("%s", self.not_configured_message())
            return
        p, checkpoint, device, dtype = load_settings(args, self.PARAMETERS, self.default_checkpoint)
        spec = self.spec(p, checkpoint, device, dtype)
        self.tokenizer = TextTokenizer(checkpoint)
        self.max_texts = p.int("max_texts_per_request")
        self.max_text_bytes = p.int("max_text_bytes")
        # Behind Triton's batcher (config.pbtxt max_batch_size > 0, see the README), one execute()
        # call carries every request queued meanwhile: fewer IPC round trips per request.
        self.batched = uses_triton_batching(args)
        self.sink = TritonSink(self.name, batch_axis=self.batched, threads=p.int("response_threads", minimum=1))
        self.metrics = EmbedderMetrics(self.name, args.get("model_version", "1"))
        if p.choice("engine_process", ("true", "false")) == "true":
            key = instance_key(self.name, args.get("model_version", "1"), str(device))
            self.client = EngineClient.connect(spec, _HeadRowsSink(self.sink), self.metrics, key,
                                               spec.cancel_check_after_s, name=self.name,
                                               cancel_check_after_s=spec.cancel_check_after_s)
            info = self.client.info
            where = f"engine process {info.pid}"
        else:
            self.engine, _, info = spec.build(self.sink, self.metrics)
            self.engine.start()
            where = "this process"
        self.vocab_size, self.max_tokens = info.vocab_size, info.max_tokens
        self.configure(p, checkpoint, info)
        log.info("%s ready: %s on %s (%s, quantization %s, %s), max %d tokens per sequence, %s batching",
                 self.name, checkpoint, device, dtype, spec.quantization, where, self.max_tokens, spec.batch_policy)

    def spec(self, p, checkpoint: Path, device, dtype) -> EncoderSpec:
        """The engine's settings, from config.pbtxt."""
        extra = {}
        if "score_tokens" in self.PARAMETERS:
            extra["score_tokens"] = p.str("score_tokens")
        if "pooling" in self.PARAMETERS:
            extra.update(pooling=p.choice("pooling", ("auto", *POOLING_MODES)),
                         normalize=p.choice("normalize", ("auto", "true", "false")))
        return EncoderSpec(
            self.KIND, str(checkpoint), str(device), str(dtype).removeprefix("torch."), p.str("quantization"),
            p.choice("allow_pickle_checkpoint", ("true", "false")) == "true",
            max_batch_sequences=p.int("max_batch_sequences"), max_batch_tokens=p.int("max_batch_tokens"),
            max_queue_requests=p.int("max_queue_requests"),
            cuda_graphs=p.choice("cuda_graphs", ("true", "false")) == "true",
            activation_arena=p.choice("activation_arena", ("auto", "true", "false")),
            arena_release_after_idle=p.int("arena_release_after_idle", minimum=0),
            response_cache_size=p.int("response_cache_size", minimum=0),
            cancel_check_after_s=p.int("cancel_check_after_ms", minimum=0) / 1000,
            batch_policy=p.choice("batch_policy", ("dp", "fifo")), dp_objective=p.choice("dp_objective", OBJECTIVES),
            trigger=_trigger(p), **extra,
        )

    def execute(self, requests):
        items = []  # (sender, queue item) of the valid requests
        for request in requests:
            sender = request.get_response_sender()
            try:
                if self.engine is None and self.client is None:
                    raise ModelNotConfigured(self.not_configured_message())
                # Triton passes the client's timeout in microseconds (0: none).
                timeout_us = request.timeout()
                deadline = time.monotonic() + timeout_us / 1e6 if timeout_us else None
                items.append((sender, self.parse(request, sender, deadline)))
            except Exception as e:
                reject(sender, e)
        if self.client is not None:
            try:  # one message for the whole call; the request's outputs function stays here
                self.client.submit([((sender, item.outputs), *item_args(item)) for sender, item in items])
            except Exception as e:  # the engine process is gone: nothing was queued
                for sender, _ in items:
                    reject(sender, e)
            return None
        for sender, item in items:
            try:
                self.engine.submit(item)
            except Exception as e:
                reject(sender, e)
        if self.engine is not None:
            self.metrics.queue_depth(self.engine.num_queued())
        return None

    def is_ready(self) -> bool:
        """Triton versions with this hook (after 2.51) report the model not ready once its
        engine process is gone; on every version its requests then fail with UNAVAILABLE."""
        return self.client is None or self.client.failure is None

    def finalize(self):
        if self.client is not None:
            self.client.close()  # the engine process stops when its last stub has gone
        elif self.engine is not None:
            self.engine.stop()
        else:
            return
        self.sink.close()
        self.metrics.close()


class _HeadRowsSink:
    """The stub's sink for an engine process: the engine answers with a request's head rows
    (`head_rows`), and the request's `outputs` function, kept here with its sender, makes the
    response's tensors (embeddings, scores, label probabilities) before Triton's sink sends it."""

    def __init__(self, sink: TritonSink):
        self.sink = sink

    def send(self, handle, outputs, error, final) -> None:
        sender, to_outputs = handle
        if outputs is not None:
            try:
                outputs = to_outputs(outputs["rows"])
            except Exception as e:  # a bug in an output function must still answer the request
                log.exception("building the response failed")
                outputs, error = None, RuntimeError(f"building the response failed: {e}")
        self.sink.send(sender, outputs, error, final)

    def is_cancelled(self, handle) -> bool:
        return self.sink.is_cancelled(handle[0])


def _trigger(p) -> TriggerPolicy:
    return TriggerPolicy(
        mode=p.choice("batch_trigger", ("hungry", "lazy", "slo")),
        lazy_timeout_s=p.int("lazy_timeout_ms", minimum=0) / 1000,
        lazy_max_queue=p.int("lazy_max_queue"),
        slo_s=p.int("slo_ms") / 1000,
        max_wait_s=p.int("max_wait_ms") / 1000,
    )

