"""client/loadgen.py: the open-loop Poisson load generator (aiohttp client + numpy).

Schedule statistics and the HTTP/SSE client against local servers (the module's trivial server,
and a scripted aiohttp.web server here that answers with errors, overload and odd streams) need
no tritonserver; the short embed and generate loads run against the real CPU server of the session."""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import threading

import numpy as np
import pytest
from aiohttp import web

from tritonformer.client import loadgen
from tritonformer.client.traces import TraceRequest, orca_trace

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
        result = loadgen.run_embed_load(url, 40.0, 0.3, distribution="short", seed=2, timeout=0.3)
    s = result["summary"]
    assert s["requests"] == len(loadgen.poisson_schedule(40.0, 0.3, seed=2)) > 0
    assert s["timeouts"] == s["requests"] and s["ok"] == 0 and math.isnan(s["latency_p50_ms"])


@contextlib.contextmanager
def scripted_server():
    """An aiohttp.web server on its own thread and loop; yields (host:port, what it saw).

    embedder: the k-th request answers 200, 503, 400 for k % 3 = 0, 1, 2. generator streams by
    its first prompt id: 1 a normal stream (two ids per event, as a list), 2 a token then an
    error event, 3 a token and no finish_reason. hf_generator: a unary answer of max_tokens ids.
    slow: answers after 50 ms, counting the requests it holds at once and the connections."""
    seen = {"posts": 0, "headers": [], "in_flight": 0, "max_in_flight": 0, "peers": set()}

    async def live(request):
        return web.Response(text="")

    async def infer(request):
        body = await request.json()
        seen["headers"].append(dict(request.headers))
        k, seen["posts"] = seen["posts"], seen["posts"] + 1
        if request.match_info["model"] == "hf_generator":
            inputs = {i["name"]: i for i in body["inputs"]}
            n = inputs["max_tokens"]["data"][0]
            return web.json_response({"outputs": [{"name": "output_ids", "datatype": "INT32", "shape": [1, n],
                                                   "data": list(range(n))}]})
        if request.match_info["model"] == "slow":
            seen["peers"].add(request.transport.get_extra_info("peername"))
            seen["in_flight"] += 1
            seen["max_in_flight"] = max(seen["max_in_flight"], seen["in_flight"])
            await asyncio.sleep(0.05)
            seen["in_flight"] -= 1
            return web.json_response({"outputs": []})
        if k % 3 == 1:
            return web.Response(status=503, text="overloaded")
        if k % 3 == 2:
            return web.json_response({"error": "bad input"}, status=400)
        return web.json_response({"outputs": [{"name": "embedding", "datatype": "FP32", "shape": [1, 2],
                                                "data": [0, 1]}]})

    async def stream(request):
        body = await request.json()
        seen["headers"].append(dict(request.headers))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        kind = body["input_ids"][0]
        events = {1: [{"output_ids": [7, 8]}, {"output_ids": [9, 10], "finish_reason": "length"}],
                  2: [{"output_ids": 7}, {"error": "boom"}],
                  3: [{"output_ids": 7}]}[kind]
        for event in events:
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await asyncio.sleep(0.02)  # separate events, so the client (usually) times them apart
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v2/health/live", live)
    app.router.add_post("/v2/models/{model}/infer", infer)
    app.router.add_post("/v2/models/{model}/generate_stream", stream)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{port}", seen
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_failures_overload_and_streams_are_accounted():
    """503s, other error statuses, an error event inside a 200 stream and a stream cut short are
    each counted where the summary says; list-valued ids count one token each; the unary
    generator's ids all arrive at the end; requests go out as plain JSON (no gzip asked for)."""
    with scripted_server() as (url, seen):
        result = loadgen.run_embed_load(url, 300.0, 0.1, lengths=[6], seed=5, timeout=10)
        s, n = result["summary"], len(result["records"])
        assert s["requests"] == n > 6
        assert (s["ok"], s["overloaded_503"], s["errors"], s["timeouts"]) == (len(range(0, n, 3)), len(range(1, n, 3)),
                                                                               len(range(2, n, 3)), 0)
        assert s["first_error"] and s["throughput_rps"] > 0
        assert all(r.error == "overloaded" for r in result["records"] if r.status == 503)
        assert all(h["Content-Type"] == "application/json" and "Accept-Encoding" not in h and "User-Agent" not in h
                   for h in seen["headers"])

        trace = [{"prompt_ids": [1, 5], "max_tokens": 4}, {"prompt_ids": [2, 5], "max_tokens": 4},
                 {"prompt_ids": [3, 5], "max_tokens": 4}]
        gen = loadgen.run_generate_load(url, trace, rate=100.0, seed=0, timeout=10)
        good, errored, cut = gen["records"]
        assert good.ok and good.tokens == 4 and len(good.events) == 2 and good.finish_reason == "length"
        assert good.sent < good.first <= good.last_token == good.end
        assert errored.status == 200 and errored.error == "boom" and not errored.ok
        assert cut.tokens == 1 and cut.error == "the event stream ended without a finish_reason"
        g = gen["summary"]
        assert (g["ok"], g["errors"], g["output_tokens"], g["expected_tokens"]) == (1, 2, 4, 12)
        assert g["tpot_p50_ms"] >= 0 and seen["headers"][-1]["Accept"] == "text/event-stream"

        unary = loadgen.run_generate_load(url, trace, rate=100.0, seed=0, timeout=10, unary=True, model="hf_generator")
        u = unary["summary"]
        assert u["ok"] == 3 and u["output_tokens"] == 12 and math.isnan(u["tpot_p50_ms"]) and u["ttft_p50_ms"] > 0
        assert all(r.finish_reason == "length" and r.first == r.end for r in unary["records"])


