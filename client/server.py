"""Run the tritonserver bundled in nvidia-pytriton on a plain model repository.

PyTriton 0.7.0 ships a real tritonserver 2.51.0, its Python backend and one backend stub per
Python minor version, but only wires them up for its own in-process models. This module does
the wiring for an ordinary ``model_repository/``:

* a backend directory of our own (cached, built atomically): the bundled ``backends/python/``
  plus the stub of the *running* Python, which must sit next to ``libtriton_python.so``;
* an environment in which the stub's embedded Python finds this interpreter's packages
  (``PATH``) and the right ``libpython`` (``LD_LIBRARY_PATH``);
* readiness per model, with a fast and readable failure when a model cannot load.

Typical use::

    with TritonServer("model_repository", http_port=free_port()) as server:
        server.wait_ready(["embedder"], timeout=120)
        client = tritonclient.http.InferenceServerClient(server.http_url)
"""

from __future__ import annotations

import ctypes
import errno
import functools
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = [
    "PortInUseError",
    "TritonServer",
    "TritonServerError",
    "backend_directory",
    "cache_dir",
    "free_port",
    "free_ports",
    "has_nvidia_gpu",
]

# Per model instance the Python backend exchanges tensors through a shared-memory pool that
# starts at 1 MiB and grows 1 MiB at a time. A batch of 64 x 512 tokens in int64 is already
# 256 KiB per input, and embeddings come back as float32 rows: start and grow in 16 MiB steps
# so a batch costs at most a couple of resizes. (tmpfs pages are only used once touched.)
SHM_DEFAULT_BYTES = 16 * 1024 * 1024
SHM_GROWTH_BYTES = 16 * 1024 * 1024

# How the `tritonformer serve` user changes each port; quoted in PortInUseError.
PORT_HINTS = {
    "http": ("--http-port", "TRITONFORMER_HTTP_PORT"),
    "grpc": ("--grpc-port", "TRITONFORMER_GRPC_PORT"),
    "metrics": ("--metrics-port", "TRITONFORMER_METRICS_PORT"),
}

_LOG_TAIL_LINES = 40


class TritonServerError(RuntimeError):
    """The server could not be prepared, started, or did not become ready."""


class PortInUseError(TritonServerError):
    """A port the server needs is taken; raised before the server is started."""

    def __init__(self, kind: str, host: str, port: int) -> None:
        flag, env = PORT_HINTS[kind]
        super().__init__(
            f"{kind.upper()} port {port} on {host} is already in use (another tritonserver?). "
            f"Choose another one with {flag} or the environment variable {env}."
        )
        self.kind, self.host, self.port = kind, host, port


# --------------------------------------------------------------------------- helpers


