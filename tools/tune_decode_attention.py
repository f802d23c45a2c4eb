"""Sweep the paged decode attention's launch configuration (GPU).

The kernel profile shows the decode attention as the largest item of a batch-64 GPT-2 step
(12 launches, ~17 us each for 25 MB of keys and values per layer: about half the HBM
bandwidth). This times `kernels.paged_attention` for one query per sequence, as the decode
graphs launch it, under every (BLOCK_N, num_warps, num_stages, key splits) in a small grid and
prints the current configuration next to the best ones:

    python3 tools/tune_decode_attention.py [--contexts 128,512] [--batches 1,64]
"""
from __future__ import annotations

import argparse
import itertools

import torch

from time_small_gemm import graph_us
from tritonformer.backend.decode_graphs import key_splits
from tritonformer.kernels import triton_attention as ta
from tritonformer.kernels.gpu_info import sm_count

SHAPES = {"gpt2": (12, 12, 64), "llama-1B": (32, 8, 64)}  # query heads, kv heads, head dim
PAGE = 16


def decode_inputs(batch: int, context: int, heads: int, kv_heads: int, head_dim: int):
    """One query per sequence over `context` cached keys in randomly placed pages."""
    dev, dtype = torch.device("cuda"), torch.float16
    pages = context // PAGE
    k_cache = torch.randn(batch * pages, PAGE, kv_heads, head_dim, device=dev, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(batch * pages, device=dev, dtype=torch.int32).view(batch, pages)
    q = torch.randn(batch, heads, head_dim, device=dev, dtype=dtype)
    cu_q = torch.arange(batch + 1, device=dev, dtype=torch.int32)
    seqlens = torch.full((batch,), context, device=dev, dtype=torch.int32)
    return q, k_cache, v_cache, tables, cu_q, seqlens, torch.empty_like(q)


def sweep_launch_configs(candidates, timed, launch_config_of) -> list[tuple[float, tuple]]:
    """[(time, candidate)] fastest first: `timed(candidate)` with the attention's launch
    configuration patched to `launch_config_of(candidate)` (BLOCK_M, BLOCK_N, warps, stages).
    A candidate that fails (a tile that does not fit in shared memory) is reported and skipped."""
    current = ta._launch_config
    results = []
    for candidate in candidates:
        ta._launch_config = lambda *a, c=launch_config_of(candidate): c
        try:
            results.append((timed(candidate), candidate))
        except Exception as e:
            print(f"{candidate} failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
        finally:
            ta._launch_config = current
    return sorted(results)


def ranked_cells(results: list[tuple[float, tuple]], fmt: str) -> str:
    """Table cells "best time | best config | 2nd | 3rd" of sweep_launch_configs' results."""
    top = [f"{c} {t:{fmt}}" for t, c in results[:3]] + ["-"] * 3
    return f"{results[0][0]:{fmt}} | {top[0]} | {top[1]} | {top[2]}" if results else "- | - | - | -"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", default="128")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--models", default=",".join(SHAPES))
    args = parser.parse_args()
    sms = sm_count(torch.device("cuda"))
    current = ta._launch_config
    print(f"# paged decode attention, {torch.cuda.get_device_name()}, fp16, page {PAGE}, us per launch in a CUDA graph")
    print("| model | batch | context | current (BLOCK_N, warps, stages, splits) us | best us | best config | 2nd | 3rd |")
    print("|---|---:|---:|---|---:|---|---|---|")
    for (name, (heads, kv_heads, head_dim)), batch, context in itertools.product(
            [(m, SHAPES[m]) for m in args.models.split(",")], map(int, args.batches.split(",")),
            map(int, args.contexts.split(","))):
        q, kc, vc, tables, cu_q, seqlens, out = decode_inputs(batch, context, heads, kv_heads, head_dim)
        default_splits = key_splits(batch, kv_heads, sms)

        def run(splits):
            return lambda: ta.paged_attention(q, kc, vc, tables, cu_q, seqlens, True, max_seqlen_q=1, out=out,
                                              num_splits=splits)

        _, bn0, w0, s0 = current(head_dim, q.dtype, heads // kv_heads, True)
        base = graph_us(run(default_splits))
        candidates = [c for c in itertools.product((32, 64, 128), (2, 4), (1, 2, 3),
                                                   sorted({1, 2, default_splits, 2 * default_splits}))
                      if c[3] <= 16 and c[0] * c[3] <= context]
        results = sweep_launch_configs(candidates, lambda c: graph_us(run(c[3])), lambda c: (16, *c[:3]))
        print(f"| {name} | {batch} | {context} | ({bn0}, {w0}, {s0}, {default_splits}) {base:.2f} | "
              f"{ranked_cells(results, '.2f')} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
