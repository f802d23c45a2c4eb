"""Sweep the relative-bias attention's launch configuration (MPNet's kernel) on the GPU, beside BERT's.

MPNet-base at (64,512) took 22.0 ms for 12 layers where DistilBERT's 6 BERT layers took 7.6 (H200,
docs/benchmarks/encoders.md): its attention, `kernels.relative_bias_attention`, was the difference. This
times it as MPNet calls it (q, k, v strided views of one packed QKV, 12 heads of 64, fp16) under each
(BLOCK, num_warps, num_stages) of a small grid (square tiles: the bias tiles need them), with
`kernels.varlen_attention` (BERT's, no bias) at the same shape and the current configuration for
reference:

    python3 tools/gpu/tune_relative_attention.py [--workloads 64x512,8x128]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton.testing

from tritonformer.kernels import triton_attention as ta
from tritonformer.kernels import triton_relative_attention as tr

HEADS, HEAD_DIM, REACH = 12, 64, 128  # all-mpnet-base-v2: 12 heads of 64, distances clamped at 128
CANDIDATES = list(itertools.product((32, 64, 128), (4, 8), (2, 3)))  # BLOCK (square tiles), warps, stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="64x512")
    args = parser.parse_args()
    dev = torch.device("cuda")
    print(f"# relative-bias attention, {torch.cuda.get_device_name()}, fp16, {HEADS} heads of {HEAD_DIM}, median ms")
    for workload in args.workloads.split(","):
        batch, length = map(int, workload.split("x"))
        qkv = torch.randn(batch * length, 3, HEADS, HEAD_DIM, device=dev, dtype=torch.float16)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        cu = torch.arange(0, batch * length + 1, length, device=dev, dtype=torch.int32)
        bias = torch.randn(HEADS, 2 * REACH + 1, device=dev)
        out = torch.empty_like(q)

        def relative():
            return tr.relative_bias_attention(q, k, v, cu, bias, length, out=out)

        bert = triton.testing.do_bench(lambda: ta.varlen_attention(q, k, v, cu, cu, False, max_seqlen_q=length,
                                                                   out=out), return_mode="median")
        now = triton.testing.do_bench(relative, return_mode="median")
        current, results = tr._launch_config, []
        for cand in CANDIDATES:
            tr._launch_config = lambda *a, c=cand: c
            try:
                results.append((triton.testing.do_bench(relative, return_mode="median"), cand))
            except Exception as e:  # noqa: BLE001 - a tile that does not fit: reported, skipped
                print(f"{cand} failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            finally:
                tr._launch_config = current
        results.sort()
        best = ", ".join(f"{c} {t:.3f}" for t, c in results[:4])
        print(f"| {workload} | BERT's varlen_attention {bert:.3f} | relative now "
              f"{tr._launch_config(HEAD_DIM, torch.float16, length, True)} {now:.3f} | best: {best} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
