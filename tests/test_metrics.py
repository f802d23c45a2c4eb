"""Our custom metrics on Triton's metrics port move as traffic flows."""
from __future__ import annotations

import time

import pytest

from helpers import http_post, scrape_metrics, wait_for_metrics

pytestmark = pytest.mark.server


def _scrape(server, model: str = "embedder") -> dict[str, float]:
    return scrape_metrics(server, model)


def _embed(server, texts):
    body = {"inputs": [{"name": "text_input", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    status, answer = http_post(server, "/v2/models/embedder/infer", body)
    assert status == 200, answer


def _wait_for(server, predicate, timeout=10.0, model="embedder"):
    return wait_for_metrics(server, model, predicate, timeout=timeout, interval=0.2)[1]


def test_embedder_metrics_move_with_traffic(triton_server):
    before = _scrape(triton_server)
    for name in ("tritonformer_queue_depth", "tritonformer_batches_total", "tritonformer_batch_tokens_count",
                 "tritonformer_queue_wait_seconds_count", "tritonformer_response_cache_hits_total"):
        assert name in before, f"{name} missing from /metrics"
    texts = [f"metrics test sentence number {i} {time.time()}" for i in range(5)]
    _embed(triton_server, texts)
    after = _wait_for(triton_server, lambda v: v["tritonformer_queue_wait_seconds_count"]
                      >= before["tritonformer_queue_wait_seconds_count"] + 1)
    assert after["tritonformer_batches_total"] > before["tritonformer_batches_total"]
    assert after["tritonformer_queue_wait_seconds_count"] >= before["tritonformer_queue_wait_seconds_count"] + 1
    assert after["tritonformer_batch_tokens_sum"] >= before["tritonformer_batch_tokens_sum"] + 5 * 8
    assert after["tritonformer_queue_depth"] == 0  # all answered

    _embed(triton_server, texts[:2])  # the same texts again: answered from the response cache
    cached = _wait_for(triton_server, lambda v: v["tritonformer_response_cache_hits_total"]
                       >= after["tritonformer_response_cache_hits_total"] + 2)
    assert cached["tritonformer_response_cache_hits_total"] >= after["tritonformer_response_cache_hits_total"] + 2


def test_generator_metrics_move_with_traffic(triton_server):
    before = _scrape(triton_server, "generator")
    assert "tritonformer_iterations_total" in before and "tritonformer_time_to_first_token_seconds_count" in before
    status, answer = http_post(triton_server, "/v2/models/generator/generate",
                               {"text_input": "Metrics, please:", "stream": False, "max_tokens": 5, "ignore_eos": True})
    assert status == 200, answer
    after = _wait_for(triton_server, lambda v: v["tritonformer_generated_tokens_total"]
                      >= before["tritonformer_generated_tokens_total"] + 5, model="generator")
    assert after["tritonformer_generated_tokens_total"] == before["tritonformer_generated_tokens_total"] + 5
    assert after["tritonformer_iterations_total"] >= before["tritonformer_iterations_total"] + 5
    assert after["tritonformer_time_to_first_token_seconds_count"] == before["tritonformer_time_to_first_token_seconds_count"] + 1
    assert after["tritonformer_time_per_output_token_seconds_count"] == before["tritonformer_time_per_output_token_seconds_count"] + 1
    # The queue's part of the time to first token, counted once per request and never more than it.
    assert after["tritonformer_prompt_queue_seconds_count"] == before["tritonformer_prompt_queue_seconds_count"] + 1
    queued = after["tritonformer_prompt_queue_seconds_sum"] - before["tritonformer_prompt_queue_seconds_sum"]
    ttft = after["tritonformer_time_to_first_token_seconds_sum"] - before["tritonformer_time_to_first_token_seconds_sum"]
    assert 0 <= queued <= ttft
    assert after["tritonformer_running_requests"] == 0 and after["tritonformer_kv_cache_bytes"] == 0


def test_generator_prefix_cache_metrics_count_a_repeated_prompt(triton_server):
    """The same long prompt twice: the second request finds the first's full KV blocks (16
    tokens each) in the prefix cache, and the counters say so."""
    prompt = "Prefix caching, metrics: " + "a sentence that repeats, word for word, " * 6
    names = [f"tritonformer_prefix_cache_{n}_total" for n in ("queries", "hits", "hit_tokens")]
    before = _scrape(triton_server, "generator")
    for _ in range(2):
        status, answer = http_post(triton_server, "/v2/models/generator/generate",
                                   {"text_input": prompt, "stream": False, "max_tokens": 2, "ignore_eos": True})
        assert status == 200, answer
    after = _wait_for(triton_server, lambda v: v[names[0]] >= before[names[0]] + 2, model="generator")
    queries, hits, hit_tokens = (after[n] - before[n] for n in names)
    assert (queries, hits) == (2, 1)
    assert hit_tokens >= 32 and hit_tokens % 16 == 0  # whole blocks of a prompt of over 40 tokens
