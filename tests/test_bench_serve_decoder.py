"""The in-process decoder benchmark's "ours" side on a tiny GPT-2, on the CPU: it must run the
real engine to completion and count exactly the useful tokens (the GPU run has no second try);
and its prefix-caching part on a tiny Llama."""
from __future__ import annotations

import torch

from tritonformer.client import bench_serve_decoder as bench
from tritonformer.client.engine_drive import our_engine, run_ours, run_timed
from tritonformer.client.hf_reference import random_gpt2, tiny_hf
from tritonformer.client.traces import orca_trace, shared_prefix_trace


def _tiny_gpt2():
    from transformers import GPT2Config

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=256)
    return random_gpt2("cpu", torch.float32, config=cfg)


def test_trace_runs_every_request_to_its_budget():
    model = _tiny_gpt2()
    engine, sink = our_engine(model, torch.device("cpu"), torch.float32, max_running=4, token_budget=64)
    trace = orca_trace(6, seed=3, prompt_range=(5, 40), output_range=(1, 9), vocab_size=1000)
    result = run_ours(engine, sink, trace)
    assert result["useful_tokens"] == sum(r.max_new_tokens for r in trace)
    assert result["tok_per_s"] > 0 and 0 < result["kv_token_utilisation"] <= 1
    assert not engine.has_work() and engine.scheduler.blocks.num_used == 0


def test_trace_arriving_at_a_rate_spans_its_arrivals():
    """`--trace-rate`: the same trace, one request every 1/rate s (the in-process side of a served
    run at that offered rate): every token counted, and the run lasts at least the arrivals."""
    model = _tiny_gpt2()
    engine, sink = our_engine(model, torch.device("cpu"), torch.float32, max_running=4, token_budget=64)
    trace = orca_trace(6, seed=3, prompt_range=(5, 40), output_range=(1, 9), vocab_size=1000)
    result = run_timed(engine, sink, trace, rate=100.0)
    assert result["useful_tokens"] == sum(r.max_new_tokens for r in trace)
    assert result["seconds"] >= 5 / 100.0 and result["tok_per_s"] == result["useful_tokens"] / result["seconds"]
    assert 0 < result["ttft_p50_ms"] <= result["ttft_p99_ms"] and not engine.has_work()
    # The steps' time by phase: every prompt went through prefill launches, and the phases' time
    # is the stepping's, within the pass (the waits for arrivals are in none of them).
    phases = result["phases"]
    assert phases["prefill"]["launches"] >= 1 and phases["prefill"]["iterations"] == phases["prefill"]["launches"]
    decoded = sum(phases[k]["iterations"] for k in ("prefill", "round", "single decode"))
    assert decoded >= max(r.max_new_tokens for r in trace)
    assert 0 < sum(p["seconds"] for p in phases.values()) <= result["seconds"]


def test_step_time_is_measured_on_decoding_sequences():
    model = _tiny_gpt2()
    engine, sink = our_engine(model, torch.device("cpu"), torch.float32, max_running=8, token_budget=256)
    step_ms, forward_ms, each = bench.our_step_ms(engine, sink, batch=3, context=20, steps=8, vocab=1000)
    assert step_ms > 0 and forward_ms > 0 and not engine.has_work()
    # Launches of up to max_decode_steps (4) iterations each; at least 8 iterations in all.
    assert engine.scheduler.max_decode_steps == 4 and 2 <= len(each) <= 8 and min(each) > 0


def test_step_time_with_one_iteration_per_launch():
    model = _tiny_gpt2()
    engine, sink = our_engine(model, torch.device("cpu"), torch.float32, max_running=8, token_budget=256,
                              max_decode_steps=1)
    step_ms, forward_ms, each = bench.our_step_ms(engine, sink, batch=3, context=20, steps=4, vocab=1000)
    assert step_ms > 0 and forward_ms > 0 and not engine.has_work()
    assert len(each) == 4 and sum(each) <= 4 * step_ms * (1 + 1e-9)  # the last step's GPU wait is in the mean only


def test_the_shared_prefix_benchmark_runs_both_sides_and_counts_the_hits():
    """`bench serve-decoder --parts prefix` on a tiny model on the CPU (the GPU run has no second
    try): both sides finish every request, only the cached side hits, outputs are identical."""
    from types import SimpleNamespace

    from tritonformer.backend.checkpoints.weights import strip_prefixes_of
    from tritonformer.backend.models.decoder import load_decoder

    hf = tiny_hf()
    model = load_decoder(hf.config.to_dict(), strip_prefixes_of(hf.state_dict()), torch.device("cpu"), torch.float32)
    args = SimpleNamespace(max_running=8, max_tokens_per_iteration=64, max_decode_steps=None, prefix_rate=0.0)
    shared = shared_prefix_trace(6, prefix_tokens=32, distinct_tokens=4, new_tokens=4, vocab_size=320)
    assert all(r.prompt_ids[:32] == shared[0].prompt_ids[:32] and len(r.prompt_ids) == 36 for r in shared)
    warm = shared_prefix_trace(2, prefix_tokens=32, distinct_tokens=4, new_tokens=4, seed=1, vocab_size=320)
    orca = orca_trace(4, 0, prompt_range=(5, 20), output_range=(1, 4), vocab_size=320)
    results: dict = {}
    r = bench.compare_prefix_caching(model, args, shared, warm, orca, results)
    off, on = r["off"]["shared"], r["on"]["shared"]
    assert off["cache_queries"] == 0 and on["cache_queries"] == 6
    # A budget of 64 tokens: the first prompt (36) and a chunk of the second (28) run before any
    # block is committed; the other four find the first's 32 prefix tokens.
    assert on["cache_hits"] == 4 and on["cache_hit_tokens"] == 4 * 32
    assert r["identical_outputs"] == 6 and all(len(o) == 4 for o in on["outputs"])
    assert 0 < on["ttft_p50_ms"] <= on["ttft_p99_ms"] and on["tok_per_s"] > 0 and r["orca_tok_per_s_ratio"] > 0
    assert "outputs" not in results["prefix_caching"]["on"]["shared"]
    assert r["on"]["orca"]["cache_hits"] == 0  # its warm-up pass left nothing the timed pass could reuse
