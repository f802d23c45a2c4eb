"""A decoder's "residual add + norm, QKV projection, split + rotary + cache write" as separate
kernels vs one fused kernel (GPU).

`kernels.prenorm_qkv_to_cache` fuses the norm into the GEMM's prologue and the rest into its
epilogue up to `triton_small_gemm.PRENORM_ROWS` rows. This times both paths for the models'
QKV layers, inside CUDA graphs (as decode steps replay them), to choose that threshold from data:

    python3 tools/time_prenorm_linear.py [--rows 1,4,16]
"""
from __future__ import annotations

import argparse

import torch

from tritonformer.kernels import triton_small_gemm as tsg
from tritonformer.kernels.reference import PreNorm
from time_small_gemm import graph_us

# (model, layer, N, K, norm, heads, kv_heads, head_dim)
LAYERS = [
    ("gpt2", "ln + qkv + cache", 2304, 768, "layer", 12, 12, 64),
    ("llama-1B", "rms + qkv + rotary + cache", 3072, 2048, "rms", 32, 8, 64),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,4,16")
    args = parser.parse_args()
    dev, dtype = torch.device("cuda"), torch.float16
    print(f"# residual add + norm + QKV + cache write, {torch.cuda.get_device_name()}, fp16, "
          "us per layer inside a CUDA graph")
    print("| model | layer | N x K | rows | separate kernels us | fused us | speed-up |")
    print("|---|---|---|---:|---:|---:|---:|")
    torch.manual_seed(0)
    for model, layer, n, k, norm, heads, kv_heads, d in LAYERS:
        w = torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5
        b = torch.randn(n, device=dev, dtype=dtype) if norm == "layer" else None
        cache = torch.randn(2, 64, 16, kv_heads, d, device=dev, dtype=dtype)
        for m in map(int, args.rows.split(",")):
            x, res = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(m, k, device=dev, dtype=dtype)
            pre = PreNorm(torch.rand(k, device=dev, dtype=dtype) + 0.5,
                          torch.randn(k, device=dev, dtype=dtype) if norm == "layer" else None, 1e-5,
                          b[:k] if norm == "layer" else None, res, torch.empty_like(res))
            table = torch.randn(m, 2, d // 2, device=dev)
            cos, sin = (table[:, 0], table[:, 1]) if norm == "rms" else (None, None)
            slots = torch.arange(m, device=dev) * 3

            def run():
                return tsg.prenorm_qkv_to_cache(x, pre, w, b, heads, kv_heads, d, cos, sin, cache[0], cache[1], slots)

            saved = tsg.PRENORM_ROWS
            try:
                tsg.PRENORM_ROWS = 0
                base = graph_us(run)
                tsg.PRENORM_ROWS = 1 << 30
                ours = graph_us(run)
            finally:
                tsg.PRENORM_ROWS = saved
            print(f"| {model} | {layer} | {n} x {k} | {m} | {base:.2f} | {ours:.2f} | {base / ours:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
