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
    seq_counts: Sequence[int] | None = None,
    token_counts: Sequence[int] | None = None,
) -> Plan:
    """Cut the items into batches minimising the objective; O(n * max_batch_size).

    An item is one sequence of `lengths[i]` tokens, or, with `seq_counts`/`token_counts`, a
    request of several sequences that must run together (lengths[i] then is its longest).
    Caps count sequences and tokens. Batches come back in the order they should run:
    shortest first."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    n = len(lengths)
    seqs = seq_counts if seq_counts is not None else [1] * n
    toks = token_counts if token_counts is not None else lengths
    order = sorted(range(n), key=lambda i: lengths[i])
    sl = [lengths[i] for i in order]
    pre_tok, pre_seq = [0], [0]
    for i in order:
        pre_tok.append(pre_tok[-1] + toks[i])
        pre_seq.append(pre_seq[-1] + seqs[i])

    def group_cost(a: int, b: int) -> float:  # sorted positions a..b-1
        return cost.batch_seconds(pre_seq[b] - pre_seq[a], sl[b - 1], pre_tok[b] - pre_tok[a])

    # A cost model with a dense table makes each evaluation a list lookup: the DP's inner loop
    # runs n * max_batch_size times, so this is what keeps a decision cheap.
    dense = getattr(cost, "dense_table", None)
    if dense is not None and n:
        table = dense(max(max_batch_size, max(seqs)), max(sl))
        packed = getattr(cost, "packed", True)

        def group_cost(a: int, b: int) -> float:  # noqa: F811 (the fast version of the same)
            n_seq = pre_seq[b] - pre_seq[a]
            row = table[n_seq] if n_seq < len(table) else None
            if row is None:
                return cost.batch_seconds(n_seq, sl[b - 1], pre_tok[b] - pre_tok[a])
            return row[(pre_tok[b] - pre_tok[a]) // n_seq] if packed else row[sl[b - 1]]

    def fits(a: int, b: int) -> bool:  # a lone item always runs, even over the caps
        return b - a == 1 or (pre_seq[b] - pre_seq[a] <= max_batch_size and pre_tok[b] - pre_tok[a] <= max_batch_tokens)

    inf = float("inf")
    if objective == "throughput":
        best = [0.0] + [inf] * n  # best[i]: cheapest plan for sorted[0:i]
        start = [0] * (n + 1)
        if dense is not None and n and packed and max(seqs) <= max_batch_size:
            _throughput_dense(n, pre_seq, pre_tok, table, max_batch_size, max_batch_tokens, best, start)
        else:
            for i in range(1, n + 1):
                a = i - 1
                while a >= 0 and fits(a, i):  # groups only grow as a moves left
                    c = best[a] + group_cost(a, i)
                    if c < best[i]:
                        best[i], start[i] = c, a
                    a -= 1
        cuts, i = [], n
        while i > 0:  # backtrack: the group is start[i]..i-1, then the prefix sorted[0:start[i]]
            cuts.append((start[i], i))
            i = start[i]
        cuts.reverse()
    else:
        best = [inf] * n + [0.0]  # best[i]: cheapest weighted plan for sorted[i:n]
        end = [n] * (n + 1)
        remaining = [pre_seq[n] - pre_seq[i] for i in range(n + 1)]  # requests' sequences still waiting
        for i in range(n - 1, -1, -1):
            k = i + 1
            while k <= n and fits(i, k):
                c = remaining[i] * group_cost(i, k) + best[k]
                if c < best[i]:
                    best[i], end[i] = c, k
                k += 1
        cuts, i = [], 0
        while i < n:
            cuts.append((i, end[i]))
            i = end[i]
    return Plan(
        batches=[[order[p] for p in range(a, b)] for a, b in cuts],
        # Estimates from the full model (correction included), for the triggers and metrics.
        estimated_seconds=[cost.batch_seconds(pre_seq[b] - pre_seq[a], sl[b - 1], pre_tok[b] - pre_tok[a])
                           for a, b in cuts],
    )


def _throughput_dense(n, pre_seq, pre_tok, table, max_seqs, max_tokens, best, start) -> None:
    """The throughput DP's loop with the cost lookup inlined (the hot path: no calls inside)."""
    for i in range(1, n + 1):
        seq_i, tok_i = pre_seq[i], pre_tok[i]
        best_i, start_i = float("inf"), i - 1
        a = i - 1
        while a >= 0:
            ns, nt = seq_i - pre_seq[a], tok_i - pre_tok[a]
            if a < i - 1 and (ns > max_seqs or nt > max_tokens):
                break
            c = best[a] + table[ns][nt // ns]
            if c < best_i:
                best_i, start_i = c, a
            a -= 1
        best[i], start[i] = best_i, start_i


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


class DpBatchPolicy:
    """The encoder queue's policy: when to cut a batch (trigger) and which (DP over the queue).

    Queue items have `.lengths` (their sequences' token counts; a request's sequences run
    together) and `.arrival` (monotonic seconds). Planning looks at the `window` oldest items
    so that its cost stays bounded however long the queue grows."""

    def __init__(
        self,
        cost: CostModel,
        max_sequences: int = 64,
        max_tokens: int = 16384,
        objective: str = "throughput",
        trigger: TriggerPolicy | None = None,
        window: int = 128,
    ):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.cost = cost
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.objective = objective
        self.trigger = trigger or TriggerPolicy()
        self.window = window
        self.last_decision_seconds = 0.0
        if hasattr(cost, "dense_table"):  # build the lookup table now, not on the first request
            cost.dense_table(max_sequences, 512)

    def ready(self, queue, now: float) -> bool:
        if not queue:
            return False
        return self.trigger.should_dispatch(now, queue[0].arrival, len(queue), True, lambda: self._head_estimate(queue))

    def wait_timeout(self, queue, now: float) -> float | None:
        """Seconds until a lazy trigger could fire with no new arrival (None: wait for one)."""
        if not queue or self.trigger.mode == "hungry":
            return None
        waited = now - queue[0].arrival
        deadline = min(self.trigger.lazy_timeout_s, self.trigger.max_wait_s)
        if self.trigger.mode == "slo":
            deadline = min(deadline, max(0.0, self.trigger.slo_s / 2 - self._head_estimate(queue)))
        return max(0.0, deadline - waited)

    def take(self, queue, now: float) -> list:
        import time

        start = time.perf_counter()
        items = [queue[i] for i in range(min(len(queue), self.window))]
        plan = plan_batches(
            [max(it.lengths) for it in items], self.cost, self.max_sequences, self.max_tokens, self.objective,
            seq_counts=[len(it.lengths) for it in items], token_counts=[sum(it.lengths) for it in items],
        )
        chosen = plan.batches[next_batch(plan, [it.arrival for it in items], now, self.trigger.slo_s, self.trigger.max_wait_s)]
        picked = {id(items[i]) for i in chosen}
        batch = [it for it in items if id(it) in picked]  # arrival order
        remaining = [it for it in queue if id(it) not in picked]
        queue.clear()
        queue.extend(remaining)
        self.last_decision_seconds = time.perf_counter() - start
        return batch

    def _head_estimate(self, queue) -> float:
        """Estimated run time of the oldest requests taken as one batch (the trigger's guess)."""
        seqs = tokens = longest = 0
        for it in queue:
            if seqs + len(it.lengths) > self.max_sequences or tokens + sum(it.lengths) > self.max_tokens:
                break
            seqs, tokens, longest = seqs + len(it.lengths), tokens + sum(it.lengths), max(longest, max(it.lengths))
        if seqs == 0:
            it = queue[0]
            seqs, tokens, longest = len(it.lengths), sum(it.lengths), max(it.lengths)
        return self.cost.batch_seconds(seqs, longest, tokens)
