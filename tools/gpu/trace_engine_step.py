"""Where a decode iteration's time goes between the host and the GPU (GPU machine).

The engine launches iteration i + 1 before it waits for iteration i's tokens, so a step should
cost max(forward, host work). When it costs more, either the host work is longer than the
forward, or the host waits on the GPU somewhere it should not (a synchronising copy, an
event). This runs engine steps of GPT-2 (random weights, fp16) at a fixed decoding batch under
torch.profiler with CPU and CUDA activities (--model llama: the Llama-3.2-1B shape) and
prints, per step:

- the wall time of a step, and of the forward's graph replay alone;
- the host time of each engine phase (schedule, inputs + replay launch, sampling, publishing
  the ids, waiting for the previous iteration's ids, bookkeeping), by wall clock without the
  profiler (which slows the host 2-3x), and again under it;
- the host time of one decode-graph launch;
- from CUDA events, without the profiler: the GPU's time per iteration and between two
  (a long gap is the GPU waiting for the host), and the host's time per step;
- the CUDA runtime calls the host makes (a long cudaEventSynchronize is the host waiting for
  the GPU; a long cudaMemcpyAsync is a copy that waited for the stream);
- the GPU's busy time (the union of its kernels and copies) and so its idle time per step.

A Chrome trace of the profiled steps goes to --trace (open it in chrome://tracing or Perfetto).

    python3 tools/gpu/trace_engine_step.py [--model gpt2] [--batch 64] [--steps 40] [--trace engine_step.json]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tools/: engine_phases.py
from engine_phases import PHASES, phase_table, wrap_phases  # noqa: E402


def _profiled(original, label):
    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(label):
            return original(*args, **kwargs)
    return wrapped


def _replay_launch_us(engine, repeats: int = 50) -> float:
    """Host microseconds of one `graph.replay()` for the running batch's bucket (median of
    `repeats` launched back to back: the queue stays short enough that none waits)."""
    from tritonformer.client.engine_drive import sync

    graphs = engine.runner.graphs
    graph = graphs._graphs[graphs.bucket(len(engine.scheduler.running))][0]
    sync(engine)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        graph.replay()
        times.append(time.perf_counter() - t0)
    sync(engine)
    return sorted(times)[repeats // 2] * 1e6


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


def _marked_runs(engine, drive, count: int):
    """Run `drive()` `count` times with CUDA events around every forward launch (input copy +
    replay); the events are timestamped when the GPU reaches them. Returns (GPU microseconds of
    each launch, GPU microseconds between consecutive launches, host microseconds per drive)."""
    import numpy as np

    from tritonformer.client.engine_drive import sync

    runner, marks, host = engine.runner, [], []
    original = runner.run

    def marked(entries):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = original(entries)
        end.record()
        marks.append((start, end))
        return out

    runner.run = marked
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            drive()
            host.append(time.perf_counter() - t0)
        sync(engine)
    finally:
        del runner.run
    span = np.array([s.elapsed_time(e) for s, e in marks]) * 1e3
    gap = np.array([e.elapsed_time(s) for (_, e), (s, _) in zip(marks, marks[1:])]) * 1e3
    return span, gap, np.array(host) * 1e6


def _gpu_timeline(engine, steps: int) -> str:
    """Without the profiler: the GPU's time per engine iteration and between two (the ids' copy
    to the host, then idle until the host launched the next), then the same last iteration
    replayed alone, back to back, for comparison at the same context length."""
    import numpy as np

    from tritonformer.client.engine_drive import decode_entries

    span, gap, host = _marked_runs(engine, engine.step, steps)
    entries = decode_entries(engine)
    alone, alone_gap, _ = _marked_runs(engine, lambda: engine.runner.run(entries), steps)
    return (f"GPU per engine iteration (input copy + replay): median {np.median(span):.1f}, max {span.max():.1f}; "
            f"the last one replayed alone: median {np.median(alone):.1f} (between replays {np.median(alone_gap):.1f})\n"
            f"GPU between engine iterations: mean {gap.mean():.1f}, median {np.median(gap):.1f}, p90 "
            f"{np.percentile(gap, 90):.1f}, max {gap.max():.1f}; {int((gap > 20).sum())} of {gap.size} over 20 us\n"
            f"host per step: median {np.median(host):.1f}, p90 {np.percentile(host, 90):.1f}, max {host.max():.1f}")


def main() -> int:
    from tritonformer.client.engine_drive import forward_ms, prefill_until_decoding, random_engine, submit, sync
    from tritonformer.client.traces import fixed_trace

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["gpt2", "llama"], default="gpt2", help="llama: the Llama-3.2-1B shape")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40, help="profiled steps (the trace keeps all of them)")
    parser.add_argument("--trace", help="write a Chrome trace of the profiled steps here")
    args = parser.parse_args()

    # One iteration per launch: this traces the pipeline of single iterations, host against GPU.
    engine, vocab = random_engine(args.model, torch.device("cuda"), max_decode_steps=1)
    # Long enough outputs that every timed and profiled step decodes the whole batch.
    submit(engine, fixed_trace(128, 4 * args.steps + 200, args.batch, seed=1, vocab_size=vocab))
    prefill_until_decoding(engine)
    for _ in range(10):
        engine.step()
    sync(engine)

    forward_us = forward_ms(engine, args.steps) * 1e3
    t0 = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    sync(engine)
    step_us = (time.perf_counter() - t0) / args.steps * 1e6

    phases = phase_table(engine, args.steps)
    timeline = _gpu_timeline(engine, args.steps)
    wrap_phases(engine, _profiled)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            with torch.profiler.record_function("engine.step"):
                engine.step()
        sync(engine)
        profiled_us = (time.perf_counter() - t0) / args.steps * 1e6
    if args.trace:
        prof.export_chrome_trace(args.trace)
    launch_us = _replay_launch_us(engine)  # last: its replays rewrite the cache with stale inputs

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
    print(f"host time of one decode graph launch (graph.replay, no sync): {launch_us:.1f}")
    print(timeline)
    print()
    print(phases)
    print("\n| host phase, under the profiler | us per step |\n|---|---:|")
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
