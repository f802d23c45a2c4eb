"""The Locust load tests (client/locustfile.py) against a real server: a short headless run of
all four scenarios, then a tag-selected run bounded by --iterations."""
from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Only look for locust: importing it monkey-patches the whole process with gevent, which
# would hang every gRPC and threading test that runs after this module is collected.
if importlib.util.find_spec("locust") is None:
    pytest.skip("locust is not installed", allow_module_level=True)

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO / "client" / "locustfile.py"


def _locust(server, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict, list]:
    """Run Locust headless against `server`; (process, {(type, name): stats row}, failure rows)."""
    env = dict(
        os.environ,
        TRITONFORMER_GRPC_PORT=str(server.grpc_port),  # --host gives the HTTP side
        TRITONFORMER_LOAD_MAX_TOKENS="8",  # the CPU generator makes ~20-50 tokens/s in all
        TRITONFORMER_LOAD_WAIT="0.5",
    )
    cmd = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "--host", f"http://{server.http_url}", "--csv", str(out / "run"), "--html", str(out / "report.html"),
        *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    with open(out / "run_stats.csv", newline="") as f:
        stats = {(r["Type"], r["Name"]): r for r in csv.DictReader(f) if r["Name"] != "Aggregated"}
    with open(out / "run_failures.csv", newline="") as f:
        failures = list(csv.DictReader(f))
    return proc, stats, failures


def test_all_scenarios_short_run(triton_server, tmp_path):
    proc, stats, failures = _locust(
        triton_server, tmp_path, "--tags", "embed", "generate", "-u", "4", "-r", "4", "--run-time", "15s"
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert failures == [], failures
    expected = [("POST", "embedder http"), ("grpc", "embedder grpc")] + [
        (kind, name) for name in ("generator grpc-stream", "generator http-sse") for kind in ("TTFT", "TPOT", "stream")
    ]
    for key in expected:
        assert key in stats, (key, sorted(stats), output[-4000:])
        assert int(stats[key]["Request Count"]) > 0 and int(stats[key]["Failure Count"]) == 0, stats[key]
    for name in ("generator grpc-stream", "generator http-sse"):
        # The stream entry's size is its output tokens: at most max_tokens, and TPOT needs 2.
        assert 2 <= float(stats[("stream", name)]["Average Content Size"]) <= 8
        assert 0 < float(stats[("TTFT", name)]["Median Response Time"]) <= float(stats[("stream", name)]["Max Response Time"])
    html = (tmp_path / "report.html").read_text()
    assert "generator http-sse" in html and "TTFT" in html


def test_tag_selects_one_scenario_and_iterations_bound_the_run(triton_server, tmp_path):
    start = time.monotonic()
    proc, stats, failures = _locust(
        triton_server, tmp_path, "--tags", "embed-grpc", "--iterations", "6", "-u", "2", "-r", "2", "--run-time", "60s"
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert failures == []
    assert list(stats) == [("grpc", "embedder grpc")]  # no other user was spawned
    # A request finishing while the users are stopped may add one or two to the count.
    assert 6 <= int(stats[("grpc", "embedder grpc")]["Request Count"]) <= 8
    assert elapsed < 30, f"--iterations did not end the run ({elapsed:.0f} s)"
