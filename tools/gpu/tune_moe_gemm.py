"""The mixture-of-experts grouped GEMMs (kernels/triton_moe.py) over a grid of tile settings (GPU).

For the published MoE shapes and a decode step's and a prefill's token counts, each GEMM (gate-up
with its activation, down with the routing weights) is timed inside a CUDA graph, as the decode
step replays it, for every setting of the grid; printed: the current setting
(`triton_moe.gemm_config`), the best one, and the floor (the routed experts' bytes at the copy
bandwidth, or the FLOPs at the matmul peak, whichever is longer), to choose `gemm_config` from data.
Run:

    python3 tools/gpu/tune_moe_gemm.py [--models qwen3-30b-a3b,mixtral-8x7b] [--tokens 1,16,64,2000]

With --routing, instead: the routing and sort (`route_align`) at each token count both ways, in one
program (up to FUSED_MAX_PAIRS) and in the chunked three launches, to choose that threshold.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_small_gemm import graph_us  # noqa: E402

from tritonformer.client.gpu_measure import copy_bandwidth, matmul_peak_tflops  # noqa: E402
from tritonformer.client.model_shapes import DECODER_SHAPES  # noqa: E402
from tritonformer.kernels import triton_moe as moe  # noqa: E402

DECODE_GRID = [dict(BLOCK_M=16, BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=s)
               for n, k, (w, s) in itertools.product((32, 64, 128), (64, 128, 256), ((4, 3), (4, 4), (8, 3)))]
PREFILL_GRID = [dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=s)
                for m, n, k, (w, s) in itertools.product((64, 128), (64, 128), (32, 64), ((4, 3), (8, 3), (8, 4)))]


def moe_shape(name: str) -> tuple[int, int, int, int]:
    """(hidden, expert intermediate, experts, top k) of a published MoE shape."""
    c = DECODER_SHAPES[name]
    inter = c.get("moe_intermediate_size", c.get("intermediate_size"))
    experts = c.get("num_local_experts", c.get("num_experts"))
    top_k = c.get("num_experts_per_tok")
    return c["hidden_size"], inter, experts, top_k


def routing(models: list[str], token_counts: list[int]) -> int:
    """route_align's us per call in a CUDA graph: one program against the three chunked launches."""
    print(f"# MoE routing and sort, {torch.cuda.get_device_name()}, us per call inside a CUDA graph "
          f"(one program up to FUSED_MAX_PAIRS = {moe.FUSED_MAX_PAIRS} now)")
    print("| model | tokens | one program us | three launches us |")
    print("|---|---:|---:|---:|")
    fused_max = moe.FUSED_MAX_PAIRS
    for name in models:
        _, _, experts, top_k = moe_shape(name)
        block_m = moe.gemm_config(top_k, experts, True)["BLOCK_M"]
        for tokens in token_counts:
            logits = torch.randn(tokens, experts, device="cuda", dtype=torch.bfloat16)
            times = []
            for fused in (True, False):
                moe.FUSED_MAX_PAIRS = tokens * top_k if fused else 0
                times.append(graph_us(lambda: moe.route_align(logits, top_k, True, torch.bfloat16, block_m)))
            moe.FUSED_MAX_PAIRS = fused_max
            print(f"| {name} | {tokens} | {times[0]:.1f} | {times[1]:.1f} |", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen3-30b-a3b,mixtral-8x7b")
    ap.add_argument("--tokens", default="1,16,64,2000")
    ap.add_argument("--routing", action="store_true", help="time route_align's two forms instead")
    args = ap.parse_args()
    if args.routing:
        return routing(args.models.split(","), [int(t) for t in args.tokens.split(",")])
    dev, dtype = torch.device("cuda"), torch.bfloat16
    bandwidth, peak = copy_bandwidth(), matmul_peak_tflops(dtype)
    print(f"# MoE grouped GEMMs, {torch.cuda.get_device_name()}, bf16, us per call inside a CUDA graph "
          f"(copy {bandwidth / 1e9:,.0f} GB/s, matmul peak {peak:.0f} TFLOP/s)")
    print("| model | tokens | GEMM | current us | best us | best setting | floor us | current / floor | best / floor |")
    print("|---|---:|---|---:|---:|---|---:|---:|---:|")
    torch.manual_seed(0)
    for name in args.models.split(","):
        hidden, inter, experts, top_k = moe_shape(name)
        gate_up = torch.randn(experts, 2 * inter, hidden, device=dev, dtype=dtype) * 0.02
        down = torch.randn(experts, hidden, inter, device=dev, dtype=dtype) * 0.02
        expert_bytes = (gate_up[0].numel() + down[0].numel()) * 2
        for tokens in (int(t) for t in args.tokens.split(",")):
            pairs = tokens * top_k
            x = torch.randn(tokens, hidden, device=dev, dtype=dtype)
            logits = torch.randn(tokens, experts, device=dev, dtype=torch.float32)
            routed = experts * (1 - (1 - top_k / experts) ** tokens)
            inner = torch.empty(pairs, inter, device=dev, dtype=dtype)
            rows = torch.empty(pairs, hidden, device=dev, dtype=torch.float32)
            for gemm, share in (("gate-up", 2 / 3), ("down", 1 / 3)):
                current = moe.gemm_config(pairs, experts, gemm == "gate-up")
                grid = DECODE_GRID if current["BLOCK_M"] == 16 else PREFILL_GRID
                floor = max(routed * expert_bytes * share / bandwidth, 2 * pairs * hidden * inter * (3 * share)
                            / (peak * 1e12)) * 1e6
                times = {}
                for config in [current] + grid:
                    key = tuple(sorted(config.items()))
                    if key in times:
                        continue
                    weights, sorted_pairs, owners = moe.route_align(logits, top_k, True, None, config["BLOCK_M"])
                    scale = weights.reshape(-1).contiguous()
                    if gemm == "gate-up":
                        run = lambda c=config, p=sorted_pairs, o=owners: moe._grouped(  # noqa: E731
                            x, gate_up, inner, p, o, None, top_k, "silu_mul", c)
                    else:
                        run = lambda c=config, p=sorted_pairs, o=owners, s=scale: moe._grouped(  # noqa: E731
                            inner, down, rows, p, o, s, 1, "none", c)
                    try:
                        times[key] = graph_us(run)
                    except Exception as e:  # (a setting past the shared memory: skip it)
                        print(f"  {name} {tokens} {gemm} {config}: {type(e).__name__}", file=sys.stderr)
                now = times[tuple(sorted(current.items()))]
                best_key = min(times, key=times.get)
                best = " ".join(f"{k.removeprefix('BLOCK_').lower()}={v}" for k, v in best_key)
                print(f"| {name} | {tokens} | {gemm} | {now:.1f} | {times[best_key]:.1f} | {best} | {floor:.1f} "
                      f"| {now / floor:.2f}x | {times[best_key] / floor:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
