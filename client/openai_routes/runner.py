"""Running the OpenAI routes: uvicorn in a thread of `tritonformer serve`, or on its own.

The socket is bound before uvicorn starts, in the caller's thread, so a port in use is reported
at once with the flag and variable that change it, like the server's own ports.

On its own, in front of any tritonserver that serves this repository's models::

    python -m tritonformer.client.openai_routes --grpc-url 127.0.0.1:8001 --port 9000
"""
from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import threading
import time

import uvicorn

from tritonformer.client.openai_routes.app import create_app

from tritonformer.client.serve import API_KEY_ENV, DEFAULT_OPENAI_PORT, OPENAI_PORT_ENV


class OpenAIPortInUse(RuntimeError):
    pass


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); OpenAIPortInUse names how to choose another port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # connections whose socket says TCP, and an accepted socket inherits the listener's `proto`.
    # With Nagle on, a response's second small write (the body after the headers, an SSE event
    # after the last) waits for the client's delayed ACK: ~40 ms per small answer.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            raise OpenAIPortInUse(f"OpenAI port {port} on {host} is already in use. Choose another one with "
                                  f"--openai-port or the environment variable {OPENAI_PORT_ENV}, or leave the "
                                  "routes out with --no-openai.") from None
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _config(grpc_url: str, api_key: str | None, log_level: str) -> uvicorn.Config:
    # The default asyncio loop: grpc.aio's support for uvloop is not something to rely on.
    # httptools parses HTTP/1.1 in C where it is installed (h11 otherwise).
    return uvicorn.Config(create_app(grpc_url, api_key), loop="asyncio", http="auto", lifespan="on",
                          log_level=log_level, access_log=False, timeout_graceful_shutdown=5)


class OpenAIRoutes:
    """The routes served by uvicorn from a daemon thread (signals stay with the main thread,
    which `tritonformer serve` uses to stop tritonserver in order). The port is bound when this
    is made; serving starts with start(), once Triton is ready."""

    def __init__(self, host: str, port: int, api_key: str | None = None, log_level: str = "warning") -> None:
        self.host, self.port, self.api_key, self.log_level = host, port, api_key, log_level
        self._socket = bind(host, port)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(self.host, self.host)
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"http://{host}:{self.port}/v1"

    def start(self, grpc_url: str, timeout: float = 60.0) -> OpenAIRoutes:
        """Serve the routes in front of Triton's gRPC endpoint `grpc_url`; return once they answer
        (RuntimeError if they could not start, e.g. Triton did not answer the model lookup)."""
        self._server = uvicorn.Server(_config(grpc_url, self.api_key, self.log_level))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="openai-routes", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the OpenAI routes did not start (see the log above)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI routes did not start within {timeout:.0f} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)
        self._socket.close()


def serve_forever(argv: list[str] | None = None) -> int:
    """`python -m tritonformer.client.openai_routes`: the routes alone, in the foreground."""
    parser = argparse.ArgumentParser(prog="python -m tritonformer.client.openai_routes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc-url", default=f"127.0.0.1:{os.environ.get('TRITONFORMER_GRPC_PORT', '8001')}",
                        help="tritonserver's gRPC endpoint (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=int(os.environ.get(OPENAI_PORT_ENV, DEFAULT_OPENAI_PORT)),
                        help=f"port (default: ${OPENAI_PORT_ENV} or {DEFAULT_OPENAI_PORT})")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, none)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    try:
        sock = bind(args.host, args.port)
    except OpenAIPortInUse as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    uvicorn.Server(_config(args.grpc_url, args.api_key, args.log_level)).run(sockets=[sock])
    return 0
