"""The iteration-level decoder through the real server at scale: 64 concurrent gRPC streams
answered exactly as each prompt alone (greedy batch invariance), a cancelled stream giving its
KV blocks back, and the paged-KV-cache metrics after load."""
from __future__ import annotations

import json
import queue
import threading
import time

import numpy as np
import pytest

from helpers import http_post, scrape_metrics, wait_for_metrics

pytestmark = pytest.mark.server

MODEL = "generator"
NUM_STREAMS = 64
STREAM_TOKENS = 6  # each prompt is also run alone afterwards: ~75 ms per token on 2 CPU cores

# 64 different prompts of different lengths (so prefill chunks and block counts differ).
_SUBJECTS = ["The ocean", "My grandmother", "A robot", "The old library", "Python", "The mountain",
             "A small cat", "The city at night"]
_OPENINGS = ["is", "said that", "was known for", "reminds me of", "can be described as", "always",
             "never forgot", "began to"]
PROMPTS = [f"{s} {o}" + " very" * (i % 5) + f" {i}"
           for i, (s, o) in enumerate((s, o) for s in _SUBJECTS for o in _OPENINGS)]


# ---- helpers --------------------------------------------------------------------------------
def _grpc_inputs(prompt: str, stream: bool, **params):
    import tritonclient.grpc as grpcclient

    tensors = []
    for name, array, dtype in (
        ("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        ("stream", np.array([stream]), "BOOL"),
        ("sampling_parameters", np.array([json.dumps(params).encode()], dtype=np.object_), "BYTES"),
    ):
        t = grpcclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        tensors.append(t)
    return tensors


def _is_final(result) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and params["triton_final_response"].bool_param


def _scrape(server, model: str = MODEL) -> dict[str, float]:
    return scrape_metrics(server, model)


def _wait_for(server, predicate, timeout: float, interval: float = 0.1) -> tuple[bool, dict]:
    return wait_for_metrics(server, MODEL, predicate, timeout=timeout, interval=interval)


def _wait_idle(server, timeout: float = 60.0) -> dict:
    """Until the engine stops iterating (iterations_total unchanged over 0.5 s)."""
    deadline = time.monotonic() + timeout
    last = _scrape(server)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _scrape(server)
        if now["tritonformer_iterations_total"] == last["tritonformer_iterations_total"]:
            return now
        last = now
    raise AssertionError(f"the generator engine still iterates after {timeout} s: {last}")


def _generate_alone(server, prompt: str, max_tokens: int) -> dict:
    status, body = http_post(
        server, f"/v2/models/{MODEL}/generate",
        {"text_input": prompt, "stream": False,
         "sampling_parameters": json.dumps({"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})},
    )
    assert status == 200, body
    return body


# ---- 1. 64 concurrent streams ----------------------------------------------------------------
def test_64_concurrent_grpc_streams_equal_each_prompt_alone(triton_server):
    import tritonclient.grpc as grpcclient

    assert len(set(PROMPTS)) == NUM_STREAMS
    before = _scrape(triton_server)
    barrier = threading.Barrier(NUM_STREAMS)
    sent_at = [0.0] * NUM_STREAMS
    streams: list = [None] * NUM_STREAMS

    def one_stream(i: int):
        responses: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(triton_server.grpc_url)
        got = []
        try:
            client.start_stream(callback=lambda result, error: responses.put((result, error)))
            tensors = _grpc_inputs(PROMPTS[i], True, max_tokens=STREAM_TOKENS, temperature=0, ignore_eos=True)
            barrier.wait(timeout=60)  # all 64 go at once
            client.async_stream_infer(MODEL, tensors, enable_empty_final_response=True)
            sent_at[i] = time.monotonic()
            while True:
                result, error = responses.get(timeout=180)
                got.append((result, error, time.monotonic()))
                if error is not None or _is_final(result):
                    break
            # Nothing may follow the final response.
            time.sleep(0.2)
            while not responses.empty():
                got.append(responses.get_nowait() + (time.monotonic(),))
        finally:
            client.stop_stream()
            client.close()
        streams[i] = got

    # Scrape the gauges while the streams run: the engine really held them together.
    peak = {"tritonformer_running_requests": 0.0, "tritonformer_waiting_requests": 0.0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            values = _scrape(triton_server)
            for k in peak:
                peak[k] = max(peak[k], values.get(k, 0.0))
            time.sleep(0.05)

    start = time.monotonic()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=one_stream, args=(i,)) for i in range(NUM_STREAMS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
    finally:
        done.set()
        watcher.join(5)
    concurrent_s = time.monotonic() - start
    assert all(not t.is_alive() for t in threads), "a stream hung"
    failed = [PROMPTS[i] for i, got in enumerate(streams) if not got]
    assert not failed, f"stream threads failed (exception printed above) for {failed}"

    first_final = min(got[-1][2] for got in streams)
    assert max(sent_at) < first_final, "the 64 requests were not all in flight together"
    # running + waiting: how many sequences the engine held at once (running is capped by
    # max_running_sequences; the rest wait in its queue).
    assert peak["tritonformer_running_requests"] >= 2, peak
    assert peak["tritonformer_running_requests"] + peak["tritonformer_waiting_requests"] >= NUM_STREAMS // 2, peak

    start = time.monotonic()
    alone = [_generate_alone(triton_server, p, STREAM_TOKENS) for p in PROMPTS]  # afterwards, one at a time
    alone_s = time.monotonic() - start
    print(f"64 streams x {STREAM_TOKENS} tokens: {concurrent_s:.1f} s concurrently; alone, one by one: {alone_s:.1f} s;"
          f" peak gauges {peak}")

    for i, (got, solo) in enumerate(zip(streams, alone)):
        errors = [e for _, e, _ in got if e is not None]
        assert not errors, (PROMPTS[i], errors)
        results = [r for r, _, _ in got]
        finals = [j for j, r in enumerate(results) if _is_final(r)]
        assert finals == [len(results) - 1], (PROMPTS[i], "exactly one final response, the last", finals)
        reasons = [r.as_numpy("finish_reason") for r in results]
        assert all(x is None for x in reasons[:-1]), (PROMPTS[i], "finish_reason before the final response")
        assert reasons[-1] is not None and reasons[-1][0].decode() == "length", (PROMPTS[i], reasons[-1])
        ids = [t for r in results for t in r.as_numpy("output_ids").tolist()]
        text = "".join(r.as_numpy("text_output")[0].decode() for r in results)
        assert len(ids) == STREAM_TOKENS, (PROMPTS[i], ids)
        assert solo["finish_reason"] == "length" and len(solo["output_ids"]) == STREAM_TOKENS, solo
        assert ids == solo["output_ids"], (PROMPTS[i], "streamed among 64 vs alone", ids, solo["output_ids"])
        assert text == solo["text_output"], (PROMPTS[i], text, solo["text_output"])
    assert len({tuple(s["output_ids"]) for s in alone}) > 1  # each stream got its own prompt's answer

    after = _wait_idle(triton_server)
    assert after["tritonformer_running_requests"] == 0 and after["tritonformer_waiting_requests"] == 0, after
    assert after["tritonformer_kv_blocks_used"] == 0, after
    assert after["tritonformer_generated_tokens_total"] >= before["tritonformer_generated_tokens_total"] + 2 * NUM_STREAMS * STREAM_TOKENS


# ---- 2. cancellation mid-stream --------------------------------------------------------------
def test_cancel_mid_stream_frees_kv_blocks(triton_server):
    import tritonclient.grpc as grpcclient

    idle = _wait_idle(triton_server)
    assert idle["tritonformer_kv_blocks_used"] == 0, idle
    pool = idle["tritonformer_kv_blocks_used"] + idle["tritonformer_kv_blocks_free"]

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer(MODEL, _grpc_inputs("Write a very long story about a dragon.", True, max_tokens=2000,
                                                  temperature=0, ignore_eos=True))
    got = []
    try:
        while len(got) < 5:
            result, error = responses.get(timeout=120)
            assert error is None, error
            assert result.as_numpy("finish_reason") is None, "finished early"
            got.append(result)
        # It runs and holds KV blocks.
        ok, running = _wait_for(triton_server, lambda v: v["tritonformer_running_requests"] == 1
                                and v["tritonformer_kv_blocks_used"] > 0, timeout=30)
        assert ok, running
        assert running["tritonformer_kv_blocks_used"] + running["tritonformer_kv_blocks_free"] == pool, running
    finally:
        client.stop_stream(cancel_requests=True)  # cancel it mid-stream
        client.close()
    cancelled_at = time.monotonic()

    # The engine stops working on it within a few cancellation checks (every 50 ms): not the
    # ~2000 tokens it was asked for.
    stopped = _wait_idle(triton_server, timeout=30)
    stop_s = time.monotonic() - cancelled_at
    iterations = stopped["tritonformer_iterations_total"] - idle["tritonformer_iterations_total"]
    assert 5 <= iterations < 500, iterations

    # Its blocks are back in the pool, and the gauges say so.
    freed, after_cancel = _wait_for(
        triton_server, lambda v: v["tritonformer_kv_blocks_used"] == 0 and v["tritonformer_running_requests"] == 0,
        timeout=30,
    )

    # The next request runs normally (the engine survived the cancellation).
    body = _generate_alone(triton_server, "After the cancellation,", 4)
    assert body["finish_reason"] == "length" and len(body["output_ids"]) == 4, body
    ok, after_next = _wait_for(
        # Gauges and counters arrive in separate metric updates: wait for both.
        triton_server, lambda v: v["tritonformer_generated_tokens_total"] >= stopped["tritonformer_generated_tokens_total"] + 4
        and v["tritonformer_kv_blocks_used"] == 0 and v["tritonformer_running_requests"] == 0,
        timeout=30,
    )
    assert ok, after_next
    assert after_next["tritonformer_kv_blocks_used"] == 0 and after_next["tritonformer_running_requests"] == 0, after_next
    assert after_next["tritonformer_kv_blocks_free"] == pool, after_next
    print(f"cancelled after {len(got)} responses; engine idle {stop_s:.2f} s later, after {iterations:.0f} iterations")

    assert freed, (
        "after the cancelled stream (and no other traffic) the KV gauges never returned to 0: "
        f"used={after_cancel['tritonformer_kv_blocks_used']}, free={after_cancel['tritonformer_kv_blocks_free']}, "
        f"running={after_cancel['tritonformer_running_requests']}"
    )
    assert after_cancel["tritonformer_kv_blocks_free"] == pool, after_cancel


# ---- 3. metrics after load -------------------------------------------------------------------
def test_kv_metrics_after_load(triton_server):
    before = _wait_idle(triton_server)
    for name in ("tritonformer_kv_blocks_used", "tritonformer_kv_blocks_free", "tritonformer_preemptions_total",
                 "tritonformer_running_requests", "tritonformer_waiting_requests", "tritonformer_kv_cache_bytes",
                 "tritonformer_iterations_total", "tritonformer_iteration_tokens_count",
                 "tritonformer_time_to_first_token_seconds_count", "tritonformer_time_per_output_token_seconds_count",
                 "tritonformer_generated_tokens_total"):
        assert name in before, f"{name} missing from /metrics"

    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"Metrics after load, request {i}:" + " and more" * i for i in range(6)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        bodies = list(pool.map(lambda p: _generate_alone(triton_server, p, 6), prompts))
    assert all(len(b["output_ids"]) == 6 for b in bodies)

    ok, after = _wait_for(
        triton_server,
        lambda v: v["tritonformer_generated_tokens_total"] >= before["tritonformer_generated_tokens_total"] + 36,
        timeout=30,
    )
    assert ok, after
    after = _wait_idle(triton_server)
    again = _scrape(triton_server)
    time.sleep(0.5)
    third = _scrape(triton_server)

    assert after["tritonformer_generated_tokens_total"] == before["tritonformer_generated_tokens_total"] + 36
    assert after["tritonformer_iterations_total"] >= before["tritonformer_iterations_total"] + 6
    assert after["tritonformer_iteration_tokens_count"] == after["tritonformer_iterations_total"]
    assert after["tritonformer_iteration_tokens_sum"] >= before["tritonformer_iteration_tokens_sum"] + 36
    assert after["tritonformer_time_to_first_token_seconds_count"] == before["tritonformer_time_to_first_token_seconds_count"] + 6
    assert after["tritonformer_time_to_first_token_seconds_sum"] > before["tritonformer_time_to_first_token_seconds_sum"]
    assert after["tritonformer_time_per_output_token_seconds_count"] == before["tritonformer_time_per_output_token_seconds_count"] + 6

    # Idle: nothing held, the whole pool free, and the pool size the same from scrape to scrape.
    pool_size = after["tritonformer_kv_blocks_used"] + after["tritonformer_kv_blocks_free"]
    assert after["tritonformer_kv_blocks_free"] > 0 and pool_size > 0
    for v in (after, again, third):
        assert v["tritonformer_kv_blocks_used"] + v["tritonformer_kv_blocks_free"] == pool_size, v
        assert v["tritonformer_kv_blocks_used"] == 0 and v["tritonformer_kv_cache_bytes"] == 0, v
        assert v["tritonformer_running_requests"] == 0 and v["tritonformer_waiting_requests"] == 0, v
    assert after["tritonformer_preemptions_total"] >= before["tritonformer_preemptions_total"]
