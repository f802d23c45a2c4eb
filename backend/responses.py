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