def cache_dir() -> Path:
    """``$TRITONFORMER_CACHE_DIR``, else ``~/.cache/tritonformer``."""
    env = os.environ.get("TRITONFORMER_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tritonformer"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports on ``host``, picked by the kernel.

    The sockets stay open until all are picked so the kernel cannot hand out one port twice.
    Another process may still grab a port before the server binds it; start() re-checks.
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(_family(host), socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One free port on ``host``."""
    return free_ports(1, host)[0]


def has_nvidia_gpu() -> bool:
    """Whether an NVIDIA GPU device node exists (cheap; no torch/CUDA import).

    Containers given only some GPUs may lack /dev/nvidia0 but have /dev/nvidia3, so glob.
    """
    return any(p.name[len("nvidia"):].isdigit() for p in Path("/dev").glob("nvidia[0-9]*"))


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _port_is_free(host: str, port: int) -> bool:
    # A plain bind (no SO_REUSEPORT) fails if anything listens there, including a gRPC server
    # that itself set SO_REUSEPORT: tritonserver's gRPC would otherwise silently share the port
    # with another server. SO_REUSEADDR keeps sockets in TIME_WAIT from counting as "in use".
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


# --------------------------------------------------------------------------- the bundled server


@dataclass(frozen=True)
class BundledTriton:
    """Where nvidia-pytriton installed the tritonserver pieces."""

    version: str  # nvidia-pytriton's version
    root: Path  # .../site-packages/pytriton/tritonserver
    libs: Path  # .../site-packages/nvidia_pytriton.libs

    @property
    def server_binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    @property
    def caches(self) -> Path:
        return self.root / "caches"

    def stub(self, minor: str) -> Path:
        return self.root / "python_backend_stubs" / minor / "triton_python_backend_stub"


def find_bundled_triton() -> BundledTriton:
    """Locate the tritonserver that nvidia-pytriton installed, without importing pytriton.

    ``$TRITONFORMER_TRITONSERVER_ROOT`` names an unpacked copy instead: ``.../pytriton/tritonserver``
    laid out as in site-packages, ``nvidia_pytriton.libs`` two levels up (tools/gpu_server.sh).
    """
    override = os.environ.get("TRITONFORMER_TRITONSERVER_ROOT")
    if override:
        root = Path(override).expanduser().resolve()
        site = root.parent.parent
        dists = list(importlib.metadata.distributions(name="nvidia-pytriton", path=[str(site)]))
        version = dists[0].version if dists else "unknown"
        return _checked(BundledTriton(version=version, root=root, libs=site / "nvidia_pytriton.libs"))
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonServerError(
            "nvidia-pytriton is not installed in this Python environment "
            f"({sys.executable}); install it with: pip install 'nvidia-pytriton==0.7.0'"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    bundled = BundledTriton(
        version=importlib.metadata.version("nvidia-pytriton"),
        root=package_dir / "tritonserver",
        libs=package_dir.parent / "nvidia_pytriton.libs",
    )
    return _checked(bundled)


def _checked(bundled: BundledTriton) -> BundledTriton:
    """``bundled`` if its server, Python backend and libraries exist, else TritonServerError."""
    for needed in (bundled.server_binary, bundled.python_backend / "libtriton_python.so", bundled.libs):
        if not needed.exists():
            raise TritonServerError(f"nvidia-pytriton {bundled.version} looks incomplete: {needed} is missing")
    return bundled


def _python_minor() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def backend_directory(bundled: BundledTriton | None = None) -> Path:
    """A ``--backend-directory`` whose ``python/`` holds the stub for the running Python.

    Kept under the cache dir, keyed by pytriton and Python version, and built in a temporary
    sibling that is renamed into place, so concurrent starts never see half a directory.
    We copy instead of writing the stub into site-packages so the installed package stays
    pristine (and may be read-only).
    """
    bundled = bundled or find_bundled_triton()
    minor = _python_minor()
    stub = bundled.stub(minor)
    if not stub.is_file():
        shipped = sorted(p.name for p in (bundled.root / "python_backend_stubs").iterdir())
        raise TritonServerError(
            f"nvidia-pytriton {bundled.version} has no Python backend stub for Python {minor} "
            f"(it ships {', '.join(shipped)}); run tritonformer with one of those versions"
        )
    target = cache_dir() / f"backends-pytriton{bundled.version}-py{minor}"
    if (target / "python" / "triton_python_backend_stub").is_file():
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        shutil.copytree(
            bundled.python_backend, staging / "python", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copy2(stub, staging / "python" / "triton_python_backend_stub")
        staging.chmod(0o755)  # mkdtemp made it private
        try:
            staging.rename(target)
        except OSError:
            # Someone else finished first; theirs is complete (rename is atomic), use it.
            if not (target / "python" / "triton_python_backend_stub").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _libpython_dirs(bundled: BundledTriton) -> list[Path]:
    """Directories to put on LD_LIBRARY_PATH so the stub loads *this* Python's libpython.

    Without them the loader may pick the system's libpython of another patch version than the
    stdlib the stub then imports. Fails early with a clear message rather than letting every
    model sit in "loading" while its stub cannot start.
    """
    minor = sys.version_info.minor
    # In a venv, sysconfig still reports the base interpreter's LIBDIR, which is what we want.
    libdir = sysconfig.get_config_var("LIBDIR")
    name = f"libpython{_python_minor()}.so.1.0"
    if libdir and (Path(libdir) / name).exists():
        return [Path(libdir)]
    # The wheel grafts one libpython (3.13's) under a hashed name that the stub links directly.
    if list(bundled.libs.glob(f"libpython3-*.{minor}.so.1.0")):
        return []
    # A system copy the dynamic loader knows about (e.g. Debian's libpython3.X package).
    import ctypes.util

    if ctypes.util.find_library(f"python{_python_minor()}"):
        return []
    raise TritonServerError(
        f"{name} was not found (looked in LIBDIR={libdir!r}, {bundled.libs} and the system "
        "loader paths). The Python backend stub embeds Python and needs the shared library: "
        f"use a Python built with --enable-shared, or install your distribution's libpython{_python_minor()} "
        "package, or add the directory that holds it to LD_LIBRARY_PATH."
    )


def server_environment(bundled: BundledTriton, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for tritonserver (and, inherited, for every backend stub)."""
    env = dict(os.environ if base is None else base)
    # The stub's embedded Python ignores PYTHONPATH (isolated config on 3.11+) and derives
    # sys.prefix from the first `python3` on PATH; that python3's pyvenv.cfg then selects the
    # venv's site-packages. So put this interpreter's bin/ first -- as given, not resolved:
    # resolving a venv's python3 symlink would land in the base install and lose the venv.
    bin_dir = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(bin_dir, "python3")):
        raise TritonServerError(
            f"{bin_dir} has no `python3`; the Python backend stub finds its packages through "
            "the first python3 on PATH. Run tritonformer from a virtualenv or an install "
            "whose bin/ has python3."
        )
    lib_dirs = [bundled.libs, *_libpython_dirs(bundled)]
    env["PATH"] = os.pathsep.join([bin_dir, *filter(None, [env.get("PATH")])])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [*(str(d) for d in lib_dirs), *filter(None, [env.get("LD_LIBRARY_PATH")])]
    )
    return env


