"""The launcher of the bundled tritonserver (tritonformer.client.server), on a real server.

Uses a tiny numpy-only Python-backend repository written into tmp dirs, so it needs
nvidia-pytriton and tritonclient but no checkpoints. Runs in ~15 s on 2 CPU cores.
"""

from __future__ import annotations

import ipaddress
import socket
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytriton", reason="needs nvidia-pytriton's bundled tritonserver")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

from tritonformer.client.server import (  # noqa: E402
    PortInUseError,
    TritonServer,
    TritonServerError,
    free_port,
    free_ports,
)

pytestmark = pytest.mark.server

IDENTITY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

IDENTITY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.copy())]))
        return responses
"""

BROKEN_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("boom: this model refuses to load")

    def execute(self, requests):
        return []
"""


def write_repository(root: Path, models: dict[str, str]) -> Path:
    """A model repository with one python model per entry: name -> model.py source."""
    for name, source in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(IDENTITY_CONFIG.format(name=name))
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    return root


def make_server(repository: Path, **kwargs) -> TritonServer:
    http, grpc, metrics = free_ports(3)
    log_file = repository.parent / f"{repository.name}-tritonserver.log"
    return TritonServer(repository, http, grpc, metrics, log_file=log_file, **kwargs)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = write_repository(tmp_path_factory.mktemp("repo") / "models", {"identity": IDENTITY_MODEL})
    with make_server(repository) as running:
        running.wait_ready(["identity"], timeout=60)
        yield running


# ------------------------------------------------------------------ helpers reading /proc


def listening_addresses(port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Local addresses of the TCP sockets in LISTEN state on ``port`` (IPv4 and IPv6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:  # 0A = LISTEN
                continue
            assert len(address) == width
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, width, 8))
            found.append(ipaddress.ip_address(raw))
    return found


def is_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)  # gRPC listens on [::ffff:127.0.0.1]
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def live_group_members(pgid: int) -> list[int]:
    """Pids of the processes (zombies excluded) whose process group is ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # exited meanwhile
        state, _ppid, pgrp = text[text.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


# ------------------------------------------------------------------ tests


def test_http_and_grpc_infer_round_trip(server: TritonServer) -> None:
    data = np.arange(5, dtype=np.float32) * 1.5

    http = httpclient.InferenceServerClient(url=server.http_url)
    try:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = http.infer("identity", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        http.close()  # an open keep-alive connection would hold up the server's shutdown

    grpc = grpcclient.InferenceServerClient(url=server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = grpc.infer("identity", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        grpc.close()


def test_binds_only_to_loopback(server: TritonServer) -> None:
    for kind in ("http", "grpc", "metrics"):
        port = server.ports[kind]
        addresses = listening_addresses(port)
        assert addresses, f"nothing listens on the {kind} port {port}"
        assert all(is_loopback(a) for a in addresses), f"{kind} port {port} listens on {addresses}"


def test_port_in_use_fails_before_starting(tmp_path: Path) -> None:
    repository = write_repository(tmp_path / "models", {"identity": IDENTITY_MODEL})
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        launcher = TritonServer(repository, http_port=free_port(), grpc_port=port, metrics_port=free_port())
        with pytest.raises(PortInUseError) as caught:
            launcher.start()
    message = str(caught.value)
    assert str(port) in message and "--grpc-port" in message and "TRITONFORMER_GRPC_PORT" in message
    assert launcher.process is None  # nothing was started


def test_port_of_a_running_server_counts_as_in_use(server: TritonServer, tmp_path: Path) -> None:
    # tritonserver's gRPC socket is IPv6 ([::ffff:127.0.0.1]) with SO_REUSEPORT; a second
    # server could silently share it, so the check must still see the port as taken.
    launcher = TritonServer(tmp_path, http_port=free_port(), grpc_port=server.grpc_port, metrics_port=free_port())
    with pytest.raises(PortInUseError, match=str(server.grpc_port)):
        launcher.start()


def test_unknown_model_fails_fast(server: TritonServer) -> None:
    started = time.monotonic()
    with pytest.raises(TritonServerError, match="'no_such_model' is not in"):
        server.wait_ready(["no_such_model"], timeout=30, progress=False)
    assert time.monotonic() - started < 5


def test_server_that_exits_fails_fast_with_log_tail(tmp_path: Path) -> None:
    repository = write_repository(tmp_path / "models", {"identity": IDENTITY_MODEL})
    launcher = make_server(repository, extra_args=["--no-such-flag"])
    launcher.start()
    try:
        with pytest.raises(TritonServerError, match="exited with code") as caught:
            launcher.wait_ready(["identity"], timeout=30, progress=False)
        assert "no-such-flag" in str(caught.value)  # tritonserver's complaint, from the log tail
    finally:
        launcher.stop()


def test_failed_model_fails_fast_and_stop_ends_the_process_group(tmp_path: Path) -> None:
    repository = write_repository(tmp_path / "models", {"identity": IDENTITY_MODEL, "broken": BROKEN_MODEL})
    launcher = make_server(repository)
    launcher.start()
    try:
        started = time.monotonic()
        with pytest.raises(TritonServerError) as caught:
            launcher.wait_ready(["identity", "broken"], timeout=120, progress=False)
        assert time.monotonic() - started < 30
        message = str(caught.value)
        assert "'broken' failed to load" in message and "boom: this model refuses to load" in message
        assert "--- last lines of" in message

        # The good model keeps being served, in the server's own group with its stub.
        assert launcher.model_ready("identity")
        assert launcher.process is not None
        pgid = launcher.process.pid
        assert len(live_group_members(pgid)) >= 2  # tritonserver + identity's stub
    finally:
        started = time.monotonic()
        code = launcher.stop()
        stop_seconds = time.monotonic() - started

    assert code is not None and launcher.process.poll() is not None  # reaped: no zombie
    assert live_group_members(pgid) == []
    assert stop_seconds < 20