def test_in_flight_cap_and_keep_alive_pool():
    """A burst above max_in_flight waits for a slot (charged as send lag) on the same few
    keep-alive connections: never more requests at the server than the cap, no connection per request."""
    with scripted_server() as (url, seen):
        result = loadgen.run_embed_load(url, 400.0, 0.05, lengths=[4], seed=0, max_in_flight=3, model="slow",
                                        timeout=10)
    s = result["summary"]
    assert s["ok"] == s["requests"] > 6, s["first_error"]
    assert seen["max_in_flight"] == 3 and len(seen["peers"]) == 3
    assert s["send_lag_max_ms"] > 40  # the later ones waited about a server answer (50 ms) or more


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
    # 12 tokens each: several decode rounds, so even when the sender coalesces pieces under load a
    # stream gets more than one event and has a time per output token.
    trace = orca_trace(2, 0, (8, 16), (12, 12), SMOLLM2_VOCAB) + [{"text": "The capital of France is", "max_tokens": 12}]
    result = loadgen.run_generate_load(triton_server.http_url, trace, rate=5.0, seed=0, timeout=120)
    s, records = result["summary"], result["records"]
    assert s["ok"] == 3, s["first_error"]
    for r in records:
        assert r.tokens == 12 and r.finish_reason == "length"  # ignore_eos: exactly max_tokens
        assert r.scheduled <= r.sent < r.first <= r.last_token <= r.end
    for key in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "latency_per_token_p50_ms"):
        assert s[key] > 0, key
    assert s["output_tokens"] == 36 and s["output_tok_per_s"] > 0


def test_each_generate_point_on_one_server_sends_prompts_of_its_own(monkeypatch, capsys):
    """The server keeps a prefix cache: a second point of the same seed's trace would find every
    prompt computed. The n-th point shifts its token ids by n: the same lengths, other tokens."""
    sent = []

    def fake_load(url, trace, rate, seed, **kwargs):
        sent.append(trace)
        return {"summary": {"offered_rate": rate, "seed": seed, "dispatch_lag_p99_ms": 0.0, "first_error": None,
                            "ok": len(trace)}}

    monkeypatch.setattr(loadgen, "run_generate_load", fake_load)
    assert loadgen.main(["generate", "--rates", "8,32,8", "--requests", "6", "--vocab-size", "1000"]) == 0
    first, second, third = sent
    assert first == orca_trace(6, 0, (32, 512), (1, 128), 1000)  # the first point: the trace as drawn
    for later in (second, third):
        assert [(len(r.prompt_ids), r.max_new_tokens) for r in later] == [(len(r.prompt_ids), r.max_new_tokens)
                                                                           for r in first]
    prompts = [{tuple(r.prompt_ids) for r in trace} for trace in sent]
    assert not (prompts[0] & prompts[1] or prompts[0] & prompts[2] or prompts[1] & prompts[2])
    capsys.readouterr()
