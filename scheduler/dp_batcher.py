"""Dynamic-programming length batching (TurboTransformers, PPoPP'21, Algorithm 2).

Queued sequences are sorted by length and cut into contiguous groups; the cut is chosen by
dynamic programming over the sorted list so that a cost model's estimate of the whole plan is
minimal. Two objectives:

- "throughput" (the paper's): minimise the total time to run every batch,
  states[i] = min_j states[j] + cost(group j..i-1).
- "latency": minimise the mean completion time when the batches run shortest first: a batch's
  cost delays every request still waiting, itself included, so it is weighted by their number,
  f[i] = min_k (n - i) * cost(group i..k-1) + f[k].

Corrections to the printed algorithm (see shared reference notes): the backtrack continues at
`i = start` (the paper's `start - 1` drops a request); the cost is a whole-batch latency (no
`x batch size`); batch size and tokens per batch are capped explicitly.
Pure Python: no torch, testable with a fake cost model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

OBJECTIVES = ("throughput", "latency")


class CostModel(Protocol):
    def batch_seconds(self, num_seqs: int, max_len: int, total_tokens: int) -> float:
        """Estimated latency of running this group as one batch."""
        ...


@dataclass(frozen=True)
class Plan:
    batches: list[list[int]]  # indices into the caller's list, each batch sorted by length
    estimated_seconds: list[float]  # per batch, in the same order


def plan_batches(
    lengths: Sequence[int],
    cost: CostModel,
    max_batch_size: int,
    max_batch_tokens: int,
    objective: str = "throughput",
) -> Plan:
    """Cut the sequences into batches minimising the objective; O(n * max_batch_size).

    Batches come back in the order they should run: shortest sequences first."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sl = [lengths[i] for i in order]
    n = len(sl)
    prefix = [0]
    for length in sl:
        prefix.append(prefix[-1] + length)

    def group_cost(a: int, b: int) -> float:  # sorted positions a..b-1
        return cost.batch_seconds(b - a, sl[b - 1], prefix[b] - prefix[a])

    def feasible_starts(end: int):
        """Starts a of groups a..end-1 within the caps, longest group last (tokens grow with it)."""
        for a in range(end - 1, max(-1, end - 1 - max_batch_size), -1):
            if a < end - 1 and prefix[end] - prefix[a] > max_batch_tokens:
                break  # a single sequence over the token cap still runs, alone
            yield a

    inf = float("inf")
    if objective == "throughput":
        best = [0.0] + [inf] * n  # best[i]: cheapest plan for sorted[0:i]
        start = [0] * (n + 1)
        for i in range(1, n + 1):
            for a in feasible_starts(i):
                c = best[a] + group_cost(a, i)
                if c < best[i]:
                    best[i], start[i] = c, a
        cuts, i = [], n
        while i > 0:  # backtrack: the group is start[i]..i-1, then the prefix sorted[0:start[i]]
            cuts.append((start[i], i))
            i = start[i]
        cuts.reverse()
    else:
        best = [inf] * n + [0.0]  # best[i]: cheapest weighted plan for sorted[i:n]
        end = [n] * (n + 1)
        for i in range(n - 1, -1, -1):
            for k in range(i + 1, min(n, i + max_batch_size) + 1):
                if k > i + 1 and prefix[k] - prefix[i] > max_batch_tokens:
                    break
                c = (n - i) * group_cost(i, k) + best[k]
                if c < best[i]:
                    best[i], end[i] = c, k
        cuts, i = [], 0
        while i < n:
            cuts.append((i, end[i]))
            i = end[i]
    return Plan(
        batches=[[order[p] for p in range(a, b)] for a, b in cuts],
        estimated_seconds=[group_cost(a, b) for a, b in cuts],
    )


@dataclass(frozen=True)
class TriggerPolicy:
    """When to cut a batch from the queue.

    - "hungry": whenever the runtime is idle and something is queued (the paper's experiments);
    - "lazy": when `lazy_max_queue` sequences are queued or the oldest waited `lazy_timeout_s`;
    - "slo": lazy, plus the paper's rule: dispatch at once when the oldest request's wait plus
      the plan's estimated run time exceeds half its latency budget.
    Whatever the mode, a request older than `max_wait_s` is never passed over (starvation bound).
    """

    mode: str = "hungry"
    lazy_timeout_s: float = 0.002
    lazy_max_queue: int = 64
    slo_s: float = 0.050
    max_wait_s: float = 0.5

    def should_dispatch(self, now: float, oldest_arrival: float | None, queued: int, runtime_idle: bool,
                        estimated_run_s: Callable[[], float]) -> bool:
        if oldest_arrival is None or not runtime_idle:
            return False
        waited = now - oldest_arrival
        if self.mode == "hungry" or waited >= self.max_wait_s:
            return True
        if self.mode == "lazy":
            return queued >= self.lazy_max_queue or waited >= self.lazy_timeout_s
        if self.mode == "slo":
            return queued >= self.lazy_max_queue or waited >= self.lazy_timeout_s or (
                waited + estimated_run_s() > self.slo_s / 2
            )
        raise ValueError(f"unknown trigger mode {self.mode!r}")


def next_batch(plan: Plan, arrivals: Sequence[float], now: float, slo_s: float, max_wait_s: float) -> int:
    """Which of the plan's batches to run now: the first (shortest) one, unless the oldest
    request would miss its budget waiting behind the others or has waited past the starvation
    bound; then the batch that holds it."""
    oldest = min(range(len(arrivals)), key=lambda i: arrivals[i])
    holder = next(b for b, batch in enumerate(plan.batches) if oldest in batch)
    waited = now - arrivals[oldest]
    finish_in_order = sum(plan.estimated_seconds[: holder + 1])
    if waited >= max_wait_s or waited + finish_in_order > slo_s:
        return holder
    return 0
