"""Sweep the paged decode attention's launch configuration (GPU).

The kernel profile shows the decode attention as the largest item of a batch-64 GPT-2 step
(12 launches, ~15 us each for 25 MB of keys and values per layer: about half the HBM
bandwidth). This times `kernels.paged_attention` for one query per sequence, as the decode
graphs launch it, under every (BLOCK_N, num_warps, num_stages, key splits) in a small grid and
prints the current configuration next to the best ones:

    python3 tools/gpu/tune_decode_attention.py [--contexts 128,512] [--batches 1,64] [--splits 1,2,4]
        [--models llama-8b,llama-8b-tp2]

Split counts past a context's key blocks are tried too: the graphs fix the splits while the
contexts grow, and a split with no keys exits (what such a launch costs at short contexts).

The keys and values come from HBM, as in a model's forward, where the other layers' weights
and caches pass through L2 between two attention launches: the timed graph cycles through
enough copies of the inputs to exceed L2 several times over. (A sweep that reused one input
set measured L2: 7.6 us at GPT-2 batch 64, context 128, where the model's launch takes 15.)
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton

from time_small_gemm import graph_us
from tritonformer.backend.decoder.graphs import key_splits
from tritonformer.kernels import triton_attention as ta
from tritonformer.kernels.gpu_info import hopper_or_newer, sm_count

# query heads, kv heads, head dim (llama-8b-tpN: one rank's share at tensor_parallel_size N)
SHAPES = {"gpt2": (12, 12, 64), "llama-1B": (32, 8, 64), "llama-8b": (32, 8, 128), "llama-8b-tp2": (16, 4, 128),
          "llama-8b-tp4": (8, 2, 128), "llama-70b-tp2": (32, 4, 128), "llama-70b-tp4": (16, 2, 128),
          "gemma-2-9b": (16, 8, 256), "phi-3-mini": (32, 32, 96)}
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


def cold_input_sets(batch: int, context: int, heads: int, kv_heads: int, head_dim: int) -> list[tuple]:
    """Enough independent input sets that cycling through them reads 4x the L2 cache from HBM
    (at most 128 sets: a one-sequence launch reads too little to need more)."""
    kv_bytes = 2 * batch * context * kv_heads * head_dim * 2
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    count = min(128, max(2, -(-4 * l2 // kv_bytes)))
    return [decode_inputs(batch, context, heads, kv_heads, head_dim) for _ in range(count)]


def sweep_launch_configs(candidates, timed, launch_config_of) -> list[tuple[float, tuple]]:
    """[(time, candidate)] fastest first: `timed(candidate)` with the attention's launch
    configuration patched to `launch_config_of(candidate)` (BLOCK_M, BLOCK_N, warps, stages).
    A candidate that fails (a tile that does not fit in shared memory) is reported and skipped."""
    current, current_split = ta._launch_config, ta._split_decode_config
    results = []
    for candidate in candidates:
        config = launch_config_of(candidate)
        ta._launch_config = lambda *a, c=config: c
        ta._split_decode_config = lambda *a, c=config: c[1:]  # split launches too
        try:
            results.append((timed(candidate), candidate))
        except Exception as e:
            print(f"{candidate} failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
        finally:
            ta._launch_config, ta._split_decode_config = current, current_split
    return sorted(results)


def ranked_cells(results: list[tuple[float, tuple]], fmt: str) -> str:
    """Table cells "best time | best config | 2nd | 3rd" of sweep_launch_configs' results."""
    top = [f"{c} {t:{fmt}}" for t, c in results[:3]] + ["-"] * 3
    return f"{results[0][0]:{fmt}} | {top[0]} | {top[1]} | {top[2]}" if results else "- | - | - | -"


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", default="128")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--models", default=",".join(SHAPES))
    parser.add_argument("--block-n", default="32,64,128")
    parser.add_argument("--warps", default="2,4")
    parser.add_argument("--stages", default="1,2,3")
    parser.add_argument("--splits", default="", help="key splits tried (default: 1, 2, the current and twice it)")
    args = parser.parse_args()
    sms = sm_count(torch.device("cuda"))
    current = ta._launch_config
    print(f"# paged decode attention, {torch.cuda.get_device_name()}, fp16, page {PAGE}, us per launch in a "
          "CUDA graph, keys and values read from HBM (L2 cold)")
    print("| model | batch | context | current (BLOCK_N, warps, stages, splits) us | best us | best config | 2nd | 3rd |")
    print("|---|---:|---:|---|---:|---|---|---|")
    for (name, (heads, kv_heads, head_dim)), batch, context in itertools.product(
            [(m, SHAPES[m]) for m in args.models.split(",")], ints(args.batches), ints(args.contexts)):
        sets = cold_input_sets(batch, context, heads, kv_heads, head_dim)
        default_splits = key_splits(batch, kv_heads, sms)

        def run(splits):
            turn = itertools.cycle(sets)

            def launch():
                q, kc, vc, tables, cu_q, seqlens, out = next(turn)
                ta.paged_attention(q, kc, vc, tables, cu_q, seqlens, True, max_seqlen_q=1, out=out,
                                   num_splits=splits)
            return launch

        tile_d = triton.next_power_of_2(head_dim)
        _, bn0, w0, s0 = current(tile_d, torch.float16, heads // kv_heads, True, hopper_or_newer(torch.device("cuda")))
        if default_splits > 1 and heads // kv_heads <= 16:
            bn0, w0, s0 = ta._split_decode_config(tile_d, torch.float16, True, (bn0, w0, s0), heads // kv_heads)
        base = graph_us(run(default_splits), calls=2 * len(sets))
        splits = ints(args.splits) if args.splits else sorted({1, 2, default_splits, 2 * default_splits})
        candidates = [c for c in itertools.product(ints(args.block_n), ints(args.warps), ints(args.stages), splits)
                      if c[3] <= 64]
        results = sweep_launch_configs(candidates, lambda c: graph_us(run(c[3]), calls=2 * len(sets)),
                                       lambda c: (16, *c[:3]))
        print(f"| {name} | {batch} | {context} | ({bn0}, {w0}, {s0}, {default_splits}) {base:.2f} | "
              f"{ranked_cells(results, '.2f')} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
