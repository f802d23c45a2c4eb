"""The engine process: one engine per GPU (the generator's, or an encoder's), serving every
instance's stub of one model.

Started by the first instance (client.py) with spawn. It builds what its spec describes
(protocol.EngineSpec): it loads the model (the generator with tensor_parallel_size > 1 as rank
0, starting the workers itself: they are this engine's), builds the engine with a BatchingSink,
warms up, and says "ready" on its starter's pipe; then it listens on the rendezvous socket for
the other instances. One reader thread waits on every stub's connection at once and turns their
messages into submits and cancellations (one thread, not one per stub: each thread that wakes
for a message contends for the GIL with the engine thread's launches); the engine thread flushes
each pass's outputs as one message per stub. It exits when the last stub has gone (a stub's end
of the connection closes when the stub exits, however it exits), or after a fatal failure that
it first reports to every stub.
"""
from __future__ import annotations

import logging
import os
import threading
import traceback
from multiprocessing import Pipe
from multiprocessing.connection import Listener, wait

from tritonformer.backend.engine_process.batching_sink import BatchingSink
from tritonformer.backend.engine_process.protocol import EngineSpec
from tritonformer.backend.spawn import LockedConnection, start_heartbeat

log = logging.getLogger("tritonformer")
STOP_TIMEOUT_S = 20.0  # the engine, its workers and the group, stopped at exit at most this long
FAILED_STOP_TIMEOUT_S = 2.0  # the same after a rank failed: the group is broken, nothing to wait for
READ_BATCH = 16  # a stub's messages read in one turn of the reader at most


