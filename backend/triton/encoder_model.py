"""What the `embedder`, `reranker` and `classifier` TritonPythonModels share (none is decoupled).

initialize() loads the checkpoint's encoder family (models/encoder.py), builds one engine with
its length-aware queue (fifo or dp), warms it up and starts it; execute() validates, tokenizes
and queues each request, then returns None; the engine thread answers every request exactly
once, later (Triton >= 24.06 allows that for non-decoupled models), so plain HTTP/gRPC `infer`
and perf_analyzer work. A subclass says which checkpoint it serves by default, what its head
reads off the hidden states, and how a request becomes queue items (`parse`).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from tritonformer.backend.checkpoints import cache_dir
from tritonformer.backend.checkpoints.weights import load_config
from tritonformer.backend.encoder.activation_arena import ActivationArena
from tritonformer.backend.encoder.cost_measure import cost_model_key, load_or_measure
from tritonformer.backend.encoder.engine import EncoderEngine
from tritonformer.backend.errors import ModelNotConfigured
from tritonformer.backend.models.encoder import Encoder
from tritonformer.backend.quantization import load_encoder
from tritonformer.backend.tokenization import TextTokenizer
from tritonformer.backend.triton.glue import (
    TritonSink,
    checkpoint_weights,
    load_settings,
    reject,
    setup_logging,
    uses_triton_batching,
)
from tritonformer.backend.triton.params import ModelParameters
from tritonformer.backend.triton.metrics import EmbedderMetrics
from tritonformer.scheduler.dp_batcher import OBJECTIVES, DpBatchPolicy, TriggerPolicy
from tritonformer.scheduler.fifo import FifoBatchPolicy

log = logging.getLogger("tritonformer")

# The parameters every encoder model takes (README: "Set parameters in each config.pbtxt").
ENCODER_PARAMETERS = {
    "checkpoint": "",  # a checkpoint folder (config.json + *.safetensors + tokenizer.json)
    "allow_pickle_checkpoint": "false",  # true: load pickle .bin weights (weights_only) if no safetensors
    "device": "auto",  # auto | cpu | cuda
    "dtype": "auto",  # auto (fp16 on GPU, fp32 on CPU) | float32 | float16 | bfloat16
    "quantization": "none",  # none | fp8: FP8 linears (GPU compute capability >= 8.9); FP8 checkpoints load as FP8
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
    "response_cache_size": "1024",  # head rows of recent token sequences kept for repeats; 0 = off
    "cancel_check_after_ms": "20",  # ask Triton about cancellation only for requests this old
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

    def configure(self, p, checkpoint: Path, model: Encoder) -> dict:
        """Read the model's own parameters; returns extra EncoderEngine arguments (head, ...)."""
        return {}

    def parse(self, request, sender, deadline: float | None):
        """A request -> one queue item for EncoderEngine.submit, answered through `sender` (raise
        InvalidRequest on bad input)."""
        raise NotImplementedError

    def not_configured_message(self) -> str:
        return f"the {self.name} model has no checkpoint"

    # ---- Triton's entry points ------------------------------------------------------------
    def initialize(self, args):
        self.name = args["model_name"]
        self.engine = None
        setup_logging()
        if not ModelParameters.from_args(args, self.PARAMETERS).str("checkpoint") and self.default_checkpoint() is None:
            # Ready, and answering UNAVAILABLE with how to name a checkpoint: a model folder
            # without one must never stop a server (--exit-on-error, strict readiness) from serving
            # the others. Decided before picking a device: an idle model holds no CUDA context.
            log.warning("%s", self.not_configured_message())
            return
        p, checkpoint, device, dtype = load_settings(args, self.PARAMETERS, self.default_checkpoint)
        hf_config = load_config(checkpoint)
        quantization = p.str("quantization")
        model = load_encoder(hf_config, checkpoint_weights(p, checkpoint), device, dtype, quantization)
        self.model = model
        self.tokenizer = TextTokenizer(checkpoint)
        self.max_tokens = min(model.config.max_tokens_per_sequence,
                              self.tokenizer.config.get("model_max_length", 10**9))
        self.max_texts = p.int("max_texts_per_request")
        self.max_text_bytes = p.int("max_text_bytes")
        self.vocab_size = model.config.vocab_size
        engine_options = self.configure(p, checkpoint, model)

        # Behind Triton's batcher (config.pbtxt max_batch_size > 0, see the README), one execute()
        # call carries every request queued meanwhile: fewer IPC round trips per request.
        self.batched = uses_triton_batching(args)
        self.sink = TritonSink(self.name, batch_axis=self.batched)
        graphs = p.choice("cuda_graphs", ("true", "false")) == "true"
        arena = _arena(p, device)
        self.metrics = EmbedderMetrics(self.name, args.get("model_version", "1"))
        self.engine = EncoderEngine(
            model, self.sink, FifoBatchPolicy(p.int("max_batch_sequences"), p.int("max_batch_tokens")),
            max_queue=p.int("max_queue_requests"), cuda_graphs=graphs, arena=arena,
            cache_entries=p.int("response_cache_size", minimum=0),
            cancel_check_after_s=p.int("cancel_check_after_ms", minimum=0) / 1000, stats=self.metrics,
            name=f"tritonformer-{self.KIND}", **engine_options,
        )
        self.engine.embed([self.tokenizer.encode("warm up")])  # first-call costs before READY
        if self.engine.graphs is not None:
            n = self.engine.graphs.warm_up()
            log.info("captured %d CUDA graphs for small batches", n)
        if device.type == "cuda":
            _warm_up_large_batches(self.engine, p.int("max_batch_tokens"), p.int("max_batch_sequences"),
                                   self.max_tokens)
        if p.choice("batch_policy", ("dp", "fifo")) == "dp":
            key = cost_model_key(device, checkpoint, dtype,
                                 {"cuda_graphs": graphs, "arena": arena is not None, "head": self.KIND,
                                  "quantization": quantization})
            cost = load_or_measure(self.engine.embed, key, cache_dir(), model.config.vocab_size, self.max_tokens, device)
            self.engine.policy = DpBatchPolicy(
                cost, p.int("max_batch_sequences"), p.int("max_batch_tokens"),
                p.choice("dp_objective", OBJECTIVES), _trigger(p),
            )
        self.engine.start()
        log.info("%s ready: %s on %s (%s, quantization %s), max %d tokens per sequence, %s batching",
                 self.name, checkpoint, device, dtype, quantization, self.max_tokens, p.str("batch_policy"))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                if self.engine is None:
                    raise ModelNotConfigured(self.not_configured_message())
                # Triton passes the client's timeout in microseconds (0: none).
                timeout_us = request.timeout()
                deadline = time.monotonic() + timeout_us / 1e6 if timeout_us else None
                self.engine.submit(self.parse(request, sender, deadline))
            except Exception as e:
                reject(sender, e)
        if self.engine is not None:
            self.metrics.queue_depth(self.engine.num_queued())
        return None

    def finalize(self):
        if self.engine is None:
            return
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
