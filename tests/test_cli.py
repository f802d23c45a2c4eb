"""The `tritonformer` CLI against the real server, as a user types it."""
from __future__ import annotations

import json

import pytest

from tritonformer.client.cli import main

pytestmark = pytest.mark.server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_embed(triton_server, capsys, protocol):
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    assert main(["embed", "hello world", "bonjour", "--protocol", protocol, "--url", url, "--full"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["text"] for row in lines] == ["hello world", "bonjour"]
    assert all(len(row["embedding"]) == 384 for row in lines)


def test_generate_streaming_and_whole(triton_server, capsys):
    args = ["generate", "What is the capital of France?", "--chat", "--max-tokens", "16", "--url", triton_server.grpc_url]
    assert main(args + ["--stream"]) == 0
    streamed = capsys.readouterr()
    assert "Paris" in streamed.out and "finish_reason" in streamed.err
    assert main(args) == 0
    assert capsys.readouterr().out == streamed.out


def test_errors_are_reported_plainly(triton_server, capsys):
    assert main(["generate", "hi", "--max-tokens", "-3", "--url", triton_server.grpc_url]) == 1
    assert "max_tokens" in capsys.readouterr().err


def test_bench_load_reaches_the_load_generator(capsys):
    """`tritonformer bench load ...` is the load generator's own command line (here against its
    trivial local server, so no model is needed)."""
    assert main(["bench", "load", "capacity", "--rates", "50", "--seconds", "0.5"]) == 0
    table = capsys.readouterr().out
    assert "| 50 |" in table and "client capacity" in table
