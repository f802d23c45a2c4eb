"""The FFN up-projection for many rows: cuBLAS + the separate bias + GELU pass vs the fused
Triton GEMM (kernels/triton_gemm.py), over a sweep of its tile configurations (GPU).

For each shape it prints cuBLAS's GEMM alone (the floor the fusion is chasing), cuBLAS + our
bias_gelu kernel (what the encoder runs unfused), cuBLASLt's own bias + GELU epilogue (tanh
GELU only, for reference), and every tile configuration of the fused kernel that compiles,
each checked against an fp32 reference before it is timed. It ends with the fastest
configuration per shape, which is what `GPU_CONFIG` should be:

    python3 tools/gpu/time_ffn_gemm.py [--rows 2048,8192,32768,67331] [--quick]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton.testing

from tritonformer.kernels import triton_elementwise as te
from tritonformer.kernels import triton_gemm as tg


def sweep_configs(quick: bool) -> list[tg.TileConfig]:
    """Hopper tiles: wgmma wants 64 or 128 rows per warpgroup and 64 halves of K per stage;
    shared memory (227 KB a block) bounds stages x tile. --quick keeps the default and a few
    neighbours."""
    if quick:  # the default, and what could overlap its epilogue with the next tile's main loop
        return [tg.GPU_CONFIG, tg.TileConfig(block_n=128, programs_per_sm=2), tg.TileConfig(flatten=True),
                tg.TileConfig(warp_specialize=True), tg.TileConfig(block_n=128, warp_specialize=True)]
    configs = []
    for (bm, bn, warps), stages, split, per_sm, flatten in itertools.product(
        [(128, 256, 8), (128, 128, 4), (128, 128, 8), (64, 256, 4)], [3, 4], [1, 2], [1, 2], [False, True]
    ):
        smem = stages * (bm + bn) * 64 * 2
        if per_sm * smem > 220 * 1024:  # would not fit: the compiler refuses or runs one per SM anyway
            continue
        configs.append(tg.TileConfig(bm, bn, 64, 8, warps, stages, split, per_sm, flatten))
    return configs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="2048,8192,32768,67331",
                        help="token counts (67,331: the 256-request U[5,500] workload in one batch)")
    parser.add_argument("--n", type=int, default=3072)
    parser.add_argument("--k", type=int, default=768)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    dev, dtype, n, k = torch.device("cuda"), torch.float16, args.n, args.k
    print(f"# FFN up-projection + bias + erf GELU, {torch.cuda.get_device_name()}, fp16, N={n} K={k}, median ms")
    gen = torch.Generator(device=dev).manual_seed(0)
    w = (torch.randn(n, k, generator=gen, device=dev) / k ** 0.5).to(dtype)
    b = (torch.randn(n, generator=gen, device=dev) * 0.5).to(dtype)
    configs = sweep_configs(args.quick)
    best: dict[int, tuple[float, str]] = {}
    print("| rows | what | ms | TFLOP/s | vs cuBLAS + bias_gelu |")
    print("|---:|---|---:|---:|---:|")
    for m in map(int, args.rows.split(",")):
        x = torch.randn(m, k, generator=gen, device=dev).to(dtype)
        out = torch.empty(m, n, device=dev, dtype=dtype)
        exact = torch.nn.functional.gelu(x.float() @ w.float().t() + b.float())
        flops = 2.0 * m * n * k

        def row(what, ms, base):
            print(f"| {m} | {what} | {ms:.4f} | {flops / ms / 1e9:.0f} | {base / ms:.2f}x |", flush=True)

        def bench(fn):
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

        gemm = bench(lambda: torch.mm(x, w.t(), out=out))
        separate = bench(lambda: te.bias_gelu(torch.mm(x, w.t(), out=out), b, "none", out=out))
        cublaslt = bench(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True, out=out))
        row("cuBLAS GEMM alone (no bias, no GELU)", gemm, separate)
        # The fused kernel's own main loop: the default tile with no bias and no GELU. What the
        # fused kernel takes beyond this is its epilogue, not overlapped with the main loop.
        row("Triton GEMM alone, default tile (no bias, no GELU)",
            bench(lambda: tg._launch(x, w, None, 0, out, tg.GPU_CONFIG)), separate)
        row("cuBLAS + bias_gelu kernel", separate, separate)
        row("cuBLASLt bias + tanh-GELU epilogue", cublaslt, separate)
        for cfg in configs:
            try:
                got = tg.linear_bias_gelu(x, w, b, out=out, config=cfg)
                rel = ((got.float() - exact).norm() / exact.norm()).item()
                if not rel < 1e-2:
                    print(f"| {m} | fused {cfg.label()} | WRONG: relative error {rel:.2e} | | |", flush=True)
                    continue
                ms = bench(lambda: tg.linear_bias_gelu(x, w, b, out=out, config=cfg))
            except Exception as e:  # a tile that does not compile (shared memory, an unsupported option)
                print(f"| {m} | fused {cfg.label()} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | | |",
                      flush=True)
                continue
            row(f"fused {cfg.label()}", ms, separate)
            if ms < best.get(m, (float("inf"), ""))[0]:
                best[m] = (ms, cfg.label())
    print("\nfastest fused tile per shape:")
    for m, (ms, label) in best.items():
        print(f"  rows {m}: {label}  {ms:.4f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