# --------------------------------------------------------------------------- the server


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before fork; the child only calls it
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Runs in the child before exec: have the kernel SIGTERM the server if we die.

    Without it a crashed test run or a `kill -9` of `tritonformer serve` leaves a server (and
    its stubs) holding the ports. Note: Linux ties this to the *thread* that forked, so start
    the server from a thread that lives as long as the server (normally the main thread).
    """
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class TritonServer:
    """One tritonserver process serving a model repository through the Python backend.

    ``start()`` returns as soon as the process runs; call ``wait_ready(models, timeout)``
    before sending requests. ``stop()`` is idempotent. Also a context manager (start/stop).
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        host: str = "127.0.0.1",
        log_verbose: int = 0,
        log_file: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        *,
        stream_log: bool = False,
        exit_timeout: int = 5,
        auto_complete_config: bool = False,
    ) -> None:
        """
        host: address every endpoint binds to; loopback unless you mean to expose the server.
        log_file: where the server's stdout/stderr go (default: the cache dir's logs/ folder,
            one file per HTTP port, overwritten at each start). Ignored with stream_log.
        stream_log: let the server write to this process's stdout/stderr (for `serve`).
        exit_timeout: seconds tritonserver waits for in-flight work when asked to stop.
        auto_complete_config: let the Python backend complete config.pbtxt from model.py's
            auto_complete_config(). Off: it starts one extra stub per model at load (~3 s each
            here) and our configs are complete.
        """
        self.model_repository = Path(model_repository).resolve()
        self.host = host
        self.ports = {"http": int(http_port), "grpc": int(grpc_port), "metrics": int(metrics_port)}
        self.log_verbose = int(log_verbose)
        self.stream_log = stream_log
        self.log_file = None if stream_log else Path(
            log_file if log_file is not None else cache_dir() / "logs" / f"tritonserver-{http_port}.log"
        )
        self.extra_args = tuple(extra_args)
        self.exit_timeout = int(exit_timeout)
        self.auto_complete_config = auto_complete_config
        self._process: subprocess.Popen[bytes] | None = None
        self._log_handle = None
        # Our own shm name prefix (tritonserver appends a UUID) lets stop() remove exactly this
        # server's regions if it had to be killed; a killed server leaves them in /dev/shm.
        self._shm_prefix = f"tritonformer_{os.getpid()}_{self.ports['http']}_"

    # ---- addresses, as the clients want them

    @property
    def _client_host(self) -> str:
        if self.host in ("0.0.0.0", ""):
            return "127.0.0.1"
        if self.host == "::":
            return "[::1]"
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def http_port(self) -> int:
        return self.ports["http"]

    @property
    def grpc_port(self) -> int:
        return self.ports["grpc"]

    @property
    def metrics_port(self) -> int:
        return self.ports["metrics"]

    @property
    def http_url(self) -> str:
        """``host:port`` for ``tritonclient.http.InferenceServerClient(url=...)``."""
        return f"{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` for ``tritonclient.grpc.InferenceServerClient(url=...)``."""
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus endpoint."""
        return f"http://{self._client_host}:{self.metrics_port}/metrics"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self._process

    # ---- lifecycle

    def command(self, backend_dir: Path, bundled: BundledTriton) -> list[str]:
        """The tritonserver command line (see the module's report for why each flag)."""
        args = [
            str(bundled.server_binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backend_dir}",
            f"--cache-directory={bundled.caches}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--log-verbose={self.log_verbose}",
            # Ready means every model is ready, matching what wait_ready checks per model.
            "--strict-readiness=true",
            # Stop within a few seconds even if a client keeps a request in flight.
            f"--exit-timeout-secs={self.exit_timeout}",
            # Keep serving the models that loaded when one fails: wait_ready then reports the
            # failed model's reason from the repository index at once, instead of the server
            # exiting (after a slow unload) with "failed to load all models".
            "--exit-on-error=false",
            f"--backend-config=python,shm-default-byte-size={SHM_DEFAULT_BYTES}",
            f"--backend-config=python,shm-growth-byte-size={SHM_GROWTH_BYTES}",
            f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}",
        ]
        if not self.auto_complete_config:
            args.append("--disable-auto-complete-config")
        if not has_nvidia_gpu():
            # Without a GPU these pools and DCGM only produce warnings at startup.
            args += [
                "--pinned-memory-pool-byte-size=0",
                "--cuda-memory-pool-byte-size=0:0",
                "--allow-gpu-metrics=false",
            ]
        return args + list(self.extra_args)

    def check_ports(self) -> None:
        """Raise PortInUseError for the first port that is taken (or given twice)."""
        seen: dict[int, str] = {}
        for kind, port in self.ports.items():
            if port in seen:
                raise TritonServerError(
                    f"the {seen[port].upper()} and {kind.upper()} ports are both {port}; "
                    f"give {PORT_HINTS[kind][0]} a different value"
                )
            seen[port] = kind
            if not _port_is_free(self.host, port):
                raise PortInUseError(kind, self.host, port)

    def start(self) -> TritonServer:
        """Check the ports, prepare the backend directory and launch tritonserver."""
        if self._process is not None and self._process.poll() is None:
            raise TritonServerError(f"this server is already running (pid {self._process.pid})")
        if not self.model_repository.is_dir():
            raise TritonServerError(f"model repository {self.model_repository} is not a directory")
        # Check ports before anything slow: tritonserver loads every model first and only then
        # finds out that a port is taken.
        self.check_ports()
        bundled = find_bundled_triton()
        env = server_environment(bundled)
        cmd = self.command(backend_directory(bundled), bundled)

        if self.stream_log:
            stdout = None
        else:
            assert self.log_file is not None
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log_handle = stdout = open(self.log_file, "wb")  # noqa: SIM115 (closed in stop)
        self._process = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout is not None else None,
            # Own session and process group: the stubs join it, so stop() can kill them all,
            # and a Ctrl-C in the terminal reaches only us; we then stop the server in order.
            start_new_session=True,
            preexec_fn=functools.partial(_die_with_parent, os.getpid()),
        )
        return self

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the server's output ('' when it streams to the terminal)."""
        if self.log_file is None or not self.log_file.exists():
            return ""
        with open(self.log_file, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
        # Skip the wide ASCII tables (options, backends, model states): they would fill the
        # tail, and the same facts are in the log lines (e.g. "failed to load 'x' ...").
        kept = [line for line in text.splitlines() if line.strip() and not line.startswith(("+", "|"))]
        # A bad flag prints the error, then ~400 lines of usage that would push it out.
        usage = next((i for i, line in enumerate(kept) if line.startswith("Usage: tritonserver")), None)
        if usage is not None:
            kept = kept[:usage] + ["(tritonserver --help text left out)"]
        return "\n".join(kept[-lines:])

    def _failure(self, message: str) -> TritonServerError:
        tail = self.log_tail()
        if tail:
            message += f"\n--- last lines of {self.log_file} ---\n{tail}"
        elif self.stream_log:
            message += "\n(see the tritonserver output above)"
        return TritonServerError(message)

    # ---- readiness

    def _http(self, method: str, path: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
        """(status, body) of a request to our own HTTP endpoint; None if it is not up yet."""
        data = b"{}" if method == "POST" else None
        request = urllib.request.Request(f"http://{self.http_url}{path}", data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout):
            return None

    def model_ready(self, model: str) -> bool:
        answer = self._http("GET", f"/v2/models/{urllib.parse.quote(model)}/ready")
        return answer is not None and answer[0] == 200

    def repository_index(self) -> list[dict] | None:
        """``POST /v2/repository/index``: name, version, state, reason of each model."""
        answer = self._http("POST", "/v2/repository/index")
        if answer is None or answer[0] != 200:
            return None
        return json.loads(answer[1])

    def _unloadable(self, pending: list[str]) -> str | None:
        """Why some pending model will never become ready, if the server already says so.

        With the default model-control mode tritonserver loads every model before its HTTP
        endpoint opens, so once the index answers, a model that is UNAVAILABLE has failed
        (reason: the exception from initialize) and a model that is absent does not exist.
        """
        index = self.repository_index()
        if index is None:
            return None
        known = {entry.get("name"): entry for entry in index}
        problems = []
        for model in pending:
            entry = known.get(model)
            if entry is None:
                problems.append(
                    f"model '{model}' is not in {self.model_repository} "
                    f"(the server knows: {', '.join(sorted(known)) or 'nothing'})"
                )
            elif entry.get("state") == "UNAVAILABLE" and entry.get("reason", "") != "unloaded":
                problems.append(f"model '{model}' failed to load: {entry.get('reason', '').strip()}")
        return "\n".join(problems) or None

    def wait_ready(self, models: Sequence[str], timeout: float = 600.0, progress: bool = True) -> float:
        """Block until every model answers ready; return the seconds waited.

        Fails fast (TritonServerError with the log tail) when the server exits or reports a
        model as failed/unknown, and after ``timeout`` seconds otherwise.
        """
        if self._process is None:
            raise TritonServerError("wait_ready() called before start()")
        started = time.monotonic()
        pending = list(dict.fromkeys(models))
        next_note = started + 10.0

        def say(text: str) -> None:
            if progress:
                print(f"tritonformer: {text}", file=sys.stderr, flush=True)

        say(f"waiting for {', '.join(pending)} (timeout {timeout:.0f} s)")
        while pending:
            code = self._process.poll()
            if code is not None:
                raise self._failure(
                    f"tritonserver exited with code {code} before {', '.join(pending)} became ready"
                )
            for model in list(pending):
                if self.model_ready(model):
                    pending.remove(model)
                    say(f"model '{model}' ready after {time.monotonic() - started:.1f} s")
            if not pending:
                break
            problem = self._unloadable(pending)
            if problem:
                raise self._failure(problem)
            now = time.monotonic()
            if now - started > timeout:
                raise self._failure(
                    f"timed out after {timeout:.0f} s waiting for {', '.join(pending)} to become ready"
                )
            if now >= next_note:
                say(f"still waiting for {', '.join(pending)} ({now - started:.0f} s)")
                next_note = now + 10.0
            time.sleep(0.2)
        return time.monotonic() - started

    # ---- shutdown

    def _signal_group(self, sig: int) -> None:
        assert self._process is not None
        try:
            os.killpg(self._process.pid, sig)
        except ProcessLookupError:
            pass  # nobody left in the group

    @staticmethod
    def _wait_group_gone(pgid: int, timeout: float) -> None:
        # Killed stubs are reaped by init, not by us; wait (briefly) until that happened so
        # callers see a clean process table when stop() returns.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def stop(self, timeout: float | None = None) -> int | None:
        """Stop the server and everything it started; return its exit code.

        SIGTERM to tritonserver alone, so it unloads models and ends its stubs itself; after
        ``timeout`` (default: exit_timeout + 10 s) SIGKILL. Then SIGKILL whatever is left in
        its process group (stray stubs) and reap the server, so nothing lingers or zombifies.
        """
        process = self._process
        if process is None:
            return None
        if timeout is None:
            timeout = self.exit_timeout + 10.0
        try:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
            # Still safe after the leader exited: Linux does not reuse a pid while it names a
            # live process group.
            self._signal_group(signal.SIGKILL)
            process.wait()
            self._wait_group_gone(process.pid, timeout=2.0)
        finally:
            if self._log_handle is not None:
                self._log_handle.close()
                self._log_handle = None
            for region in Path("/dev/shm").glob(f"{self._shm_prefix}*"):
                region.unlink(missing_ok=True)
        return process.returncode

    def kill(self) -> int | None:
        """Stop at once (SIGKILL to the whole group), e.g. on a second Ctrl-C."""
        if self._process is not None and self._process.poll() is None:
            self._signal_group(signal.SIGKILL)
        return self.stop(timeout=5.0)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
