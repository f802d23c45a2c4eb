"""The thread that owns the model: requests come in through `submit`, work runs in `step`.

`execute()` in Triton's stub thread only validates and calls `submit`, then returns; this
thread batches and runs the model and hands results to the response sink. The queue is
bounded: when it is full `submit` raises `Overloaded` at once, so the client gets a clear
"retry" error instead of a request that waits without limit.
"""
from __future__ import annotations

import gc
import logging
import threading
from collections import deque
from typing import Callable

log = logging.getLogger("tritonformer")


def freeze_startup_objects() -> None:
    """Take every object alive now out of the garbage collector's reach, once loading and
    warm-up are done. They are the process's for good (modules, weight and tokenizer objects:
    ~365k with torch and transformers loaded), yet a full collection walks them all: 124-140 ms on
    a 2-core dev machine, a pause for every stream whenever enough new objects have survived
    to trigger one. Frozen, a full collection walks only what serving itself created."""
    gc.collect()
    gc.freeze()


class Overloaded(RuntimeError):
    """The request queue is full; the client should retry later (UNAVAILABLE / HTTP 503)."""


class RequestCancelled(RuntimeError):
    """The client cancelled; the final response carries this error (CANCELLED)."""


class RequestTimedOut(RuntimeError):
    """The client's timeout passed while the request waited in our queue."""


class ShuttingDown(RuntimeError):
    """The model is being unloaded; queued work is answered with this error."""


class EngineFailed(RuntimeError):
    """The engine can never run again (a tensor-parallel rank died): restart the model."""


class EngineLoop:
    def __init__(self, name: str, max_queue: int):
        if max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        self.max_queue = max_queue
        self._inbox: deque = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._failed: Exception | None = None
        self._failure_seen = threading.Event()  # the engine thread answered what it held
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        # Called on this thread after every pass that may have produced responses (a step, or
        # every request answered): a sink that batches its responses sends them then, once.
        self.after_pass: Callable[[], None] | None = None

    # ---- called from Triton's threads -------------------------------------------------
    def start(self) -> None:
        freeze_startup_objects()
        self._thread.start()

    def submit(self, item) -> None:
        with self._cv:
            if self._stopping:
                raise ShuttingDown("the model is shutting down")
            if self._failed is not None:
                raise self._failed
            if len(self._inbox) + self.num_queued() >= self.max_queue:
                raise Overloaded(f"server overloaded: {self.max_queue} requests already queued; retry later")
            self._inbox.append(item)
            self._cv.notify()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout)

    def fail(self, error: Exception, grace_s: float = 2.0) -> None:
        """The engine cannot run any more (called from another thread, e.g. when a
        tensor-parallel rank died): new requests are refused with `error` at once, queued ones
        are answered with it. The engine thread answers what it holds; if it does not within
        `grace_s` (it waits in a collective that will never complete), they are answered here."""
        error = error if isinstance(error, EngineFailed) else EngineFailed(str(error))
        with self._cv:
            self._failed = error
            items = list(self._inbox)
            self._inbox.clear()
            self._cv.notify()
        for item in items:
            self.reject(item, error)
        if not self._failure_seen.wait(grace_s):
            self.abort_all(error)

    # ---- implemented by the engines, run on this thread ---------------------------------
    def reject(self, item, error: Exception) -> None:
        """Answer a submitted item that never reached the engine with `error`."""
        raise NotImplementedError

    def admit(self, items: list) -> None:
        raise NotImplementedError

    def has_work(self) -> bool:
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether `step` should run now (a batching policy may prefer to wait for more)."""
        return self.has_work()

    def wait_timeout(self) -> float | None:
        """Longest sleep before `ready` may turn true without a new request (None: no limit)."""
        return None

    def num_queued(self) -> int:
        """Requests admitted but not finished (counted against max_queue)."""
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def abort_all(self, error: Exception) -> None:
        """Answer every request still held with `error` (used at shutdown)."""
        raise NotImplementedError

    # ---- the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._inbox and not self._stopping and not self.ready():
                    # Sleep until a request arrives, or until a waiting batch is due.
                    self._cv.wait(self.wait_timeout())
                items = list(self._inbox)
                self._inbox.clear()
                stopping = self._stopping
                failed = self._failed
            if failed is not None:  # (fail() answered the inbox; this thread answers what it holds)
                self.abort_all(failed)
                self._pass_done()
                self._failure_seen.set()
                return
            self.admit(items)
            if stopping:
                self.abort_all(ShuttingDown("the model is shutting down"))
                self._pass_done()
                return
            if not self.ready():
                continue
            try:
                self.step()
            except Exception:  # a bug must not kill the thread and strand every request
                log.exception("engine step failed")
                self.abort_all(RuntimeError("internal error in the engine; see the server log"))
            self._pass_done()

    def _pass_done(self) -> None:
        if self.after_pass is not None:
            self.after_pass()
