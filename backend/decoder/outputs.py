"""What a generator response carries beyond text and ids: the vLLM backend's optional outputs.

Triton's OpenAI frontend (`--backend vllm`) and other clients of vLLM's Triton backend ask for
them with BOOL inputs: `exclude_input_in_output` (false: the prompt text comes first, OpenAI's
`echo`), `return_num_input_tokens`, `return_num_output_tokens` (each response counts its own new
tokens, so a stream's counts add up to the completion's) and `return_logprobs` (JSON, per token
`{token_id: {"logprob", "rank", "decoded_token"}}`). n > 1 samples of one prompt answer through
one sender; each response says which sample it belongs to in `index`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class ResponseOptions:
    """A request's choice of outputs (the vLLM contract's flags); the defaults are the native
    contract's responses, unchanged."""

    echo_prompt: str | None = None  # put before the completion's text (exclude_input_in_output false)
    num_input_tokens: bool = False
    num_output_tokens: bool = False
    logprobs: bool = False


class RequestGroup:
    """The n > 1 samples of one request: one response sender, one FINAL flag (on the response
    of the sample that ends last), one error at most."""

    def __init__(self, n: int):
        self.n = n
        self.live = n
        self.closed = False  # an error was answered: nothing more may be sent

    def leave(self) -> bool:
        """A sample ended; whether it was the last one."""
        self.live -= 1
        return self.live == 0


def extra_outputs(options: ResponseOptions, num_prompt_tokens: int, num_new_tokens: int,
                  logprobs: list[dict[int, tuple[float, int]]] | None, decode: Callable[[int], str],
                  index: int | None) -> dict[str, np.ndarray]:
    """The optional outputs of one response holding `num_new_tokens` new tokens whose
    log-probabilities are `logprobs` (None: the request did not ask for any in its sampling
    parameters, answered as vLLM does, with "null")."""
    out = {}
    if options.num_input_tokens:
        out["num_input_tokens"] = np.array([num_prompt_tokens], dtype=np.uint32)
    if options.num_output_tokens:
        out["num_output_tokens"] = np.array([num_new_tokens], dtype=np.uint32)
    if options.logprobs:
        out["logprobs"] = np.array([logprobs_json(logprobs, decode)], dtype=np.object_)
    if index is not None:
        out["index"] = np.array([index], dtype=np.int32)
    return out


def logprobs_json(entries: list[dict[int, tuple[float, int]]] | None, decode: Callable[[int], str]) -> bytes:
    """vLLM's `logprobs` output: a JSON list with one object per token, keyed by token id."""
    if entries is None:
        return b"null"
    return json.dumps([
        {str(token): {"logprob": lp, "rank": rank, "decoded_token": decode(token)} for token, (lp, rank) in e.items()}
        for e in entries
    ]).encode()
