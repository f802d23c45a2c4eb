"""Where one long prompt's prefill spends its GPU time, kernel by kernel, per published shape.

    python3 tools/gpu/profile_prefill.py [--models gemma-2-9b,llama-3.1-8b] [--tokens 2000] [--top 15] [--timeline]

Random weights at each shape (client/model_shapes.py), bf16, the engine as the families benchmark
builds it (`bench serve-decoder --model`): one prompt of `--tokens` tokens on an idle engine, run
once to compile, then under torch.profiler. Prints the wall time (arrival to first token), the
summed kernel time, the matmul FLOP time at the measured bf16 peak, the time by kernel group
(GEMMs, attention, norms, rotary and cache writes, elementwise, sampling) and the top kernels.
It says which part of the time to first token a family loses against another.
"""
from __future__ import annotations

import argparse
import re
from collections import defaultdict

import numpy as np
import torch

GROUPS = (  # first match wins
    ("gemm", re.compile(r"gemm|gemv|nvjet|cutlass|xmma|cublas|splitk|small_linear|many_row", re.I)),
    ("attention", re.compile(r"attention|attn|flash|combine", re.I)),
    ("norm", re.compile(r"norm", re.I)),
    ("rotary / cache", re.compile(r"rotary|rope|cache|qkv_to", re.I)),
    ("sampling / head", re.compile(r"argmax|sample|softcap|topk|softmax|logit", re.I)),
)


def group_of(name: str) -> str:
    return next((g for g, pattern in GROUPS if pattern.search(name)), "other")


def first_token(engine, vocab: int, tokens: int, rng) -> float:
    """ms from admitting one random prompt of `tokens` tokens to its first token, idle engine."""
    from tritonformer.client.bench_serve_decoder import first_token_ms

    return first_token_ms(engine, rng.integers(0, vocab, tokens).tolist())


def timeline(engine, vocab: int, tokens: int, rng, gap_us: float = 20.0) -> None:
    """Where the wall time outside kernels goes: one more first token under torch.profiler with
    the host side too. Prints the time before the first kernel and after the last, the GPU's
    idle gaps of more than `gap_us` between them, and the host calls under those idle times
    (the profiler's own per-call cost inflates the host side a little)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        first_token(engine, vocab, tokens, rng)
    events = prof.events()
    gpu = sorted((e.time_range.start, e.time_range.end) for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    if not gpu or not host:
        print("(timeline: no events)")
        return
    start, end = min(e.time_range.start for e in host), max(max(e.time_range.end for e in host), gpu[-1][1])
    idle, busy_end = [(start, gpu[0][0])], gpu[0][1]
    for a, b in gpu[1:]:
        if a > busy_end + gap_us:
            idle.append((busy_end, a))
        busy_end = max(busy_end, b)
    idle.append((busy_end, end))
    under = defaultdict(float)
    for a, b in idle:
        for e in host:
            overlap = min(b, e.time_range.end) - max(a, e.time_range.start)
            if overlap > 0:
                under[e.name] += overlap
    between = idle[1:-1]
    print(f"\ntimeline, {tokens} tokens: {(end - start) / 1e3:.2f} ms profiled; before the first kernel "
          f"{(idle[0][1] - idle[0][0]) / 1e3:.2f} ms, after the last {(idle[-1][1] - idle[-1][0]) / 1e3:.2f} ms, "
          f"{len(between)} idle gaps > {gap_us:.0f} us between kernels: {sum(b - a for a, b in between) / 1e3:.2f} ms "
          f"(largest {max((b - a for a, b in between), default=0) / 1e3:.2f} ms)")
    print("| host call under the GPU's idle time | ms |")
    print("|---|---:|")
    for name, us in sorted(under.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| {name[:100]} | {us / 1e3:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gemma-2-9b,llama-3.1-8b")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--timeline", action="store_true", help="also the GPU's idle time and the host calls under it")
    args = ap.parse_args()

    from tritonformer.client.bench_serve_decoder import free_gpu_memory, release
    from tritonformer.client.engine_drive import engine_for
    from tritonformer.client.gpu_measure import matmul_peak_tflops, prefill_flops
    from tritonformer.client.model_shapes import random_decoder

    dev, dtype = torch.device("cuda"), torch.bfloat16
    peak = matmul_peak_tflops(dtype)
    print(f"# prefill of {args.tokens} tokens, {torch.cuda.get_device_name()}, bf16, matmul peak {peak:.0f} TFLOP/s")
    rng = np.random.default_rng(3)
    for name in [m for m in args.models.split(",") if m]:
        model = random_decoder(name, dev, dtype, max_model_len=4096)
        torch.cuda.empty_cache()
        engine, sink = engine_for(model, 256, 4096)

        vocab = min(model.vocab_size, 30000)
        first_token(engine, vocab, args.tokens, rng)
        wall = min(first_token(engine, vocab, args.tokens, rng) for _ in range(2))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            first_token(engine, vocab, args.tokens, rng)
        rows = sorted(((e.device_time_total, e.count, e.key) for e in prof.key_averages() if e.device_time_total > 0),
                      reverse=True)
        total = sum(r[0] for r in rows) / 1e3
        groups = defaultdict(float)
        for us, _, key in rows:
            groups[group_of(key)] += us / 1e3
        flop_ms = prefill_flops(model, args.tokens) / (peak * 1e12) * 1e3
        print(f"\n## {name}: {len(model.layers)} layers; first token {wall:.1f} ms (best of 2), kernels {total:.1f} ms, "
              f"matmul FLOP time {flop_ms:.1f} ms")
        print("| group | ms | share of kernels |")
        print("|---|---:|---:|")
        for g, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
            print(f"| {g} | {ms:.2f} | {ms / total:.1%} |")
        print("| us | launches | kernel |")
        print("|---:|---:|---|")
        for us, count, key in rows[: args.top]:
            print(f"| {us:.0f} | {count} | {key[:110]} |", flush=True)
        if args.timeline:
            timeline(engine, vocab, args.tokens, rng)
        release(engine)
        del engine, sink, model
        free_gpu_memory()


if __name__ == "__main__":
    main()
