"""OpenAI response objects and stream chunks, built from the generator's pieces.

The generator's `logprobs` output is vLLM's: per new token `{token_id: {"logprob", "rank",
"decoded_token"}}`, holding the sampled token and the top k (rank 1 = most likely). The chat API
wants them as `content: [{token, logprob, bytes, top_logprobs: [...]}]`, the legacy completions
API as parallel lists (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from tritonformer.backend.tokenization import TextTokenizer
from tritonformer.client.openai_routes.triton_calls import Piece

# The generator's finish reasons; "cancelled" never reaches a client that is still there.
FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "stop"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    return b"data: " + (obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass
class TokenLogprob:
    """The sampled token's log-probability and the top alternatives (by rank)."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


def token_logprobs(piece: Piece, tokenizer: TextTokenizer, top_n: int) -> list[TokenLogprob]:
    """The piece's new tokens with their logprobs (decoded_token, else decoded here)."""
    if not piece.logprobs:
        return []

    def text(token_id: str, entry: dict) -> str:
        decoded = entry.get("decoded_token")
        return decoded if decoded is not None else tokenizer.decode([int(token_id)], skip_special_tokens=False)

    out = []
    for token_id, entries in zip(piece.token_ids, piece.logprobs):
        chosen = entries.get(str(token_id))
        if chosen is None:  # not expected: the generated token is always listed
            continue
        ranked = sorted(entries.items(), key=lambda item: item[1].get("rank", 1 << 30))[:top_n]
        out.append(TokenLogprob(text(str(token_id), chosen), float(chosen["logprob"]),
                                [(text(tid, e), float(e["logprob"])) for tid, e in ranked]))
    return out


def chat_logprobs(tokens: list[TokenLogprob]) -> dict:
    def item(token: str, logprob: float) -> dict:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {"content": [{**item(t.token, t.logprob), "top_logprobs": [item(s, lp) for s, lp in t.top]}
                        for t in tokens]}


def completion_logprobs(tokens: list[TokenLogprob], start_offset: int) -> dict:
    offsets, at = [], start_offset
    for t in tokens:
        offsets.append(at)
        at += len(t.token)
    return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [dict(t.top) for t in tokens], "text_offset": offsets}


@dataclass
class Choice:
    """One choice of a non-streamed answer, accumulated from its pieces."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, piece: Piece, tokens: list[TokenLogprob]) -> None:
        self.text += piece.text
        self.logprobs.extend(tokens)
        if piece.finish_reason:
            self.finish_reason = FINISH_REASONS.get(piece.finish_reason, piece.finish_reason)


class TokenCounter:
    """Usage from the pieces: prompt tokens from the first response that reports them (else the
    routes' own count), output tokens summed over the stream (each response counts its own new
    tokens; without the count output, its output ids)."""

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self._reported_prompt = False

    def add(self, piece: Piece) -> None:
        if piece.num_input_tokens is not None and not self._reported_prompt:
            self.prompt_tokens, self._reported_prompt = piece.num_input_tokens, True
        self.completion_tokens += piece.num_output_tokens if piece.num_output_tokens is not None \
            else len(piece.token_ids)


class ChatShape:
    """How /v1/chat/completions answers: `message` / `delta` objects, logprobs as `content`."""

    whole_object, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    @staticmethod
    def whole_choice(index: int, choice: Choice, logprobs: bool, echo: str) -> dict:
        return {"index": index, "message": {"role": "assistant", "content": choice.text},
                "logprobs": chat_logprobs(choice.logprobs) if logprobs else None,
                "finish_reason": choice.finish_reason}

    @staticmethod
    def opening(index: int, echo: str) -> dict | None:
        """The choice's first chunk, before its text: the assistant's role."""
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}

    @staticmethod
    def chunk_choice(index: int, text: str, tokens: list[TokenLogprob] | None, finish: str | None,
                     offset: int) -> dict:
        return {"index": index, "delta": {"content": text} if text else {},
                "logprobs": chat_logprobs(tokens) if tokens is not None else None, "finish_reason": finish}


class CompletionShape:
    """How /v1/completions answers: `text`, logprobs as parallel lists with text offsets."""

    whole_object = chunk_object = "text_completion"
    id_prefix = "cmpl"

    @staticmethod
    def whole_choice(index: int, choice: Choice, logprobs: bool, echo: str) -> dict:
        return {"index": index, "text": choice.text, "finish_reason": choice.finish_reason,
                "logprobs": completion_logprobs(choice.logprobs, len(echo)) if logprobs else None}

    @staticmethod
    def opening(index: int, echo: str) -> dict | None:
        """The echoed prompt, if any, as the choice's first chunk."""
        return {"index": index, "text": echo, "logprobs": None, "finish_reason": None} if echo else None

    @staticmethod
    def chunk_choice(index: int, text: str, tokens: list[TokenLogprob] | None, finish: str | None,
                     offset: int) -> dict:
        return {"index": index, "text": text, "finish_reason": finish,
                "logprobs": completion_logprobs(tokens, offset) if tokens is not None else None}
