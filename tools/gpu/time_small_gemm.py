"""Few-row linear layers: the fused Triton kernel vs cuBLAS + the separate epilogue (GPU).

`kernels.linear_act` runs its own kernel up to `triton_small_gemm.MAX_ROWS` rows and cuBLAS
above; this prints both for the layer shapes the models run, inside CUDA graphs (as decode
steps and small encoder batches replay them, so launch gaps are what the served path pays),
to choose that threshold from data (at one or two rows the fused column is the prefetching GEMV
of triton_gemv.py, which runs those rows of every linear):

    python3 tools/gpu/time_small_gemm.py [--rows 1,4,16,32,64]
"""
from __future__ import annotations

import argparse

import torch

from tritonformer.backend.cuda_graphs import capture_graph
from tritonformer.kernels import triton_gemv
from tritonformer.kernels import triton_small_gemm as tsg

# (model, layer, N, K, activation)
LAYERS = [
    ("gpt2", "qkv", 2304, 768, "none"), ("gpt2", "out", 768, 768, "none"),
    ("gpt2", "fc+gelu", 3072, 768, "gelu_tanh"), ("gpt2", "proj", 768, 3072, "none"),
    ("bert", "ffn_in+gelu", 3072, 768, "gelu"),
    ("llama-1B", "qkv", 3072, 2048, "none"), ("llama-1B", "o", 2048, 2048, "none"),
    ("llama-1B", "gate_up+silu", 8192, 2048, "silu_mul"), ("llama-1B", "down", 2048, 8192, "none"),
    # the output heads (vocabularies padded to a multiple of 64, as the decoders pad them)
    ("gpt2", "lm head", 50304, 768, "none"), ("llama-1B", "lm head", 128256, 2048, "none"),
]


def graph_us(fn, calls: int = 20, reps: int = 20) -> float:
    """Microseconds per call of fn, replayed `calls` times in one CUDA graph (best of reps)."""
    graph, _ = capture_graph(lambda: [fn() for _ in range(calls)])  # compiles / autotunes first, uncaptured
    best = float("inf")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,4,16,32,64")
    parser.add_argument("--layers", default="", help="only these layer names, comma-separated (default: all)")
    args = parser.parse_args()
    chosen = set(args.layers.split(",")) if args.layers else None
    dev, dtype = torch.device("cuda"), torch.float16
    print(f"# linear + epilogue, {torch.cuda.get_device_name()}, fp16, us per call inside a CUDA graph")
    print("| model | layer | N x K | rows | cuBLAS + epilogue us | fused Triton us | speed-up | Triton GB/s |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    torch.manual_seed(0)
    for model, layer, n, k, act in LAYERS:
        if chosen is not None and layer not in chosen:
            continue
        rows_w = 2 * n if act == "silu_mul" else n
        w = torch.randn(rows_w, k, device=dev, dtype=dtype) / k ** 0.5
        b = torch.randn(rows_w, device=dev, dtype=dtype) if act.startswith("gelu") else None
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k, device=dev, dtype=dtype)
            out = torch.empty(m, n, device=dev, dtype=dtype)
            saved = tsg.MAX_ROWS, tsg.FUSE_PLAIN, triton_gemv.MAX_ROWS
            try:
                tsg.MAX_ROWS = triton_gemv.MAX_ROWS = 0
                base = graph_us(lambda: tsg.linear_act(x, w, b, act, out=out))
                tsg.MAX_ROWS, tsg.FUSE_PLAIN, triton_gemv.MAX_ROWS = 1 << 30, True, saved[2]
                ours = graph_us(lambda: tsg.linear_act(x, w, b, act, out=out))
            finally:
                tsg.MAX_ROWS, tsg.FUSE_PLAIN, triton_gemv.MAX_ROWS = saved
            gbps = w.numel() * w.element_size() / (ours * 1e-6) / 1e9
            print(f"| {model} | {layer} | {n} x {k} | {m} | {base:.2f} | {ours:.2f} | {base / ours:.2f}x | {gbps:.0f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
