"""Where engines put their results: a sink that Triton glue (or a test) implements."""
from __future__ import annotations

import json
from typing import Any, Protocol

import numpy as np


class ResponseSink(Protocol):
    def send(self, handle: Any, outputs: dict[str, np.ndarray] | None, error: Exception | None, final: bool) -> None:
        """Deliver one response for the request `handle`. Exactly one call per request has
        final=True, and nothing follows it. `error` set means an error response."""
        ...

    def is_cancelled(self, handle: Any) -> bool: ...


def coalesce(items: list[tuple]) -> list[tuple]:
    """Merge queued streaming responses of the same request into one, keeping order.

    Each item is (handle, outputs, error, final). When the sender falls behind (every send is
    an IPC round trip), a stream's pending pieces leave as one response: texts and token ids
    concatenated, the finish reason and FINAL from the last. Errors are never merged. The n > 1
    samples of one request share its handle: only pieces of the same sample (`index`) merge.
    """
    merged: list[tuple] = []
    open_index: dict[tuple, int] = {}  # (id(handle), sample) -> index in merged of its last mergeable item
    for handle, outputs, error, final in items:
        stream = (id(handle), _sample(outputs))
        i = open_index.get(stream)
        if i is not None and error is None and outputs is not None and _mergeable(outputs):
            _, prev, _, _ = merged[i]
            merged[i] = (handle, _concat(prev, outputs), None, final)
            if final or "finish_reason" in outputs:  # (a sample's last piece, FINAL or not)
                del open_index[stream]
            continue
        merged.append((handle, outputs, error, final))
        if error is None and outputs is not None and not final and _mergeable(outputs) and "finish_reason" not in outputs:
            open_index[stream] = len(merged) - 1
        else:
            open_index.pop(stream, None)
    return merged


def _sample(outputs: dict | None) -> int:
    index = None if outputs is None else outputs.get("index")
    return 0 if index is None else int(index[0])


def _mergeable(outputs: dict) -> bool:
    return "text_output" in outputs and "output_ids" in outputs


def _concat(a: dict, b: dict) -> dict:
    text = a["text_output"][0] + b["text_output"][0]
    out = {
        "text_output": np.array([text], dtype=np.object_),
        "output_ids": np.concatenate([a["output_ids"], b["output_ids"]]),
    }
    if "finish_reason" in b:
        out["finish_reason"] = b["finish_reason"]
    # The vLLM contract's outputs: per-response token counts add up, log-probabilities join.
    for name in ("num_input_tokens", "index"):
        if name in b:
            out[name] = b[name]
    if "num_output_tokens" in b:
        out["num_output_tokens"] = a["num_output_tokens"] + b["num_output_tokens"]
    if "logprobs" in b:
        first, second = json.loads(a["logprobs"][0]), json.loads(b["logprobs"][0])
        joined = None if first is None and second is None else (first or []) + (second or [])
        out["logprobs"] = np.array([json.dumps(joined).encode()], dtype=np.object_)
    return out


def first_pieces_first(items: list[tuple], started: set[int]) -> list[tuple]:
    """Order a batch of responses about to be sent so that every request's *first* response
    leaves before the rest (stable otherwise). Under load the sender falls behind (each send is
    an IPC round trip) and a new stream's first piece would queue behind the pieces of all the
    running ones; the time to first token is what a user waits for. `started` holds the
    id()s of requests that got a response already; it is updated (a final response removes
    its request)."""
    first, rest = [], []
    for item in items:
        key = id(item[0])
        (rest if key in started else first).append(item)
        if item[3]:
            started.discard(key)
        else:
            started.add(key)
    return first + rest if first and rest else items
