"""Helper processes started from Triton's stub: how they are spawned, and how they say they live.

Both kinds of helper process (the tensor-parallel workers, the generator's engine process) are
started with multiprocessing's spawn context from inside Triton's Python-backend stub, talk over
a multiprocessing Connection that two threads send on, and prove they still run Python with a
heartbeat from a thread of their own: a process that freezes (SIGSTOP, a hung interpreter) is
alive to the kernel, so only its silence shows it (SILENCE_S). Finding them again (tests,
failure drills) goes through /proc: `spawned_by`, `stub_pids`.
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import threading
import time
from pathlib import Path

BEAT_S = 0.5  # a heartbeat every this often, from a thread of its own (compiling never holds it up)
SILENCE_S = 5.0  # a process unheard of this long is frozen


def python_executable() -> str:
    """An interpreter for spawned processes: Triton's Python-backend stub is not one (its
    sys.executable names the stub binary), so the interpreter of the environment it runs in."""
    exe = sys.executable
    if exe and Path(exe).name.startswith("python"):
        return exe
    candidate = Path(sys.prefix) / "bin" / "python3"
    return str(candidate) if candidate.exists() else (shutil.which("python3") or "python3")


def spawn_context():
    """multiprocessing's spawn context with a real interpreter as the executable (see above)."""
    ctx = multiprocessing.get_context("spawn")
    ctx.set_executable(python_executable())
    return ctx


class LockedConnection:
    """A Connection several threads send on (answers, batches, the heartbeat): one message at a
    time. `recv`/`poll` stay unlocked: a single thread reads."""

    def __init__(self, conn):
        self.conn, self._lock = conn, threading.Lock()
        self.recv, self.poll = conn.recv, conn.poll

    def send(self, message) -> None:
        with self._lock:
            self.conn.send(message)

    def close(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass


def start_heartbeat(send, every: float = BEAT_S, name: str = "tritonformer-heartbeat") -> threading.Thread:
    """Call send(("beat", None)) every `every` seconds from a daemon thread until it raises."""

    def beat() -> None:
        while True:
            time.sleep(every)
            try:
                send(("beat", None))
            except (OSError, EOFError, ValueError):
                return

    thread = threading.Thread(target=beat, name=name, daemon=True)
    thread.start()
    return thread


def process_table() -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, command line)} of every process on this (Linux) host."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry)] = (ppid, cmd)
    return table


def spawned_by(parents: set[int], table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """Pids of the processes that `parents` started with the spawn context (not its resource
    tracker): a model's engine process, an engine's tensor-parallel workers."""
    table = table if table is not None else process_table()
    return [pid for pid, (ppid, cmd) in table.items()
            if ppid in parents and "spawn_main" in cmd and "resource_tracker" not in cmd]


def stub_pids(model: str, table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """Pids of the Triton Python-backend stubs serving `model` (their command line names the
    model's folder)."""
    table = table if table is not None else process_table()
    return [pid for pid, (_, cmd) in table.items() if "triton_python_backend_stub" in cmd and f"/{model}/" in cmd]
