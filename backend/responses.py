"""Where engines put their results: a sink that Triton glue (or a test) implements."""
from __future__ import annotations

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
    concatenated, the finish reason and FINAL from the last. Errors are never merged.
    """
    merged: list[tuple] = []
    open_index: dict[int, int] = {}  # id(handle) -> index in merged of its last mergeable item
    for handle, outputs, error, final in items:
        i = open_index.get(id(handle))
        if i is not None and error is None and outputs is not None and _mergeable(outputs):
            _, prev, _, _ = merged[i]
            merged[i] = (handle, _concat(prev, outputs), None, final)
            if final:
                del open_index[id(handle)]
            continue
        merged.append((handle, outputs, error, final))
        if error is None and outputs is not None and not final and _mergeable(outputs):
            open_index[id(handle)] = len(merged) - 1
        else:
            open_index.pop(id(handle), None)
    return merged


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
    return out
