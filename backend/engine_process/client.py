"""A Triton stub's side of the engine process: submit, receive, poll cancellations, notice death.

`EngineClient.connect` attaches to the engine process of this model on this GPU, or starts it
(rendezvous.py). `submit` sends one execute() call's requests, already tokenized, as one
message. A receiver thread takes the engine's per-iteration batches and hands each response to
the stub's sink (TritonSink: its own thread does the IPC to tritonserver, coalescing a stream's
pieces when it lags) and the engine's stats calls to the stub's metrics. A watcher thread polls
`is_cancelled` (an IPC call each) every cancel_check_interval_s, round-robin within
CANCEL_CHECKS_PER_S, and forwards what it finds in one message; it never polls a request whose
final response may have left (see _watch_cancellations).

The engine process exiting closes the connection (noticed at once); one that freezes stops its
heartbeat (noticed after SILENCE_S). Either way every request this stub holds is answered with
EngineFailed (UNAVAILABLE) at once, new ones are refused with it, and `failure` says why.
"""
from __future__ import annotations

import atexit
import itertools
import logging
import os
import socket
import threading
import time
from multiprocessing.connection import Client

from tritonformer.backend.decoder.engine import CANCEL_CHECKS_PER_S
from tritonformer.backend.engine_loop import EngineFailed, ShuttingDown
from tritonformer.backend.engine_process.batching_sink import replay
from tritonformer.backend.engine_process.protocol import EngineSpec, unpack_outputs
from tritonformer.backend.engine_process.rendezvous import Rendezvous
from tritonformer.backend.spawn import SILENCE_S, LockedConnection, spawn_context

log = logging.getLogger("tritonformer")
POLL_S = 0.2  # the receiver's longest wait before it checks the engine's heartbeat
STOP_GRACE_S = 10.0  # an engine this stub started, given this long to leave after the last stub did


