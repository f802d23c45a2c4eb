"""The Orca trace in-process, its time split by launch kind: iterations with prompt chunks
(prefill), single decode iterations, and rounds of several decode iterations.

    python3 tools/gpu/time_trace_phases.py --max-decode-steps 4   # (GPU) two timed passes after a warm one
    python3 tools/gpu/time_trace_phases.py --model llama-3.1-8b     # a published shape, bf16 (model_shapes)

The benchmark (`tritonformer bench serve-decoder --in-process --parts trace`) gives one
tokens-per-second figure; this says which phase a slow pass lost its time in.
"""
from __future__ import annotations

import argparse
import time

import torch

from tritonformer.client.engine_drive import PhaseClock, engine_for, random_engine, run_ours, submit, sync
from tritonformer.client.traces import orca_trace, warm_up_copy


def timed_pass(engine, trace) -> tuple[float, dict]:
    """One pass over `trace`: (seconds, {launch kind: [seconds, launches, iterations]})."""
    engine.scheduler.blocks.evict_idle()  # an earlier pass left the trace's prompts in the prefix cache
    submit(engine, trace)
    sync(engine)
    t0 = time.perf_counter()
    with PhaseClock(engine) as clock:
        while engine.has_work():
            clock.step(engine)
        sync(engine)
    engine.sink.finished = 0
    return time.perf_counter() - t0, {kind: p for kind, p in clock.phases.items() if p[1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-decode-steps", type=int, default=None, help="default: the served default")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--model", default="gpt2",
                        help="gpt2 (124M, fp16) or a published shape of client/model_shapes (random weights, bf16)")
    args = parser.parse_args()
    dev = torch.device("cuda")
    if args.model == "gpt2":
        engine, vocab = random_engine("gpt2", dev, max_running=256, token_budget=4096,
                                      max_decode_steps=args.max_decode_steps)
    else:  # as `bench serve-decoder --model NAME` builds it
        from tritonformer.client.model_shapes import random_decoder

        model = random_decoder(args.model, dev, torch.bfloat16, max_model_len=4096)
        torch.cuda.empty_cache()
        engine, _ = engine_for(model, 256, 4096, max_decode_steps=args.max_decode_steps)
        vocab = min(model.vocab_size, 30000)  # as the families benchmark draws the trace's tokens
    trace = orca_trace(256, 0, vocab_size=vocab)
    run_ours(engine, engine.sink, warm_up_copy(trace))  # a cold Triton cache compiles the prefill shapes here
    useful = sum(r.max_new_tokens for r in trace)
    for i in range(args.passes):
        seconds, phases = timed_pass(engine, trace)
        print(f"max_decode_steps {engine.scheduler.max_decode_steps}, pass {i}: {useful / seconds:,.0f} useful tok/s, "
              f"{seconds * 1e3:.0f} ms; " + "; ".join(f"{kind}: {t * 1e3:.0f} ms in {n} launches / {its} iterations"
                                                      for kind, (t, n, its) in phases.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
