"""One way to build an encoder engine (embedder, reranker or classifier) from its settings.

The glue (backend/triton/encoder_model.py) reads config.pbtxt into an `EncoderSpec`. The spec
builds the engine on a thread of the stub's own process, or in the engine process
(backend/engine_process/), where one engine per GPU serves every instance of the model. Either
way the steps are the same: load the checkpoint's encoder family, pick the head (pooled
embeddings, or the classification head's logits), warm up before READY (first-call costs, CUDA
graphs, the largest batches), load or measure the DP batcher's cost table, and say in an
`EncoderInfo` what a stub needs to validate requests without holding the weights.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonformer.backend.encoder.engine import EmbedRequest, EncoderEngine, SplitRequest
from tritonformer.backend.models.encoder import ClassifierLabels
from tritonformer.scheduler.dp_batcher import DpBatchPolicy, TriggerPolicy
from tritonformer.scheduler.fifo import FifoBatchPolicy

log = logging.getLogger("tritonformer")
KINDS = ("embedder", "reranker", "classifier")


RERANKER_SCORE_TOKENS_ENV = "TRITONFORMER_RERANKER_SCORE_TOKENS"  # `tritonformer serve --reranker-score-tokens`


def reranker_score_tokens(parameter: str, checkpoint_parameter: str) -> str:
    """The reranker's score_tokens: its parameter; where both it and the `checkpoint` parameter
    are empty (the checkpoint the environment names), the environment's."""
    if parameter or checkpoint_parameter:
        return parameter
    return os.environ.get(RERANKER_SCORE_TOKENS_ENV, "").strip()


def score_token_ids(tokenizer, score_tokens: str) -> tuple[int, ...]:
    """The ids of `score_tokens` ("no,yes": comma-separated, each one token of the vocabulary)."""
    ids = []
    for text in filter(None, (t.strip() for t in score_tokens.split(","))):
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"score_tokens: {text!r} is {len(encoded)} tokens of this vocabulary, not one")
        ids.append(encoded[0])
    if len(ids) > 2:
        raise ValueError(f"score_tokens names {len(ids)} tokens: one (its logit) or two (no, yes: their difference)")
    return tuple(ids)


def head_rows(rows: np.ndarray) -> dict:
    """A request's head rows as they leave the engine process: the stub that holds the request
    turns them into its response (its `outputs` function)."""
    return {"rows": rows}


@dataclass(frozen=True)
class EncoderInfo:
    """What a stub needs of the engine's model to validate requests and shape responses."""

    vocab_size: int
    max_tokens: int  # per sequence: the model's positions and the tokenizer's model_max_length
    labels: ClassifierLabels | None  # the classification head's labels (reranker, classifier)
    token_types: bool  # requests carry segment ids (text pairs on a model with several token types)
    device: str
    pid: int


