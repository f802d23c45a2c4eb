"""A fresh generator's first requests against later ones: time to first token, split into its
parts, and the Triton kernels compiled while requests wait (GPU machine).

The engine is the served one (GPT-2 random weights, fp16, the served parameters of
tools/gpu_served_bench.sh) driven in this process by its own thread, as in `model.py`, with
requests submitted at Poisson arrivals (the Orca trace: prompt U[32,512], output U[1,128],
greedy, EOS ignored). Two passes of the same trace follow each other; for each:

- TTFT p50 / p99: arrival to the first response handed to the sink;
- queue p50: arrival to the first iteration that runs the prompt;
- prompt p50: from there to the first token on the host (prefill iterations, the sample);
- compiled: Triton kernel variants compiled during the pass (new specialisations), and the
  kernels they belong to.

Run it in a fresh process with an empty `TRITON_CACHE_DIR` to see a first server start of a
machine; `--warm-up fixed` is the runner's warm-up alone (fixed shapes, decode graphs), `burst`
adds the synthetic traffic of backend/decoder/warm_up.py (what `model.py` runs).

    TRITON_CACHE_DIR=$(mktemp -d) python3 tools/gpu/ttft_cold_start.py --warm-up burst [--rate 128]
"""
from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import threading
import time
from collections import Counter

import numpy as np
import torch


def jit_functions() -> dict:
    """Every Triton JITFunction defined in tritonformer.kernels, by module.name."""
    import tritonformer.kernels as package
    from triton.runtime.jit import JITFunction

    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, obj in vars(module).items():
            fn = obj
            while fn is not None and not isinstance(fn, JITFunction):
                fn = getattr(fn, "fn", None)  # autotuners and heuristics wrap the JITFunction
            if fn is not None:
                found[f"{info.name}.{name}"] = fn
    return found


def compiled_variants(fns: dict) -> Counter:
    return Counter({name: sum(len(cache[0]) for cache in fn.device_caches.values()) for name, fn in fns.items()})


class TimingSink:
    def __init__(self):
        self.first: dict[int, float] = {}
        self.done = threading.Semaphore(0)
        self.errors = []

    def send(self, handle, outputs, error, final):
        self.first.setdefault(handle, time.monotonic())
        if error is not None:
            self.errors.append(error)
        if final:
            self.done.release()

    def is_cancelled(self, handle):
        return False


class _Ids:
    """Random weights have no tokenizer; every id reads as text, so every token is streamed."""

    def decode(self, ids) -> str:
        return " ".join(map(str, ids))


