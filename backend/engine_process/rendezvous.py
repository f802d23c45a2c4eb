"""How the model instances of one model on one GPU find one engine process.

The first instance to initialize starts the engine process; the others connect to it. They meet
at a unix socket named for the model, its version, the device and the server process (each
instance's stub is a child of tritonserver, so two servers never share an engine), in a
directory only this user can enter, with an authentication key beside it (connections carry
pickles: nobody else may connect). A file lock makes "connect, or else start" one step, so two
instances initializing at once start one engine, not two.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rendezvous:
    socket: str  # the engine's Listener address
    key_file: Path  # its authentication key
    lock_file: Path

    @classmethod
    def for_key(cls, key: str, root: Path | None = None) -> "Rendezvous":
        root = root or Path(tempfile.gettempdir()) / f"tritonformer-{os.getuid()}"
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
        if len(str(root / name)) > 90:  # a unix socket path holds at most 107 bytes
            name = hashlib.sha1(key.encode()).hexdigest()[:16]
        base = root / name
        return cls(str(base) + ".sock", base.with_name(name + ".key"), base.with_name(name + ".lock"))

    @contextlib.contextmanager
    def locked(self):
        """Held while an instance connects to the engine or starts it."""
        with open(self.lock_file, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def new_authkey(self) -> bytes:
        """A fresh key for an engine about to start (its old socket, if any, removed)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        key = os.urandom(32)
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key

    def authkey(self) -> bytes | None:
        """The running engine's key (None: none was started here)."""
        try:
            return self.key_file.read_bytes()
        except FileNotFoundError:
            return None


def instance_key(model_name: str, version: str, device: str) -> str:
    """The engine shared by this model's instances on `device` under this server process."""
    return f"{model_name}-{version}-{device}-{os.getppid()}"