@dataclass(frozen=True)
class EncoderSpec:
    """An encoder engine's model and settings (the encoder models' config parameters)."""

    kind: str  # embedder | reranker | classifier: the head, the cost table's key, log lines
    checkpoint: str
    device: str  # "cpu" or "cuda:N"
    dtype: str  # a torch dtype's name: "float16"
    quantization: str = "none"
    allow_pickle: bool = False
    pooling: str = "auto"  # the embedder's: auto (from the checkpoint) | mean | cls | last
    score_tokens: str = ""  # the reranker's: a decoder's next-token logits as its score ("no,yes"), see models/encoder.py
    normalize: str = "auto"  # the embedder's: auto | true | false
    max_batch_sequences: int = 256
    max_batch_tokens: int = 8192  # the largest CUDA-graph bucket (cuda_graphs.TOKEN_BUCKETS)
    max_queue_requests: int = 1024
    cuda_graphs: bool = True
    activation_arena: str = "false"  # auto (on GPU) | true | false
    arena_release_after_idle: int = 0
    response_cache_size: int = 1024
    cancel_check_after_s: float = 0.02
    batch_policy: str = "fifo"  # fifo | dp
    dp_objective: str = "throughput"
    trigger: TriggerPolicy = TriggerPolicy()
    warm_up: bool = True

    def build(self, sink, stats=None):
        """Load, build, warm up: (engine, None, EncoderInfo); the engine is not started. (The
        None stands for tensor-parallel workers, which encoders do not have: the engine process
        takes every engine's spec alike.)"""
        import torch

        from tritonformer.backend.checkpoints import cache_dir
        from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
        from tritonformer.backend.encoder.cost_measure import cost_model_key, load_or_measure
        from tritonformer.backend.quantization import load_encoder
        from tritonformer.backend.tokenization import TextTokenizer

        if self.kind not in KINDS:
            raise ValueError(f"unknown encoder kind {self.kind!r}; one of {KINDS}")
        device, dtype = torch.device(self.device), getattr(torch, self.dtype)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        checkpoint = Path(self.checkpoint)
        tokenizer = TextTokenizer(checkpoint)
        model = load_encoder(load_config(checkpoint), load_state_dict(checkpoint, allow_pickle=self.allow_pickle),
                             device, dtype, self.quantization, score_token_ids(tokenizer, self.score_tokens))
        max_tokens = min(model.config.max_tokens_per_sequence, tokenizer.config.get("model_max_length", 10**9))
        token_types = self.kind == "reranker" and getattr(model.config, "type_vocab_size", 1) > 1
        engine = EncoderEngine(
            model, sink, FifoBatchPolicy(self.max_batch_sequences, self.max_batch_tokens),
            max_queue=self.max_queue_requests, cuda_graphs=self.cuda_graphs, arena=self._arena(device),
            cache_entries=self.response_cache_size, cancel_check_after_s=self.cancel_check_after_s, stats=stats,
            name=f"tritonformer-{self.kind}", token_types=token_types, **self._head(model, checkpoint),
        )
        if self.warm_up:
            engine.embed([tokenizer.encode("warm up")])  # first-call costs before READY
            if engine.graphs is not None:
                log.info("captured %d CUDA graphs", engine.graphs.warm_up())
            if device.type == "cuda":
                _warm_up_large_batches(engine, self.max_batch_tokens, self.max_batch_sequences, max_tokens)
        if self.batch_policy == "dp":
            key = cost_model_key(device, checkpoint, dtype,
                                 {"cuda_graphs": self.cuda_graphs, "arena": engine.arena is not None,
                                  "head": self.kind, "quantization": self.quantization})
            cost = load_or_measure(engine.embed, key, cache_dir(), model.config.vocab_size, max_tokens, device)
            engine.policy = DpBatchPolicy(cost, self.max_batch_sequences, self.max_batch_tokens,
                                          self.dp_objective, self.trigger)
        info = EncoderInfo(model.config.vocab_size, max_tokens, model.labels, token_types, str(device), os.getpid())
        return engine, None, info

    def _head(self, model, checkpoint: Path) -> dict:
        """The engine's head arguments: pooled embeddings, or the classification head's logits."""
        if self.kind == "embedder":
            from tritonformer.backend.models.bert import pooling_from_checkpoint

            mode, normalize = pooling_from_checkpoint(checkpoint)
            return {"pooling": mode if self.pooling == "auto" else self.pooling,
                    "normalize": normalize if self.normalize == "auto" else self.normalize == "true"}
        if model.labels is None:
            raise ValueError(f"{checkpoint} has no sequence-classification head (config.json architectures "
                             f"name no *ForSequenceClassification)"
                             + (": the reranker needs a cross-encoder" if self.kind == "reranker" else ""))
        if self.kind == "reranker" and model.labels.num_labels != 1:
            raise ValueError(f"{checkpoint}'s head has {model.labels.num_labels} labels; a reranker reads one "
                             f"relevance logit (serve this checkpoint with the classifier model)")
        return {"head": model.classify}

    def _arena(self, device):
        from tritonformer.backend.encoder.activation_arena import ActivationArena

        if self.activation_arena == "false" or (self.activation_arena == "auto" and device.type != "cuda"):
            return None
        return ActivationArena(device, release_after_idle=self.arena_release_after_idle)

    @staticmethod
    def new_item(engine, handle, args: tuple):
        """The queue item, answered with `head_rows`, for a request that crossed from a stub as
        `item_args(item)`."""
        sequences, token_types, arrival, deadline, split = args
        kind = SplitRequest if split else EmbedRequest
        return kind(handle, sequences, outputs=head_rows, token_types=token_types, arrival=arrival,
                    deadline=deadline)


def item_args(item: EmbedRequest | SplitRequest) -> tuple:
    """What of a queue item crosses to the engine process (its `outputs` function stays with
    the stub). Arrival and deadline are time.monotonic() values: one clock for every process."""
    return item.sequences, item.token_types, item.arrival, item.deadline, isinstance(item, SplitRequest)


def _warm_up_large_batches(engine, max_batch_tokens: int, max_batch_sequences: int, max_text_tokens: int) -> None:
    """Run the largest batches the policy can form (above the biggest CUDA-graph bucket they run
    eagerly) once before READY: long texts and many short ones. Their first run compiles kernel
    variants and grows the allocator; measured under load on an H100, that put a ~100 ms p99 on
    the first seconds after start-up."""
    for length in (max_text_tokens, 64):
        count = max(1, min(max_batch_sequences, max_batch_tokens // length))
        engine.embed([[5] * length] * count)  # any valid ids: only the shapes matter here
