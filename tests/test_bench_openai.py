"""`tritonformer bench openai` (client/bench_openai.py) end to end on the CPU, against the
session's tritonserver (tests/conftest.py) with the OpenAI routes in this process, as
`tritonformer serve` runs them."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")


pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def routes(openai_routes):
    return openai_routes


def test_benchmark_runs_both_ways_on_a_tiny_trace(routes, triton_server, capsys):
    """bench_openai end to end on CPU: both ways answer every request and the ratios print; no
    way finds its prompts in the prefix cache (prompts of 2+ KV blocks: each way has its own)."""
    from tritonformer.client import bench_openai

    parser = __import__("argparse").ArgumentParser()
    bench_openai.add_arguments(parser)
    args = parser.parse_args(["--grpc-url", triton_server.grpc_url, "--openai-url", routes.url.removesuffix("/v1"),
                              "--metrics-url", triton_server.metrics_url,
                              "--requests", "4", "--low-requests", "3", "--prompt-range", "33,48",
                              "--output-range", "2,4", "--saturation-rate", "50", "--low-rate", "8"])
    assert bench_openai.run(args) == 0
    printed = capsys.readouterr().out
    assert "tokens/s at saturation, /v1 / direct" in printed and "TTFT p50 at 8 req/s" in printed
    rows = [line for line in printed.splitlines() if line.startswith("| saturation") or line.startswith("| low")]
    assert len(rows) == 4 and all(" 4 / 4 " in r or " 3 / 3 " in r for r in rows), rows
    assert all(r.rstrip(" |").rsplit("|", 1)[1].strip() == "0" for r in rows), rows  # prefix-cache hit tokens
