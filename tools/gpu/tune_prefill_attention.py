"""Sweep the packed (prefill) attention's launch configuration on BERT's shapes (GPU).

The kernel profile puts attention at 195 us per layer of bert-base at 64 x 512 tokens (264
TFLOP/s, 14% of the forward) and 4.4 ms of the 256-request workload. This times
`kernels.varlen_attention` as the encoder calls it (q, k, v strided views of one packed QKV
GEMM output, non-causal) under every (BLOCK_M, BLOCK_N, num_warps, num_stages) of a small grid
and prints the current configuration next to the best ones:

    python3 tools/gpu/tune_prefill_attention.py [--workloads 64x512,u5-500,8x128]
"""
from __future__ import annotations

import argparse
import itertools

import numpy as np
import torch
import triton.testing

from tune_decode_attention import ranked_cells, sweep_launch_configs
from tritonformer.kernels import reference
from tritonformer.kernels import triton_attention as ta

HEADS, HEAD_DIM = 12, 64  # bert-base


def lengths_of(workload: str) -> list[int]:
    """"BxL": B sequences of L tokens; "u5-500": the 256-request U[5,500] seed-0 workload."""
    if workload == "u5-500":
        return [int(n) for n in np.random.default_rng(0).integers(5, 501, 256)]
    batch, length = map(int, workload.split("x"))
    return [length] * batch


def packed_qkv(lengths: list[int]):
    """q, k, v as the encoder passes them: strided views of one `[T, 3, H, D]` tensor."""
    dev = torch.device("cuda")
    qkv = torch.randn(sum(lengths), 3, HEADS, HEAD_DIM, device=dev, dtype=torch.float16)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), device=dev, dtype=torch.int32)
    return qkv[:, 0], qkv[:, 1], qkv[:, 2], cu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="64x512,u5-500,8x128")
    args = parser.parse_args()
    current = ta._launch_config
    print(f"# packed attention, bert-base heads, {torch.cuda.get_device_name()}, fp16, non-causal, median ms")
    print("| workload | current (BLOCK_M, BLOCK_N, warps, stages) ms | TFLOP/s | best TFLOP/s | best ms | best | 2nd | 3rd |")
    print("|---|---|---:|---:|---:|---|---|---|")
    for workload in args.workloads.split(","):
        lengths = lengths_of(workload)
        q, k, v, cu = packed_qkv(lengths)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        longest = max(lengths)
        flops = 4.0 * sum(n * n for n in lengths) * HEADS * HEAD_DIM
        expected = reference.varlen_attention(q.float(), k.float(), v.float(), cu, cu, causal=False)

        def run():
            return ta.varlen_attention(q, k, v, cu, cu, causal=False, max_seqlen_q=longest, out=out)

        def timed() -> float:
            err = (run().float() - expected).abs().max().item()
            if not err < 2e-2:
                raise AssertionError(f"max error {err:.2e}")
            return triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")

        base_cfg = current(HEAD_DIM, q.dtype, longest, True)
        base = timed()
        results = sweep_launch_configs(itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)),
                                       lambda c: timed(), lambda c: c)
        best_tflops = f"{flops / results[0][0] / 1e9:.0f}" if results else "-"
        print(f"| {workload} | {base_cfg} {base:.4f} | {flops / base / 1e9:.0f} | {best_tflops} | "
              f"{ranked_cells(results, '.4f')} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