def run_pass(engine, sink, trace, rate: float, seed: int) -> dict:
    from tritonformer.backend.decoder.sampling_params import SamplingParams

    from tritonformer.client.loadgen import poisson_schedule

    seqs, start = [], time.monotonic()
    for i, (request, offset) in enumerate(zip(trace, poisson_schedule(rate, seed=seed, n=len(trace)))):
        due = start + offset
        time.sleep(max(0.0, due - time.monotonic()))
        seq = engine.new_sequence(i, request.prompt_ids, SamplingParams(max_tokens=request.max_new_tokens,
                                                                        ignore_eos=True), stream=True)
        seq.arrival = due  # the scheduled arrival, as the load generator counts it
        seqs.append(seq)
        engine.submit(seq)
    for _ in seqs:
        sink.done.acquire()
    if sink.errors:
        raise RuntimeError(f"{len(sink.errors)} requests failed: {sink.errors[:2]}")
    ttft = np.array([sink.first[i] - s.arrival for i, s in enumerate(seqs)]) * 1e3
    queue = np.array([s.scheduled_at - s.arrival for s in seqs]) * 1e3
    prompt = np.array([s.first_token_at - s.scheduled_at for s in seqs]) * 1e3
    first_second = ttft[[s.arrival - start < 1.0 for s in seqs]]
    sink.first.clear()
    return {"ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "ttft_first_second_p50_ms": float(np.percentile(first_second, 50)) if len(first_second) else None,
            "queue_p50_ms": float(np.percentile(queue, 50)), "queue_p99_ms": float(np.percentile(queue, 99)),
            "prompt_p50_ms": float(np.percentile(prompt, 50)), "prompt_p99_ms": float(np.percentile(prompt, 99)),
            "seconds": time.monotonic() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm-up", choices=("fixed", "burst"), default="burst")
    parser.add_argument("--rate", type=float, default=128.0)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--max-decode-steps", type=int, default=4)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--cpu-smoke", action="store_true", help="a two-layer model on the CPU: checks this tool only")
    args = parser.parse_args()

    from tritonformer.backend.checkpoints.weights import strip_prefixes_of
    from tritonformer.backend.decoder.build import EngineOptions, build_engine
    from tritonformer.backend.decoder.warm_up import warm_up
    from tritonformer.backend.models.decoder import load_decoder
    from tritonformer.client.hf_reference import random_gpt2
    from tritonformer.client.traces import orca_trace

    device, dtype = torch.device("cuda"), torch.float16
    config = None
    if args.cpu_smoke:
        from transformers import GPT2Config

        device, dtype, config = torch.device("cpu"), torch.float32, GPT2Config(n_layer=2, n_embd=64, n_head=2)
    hf = random_gpt2(device, dtype, config)
    model = load_decoder(hf.config.to_dict(), strip_prefixes_of(hf.state_dict()), device, dtype)
    del hf
    sink = TimingSink()
    options = EngineOptions(max_running_sequences=256, max_tokens_per_iteration=4096, kv_cache_memory_fraction=0.4,
                            max_decode_steps=args.max_decode_steps,
                            kv_cache_tokens="auto" if device.type == "cuda" else "200000")  # tools/gpu_served_bench.sh's parameters
    engine = build_engine(model, _Ids(), sink, options)
    fns = jit_functions()
    t0 = time.monotonic()
    if args.warm_up == "burst":
        warm_up(engine)
    else:
        engine.runner.warm_up()
    if device.type == "cuda":
        torch.cuda.synchronize()
    warm_s = time.monotonic() - t0
    before = compiled_variants(fns)
    engine.start()
    trace = orca_trace(args.requests, 0, (32, 512), (1, 128), model.config.vocab_size)
    rows = []
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{gpu}, warm-up {args.warm_up}: {warm_s:.1f} s, {sum(before.values())} kernel "
          f"variants compiled; then {args.passes} passes of {args.requests} requests at {args.rate:g} req/s "
          f"(max_decode_steps {args.max_decode_steps})")
    print("| pass | TTFT p50 / p99 ms | TTFT p50, first second | queue p50 / p99 ms | prompt p50 / p99 ms | "
          "compiled during the pass |")
    print("|---|---|---:|---|---|---|")
    for p in range(args.passes):
        result = run_pass(engine, sink, trace, args.rate, seed=p)
        after = compiled_variants(fns)
        new = after - before
        before = after
        result["compiled"] = dict(new)
        rows.append(result)
        names = ", ".join(f"{k} x{v}" for k, v in new.most_common(6)) or "-"
        first = result["ttft_first_second_p50_ms"]
        print(f"| {p + 1} | {result['ttft_p50_ms']:.1f} / {result['ttft_p99_ms']:.1f} | "
              f"{first if first is None else round(first, 1)} | {result['queue_p50_ms']:.1f} / "
              f"{result['queue_p99_ms']:.1f} | {result['prompt_p50_ms']:.1f} / {result['prompt_p99_ms']:.1f} | "
              f"{sum(new.values())}: {names} |", flush=True)
    engine.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "warm_up": args.warm_up, "warm_up_s": warm_s,
                       "rate": args.rate, "passes": rows}, f, indent=1)


if __name__ == "__main__":
    main()
