"""The engine process's response sink: every iteration's outputs leave as one message per stub.

A request's handle here is (connection id, request id). `send` only appends to the connection's
batch (outputs as plain lists: protocol.pack_outputs); `flush` (the engine loop's `after_pass`,
once per iteration) sends each connection its batch, with the engine's stats calls on one
connection (the stubs of one model publish into the same metric series, so only one of them may
apply them). Cancellations come in from the stubs, which poll Triton: `is_cancelled` is a set
lookup, no IPC.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from tritonformer.backend.engine_process.protocol import gather_arrays, pack_outputs

GAUGES = frozenset({"occupancy", "queue_depth"})  # stats calls of which only the latest counts
STATS_EVERY_S = 0.05  # stats without responses to carry them leave this often at most


class ForwardedStats:
    """A GeneratorStats (or any engine's stats object) that records the calls made to it, to
    replay them on the stub's metrics object (Triton's metrics API exists only in the stub)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls: list[tuple[str, tuple, dict]] = []
        self._gauges: dict[str, tuple[str, tuple, dict]] = {}

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def record(*args, **kwargs) -> None:
            with self._lock:
                if name in GAUGES:
                    self._gauges[name] = (name, args, kwargs)
                else:
                    self._calls.append((name, args, kwargs))

        return record

    def take(self) -> list[tuple[str, tuple, dict]] | None:
        """The calls since the last take, gauges first (None: none)."""
        with self._lock:
            calls = list(self._gauges.values()) + self._calls
            self._calls, self._gauges = [], {}
        return calls or None


def replay(stats: Any, calls: list[tuple[str, tuple, dict]]) -> None:
    """Apply recorded calls to the stub's stats object."""
    for name, args, kwargs in calls:
        getattr(stats, name)(*args, **kwargs)


class BatchingSink:
    def __init__(self):
        self._lock = threading.Lock()  # the batches, the live and cancelled sets, the connections
        self._flush_lock = threading.Lock()  # one flush at a time: a stream's pieces stay in order
        self._batches: dict[int, list[tuple]] = {}
        self._live: set[tuple[int, int]] = set()
        self._cancelled: set[tuple[int, int]] = set()
        self._connections: dict[int, Any] = {}  # id -> a connection with send()
        self.stats = ForwardedStats()
        self._stats_sent_at = 0.0

    # ---- the connections (the engine process's readers) -----------------------------------
    def connect(self, cid: int, conn) -> None:
        with self._lock:
            self._connections[cid] = conn

    def disconnect(self, cid: int) -> None:
        """The stub went away: its requests still held are cancelled, nothing more is sent."""
        with self._lock:
            self._connections.pop(cid, None)
            self._batches.pop(cid, None)
            self._cancelled.update(h for h in self._live if h[0] == cid)

    def opened(self, handle: tuple[int, int]) -> None:
        with self._lock:
            self._live.add(handle)

    def cancel(self, handles: list[tuple[int, int]]) -> None:
        with self._lock:
            self._cancelled.update(h for h in handles if h in self._live)

    # ---- ResponseSink -----------------------------------------------------------------------
    def send(self, handle, outputs, error, final) -> None:
        cid, rid = handle
        with self._lock:
            if cid in self._connections:
                self._batches.setdefault(cid, []).append((rid, pack_outputs(outputs), error, final))
            if final:
                self._live.discard(handle)
                self._cancelled.discard(handle)

    def is_cancelled(self, handle) -> bool:
        return handle in self._cancelled

    def flush(self) -> None:
        """Send every connection its batch (one message each). The stats go to the oldest
        connection, with its batch, or alone at most every STATS_EVERY_S (an iteration without
        responses sends nothing then)."""
        with self._flush_lock:
            with self._lock:
                batches, self._batches = self._batches, {}
                connections = dict(self._connections)
            stats, primary = None, min(connections) if connections else None
            now = time.monotonic()
            if primary is not None and (primary in batches or now - self._stats_sent_at >= STATS_EVERY_S):
                stats = self.stats.take()
                if stats is not None:
                    self._stats_sent_at = now
                    batches.setdefault(primary, [])
            for cid, items in batches.items():
                conn = connections.get(cid)
                if conn is None:
                    continue
                try:
                    conn.send(("out", (*gather_arrays(items), stats if cid == primary else None)))
                except (OSError, EOFError, ValueError):
                    pass  # the stub is gone: its reader notices and disconnects it

    def broadcast(self, message) -> None:
        with self._lock:
            connections = list(self._connections.values())
        for conn in connections:
            try:
                conn.send(message)
            except (OSError, EOFError, ValueError):
                pass

    def num_connections(self) -> int:
        with self._lock:
            return len(self._connections)
