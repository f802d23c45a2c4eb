"""`tritonformer serve`: run tritonserver on model_repository/ in the foreground.

Prepares the checkpoints (conversion progress shows here, not buried in the server log),
starts the bundled tritonserver with its output streamed to the terminal, waits until every
model is ready, prints where to reach it, and serves until Ctrl-C / SIGTERM. Beside it, the
OpenAI routes (client/openai_routes) listen on --openai-port, a Triton client in a thread of
this process; --no-openai leaves them out.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from tritonformer.client.server import PORT_HINTS, TritonServer, TritonServerError

if TYPE_CHECKING:
    from tritonformer.client.openai_routes.runner import OpenAIRoutes

# The OpenAI routes' settings (their code, FastAPI and uvicorn, is imported only when they start).
OPENAI_PORT_ENV = "TRITONFORMER_OPENAI_PORT"
API_KEY_ENV = "TRITONFORMER_API_KEY"
DEFAULT_OPENAI_PORT = 9000  # as Triton's own OpenAI frontend

DEFAULT_MODEL_REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
# Models that ship without a checkpoint -> the environment variable their config.pbtxt falls back
# to (the server's environment reaches the models).
CHECKPOINT_ENVS = {"reranker": "TRITONFORMER_RERANKER_CHECKPOINT", "classifier": "TRITONFORMER_CLASSIFIER_CHECKPOINT"}
# The reranker's `score_tokens` for that checkpoint (a causal-LM reranker's, e.g. "no,yes";
# backend/encoder/build.py reads it).
SCORE_TOKENS_ENV = "TRITONFORMER_RERANKER_SCORE_TOKENS"


def _port_type(env: str) -> Callable[[str], int]:
    def port(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if not 1 <= value <= 65535:
            raise argparse.ArgumentTypeError(f"not a TCP port: {text!r} (also check ${env})")
        return value

    return port


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=DEFAULT_MODEL_REPOSITORY,
        help="model repository to serve (default: %(default)s)",
    )
    for kind, (flag, env) in PORT_HINTS.items():
        # A string default goes through type=_port too, so a bad env value is reported by
        # argparse like a bad flag value.
        parser.add_argument(
            flag,
            type=_port_type(env),
            default=os.environ.get(env, str(DEFAULT_PORTS[kind])),
            help=f"{kind} port (default: ${env} or {DEFAULT_PORTS[kind]})",
        )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the endpoints bind to (default: %(default)s, loopback only; "
        "0.0.0.0 exposes the server to the network)",
    )
    parser.add_argument(
        "--models",
        action="extend",
        nargs="+",
        metavar="NAME",
        help="models that must become ready (space- or comma-separated; default: every folder "
        "of the repository with a config.pbtxt)",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the models to load (default: %(default)s)",
    )
    for model, env in CHECKPOINT_ENVS.items():
        parser.add_argument(
            f"--{model}-checkpoint",
            type=Path,
            default=None,
            help=f"checkpoint folder of the {model} model, which ships without one (default: ${env}; "
            f"without either the {model} answers every request with how to name one)",
        )
    parser.add_argument(
        "--reranker-score-tokens",
        default=None,
        help=f"the --reranker-checkpoint's score from its next-token logits, e.g. \"no,yes\" for Qwen3-Reranker "
        f"(the reranker's score_tokens parameter; default: ${SCORE_TOKENS_ENV})",
    )
    parser.add_argument(
        "--openai-port",
        type=_port_type(OPENAI_PORT_ENV),
        default=os.environ.get(OPENAI_PORT_ENV, str(DEFAULT_OPENAI_PORT)),
        help=f"port of the OpenAI routes (/v1/chat/completions, ...) (default: ${OPENAI_PORT_ENV} or "
        f"{DEFAULT_OPENAI_PORT})",
    )
    parser.add_argument("--no-openai", action="store_true", help="do not start the OpenAI routes")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"the OpenAI routes answer 401 unless a request sends 'Authorization: Bearer KEY' "
        f"(default: ${API_KEY_ENV}; none: no key needed)",
    )
    parser.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose level")
    parser.add_argument(
        "--no-prepare",
        action="store_true",
        help="do not prepare/convert the default checkpoints before starting",
    )


def repository_models(repository: Path) -> list[str]:
    """Every model folder (one holding a config.pbtxt) in ``repository``."""
    return sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))


class _StopRequested(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGINT/SIGTERM into _StopRequested in the main thread, wherever it is waiting.

    The server runs in its own session, so a Ctrl-C reaches only us; we then stop it in order.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _StopRequested(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _exit_code(code: int | None) -> int:
    """Popen's -N (killed by signal N) as the shell's 128+N; sys.exit(-9) would give 247."""
    if code is None:
        return 0
    return 128 - code if code < 0 else code


def _say(text: str) -> None:
    print(f"tritonformer: {text}", file=sys.stderr, flush=True)


def _stop(server: TritonServer) -> int | None:
    """Stop the server; a second Ctrl-C/SIGTERM while it shuts down kills it at once."""
    _say(f"stopping tritonserver (up to {server.exit_timeout} s; Ctrl-C again to kill it)")
    try:
        return server.stop()
    except _StopRequested:
        _say("killing tritonserver")
        return server.kill()


def run_serve(args: argparse.Namespace) -> int:
    repository = Path(args.model_repository).resolve()
    if not repository.is_dir():
        _say(f"error: model repository {repository} does not exist")
        return 2
    # --models a b and --models a,b both work.
    models = [name for arg in args.models or () for name in arg.split(",") if name]
    models = models or repository_models(repository)
    if not models:
        _say(f"error: {repository} has no model folders with a config.pbtxt")
        return 2
    missing = [m for m in models if not (repository / m / "config.pbtxt").is_file()]
    if missing:
        _say(f"error: no config.pbtxt for {', '.join(missing)} in {repository}")
        return 2

    if not args.no_prepare:
        # Imported here: it pulls in torch/gguf, which the other commands do not need.
        from tritonformer.backend.checkpoints import prepare_default_checkpoints

        _say("preparing checkpoints")
        prepare_default_checkpoints(progress=True)

    for model, env in CHECKPOINT_ENVS.items():
        folder = getattr(args, f"{model}_checkpoint", None)
        if folder is not None:
            if not (folder / "config.json").is_file():
                _say(f"error: --{model}-checkpoint {folder} is not a checkpoint folder (no config.json)")
                return 2
            os.environ[env] = str(folder.resolve())  # inherited by tritonserver and its model stubs
    if args.reranker_score_tokens is not None:
        os.environ[SCORE_TOKENS_ENV] = args.reranker_score_tokens

    routes = None
    if not args.no_openai:
        taken = {args.http_port: "HTTP", args.grpc_port: "gRPC", args.metrics_port: "metrics"}
        if args.openai_port in taken:
            _say(f"error: --openai-port {args.openai_port} is also the {taken[args.openai_port]} port; choose "
                 f"another (or ${OPENAI_PORT_ENV}), or leave the OpenAI routes out with --no-openai")
            return 2
        try:
            from tritonformer.client.openai_routes.runner import OpenAIPortInUse, OpenAIRoutes
        except ImportError as e:  # a bare Python (a GPU image) without FastAPI: Triton alone
            _say(f"warning: the OpenAI routes are not started ({e}; ./install.sh installs them)")
        else:
            try:  # the port is bound now, so that a port in use stops us before tritonserver starts
                routes = OpenAIRoutes(args.host, args.openai_port, args.api_key)
            except OpenAIPortInUse as e:
                _say(f"error: {e}")
                return 1

    server = TritonServer(
        repository,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        host=args.host,
        log_verbose=args.log_verbose,
        stream_log=True,
    )
    try:
        return _serve(server, models, routes, args.ready_timeout)
    finally:
        if routes is not None:
            routes.stop()


def _serve(server: TritonServer, models: list[str], routes: OpenAIRoutes | None, ready_timeout: float) -> int:
    """Start the server (and the OpenAI routes once it is ready) and serve until stopped."""
    with _signals_raise():
        try:
            server.start()
        except TritonServerError as e:
            _say(f"error: {e}")
            return 1
        except _StopRequested:
            _stop(server)
            return 130
        try:
            server.wait_ready(models, timeout=ready_timeout, progress=True)
            openai = ""
            if routes is not None:
                routes.start(server.grpc_url)
                openai = f" | OpenAI {routes.url}"
            print(
                f"tritonformer: serving {', '.join(models)} | HTTP http://{server.http_url} | "
                f"gRPC {server.grpc_url} | metrics {server.metrics_url}{openai} | Ctrl-C to stop",
                flush=True,
            )
            assert server.process is not None
            code = server.process.wait()  # returns only if the server dies on its own
            _say(f"error: tritonserver exited unexpectedly with code {code}")
            server.stop()
            return _exit_code(code) or 1
        except RuntimeError as e:  # a TritonServerError, or the OpenAI routes did not start
            _say(f"error: {e}")
            _stop(server)
            return 1
        except _StopRequested as stop:
            _say(f"{stop} received")
            if routes is not None:  # no new OpenAI requests while the models unload
                routes.stop()
            code = _stop(server)
            _say(f"tritonserver stopped (exit code {code})")
            return _exit_code(code)