class EngineClient:
    def __init__(self, conn, info, sink, stats=None, process=None, cancel_check_interval_s: float = 0.05,
                 name: str = "generator", cancel_check_after_s: float = 0.0):
        self.conn = LockedConnection(conn)
        self.name = name  # the model's, in error messages
        self.info = info
        self.sink = sink  # send(handle, outputs, error, final), is_cancelled(handle)
        self.stats = stats  # the stub's metrics (GeneratorStats), or None
        self.process = process  # the engine process, when this stub started it
        self.cancel_check_interval_s = cancel_check_interval_s
        self.cancel_check_after_s = cancel_check_after_s  # a request younger than this is not polled
        self.failure: str | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, object] = {}  # request id -> handle (a Triton response sender)
        self._submitted: dict[int, float] = {}  # request id -> when it was sent (with cancel_check_after_s)
        self._cancel_sent: set[int] = set()
        self._ids = itertools.count()
        self._closing = threading.Event()
        self._receiver = threading.Thread(target=self._receive, name="tritonformer-engine-receiver", daemon=True)
        self._watcher = threading.Thread(target=self._watch_cancellations, name="tritonformer-cancel-watch",
                                         daemon=True)
        self._receiver.start()
        self._watcher.start()
        atexit.register(self.close)  # multiprocessing joins its children at exit: let the engine go first

    # ---- starting or attaching ----------------------------------------------------------
    @classmethod
    def connect(cls, spec: EngineSpec, sink, stats=None, key: str | None = None, cancel_check_interval_s: float = 0.05,
                rendezvous: Rendezvous | None = None, **options) -> "EngineClient":
        """Attach to the engine process of `key` (instance_key) if one runs, else start it and
        wait until it is ready (loading and warm-up: seconds to minutes). key None: a private
        engine, started here, that no other stub can reach. `spec`: what the engine process
        serves (protocol.GeneratorSpec, encoder.build.EncoderSpec); `options`: the name and
        cancel_check_after_s of __init__."""
        if key is None and rendezvous is None:
            conn, info, process = _start(spec, None, None)
            return cls(conn, info, sink, stats, process, cancel_check_interval_s, **options)
        place = rendezvous or Rendezvous.for_key(key)
        with place.locked():
            attached = _attach(place)
            if attached is not None:
                conn, info = attached
                log.info("attached to the engine process (pid %d)", info.pid)
                return cls(conn, info, sink, stats, None, cancel_check_interval_s, **options)
            conn, info, process = _start(spec, place.socket, place.new_authkey())
        return cls(conn, info, sink, stats, process, cancel_check_interval_s, **options)

    # ---- requests -----------------------------------------------------------------------
    def submit(self, requests: list[tuple]) -> None:
        """Queue requests, (handle, *args) each (the args the spec's new_item takes: the
        generator's are prompt ids, SamplingParams, stream, ResponseOptions), in one message.
        Raises EngineFailed (nothing queued) once the engine is gone; otherwise every request is
        answered through the sink, errors included (Overloaded comes back that way)."""
        now = time.monotonic()
        with self._lock:
            if self.failure is not None:
                raise EngineFailed(self.failure)
            items = []
            for handle, *args in requests:
                rid = next(self._ids)
                self._pending[rid] = handle
                if self.cancel_check_after_s:
                    self._submitted[rid] = now
                items.append((rid, tuple(args)))
        try:
            self.conn.send(("submit", items))
        except (OSError, EOFError, ValueError) as e:
            self._fail(f"the engine process's connection broke ({e})")

    def num_pending(self) -> int:
        with self._lock:
            return len(self._pending)

    # ---- the receiver ---------------------------------------------------------------------
    def _receive(self) -> None:
        heard = time.monotonic()
        problem, frozen = None, False
        while problem is None and not self._closing.is_set():
            try:
                if not self.conn.poll(POLL_S):
                    silent = time.monotonic() - heard
                    if self.process is not None and not self.process.is_alive():
                        problem = f"the engine process exited (code {self.process.exitcode})"
                    elif silent > SILENCE_S:
                        problem = f"the engine process stopped answering (no heartbeat for {silent:.1f} s)"
                        frozen = True
                    continue
                kind, body = self.conn.recv()
            except (EOFError, OSError):
                if not self._closing.is_set():
                    code = "" if self.process is None else f", code {self.process.exitcode}"
                    problem = f"the engine process closed its connection (it exited{code})"
                break
            heard = time.monotonic()
            if kind == "out":
                responses, arrays, stats = body
                self._deliver(responses, arrays)
                if stats and self.stats is not None:
                    try:
                        replay(self.stats, stats)
                    except Exception as e:
                        log.warning("could not apply the engine's stats: %s", e)
            elif kind == "failed":  # (it leaves by itself)
                problem = body
        if problem is not None and not self._closing.is_set():
            self._fail(problem, kill=frozen)

    def _deliver(self, responses: list[tuple], arrays: list) -> None:
        with self._lock:
            pending = self._pending
            resolved = []
            for rid, outputs, error, final in responses:
                handle = pending.pop(rid, None) if final else pending.get(rid)
                if handle is not None:
                    resolved.append((handle, outputs, error, final))
                    if final:
                        self._cancel_sent.discard(rid)
                        self._submitted.pop(rid, None)
        for handle, outputs, error, final in resolved:
            self.sink.send(handle, unpack_outputs(outputs, arrays), error, final)

    def _fail(self, problem: str, kill: bool = False) -> None:
        """The engine is gone: answer everything held, refuse what comes (see the docstring).
        `kill`: it froze; if this stub started it, it is killed (it would hold its GPU memory)."""
        with self._lock:
            if self.failure is None:
                self.failure = f"the {self.name}'s engine process failed: {problem}"
                if "restart the model" not in problem:
                    self.failure += "; restart the model"
                log.error("%s", self.failure)
            held, self._pending = list(self._pending.values()), {}
            self._submitted.clear()
        if kill and self.process is not None and self.process.is_alive():
            self.process.kill()  # first: once the requests have their errors, nothing of it is left running
        error = EngineFailed(self.failure)
        for handle in held:
            self.sink.send(handle, None, error, True)
        _shut(self.conn.conn)  # an execute() blocked sending to a frozen engine returns (with an error)
        if self.process is not None:
            self.process.join(1.0)  # reaped: no zombie left while the model stays loaded

    # ---- cancellations --------------------------------------------------------------------
    def _watch_cancellations(self) -> None:
        cursor = 0
        quota = max(1, int(CANCEL_CHECKS_PER_S * max(self.cancel_check_interval_s, 0.001)))
        while not self._closing.wait(max(self.cancel_check_interval_s, 0.001)):
            young = time.monotonic() - self.cancel_check_after_s
            with self._lock:
                held = [(rid, h) for rid, h in self._pending.items()
                        if rid not in self._cancel_sent and self._submitted.get(rid, 0.0) <= young]
            if not held:
                continue
            start = cursor % len(held)
            checked = (held[start:] + held[:start])[:quota]
            cursor = start + len(checked)
            cancelled = []
            for rid, handle in checked:
                # Polled under the lock, and only while still pending: a request's final is handed
                # to the sink only after _deliver (or _fail, close) took it out of _pending under
                # this lock, so no poll can meet or follow its final. Triton frees a request's
                # response factory once the final is sent, and is_cancelled on it then reads freed
                # memory in tritonserver (SIGSEGV under load: every open stream cut off).
                with self._lock:
                    if rid not in self._pending:
                        continue
                    try:
                        if self.sink.is_cancelled(handle):
                            cancelled.append(rid)
                    except Exception:
                        pass
            if cancelled:
                with self._lock:
                    self._cancel_sent.update(cancelled)
                try:
                    self.conn.send(("cancel", cancelled))
                except (OSError, EOFError, ValueError):
                    pass  # the receiver notices

    # ---- unload ---------------------------------------------------------------------------
    def close(self, timeout: float = STOP_GRACE_S) -> None:
        """Leave the engine (it stops when its last stub has left), answer what is still held
        with ShuttingDown, and make sure an engine process started here is gone."""
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            self.conn.send(("bye", None))
        except (OSError, EOFError, ValueError):
            pass
        self._receiver.join(2 * POLL_S + 1.0)
        self.conn.close()
        with self._lock:
            held, self._pending = list(self._pending.values()), {}
            if self.failure is None:
                self.failure = "the model is shutting down"
        for handle in held:
            self.sink.send(handle, None, ShuttingDown("the model is shutting down"), True)
        if self.process is not None:
            self.process.join(timeout)
            if self.process.is_alive():
                log.warning("the engine process did not leave within %.0f s: killing it", timeout)
                self.process.kill()
                self.process.join(5.0)


