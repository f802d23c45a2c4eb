"""Where a decode iteration's time goes between the host and the GPU (GPU machine).

The engine launches iteration i + 1 before it waits for iteration i's tokens, so a step should
cost max(forward, host work). When it costs more, either the host work is longer than the
forward, or the host waits on the GPU somewhere it should not (a synchronising copy, an
event). This runs engine steps of GPT-2 (random weights, fp16) at a fixed decoding batch under
torch.profiler with CPU and CUDA activities (--model llama: the Llama-3.2-1B shape) and
prints, per step:

- the wall time of a step, and of the forward's graph replay alone;
- the host time of each engine phase (schedule, inputs + replay launch, sampling, publishing
  the ids, waiting for the previous iteration's ids, bookkeeping), as the engine calls them;
- the CUDA runtime calls the host makes (a long cudaEventSynchronize is the host waiting for
  the GPU; a long cudaMemcpyAsync is a copy that waited for the stream);
- the GPU's busy time (the union of its kernels and copies) and so its idle time per step.

A Chrome trace of the profiled steps goes to --trace (open it in chrome://tracing or Perfetto).

    python3 tools/trace_engine_step.py [--model gpt2] [--batch 64] [--steps 40] [--trace engine_step.json]
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

PHASES = {  # engine phase -> (object attribute path, method)
    "schedule": ("scheduler", "schedule"),
    "inputs + replay launch": ("runner", "run"),
    "sampling": ("sampler", "sample_ids"),
    "publish ids": ("runner", "publish"),
    "scheduler commit": ("scheduler", "commit"),
    "complete previous (wait + bookkeeping)": (None, "_complete"),
    "drop cancelled": (None, "_drop_cancelled"),
}


def _wrap(obj, method: str, label: str) -> None:
    original = getattr(obj, method)

    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(label):
            return original(*args, **kwargs)

    setattr(obj, method, wrapped)


def _busy_us(events) -> float:
    """Union of [start, end) intervals, microseconds."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    busy, cur_start, cur_end = 0.0, None, None
    for s, e in spans:
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                busy += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        busy += cur_end - cur_start
    return busy


def main() -> int:
    from tritonformer.client import bench_decoder_baselines as hf
    from tritonformer.client.bench_serve_decoder import _forward_ms, _submit, _sync, prefill_until_decoding, random_engine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["gpt2", "llama"], default="gpt2", help="llama: the Llama-3.2-1B shape")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40, help="profiled steps (the trace keeps all of them)")
    parser.add_argument("--trace", help="write a Chrome trace of the profiled steps here")
    args = parser.parse_args()

    engine, vocab = random_engine(args.model, torch.device("cuda"))
    # Long enough outputs that every timed and profiled step decodes the whole batch.
    _submit(engine, hf.fixed_trace(128, 3 * args.steps + 200, args.batch, seed=1, vocab_size=vocab))
    prefill_until_decoding(engine)
    for _ in range(10):
        engine.step()
    _sync(engine)

    forward_us = _forward_ms(engine, args.steps) * 1e3
    t0 = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    _sync(engine)
    step_us = (time.perf_counter() - t0) / args.steps * 1e6

    for label, (path, method) in PHASES.items():
        _wrap(engine if path is None else getattr(engine, path), method, label)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            with torch.profiler.record_function("engine.step"):
                engine.step()
        _sync(engine)
        profiled_us = (time.perf_counter() - t0) / args.steps * 1e6
    if args.trace:
        prof.export_chrome_trace(args.trace)

    events = prof.events()
    host = defaultdict(float)
    runtime = defaultdict(lambda: [0.0, 0])
    gpu = []
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            if e.name not in PHASES and e.name != "engine.step":  # (ranges echoed on the GPU timeline)
                gpu.append(e)
        elif e.name in PHASES or e.name == "engine.step":
            host[e.name] += e.cpu_time_total
        elif e.name.startswith("cuda") or e.name.startswith("cu"):
            runtime[e.name][0] += e.cpu_time_total
            runtime[e.name][1] += 1
    busy = _busy_us(gpu) / args.steps
    print(f"# {args.model} decode, batch {args.batch}, {torch.cuda.get_device_name()}: microseconds per step")
    print(f"step (no profiler) {step_us:.1f} | forward replay alone {forward_us:.1f} | "
          f"step under the profiler {profiled_us:.1f} | GPU busy {busy:.1f}, idle {profiled_us - busy:.1f}")
    print("\n| host phase | us per step |\n|---|---:|")
    for name in ["engine.step", *PHASES]:
        print(f"| {name} | {host[name] / args.steps:.1f} |")
    print("\n| CUDA runtime call | us per step | calls per step |\n|---|---:|---:|")
    for name, (us, count) in sorted(runtime.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f"| {name} | {us / args.steps:.1f} | {count / args.steps:.1f} |")
    while engine.has_work():
        engine.step()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
