"""Time the DP batcher's decision (plan_batches, and DpBatchPolicy.take) on CPU.

The cost model is a GridCostModel measured from a synthetic batch latency on the GPU grid the
encoder measures (backend/encoder/cost_measure.py): 0.4 ms per batch, 0.35 us per token and a small
attention term per sequence proportional to its length squared. Each case plans 256 queued
sequences; times are in microseconds: the median of --reps runs, the best of --blocks such
medians (this filters out other processes' bursts on a shared machine, not the slow calls of
the batcher itself). The plan's total estimated cost is printed too, so that two versions of
the batcher can be checked to agree:

    .venv/bin/python tools/time_dp_decision.py
    git show HEAD:scheduler/dp_batcher.py > /tmp/dp_batcher_head.py
    .venv/bin/python tools/time_dp_decision.py --batcher /tmp/dp_batcher_head.py
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from tritonformer.scheduler import dp_batcher
from tritonformer.scheduler.cost_model import GridCostModel

GRID_SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # backend/encoder/cost_measure.py GPU_GRID
GRID_LENGTHS = (8, 16, 32, 64, 128, 256, 512)
GRID_MAX_TOKENS = 65536
MAX_SEQS, MAX_TOKENS, N = 64, 16384, 256


def synthetic_batch_seconds(n: int, length: int) -> float:
    return 0.4e-3 + 0.35e-6 * n * length + 1e-10 * n * length * length


def cost_model() -> GridCostModel:
    return GridCostModel.measure(synthetic_batch_seconds, {"synthetic": 1}, packed=True, seqs=GRID_SEQS,
                                 lengths=GRID_LENGTHS, max_tokens=GRID_MAX_TOKENS)


def distributions() -> dict[str, list[int]]:
    rng = np.random.default_rng(0)
    n_short = int(0.7 * N)
    short = np.clip(np.rint(rng.lognormal(np.log(24), 1.0, n_short)), 2, 512)
    long = rng.integers(128, 513, N - n_short)
    mixed = np.concatenate([short, long]).astype(int)
    rng.shuffle(mixed)
    return {
        "mixed": mixed.tolist(),
        "uniform[16,512]": rng.integers(16, 513, N).tolist(),
        "uniform[5,500]": rng.integers(5, 501, N).tolist(),
    }


def load_batcher(path: str | None):
    """The installed dp_batcher module, or another version of it from a file."""
    if path is None:
        return dp_batcher
    spec = importlib.util.spec_from_file_location("dp_batcher_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def best_median_us(run_once, reps: int, blocks: int) -> float:
    """run_once() -> seconds of one call; the best of `blocks` medians of `reps` calls."""
    run_once()  # warm: caches, the dense table
    return min(statistics.median(run_once() for _ in range(reps)) for _ in range(blocks)) * 1e6


def timed(fn):
    def run_once() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run_once


@dataclass(eq=False)
class Item:
    lengths: list[int]
    arrival: float


def take_once(batcher, cost: GridCostModel, lengths: list[int], objective: str, window: int):
    """run_once for DpBatchPolicy.take over a fresh queue of these requests, by its own clock."""
    policy = batcher.DpBatchPolicy(cost, MAX_SEQS, MAX_TOKENS, objective, window=window)
    items = [Item([n], arrival=i * 1e-5) for i, n in enumerate(lengths)]

    def run_once() -> float:
        policy.take(deque(items), now=items[-1].arrival)
        return policy.last_decision_seconds

    return run_once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=200, help="calls per median")
    parser.add_argument("--blocks", type=int, default=5, help="medians taken; the best is shown")
    parser.add_argument("--batcher", help="a dp_batcher.py to time instead of the installed one")
    args = parser.parse_args()
    batcher = load_batcher(args.batcher)
    cost = cost_model()
    solver = "compiled loop" if getattr(batcher, "USE_NATIVE", False) else "Python/numpy (the compiled loop is not built)"
    print(f"{N} queued sequences, caps {MAX_SEQS} sequences / {MAX_TOKENS} tokens; microseconds, "
          f"best of {args.blocks} medians of {args.reps} calls; solver: {solver}")
    print(f"{'lengths':<16} {'objective':<11} {'plan_batches':>12} {'take w=128':>11} {'take w=256':>11}  "
          f"{'batches':>7}  sum of batch estimates")
    for name, lengths in distributions().items():
        for objective in ("throughput", "latency"):
            def plan(lengths=lengths, objective=objective):
                return batcher.plan_batches(lengths, cost, MAX_SEQS, MAX_TOKENS, objective)

            times = [best_median_us(timed(plan), args.reps, args.blocks)]
            for window in (128, N):
                times.append(best_median_us(take_once(batcher, cost, lengths, objective, window), args.reps,
                                            args.blocks))
            result = plan()
            print(f"{name:<16} {objective:<11} {times[0]:12.1f} {times[1]:11.1f} {times[2]:11.1f}  "
                  f"{len(result.batches):7d}  {sum(result.estimated_seconds) * 1e3:.9f} ms")


if __name__ == "__main__":
    main()
