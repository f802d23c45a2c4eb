"""client/loadgen.py: the open-loop Poisson load generator (stdlib HTTP + numpy).

Schedule statistics and the HTTP/SSE client against its own trivial server need no tritonserver;
the short embed and generate loads run against the real CPU server of the session."""
from __future__ import annotations

import json
import math
import socket

import numpy as np
import pytest

from tritonformer.client import loadgen
from tritonformer.client.bench_decoder_baselines import TraceRequest, orca_trace

SMOLLM2_VOCAB = 49152


def test_poisson_schedule_statistics():
    rate, seconds = 50.0, 400.0
    offsets = loadgen.poisson_schedule(rate, seconds, seed=3)
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    # The count of a Poisson process is Poisson(rate * seconds): mean 20000, sd ~141.
    assert abs(len(offsets) - rate * seconds) < 5 * math.sqrt(rate * seconds)
    assert np.all(gaps > 0) and offsets[-1] < seconds
    assert abs(gaps.mean() - 1 / rate) < 0.03 / rate  # mean gap 1/rate
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05  # exponential: coefficient of variation 1
    # Reproducible per seed, different across seeds; exactly n arrivals when n is given.
    assert np.array_equal(offsets, loadgen.poisson_schedule(rate, seconds, seed=3))
    assert not np.array_equal(offsets[:100], loadgen.poisson_schedule(rate, seconds, seed=4)[:100])
    fixed = loadgen.poisson_schedule(2.0, seed=0, n=5000)
    assert len(fixed) == 5000 and abs(np.diff(fixed).mean() - 0.5) < 0.05
    # Many short schedules: the count stays unbiased (the 6-sigma block is only a first draw).
    counts = [len(loadgen.poisson_schedule(20.0, 1.0, seed=s)) for s in range(400)]
    assert abs(np.mean(counts) - 20) < 1.0


def test_client_against_trivial_server():
    """Every request answered; times ordered scheduled <= launched <= sent < end; SSE tokens
    counted (the trivial server sends one id per event, as a scalar like Triton does)."""
    with loadgen.trivial_server() as server:
        result = loadgen.run_embed_load(server.url, 400.0, 0.5, distribution="short", seed=1, timeout=10)
        s, records = result["summary"], result["records"]
        assert len(records) == len(loadgen.poisson_schedule(400.0, 0.5, seed=1)) == s["requests"] == s["ok"]
        for r in records:
            assert r.scheduled <= r.launched <= r.sent < r.end and r.status == 200
        assert s["latency_p50_ms"] > 0 and s["throughput_rps"] > 0
        # Two forked client processes share one schedule and one start; records come back in order.
        sharded = loadgen.run_embed_load(server.url, 400.0, 0.5, distribution="short", seed=1, processes=2, timeout=10)
        assert [r.index for r in sharded["records"]] == list(range(len(records)))
        assert [r.scheduled - sharded["start"] for r in sharded["records"]] == pytest.approx(
            [r.scheduled - result["start"] for r in records], abs=1e-9)
        assert sharded["summary"]["ok"] == len(records)

        trace = [TraceRequest([5, 6, 7], 3), {"text": "hello", "max_tokens": 5}]
        gen = loadgen.run_generate_load(server.url, trace, rate=50.0, seed=0, timeout=10)
        assert [r.tokens for r in gen["records"]] == [3, 5]
        assert all(r.finish_reason == "length" and len(r.events) == r.tokens for r in gen["records"])
        assert gen["summary"]["output_tokens"] == gen["summary"]["expected_tokens"] == 8


def test_unreachable_server_fails_fast():
    with loadgen.trivial_server() as server:
        url = server.url
    # The server is gone: the prewarm connect fails fast and loudly rather than hanging.
    with pytest.raises(OSError):
        loadgen.run_embed_load(url, 50.0, 0.1, distribution="short", timeout=2)


def test_unanswered_requests_become_timeouts():
    """A server that accepts connections but never answers: every request is a timeout, charged
    as a failure after `timeout` seconds from the last arrival, and the run still ends."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        url = f"127.0.0.1:{listener.getsockname()[1]}"
        result = loadgen.run_embed_load(url, 40.0, 0.3, distribution="short", seed=2, timeout=0.5)
    s = result["summary"]
    assert s["requests"] == len(loadgen.poisson_schedule(40.0, 0.3, seed=2)) > 0
    assert s["timeouts"] == s["requests"] and s["ok"] == 0 and math.isnan(s["latency_p50_ms"])


def test_cli_capacity_table_and_json(tmp_path, capsys):
    out = tmp_path / "cap.json"
    assert loadgen.main(["capacity", "--rates", "200", "--seconds", "0.3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| offered req/s |" in text and "\n| 200 | 0 |" in text
    (row,) = json.loads(out.read_text())["results"]
    assert row["ok"] == row["requests"] > 0 and row["errors"] == 0


@pytest.mark.server
def test_embed_load_against_real_server(triton_server):
    # Short distinct texts (the embedder's response cache would answer repeats without the model).
    texts = [f"short text number {i} about load" for i in range(64)]
    result = loadgen.run_embed_load(triton_server.http_url, 20.0, 1.0, texts=texts, seed=0, timeout=60)
    s, records = result["summary"], result["records"]
    assert len(records) == len(loadgen.poisson_schedule(20.0, 1.0, seed=0)) == s["requests"]
    assert s["ok"] == s["requests"], s["first_error"]
    assert all(r.end - r.scheduled > 0 and r.sent >= r.scheduled for r in records)
    assert 0 < s["latency_p50_ms"] <= s["latency_p90_ms"] <= s["latency_p99_ms"]
    # Pre-tokenized input_ids of exact lengths, the benchmark's default.
    result = loadgen.run_embed_load(triton_server.http_url, 20.0, 0.5, distribution="short", seed=1, timeout=60)
    assert result["summary"]["ok"] == result["summary"]["requests"] > 0, result["summary"]["first_error"]
    assert result["summary"]["tokens_per_s"] > 0


@pytest.mark.server
def test_generate_load_against_real_server(triton_server):
    trace = orca_trace(2, 0, (8, 16), (4, 4), SMOLLM2_VOCAB) + [{"text": "The capital of France is", "max_tokens": 4}]
    result = loadgen.run_generate_load(triton_server.http_url, trace, rate=5.0, seed=0, timeout=120)
    s, records = result["summary"], result["records"]
    assert s["ok"] == 3, s["first_error"]
    for r in records:
        assert r.tokens == 4 and r.finish_reason == "length"  # ignore_eos: exactly max_tokens
        assert r.scheduled <= r.sent < r.first <= r.last_token <= r.end
    for key in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "latency_per_token_p50_ms"):
        assert s[key] > 0, key
    assert s["output_tokens"] == 12 and s["output_tok_per_s"] > 0
