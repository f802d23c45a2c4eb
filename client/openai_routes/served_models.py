"""What the routes need to know about the models Triton serves, read once from Triton itself.

The routes apply the chat template and count prompt tokens themselves (the generator's
`apply_chat_template` key renders one user turn only, not a conversation with a system prompt),
so they need the served checkpoint's tokenizer. They find it the way the model found it: the
`checkpoint` parameter of the model's config (as Triton reports it, overrides included), empty
for the bundled default, a bundled name, or a folder path (`backend/triton/glue.load_settings`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from tritonformer.backend.checkpoints import (
    DEFAULT_GENERATOR,
    GENERATOR_CHECKPOINTS,
    minilm_dir,
    prepare_generator_checkpoint,
)
from tritonformer.backend.tokenization import TextTokenizer

GENERATOR = "generator"
EMBEDDER = "embedder"
RERANKER = "reranker"
CLASSIFIER = "classifier"
# What `tritonformer serve --reranker-checkpoint / --classifier-checkpoint` set (the models read them too).
CHECKPOINT_ENVS = {RERANKER: "TRITONFORMER_RERANKER_CHECKPOINT", CLASSIFIER: "TRITONFORMER_CLASSIFIER_CHECKPOINT"}


@dataclass(frozen=True)
class ServedModel:
    """One Triton model as the OpenAI routes use it.

    `kind` is GENERATOR (decoupled, `text_output`), EMBEDDER (`embedding`), RERANKER (`query`
    and `texts` in, `scores` out) or CLASSIFIER (`probabilities` and `labels` out); `inputs` are
    the input names its config declares, so a request only carries the optional inputs the model
    accepts (the vLLM-format flags need the generator's newer config). A reranker or classifier
    configured with no checkpoint has no tokenizer (the model itself answers every request with
    how to configure it)."""

    name: str
    kind: str
    checkpoint: Path | None
    tokenizer: TextTokenizer | None = field(repr=False)
    inputs: frozenset[str]
    outputs: frozenset[str]
    context_length: int = 0  # generator: the longest prompt + output it serves
    max_tokens_limit: int = 0  # generator: the largest max_tokens a request may ask for
    max_prompt_bytes: int = 0  # generator: its bound on prompt text, kept by the routes (they send ids)
    created: int = 0  # unix time the routes found it (OpenAI's `created`)


def model_kind(config: dict) -> str | None:
    """GENERATOR, EMBEDDER or None (a model the OpenAI routes do not serve) from a Triton config."""
    outputs = {o["name"] for o in config.get("output", [])}
    decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
    if decoupled and "text_output" in outputs:
        return GENERATOR
    inputs = {i["name"] for i in config.get("input", [])}
    if "embedding" in outputs and "text_input" in inputs:
        return EMBEDDER
    if "scores" in outputs and {"query", "texts"} <= inputs:
        return RERANKER
    if {"probabilities", "labels"} <= outputs and "text_input" in inputs:
        return CLASSIFIER
    return None


def parameter(config: dict, key: str, default: str = "") -> str:
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


def generator_checkpoint(value: str) -> Path:
    """The generator's checkpoint folder for its `checkpoint` parameter's value."""
    if value in GENERATOR_CHECKPOINTS or not value:
        return prepare_generator_checkpoint(value or DEFAULT_GENERATOR, progress=False)
    return Path(value)


def embedder_checkpoint(value: str) -> Path:
    return Path(value) if value else minilm_dir()


def head_checkpoint(kind: str, value: str) -> Path | None:
    """A reranker's or classifier's folder: its `checkpoint` parameter, else the bundled server's
    environment variable (as the model itself resolves it), else None (none ships)."""
    value = value or os.environ.get(CHECKPOINT_ENVS[kind], "")
    return Path(value) if value else None


def context_length(hf_config: dict, max_model_len: str) -> int:
    """Longest sequence (prompt + output): the checkpoint's positions, capped by `max_model_len`
    (GPT-2 calls them `n_positions`), as backend/models/decoder.load_decoder sizes the model; a sparse-attention
    checkpoint's (`index_topk`: DeepSeek-V3.2, GLM-5) at most index_topk, as its family serves it."""
    longest = hf_config.get("max_position_embeddings") or hf_config.get("n_positions") or 2048
    if hf_config.get("index_topk"):
        longest = min(longest, int(hf_config["index_topk"]))
    if max_model_len not in ("", "auto"):
        longest = min(longest, int(max_model_len))
    return int(longest)


def served_model(name: str, config: dict, created: int) -> ServedModel | None:
    """A ServedModel for Triton model `name` and its config (JSON), or None if not one of ours."""
    kind = model_kind(config)
    if kind is None:
        return None
    inputs = frozenset(i["name"] for i in config.get("input", []))
    outputs = frozenset(o["name"] for o in config.get("output", []))
    value = parameter(config, "checkpoint")
    if kind == GENERATOR:
        checkpoint = generator_checkpoint(value)
        return ServedModel(
            name, kind, checkpoint, TextTokenizer(checkpoint), inputs, outputs,
            context_length=context_length(json.loads((checkpoint / "config.json").read_text()),
                                          parameter(config, "max_model_len", "auto")),
            max_tokens_limit=int(parameter(config, "max_tokens_limit", "4096")),
            max_prompt_bytes=int(parameter(config, "max_prompt_bytes", "200000")),
            created=created,
        )
    if kind in CHECKPOINT_ENVS:
        checkpoint = head_checkpoint(kind, value)
        tokenizer = TextTokenizer(checkpoint) if checkpoint and (checkpoint / "tokenizer.json").is_file() else None
        return ServedModel(name, kind, checkpoint, tokenizer, inputs, outputs, created=created)
    checkpoint = embedder_checkpoint(value)
    return ServedModel(name, kind, checkpoint, TextTokenizer(checkpoint), inputs, outputs, created=created)
