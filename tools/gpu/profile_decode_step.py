"""Where one decode step of a published decoder shape spends its GPU time, kernel by kernel.

    python3 tools/gpu/profile_decode_step.py --model gemma-2-9b --batch 1 --context 128

Random weights at the shape (client/model_shapes.py), the step as the engine runs it (decode
graph replay on the GPU), profiled with torch.profiler over several replays: each kernel's total
and per-step time, launches per step, and the step's sum against the weight-read floor.
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-pdl", action="store_true",
                    help="launch without PDL: each kernel's time is then its own, not its wait for the one before")
    args = ap.parse_args()
    if args.no_pdl:
        from tritonformer.kernels import triton_pdl
        triton_pdl.USE_PDL = False

    from tritonformer.backend.decoder.batch import BatchEntry
    from tritonformer.client.gpu_measure import copy_bandwidth, read_bytes_per_step
    from tritonformer.client.model_shapes import random_decoder

    dev, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    model = random_decoder(args.model, dev, dtype, max_model_len=args.context + 64)
    from tritonformer.backend.decoder.runner import DecoderRunner

    blocks_per_seq = -(-(args.context + 1) // 16)
    cache = model.new_kv_cache(args.batch * blocks_per_seq + 1, 16)
    cache.state = model.new_state_cache(max(args.batch, 1))  # (a hybrid model's recurrent state: slot b for row b)
    runner = DecoderRunner(model, cache, max(args.batch, 1))
    runner.warm_up()
    entries = [BatchEntry([1], args.context, list(range(b * blocks_per_seq, (b + 1) * blocks_per_seq)), True,
                          b if cache.state is not None else -1)
               for b in range(args.batch)]
    for _ in range(3):
        runner.run(entries)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        runner.run(entries)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) / args.steps * 1e3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            runner.run(entries)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_time_total > 0:
            rows.append((e.device_time_total / args.steps, e.count / args.steps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    floor = read_bytes_per_step(model) / copy_bandwidth() * 1e3
    print(f"# {args.model}, batch {args.batch}, context {args.context}, {args.dtype}, {torch.cuda.get_device_name()}")
    print(f"step {step_ms:.3f} ms (wall, replays), kernels {total / 1e3:.3f} ms, weight-read floor {floor:.3f} ms")
    print("| us per step | launches per step | kernel |")
    print("|---:|---:|---|")
    for us, count, name in rows[: args.top]:
        print(f"| {us:.1f} | {count:.0f} | {name[:110]} |")


if __name__ == "__main__":
    main()