def engine_main(spec: EngineSpec, starter, address: str | None, authkey: bytes | None) -> None:
    """The process's target: serve until every stub has gone, then leave (see the docstring)."""
    logging.basicConfig(level=logging.INFO, format="tritonformer engine: %(levelname)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    EngineServer(spec, LockedConnection(starter), address, authkey).run()
    os._exit(0)  # daemon threads may sit in recv or a collective: leave without waiting for them


class EngineServer:
    def __init__(self, spec: EngineSpec, starter: LockedConnection, address: str | None, authkey: bytes | None):
        self.spec, self.starter, self.address, self.authkey = spec, starter, address, authkey
        self.sink = BatchingSink()
        self.engine = None
        self.workers = None
        self._ids = 0
        self._ids_lock = threading.Lock()
        self._ready = False
        self._done = threading.Event()
        self._failed = False
        self._listener = None
        self._readable: dict = {}  # a stub's raw connection -> (its id, its LockedConnection)
        self._readable_lock = threading.Lock()  # (also one send on the waker at a time)
        self._wake_reader, self._waker = Pipe(duplex=False)  # a new stub joins the reader's wait

    def run(self) -> None:
        start_heartbeat(self._beat)
        try:
            info = self._build()
        except BaseException:
            try:
                self.starter.send(("error", traceback.format_exc()))
            except (OSError, EOFError, ValueError):
                pass
            self._stop_engine()
            return
        self.info = info
        threading.Thread(target=self._read, name="tritonformer-stubs", daemon=True).start()
        if self.address is not None:
            self._listener = Listener(self.address, "AF_UNIX", authkey=self.authkey)
            threading.Thread(target=self._accept, name="tritonformer-accept", daemon=True).start()
        self._ready = True
        if not self._serve(self.starter):
            self._done.set()  # the starter went away during the warm-up
        self._done.wait()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        if self._failed:  # the broken group's collectives may never return: no graceful stop
            self.workers.kill()
        stopper = threading.Thread(target=self._stop_engine, name="tritonformer-stop", daemon=True)
        stopper.start()
        stopper.join(FAILED_STOP_TIMEOUT_S if self._failed else STOP_TIMEOUT_S)

    def _build(self):
        engine, self.workers, info = self.spec.build(self.sink, self.sink.stats)
        self.engine = engine
        if self.workers is not None:
            self.workers.on_failure = self._fatal
        engine.after_pass = self.sink.flush
        engine.start()
        return info

    # ---- connections --------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError, ValueError):
                if self._done.is_set():
                    return
                continue  # a client that failed the handshake
            self._serve(LockedConnection(conn))

    def _serve(self, conn: LockedConnection) -> bool:
        """Greet a stub and add its connection to the reader's; False if it is gone."""
        with self._ids_lock:
            cid = self._ids
            self._ids += 1
        try:
            conn.send(("ready", self.info))
        except (OSError, EOFError, ValueError):
            conn.close()
            return False
        self.sink.connect(cid, conn)
        with self._readable_lock:
            self._readable[conn.conn] = (cid, conn)
            self._waker.send_bytes(b"")
        return True

    def _read(self) -> None:
        """Every stub's messages, on one thread: wait until connections hold some, read each
        one's (up to READ_BATCH in a turn, so that none waits behind a busy one), wait again. A
        stub that said "bye", or whose connection closed, is dropped."""
        while True:
            with self._readable_lock:
                readable = dict(self._readable)
            for raw in wait([self._wake_reader, *readable]):
                if raw is self._wake_reader:
                    self._wake_reader.recv_bytes()
                    continue
                cid, conn = readable[raw]
                try:
                    staying = self._handle(cid, conn.recv())
                    for _ in range(READ_BATCH - 1):
                        if not (staying and raw.poll()):
                            break
                        staying = self._handle(cid, conn.recv())
                except (EOFError, OSError):
                    staying = False
                except Exception:  # a message that cannot be read: that stub is cut off, not every stub
                    log.exception("a message from stub %d failed; its connection is closed", cid)
                    staying = False
                if not staying:
                    self._drop(raw, cid, conn)

    def _drop(self, raw, cid: int, conn: LockedConnection) -> None:
        with self._readable_lock:
            self._readable.pop(raw, None)
        self.sink.disconnect(cid)
        conn.close()
        if self.sink.num_connections() == 0:
            self._done.set()

    def _handle(self, cid: int, message) -> bool:
        """One stub message: submits, cancellations; False for its "bye"."""
        engine, sink = self.engine, self.sink
        kind, body = message
        if kind == "submit":
            rejected = False
            for rid, args in body:
                handle = (cid, rid)
                sink.opened(handle)
                try:
                    engine.submit(self.spec.new_item(engine, handle, args))
                except Exception as e:  # Overloaded, EngineFailed, ShuttingDown
                    sink.send(handle, None, e, True)
                    rejected = True
            if rejected:
                sink.flush()
        elif kind == "cancel":
            sink.cancel([(cid, rid) for rid in body])
        elif kind == "bye":
            return False
        return True

    def _beat(self, message) -> None:
        if self._ready:
            self.sink.flush()  # stats held back while no responses carried them (an idle engine)
            self.sink.broadcast(message)
            return
        try:
            self.starter.send(message)
        except (OSError, EOFError, ValueError):
            os._exit(1)  # the starter died while this process loaded: nobody will ever connect

    # ---- failure and exit ---------------------------------------------------------------
    def _fatal(self, problem: str) -> None:
        """A tensor-parallel rank failed: answer everything, tell every stub, then leave."""
        log.error("tensor-parallel rank failed, the engine stops: %s", problem)
        reason = f"the generator's tensor-parallel rank failed ({problem}); restart the model"
        self.engine.fail(RuntimeError(reason))
        self.sink.flush()
        self.sink.broadcast(("failed", reason))
        self._failed = True
        self._done.set()

    def _stop_engine(self) -> None:
        if self.engine is not None:
            self.engine.stop(timeout=5.0)  # first: its last iterations still need the workers
        if self.workers is not None:
            self.workers.stop()
            if self.engine is not None and not self._failed:
                self.engine.runner.close()
