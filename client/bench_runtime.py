"""`tritonformer bench runtime`: our encoder runtime vs Hugging Face BertModel on one GPU.

One run, same random bert-base weights, fp16: HF eager, HF SDPA and ours (packed, Triton
kernels) on a fixed grid of (batch, sequence length) and on a variable-length workload of 256
requests (lengths uniform in [5, 500], numpy seed 0). Prints milliseconds, ratios and the share
of the bf16 matmul peak measured in the same run, with the GPU's name.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

GRID = [(1, 32), (1, 128), (1, 512), (8, 128), (32, 128), (64, 128), (64, 512)]
# Where the FFN's bias + GELU runs, timed eagerly next to the default ("auto"); see BertEncoder.
ABLATIONS = ("separate", "triton", "cublaslt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iters", type=int, default=30, help="timed repetitions per point (median reported)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--layers", type=int, default=12, help="encoder layers (bert-base: 12)")


def _time_ms(fn, iters: int, warmup: int = 5) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_bf16_peak_tflops(n: int = 8192) -> float:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = _time_ms(lambda: a @ b, iters=20)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def bert_flops(lengths: list[int], hidden: int, layers: int, intermediate: int) -> float:
    """Matmul FLOPs of an encoder forward: QKV, output, FFN GEMMs, plus QK^T and PV."""
    tokens = sum(lengths)
    gemm = 2 * tokens * (4 * hidden * hidden + 2 * hidden * intermediate)
    attention = sum(2 * 2 * n * n * hidden for n in lengths)
    return layers * (gemm + attention)


def packed_batch(lengths: list[int], device):
    """Random token ids for sequences of these lengths, packed: (ids, cu_seqlens, max length),
    the encoder's forward arguments."""
    import numpy as np
    import torch

    ids = torch.randint(1000, 20000, (sum(lengths),), device=device)
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32, device=device)
    return ids, cu, max(lengths)


