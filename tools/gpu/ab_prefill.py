"""Time to first token with some ops' Triton kernels against the same ops on their PyTorch references, one process.

    python3 tools/gpu/ab_prefill.py --models qwen3.5-27b,bamba-9b --tokens 2000 \
        --reference-ops gated_delta_chunk,conv1d_chunk,ssd_chunk

Random weights at each published shape (client/model_shapes.py), bf16, the engine as the families benchmark
builds it; one prompt of `--tokens` tokens on an idle engine, the two variants alternated `--repeats` times
after a warm-up of each (so both see the same compiled kernels and the same GPU state). Prints each variant's
median first-token time, the ratio, and the matmul FLOP time at the measured bf16 peak.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reference-ops", required=True, help="comma-separated op names run on their references in B")
    args = ap.parse_args()

    from tritonformer.client.bench_serve_decoder import first_token_ms, free_gpu_memory, release
    from tritonformer.client.engine_drive import engine_for
    from tritonformer.client.gpu_measure import matmul_peak_tflops, prefill_flops
    from tritonformer.client.model_shapes import random_decoder
    from tritonformer.kernels import dispatch

    dispatch.load_kernels()
    ops = [o for o in args.reference_ops.split(",") if o]
    kernels = {o: dispatch._KERNELS[o] for o in ops}
    dev, dtype = torch.device("cuda"), torch.bfloat16
    peak = matmul_peak_tflops(dtype)
    print(f"# first token of {args.tokens} tokens, {torch.cuda.get_device_name()}, bf16, peak {peak:.0f} TFLOP/s; "
          f"B: {', '.join(ops)} on their references")
    print("| model | layers | A: kernels ms | B: references ms | A / B | FLOP time ms | A / FLOP time |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(3)
    for name in [m for m in args.models.split(",") if m]:
        model = random_decoder(name, dev, dtype, max_model_len=args.tokens + 64)
        torch.cuda.empty_cache()
        engine, sink = engine_for(model, 256, 4096)
        vocab = min(model.vocab_size, 30000)
        times: dict[str, list[float]] = {"A": [], "B": []}
        for i in range(args.repeats + 1):
            for variant in ("A", "B"):
                for o in ops:
                    if variant == "A":
                        dispatch._KERNELS[o] = kernels[o]
                    else:
                        dispatch._KERNELS.pop(o, None)
                ms = first_token_ms(engine, rng.integers(0, vocab, args.tokens).tolist())
                if i:  # the first of each warms up
                    times[variant].append(ms)
        for o in ops:
            dispatch._KERNELS[o] = kernels[o]
        a, b = float(np.median(times["A"])), float(np.median(times["B"]))
        flop_ms = prefill_flops(model, args.tokens) / (peak * 1e12) * 1e3
        print(f"| {name} | {len(model.layers)} | {a:.1f} | {b:.1f} | {a / b:.3f} | {flop_ms:.1f} "
              f"| {a / flop_ms:.2f}x |", flush=True)
        sink.finished = 0
        release(engine)
        del engine, sink, model
        free_gpu_memory()


if __name__ == "__main__":
    main()
