"""Where the GPU time of the benchmarked shapes goes, kernel by kernel (GPU machine).

The closing notes must explain missed targets with profile numbers. This runs each case a few
times under torch.profiler (CUPTI sees the kernels inside CUDA-graph replays too) and prints,
per iteration: wall time, summed kernel time, the kernel count, the share of GEMMs (cuBLAS,
cuBLASLt, nvjet), and the kernels that take the most time.

Cases: the encoder (random bert-base, fp16) at (1,32) as its CUDA-graph replay, at (64,512)
eager and on the 256-request U[5,500] workload as one packed batch; the decoder's forward
(graph replay) for GPT-2 at batch 1 and 64 and the Llama-3.2-1B shape at batch 1, and one
whole GPT-2 engine iteration at batch 64 (host work included: gaps show up as wall time
above kernel time).

    python3 tools/gpu/profile_gpu_kernels.py [--cases bert,gpt2,llama] [--top 8] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict

import numpy as np
import torch

_GEMM = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|cublas|splitk|small_linear", re.IGNORECASE)


def _kernel_rows(prof, iters: int) -> list[dict]:
    """Per kernel name: microseconds and launches per iteration, from the profiler's events."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name
        if name.startswith(("Memcpy", "Memset")) or "memcpy" in name.lower():
            name = "[copy] " + name
        totals[name][0] += ev.device_time
        totals[name][1] += 1
    return sorted(({"kernel": k, "us": v[0] / iters, "count": v[1] / iters} for k, v in totals.items()),
                  key=lambda r: -r["us"])


def profile_case(label: str, fn, iters: int = 20, top: int = 8) -> dict:
    """Wall and kernel time of fn() per call, with its heaviest kernels."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    wall_us = (time.perf_counter() - t0) / iters * 1e6
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = _kernel_rows(prof, iters)
    kernel_us = sum(r["us"] for r in rows)
    gemm = [r for r in rows if _GEMM.search(r["kernel"])]
    gemm_us = sum(r["us"] for r in gemm)
    count = sum(r["count"] for r in rows)
    gemm_count = sum(r["count"] for r in gemm)
    print(f"\n## {label}: wall {wall_us:.1f} us/iter, kernels {kernel_us:.1f} us in {count:.0f} launches "
          f"(GEMMs {gemm_us:.1f} us in {gemm_count:.0f}; the rest {kernel_us - gemm_us:.1f} us in {count - gemm_count:.0f})")
    print("| kernel | us/iter | launches/iter | us each |")
    print("|---|---:|---:|---:|")
    for r in rows[:top]:
        print(f"| {r['kernel'][:90]} | {r['us']:.1f} | {r['count']:.0f} | {r['us'] / max(r['count'], 1e-9):.2f} |")
    return {"label": label, "wall_us": wall_us, "kernel_us": kernel_us, "launches": count, "gemm_us": gemm_us,
            "gemm_launches": gemm_count, "kernels": rows[:40]}


def bert_cases(top: int) -> list[dict]:
    import transformers

    from tritonformer.backend.encoder.activation_arena import ActivationArena
    from tritonformer.backend.cuda_graphs import EncoderGraphs
    from tritonformer.backend.models.bert import BertConfig, BertEncoder
    from tritonformer.client.encoder_inputs import packed_batch

    dev = torch.device("cuda")
    cfg = transformers.BertConfig()
    torch.manual_seed(0)
    hf = transformers.BertModel._from_config(cfg, add_pooling_layer=False)
    model = BertEncoder(BertConfig.from_hf(cfg.to_dict()), hf.state_dict(), dev, torch.float16)
    del hf
    graphs = EncoderGraphs(model)
    arena = ActivationArena(dev)

    def packed(lengths):
        return packed_batch(lengths, dev)

    out = []
    with torch.inference_mode():
        ids, _, _ = packed([32])
        out.append(profile_case("bert-base (1,32), CUDA-graph replay", lambda: graphs.forward(ids, [32]), 50, top))
        big = packed([512] * 64)
        out.append(profile_case("bert-base (64,512), eager, arena", lambda: model.forward(*big, arena=arena), 10, top))
        lengths = np.random.default_rng(0).integers(5, 501, 256).tolist()
        work = packed(lengths)
        out.append(profile_case("bert-base 256 req U[5,500], one packed batch", lambda: model.forward(*work), 10, top))
    return out


def decoder_cases(name: str, top: int) -> list[dict]:
    from tritonformer.client.engine_drive import decode_entries, prefill_until_decoding, random_engine, submit, sync
    from tritonformer.client.traces import fixed_trace

    batches = {"gpt2": (1, 64), "llama": (1,)}[name]
    engine, vocab = random_engine(name, torch.device("cuda"))
    out = []
    for b in batches:
        submit(engine, fixed_trace(128, 160, b, seed=1, vocab_size=vocab))  # outlives the profiled steps
        prefill_until_decoding(engine)
        sync(engine)
        entries = decode_entries(engine)
        out.append(profile_case(f"{name} decode forward, batch {b} (graph replay)",
                                lambda: engine.runner.run(entries), 50, top))
        if b > 1:
            out.append(profile_case(f"{name} whole engine iteration, batch {b}", engine.step, 50, top))
        while engine.has_work():  # run the batch out before the next one
            engine.step()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="bert,gpt2,llama")
    parser.add_argument("--top", type=int, default=8, help="kernels listed per case")
    parser.add_argument("--json", help="write every case's numbers here")
    args = parser.parse_args()
    print(f"# kernel profile on {torch.cuda.get_device_name()}, fp16")
    results = []
    for case in args.cases.split(","):
        results += bert_cases(args.top) if case == "bert" else decoder_cases(case, args.top)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