def run(args) -> int:
    import numpy as np
    import torch
    import transformers

    from tritonformer.backend.encoder.activation_arena import ActivationArena
    from tritonformer.backend.cuda_graphs import EncoderGraphs
    from tritonformer.backend.models.bert import BertConfig, BertEncoder

    if not torch.cuda.is_available():
        print("bench runtime needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name()
    peak = measure_bf16_peak_tflops()

    cfg = transformers.BertConfig(num_hidden_layers=args.layers)
    torch.manual_seed(0)
    hf_sdpa = transformers.BertModel._from_config(cfg, attn_implementation="sdpa", add_pooling_layer=False)
    hf_sdpa = hf_sdpa.eval().to(dev, torch.float16)
    hf_eager = transformers.BertModel._from_config(cfg, attn_implementation="eager", add_pooling_layer=False)
    hf_eager.load_state_dict(hf_sdpa.state_dict())
    hf_eager = hf_eager.eval().to(dev, torch.float16)
    ours = BertEncoder(BertConfig.from_hf(cfg.to_dict()), hf_sdpa.state_dict(), dev, torch.float16)
    graphs = EncoderGraphs(ours)
    arena = ActivationArena(dev)  # the served configuration: eager batches run in the arena
    h, L, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size

    def packed(lengths):
        return packed_batch(lengths, dev)

    rows = []
    with torch.inference_mode():
        # Correctness first: ours vs HF SDPA on one grid point.
        ids = torch.randint(1000, 20000, (8, 128), device=dev)
        ref = hf_sdpa(input_ids=ids).last_hidden_state.reshape(-1, h).float()
        cu8 = torch.arange(0, 8 * 128 + 1, 128, device=dev, dtype=torch.int32)
        got = ours.forward(ids.reshape(-1), cu8, 128).float()
        cosine = torch.nn.functional.cosine_similarity(got, ref, dim=-1).min().item()
        ablation_cosine = {}  # the FFN epilogue ablations must stay as close to HF
        for epilogue in ABLATIONS:
            ours.ffn_epilogue = epilogue
            got = ours.forward(ids.reshape(-1), cu8, 128).float()
            ablation_cosine[epilogue] = torch.nn.functional.cosine_similarity(got, ref, dim=-1).min().item()
        ours.ffn_epilogue = "auto"
        print(f"min cosine vs HF at (8,128) with the FFN epilogue ablations: {ablation_cosine}", file=sys.stderr)

        for b, s in GRID:
            ids = torch.randint(1000, 20000, (b, s), device=dev)
            flat, cu, mx = ids.reshape(-1), torch.arange(0, b * s + 1, s, device=dev, dtype=torch.int32), s
            t_eager = _time_ms(lambda: hf_eager(input_ids=ids), args.iters)
            t_sdpa = _time_ms(lambda: hf_sdpa(input_ids=ids), args.iters)
            t_ours = t_ours_eager = _time_ms(lambda: ours.forward(flat, cu, mx, arena=arena), args.iters)
            if graphs.bucket(b * s, b) is not None:  # small shapes: replay a captured CUDA graph
                t_ours = min(t_ours, _time_ms(lambda: graphs.forward(flat, [s] * b), args.iters))
            # Ablations, eager: the FFN's bias + GELU as a separate pass after cuBLAS / in a
            # Triton GEMM's epilogue whatever the rows / in cuBLASLt's (tanh) epilogue.
            t_fused = {}
            for epilogue in ABLATIONS:
                ours.ffn_epilogue = epilogue
                t_fused[epilogue] = _time_ms(lambda: ours.forward(flat, cu, mx, arena=arena), args.iters)
            ours.ffn_epilogue = "auto"
            flops = bert_flops([s] * b, h, L, inter)
            rows.append(
                {"shape": f"({b},{s})", "hf_eager_ms": t_eager, "hf_sdpa_ms": t_sdpa, "ours_ms": t_ours,
                 "ours_eager_ms": t_ours_eager, "ours_eager_separate_ffn_ms": t_fused["separate"],
                 "ours_eager_triton_ffn_ms": t_fused["triton"],
                 "ours_eager_cublaslt_ffn_ms": t_fused["cublaslt"],
                 "vs_sdpa": t_sdpa / t_ours, "vs_eager": t_eager / t_ours,
                 "ours_pct_peak": 100 * flops / (t_ours * 1e-3) / (peak * 1e12)}
            )

        # Variable-length workload: 256 requests, lengths U[5, 500], seed 0.
        lengths = np.random.default_rng(0).integers(5, 501, 256).tolist()
        order = sorted(range(256), key=lambda i: lengths[i])
        batches = [order[i : i + 32] for i in range(0, 256, 32)]
        hf_inputs = []
        for batch in batches:
            mx = max(lengths[i] for i in batch)
            ids = torch.randint(1000, 20000, (len(batch), mx), device=dev)
            mask = torch.zeros(len(batch), mx, dtype=torch.long, device=dev)
            for row, i in enumerate(batch):
                mask[row, : lengths[i]] = 1
            hf_inputs.append((ids, mask))
        ours_sorted = [packed([lengths[i] for i in batch]) for batch in batches]
        ours_all = packed(lengths)

        def run_hf():
            for ids, mask in hf_inputs:
                hf_sdpa(input_ids=ids, attention_mask=mask)

        def run_ours_sorted(arena=None):
            for ids, cu, mx in ours_sorted:
                ours.forward(ids, cu, mx, arena=arena)

        arena = ActivationArena(dev)
        mem = {}
        for name, fn in (("hf_sdpa_sorted32", run_hf), ("ours_sorted32", run_ours_sorted),
                         ("ours_sorted32_arena", lambda: run_ours_sorted(arena)),
                         ("ours_one_batch", lambda: ours.forward(*ours_all)),
                         ("ours_one_batch_arena", lambda: ours.forward(*ours_all, arena=arena))):
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            ms = _time_ms(fn, max(3, args.iters // 5), warmup=2)
            mem[name] = torch.cuda.max_memory_allocated() - base
            rows.append({"shape": f"256 req U[5,500] {name}", "ms": ms, "req_per_s": 256 / (ms * 1e-3),
                         "peak_activation_MiB": mem[name] / 2**20})

        # One 8192-token request (16 texts of 512: BERT's longest), then short ones: the arena
        # must shrink back.
        arena = ActivationArena(dev)
        ours.forward(*packed([512] * 16), arena=arena)
        after_long = arena.stats.reserved_bytes
        for _ in range(3):
            ours.forward(*packed([32, 17]), arena=arena)
        rows.append({"arena_after_8192_MiB": after_long / 2**20, "arena_after_short_MiB": arena.stats.reserved_bytes / 2**20,
                     "arena_planning_ms": 1e3 * arena.stats.planning_seconds, "arena_plan_hits": arena.stats.plan_cache_hits})

    _print_table(gpu, peak, cosine, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "bf16_peak_tflops": peak, "min_cosine_vs_hf": cosine,
                       "min_cosine_ffn_epilogue_ablations": ablation_cosine, "rows": rows}, f, indent=2)
    return 0


def _print_table(gpu: str, peak: float, cosine: float, rows: list[dict]) -> None:
    print(f"\nGPU: {gpu}   measured bf16 matmul peak: {peak:.0f} TFLOP/s   min cosine ours vs HF (8,128): {cosine:.5f}")
    print("(ours: packed, Triton kernels; a CUDA-graph replay where a small-shape bucket fits)")
    print(f"{'shape':>10} {'HF eager ms':>12} {'HF SDPA ms':>11} {'ours ms':>9} {'vs SDPA':>8} {'vs eager':>9} {'% peak':>7}"
          f" | eager + arena, FFN bias+GELU: {'auto':>9} {'separate':>9} {'Triton GEMM':>12} {'cuBLASLt':>9}")
    for r in rows:
        if "ours_ms" in r:
            print(f"{r['shape']:>10} {r['hf_eager_ms']:12.3f} {r['hf_sdpa_ms']:11.3f} {r['ours_ms']:9.3f} "
                  f"{r['vs_sdpa']:7.2f}x {r['vs_eager']:8.2f}x {r['ours_pct_peak']:6.1f}% |"
                  f" {'':29} {r['ours_eager_ms']:9.3f} {r['ours_eager_separate_ffn_ms']:9.3f}"
                  f" {r['ours_eager_triton_ffn_ms']:12.3f} {r['ours_eager_cublaslt_ffn_ms']:9.3f}")
    print(f"\n{'variable-length workload':<40} {'ms':>9} {'req/s':>9} {'peak act. MiB':>14}")
    for r in rows:
        if "req_per_s" in r:
            print(f"{r['shape']:<40} {r['ms']:9.2f} {r['req_per_s']:9.0f} {r['peak_activation_MiB']:14.1f}")
    hf = next(r for r in rows if r.get("shape", "").endswith("hf_sdpa_sorted32"))
    for r in rows:
        if "req_per_s" in r and r is not hf:
            print(f"  {r['shape'].split()[-1]} vs HF SDPA sorted batches of 32: {r['req_per_s'] / hf['req_per_s']:.2f}x")
    for r in rows:
        if "arena_after_8192_MiB" in r:
            print(f"\narena: {r['arena_after_8192_MiB']:.1f} MiB after one 8192-token request, "
                  f"{r['arena_after_short_MiB']:.1f} MiB after 3 short ones "
                  f"(planning {r['arena_planning_ms']:.2f} ms in all, {r['arena_plan_hits']} plan-cache hits)")