def _shut(conn) -> None:
    """Shut a connection's socket down both ways: a thread blocked sending on it wakes up."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, ValueError):
        pass


def _attach(place: Rendezvous):
    """(connection, the engine's info) of the engine running at `place`, or None."""
    authkey = place.authkey()
    if authkey is None:
        return None
    try:
        conn = Client(place.socket, "AF_UNIX", authkey=authkey)
    except (OSError, EOFError):
        return None  # none listens (it exited, or never started)
    except Exception:  # a key that does not match: an older engine's socket
        return None
    try:
        if not conn.poll(SILENCE_S):
            conn.close()
            return None
        kind, info = conn.recv()
        while kind == "beat":
            kind, info = conn.recv()
    except (EOFError, OSError):
        conn.close()
        return None
    return conn, info


def _start(spec: EngineSpec, address: str | None, authkey: bytes | None):
    """Spawn the engine process and wait for its "ready": (connection, the spec's info, process)."""
    from tritonformer.backend.engine_process.server import engine_main

    ctx = spawn_context()
    parent, child = ctx.Pipe()
    # Not a daemon: it starts the tensor-parallel workers, and daemons may not have children.
    process = ctx.Process(target=engine_main, args=(spec, child, address, authkey), name="tritonformer-engine")
    process.start()
    child.close()
    heard = None  # silence counts once it has spoken: importing torch takes a while
    try:
        while True:
            if not parent.poll(POLL_S):
                if not process.is_alive():
                    raise RuntimeError(f"the engine process exited while starting (code {process.exitcode})")
                if heard is not None and time.monotonic() - heard > SILENCE_S:
                    raise RuntimeError("the engine process stopped answering while starting")
                continue
            try:
                kind, body = parent.recv()
            except EOFError:
                process.join(5.0)
                raise RuntimeError(f"the engine process exited while starting (code {process.exitcode})") from None
            heard = time.monotonic()
            if kind == "ready":
                return parent, body, process
            if kind == "error":
                raise RuntimeError(f"the engine process failed to start:\n{body}")
    except BaseException:
        parent.close()
        process.join(5.0)
        if process.is_alive():
            process.kill()
            process.join(5.0)
        raise
