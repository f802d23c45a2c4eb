"""The in-process decoder benchmark's "ours" side on a tiny GPT-2, on the CPU: it must run the
real engine to completion and count exactly the useful tokens (the GPU run has no second try)."""
from __future__ import annotations

import torch

from tritonformer.client import bench_decoder_baselines as hf
from tritonformer.client import bench_serve_decoder as bench


def _tiny_gpt2():
    from transformers import GPT2Config

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=256)
    return hf.random_gpt2("cpu", torch.float32, config=cfg)


def test_trace_runs_every_request_to_its_budget():
    model = _tiny_gpt2()
    engine, sink = bench.our_engine(model, torch.device("cpu"), torch.float32, max_running=4, token_budget=64)
    trace = hf.orca_trace(6, seed=3, prompt_range=(5, 40), output_range=(1, 9), vocab_size=1000)
    result = bench.run_ours(engine, sink, trace)
    assert result["useful_tokens"] == sum(r.max_new_tokens for r in trace)
    assert result["tok_per_s"] > 0 and 0 < result["kv_token_utilisation"] <= 1
    assert not engine.has_work() and engine.scheduler.blocks.num_used == 0


def test_step_time_is_measured_on_decoding_sequences():
    model = _tiny_gpt2()
    engine, sink = bench.our_engine(model, torch.device("cpu"), torch.float32, max_running=8, token_budget=256)
    step_ms, forward_ms, each = bench.our_step_ms(engine, sink, batch=3, context=20, steps=8, vocab=1000)
    assert step_ms > 0 and forward_ms > 0 and not engine.has_work()
    # Launches of up to max_decode_steps (4) iterations each; at least 8 iterations in all.
    assert engine.scheduler.max_decode_steps == 4 and 2 <= len(each) <= 8 and min(each) > 0


def test_step_time_with_one_iteration_per_launch():
    model = _tiny_gpt2()
    engine, sink = bench.our_engine(model, torch.device("cpu"), torch.float32, max_running=8, token_budget=256,
                                    max_decode_steps=1)
    step_ms, forward_ms, each = bench.our_step_ms(engine, sink, batch=3, context=20, steps=4, vocab=1000)
    assert step_ms > 0 and forward_ms > 0 and not engine.has_work()
    assert len(each) == 4 and sum(each) <= 4 * step_ms * (1 + 1e-9)  # the last step's GPU wait is in the mean only
