"""Dynamic-programming length batching (TurboTransformers, PPoPP'21, Algorithm 2).

Queued sequences are sorted by length and cut into contiguous groups; the cut is chosen by
dynamic programming over the sorted list so that a cost model's estimate of the whole plan is
minimal. Two objectives:

- "throughput" (the paper's): minimise the total time to run every batch,
  states[i] = min_j states[j] + cost(group j..i-1).
- "latency": minimise the mean completion time when the batches run shortest first: a batch's
  cost delays every request still waiting, itself included, so it is weighted by their number,
  which depends only on where the batch starts:
  states[i] = min_j states[j] + (sequences in sorted[j:]) * cost(group j..i-1).

Corrections to the printed algorithm (see shared reference notes): the backtrack continues at
`i = start` (the paper's `start - 1` drops a request); the cost is a whole-batch latency (no
`x batch size`); batch size and tokens per batch are capped explicitly.

The DP is a plain loop (_dp_loop). Over a dense cost table (what the served cost model has) the
same loop runs compiled (scheduler/_dp_native.c, built by `pip install`): a decision for 256
queued sequences takes tens of microseconds instead of ~1.7 ms in Python, with exactly the
Python loop's plans. Without the compiled module (a source tree never installed) the Python
loop runs, slower and otherwise the same.
Pure Python, numpy and that one C loop: no torch, testable with a fake cost model.
"""
from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate, compress, islice
from typing import Callable, Protocol, Sequence

import numpy as np

try:
    from tritonformer.scheduler import _dp_native
except ImportError:  # not built: the Python loop plans alone
    _dp_native = None

OBJECTIVES = ("throughput", "latency")
# Plan with the compiled loop when it is built and the cost model has a dense table (tests
# switch it off to compare the two).
USE_NATIVE = _dp_native is not None


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
    """Cut the items into batches minimising the objective; O(n * max_batch_size) work.

    An item is one sequence of `lengths[i]` tokens, or, with `seq_counts`/`token_counts`, a
    request of several sequences that must run together (lengths[i] then is its longest).
    Caps count sequences and tokens. Batches come back in the order they should run:
    shortest first."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if len(lengths) == 0:
        return Plan(batches=[], estimated_seconds=[])
    solution = _solve(lengths, cost, max_batch_size, max_batch_tokens, objective, seq_counts, token_counts)
    batches = range(len(solution.cuts))
    return Plan(batches=[solution.batch(b) for b in batches],
                estimated_seconds=[solution.estimate(b) for b in batches])


@dataclass(frozen=True)
class _Solution:
    """The DP's plan before it becomes a Plan: DpBatchPolicy.take needs one batch of it, and
    the estimates (a cost model interpolation each) only when the oldest request is at risk."""

    cost: CostModel
    order: list[int]  # sorted position -> the caller's index
    cuts: list[tuple[int, int]]  # the batches as sorted positions a..b-1, shortest first
    stats: list[tuple[int, int, int]]  # per batch: (sequences, longest, tokens)

    def batch(self, b: int) -> list[int]:
        a, z = self.cuts[b]
        return self.order[a:z]

    def estimate(self, b: int) -> float:
        """From the full model (correction included), for the triggers and metrics."""
        return self.cost.batch_seconds(*self.stats[b])

    def batch_holding(self, item: int) -> int:
        position = self.order.index(item)
        return bisect_right(self.cuts, (position, len(self.order))) - 1  # the last cut starting at or before it


def _solve(lengths, cost, max_batch_size, max_batch_tokens, objective, seq_counts, token_counts) -> _Solution:
    if USE_NATIVE and hasattr(cost, "dense_table"):
        return _solve_native(lengths, cost, max_batch_size, max_batch_tokens, objective, seq_counts, token_counts)
    table = _dense_table(cost, max_batch_size, lengths, seq_counts) if hasattr(cost, "dense_table") else None
    order, sl, pre_seq, pre_tok, start = _dp_loop(lengths, seq_counts, token_counts, objective, cost, table,
                                                  max_batch_size, max_batch_tokens)
    cuts, i = [], len(lengths)
    while i > 0:  # backtrack: the group is start[i]..i-1, then the prefix sorted[0:start[i]]
        cuts.append((start[i], i))
        i = start[i]
    cuts.reverse()
    stats = [(pre_seq[z] - pre_seq[a], sl[z - 1], pre_tok[z] - pre_tok[a]) for a, z in cuts]
    return _Solution(cost, order, cuts, stats)


def _solve_requests(requests: list[list[int]], cost, max_batch_size, max_batch_tokens, objective) -> _Solution:
    """_solve over requests given as their sequences' lengths (a request's sequences run together)."""
    if USE_NATIVE and hasattr(cost, "dense_table"):  # it reads the requests itself
        return _solve_native(requests, cost, max_batch_size, max_batch_tokens, objective, None, None)
    if max(map(len, requests)) > 1:
        return _solve(list(map(max, requests)), cost, max_batch_size, max_batch_tokens, objective,
                      list(map(len, requests)), list(map(sum, requests)))
    return _solve([r[0] for r in requests], cost, max_batch_size, max_batch_tokens, objective, None, None)


def _solve_native(items, cost, max_batch_size, max_batch_tokens, objective, seq_counts, token_counts) -> _Solution:
    """The compiled loop over the cost model's dense table (ints or requests as items). The
    table is asked for at its current size; the loop says when an item needs a larger one."""
    args = (seq_counts, token_counts, objective == "latency")
    caps = (getattr(cost, "packed", True), max_batch_size, max_batch_tokens)
    try:
        order, cuts, stats = _dp_native.solve(items, *args, _as_array(cost.dense_table(max_batch_size, 0)), *caps)
    except IndexError:  # longer sequences or larger requests than the table has seen yet
        table = _dense_table(cost, max_batch_size, items, seq_counts)
        order, cuts, stats = _dp_native.solve(items, *args, _as_array(table), *caps)
    return _Solution(cost, order, cuts, stats)


def _dense_table(cost, max_batch_size, items, seq_counts) -> list[list[float]]:
    """The cost model's dense table, large enough for these items (one int each, or requests as
    their sequences' lengths). The DP compares uncorrected table entries: the correction factor
    scales every cost alike."""
    if seq_counts is None and hasattr(items[0], "__len__"):  # requests
        most_seqs, longest = max(map(len, items)), max(map(max, items))
    else:
        most_seqs, longest = (1 if seq_counts is None else max(seq_counts)), max(items)
    return cost.dense_table(max(max_batch_size, most_seqs), longest)


def _dp_loop(lengths, seq_counts, token_counts, objective, cost, table, max_seqs, max_tokens):
    """The DP as a plain loop (any cost model; the reference the compiled loop follows line by
    line). Returns the sorted order, the sorted lengths, prefix sums of sequences and tokens,
    and start[i]: where the last group of the best plan for sorted[0:i] starts."""
    n = len(lengths)
    seqs = seq_counts if seq_counts is not None else [1] * n
    toks = token_counts if token_counts is not None else lengths
    order = sorted(range(n), key=lengths.__getitem__)
    sl = [lengths[i] for i in order]
    pre_seq = list(accumulate([seqs[i] for i in order], initial=0))
    pre_tok = list(accumulate([toks[i] for i in order], initial=0))
    # A batch starting at sorted position j weighs 1 (throughput) or every sequence still waiting.
    weight = None if objective == "throughput" else [pre_seq[-1] - s for s in pre_seq[:-1]]
    if table is None:
        def group_cost(n_seq: int, n_tok: int, i: int) -> float:  # the group ends at sorted position i-1
            return cost.batch_seconds(n_seq, sl[i - 1], n_tok)
    elif getattr(cost, "packed", True):
        def group_cost(n_seq: int, n_tok: int, i: int) -> float:
            return table[n_seq][n_tok // n_seq]
    else:
        def group_cost(n_seq: int, n_tok: int, i: int) -> float:
            return table[n_seq][sl[i - 1]]

    best = [0.0] + [float("inf")] * n  # best[i]: cheapest plan for sorted[0:i]
    start = [0] * (n + 1)
    for i in range(1, n + 1):
        seq_i, tok_i = pre_seq[i], pre_tok[i]
        best_i, a = float("inf"), i - 1
        while a >= 0:  # the group a..i-1 only grows as a moves left
            n_seq, n_tok = seq_i - pre_seq[a], tok_i - pre_tok[a]
            if a < i - 1 and (n_seq > max_seqs or n_tok > max_tokens):
                break  # a lone item always runs, even over the caps
            c = group_cost(n_seq, n_tok, i)
            c = best[a] + (c if weight is None else weight[a] * c)
            if c < best_i:
                best_i, start[i] = c, a
            a -= 1
        best[i] = best_i
    return order, sl, pre_seq, pre_tok, start


_dense_arrays: dict[int, tuple[list, np.ndarray]] = {}  # id(table) -> (table, its numpy copy)


def _as_array(table: list[list[float]]) -> np.ndarray:
    """The dense table as a C-contiguous float64 array, converted once per table (about 5 ms
    for the GPU grid's): a cost model builds its table once and never edits it; a larger
    request makes a new list. Holding the table keeps its id from being reused while cached."""
    entry = _dense_arrays.get(id(table))
    if entry is None or entry[0] is not table:
        if len(_dense_arrays) >= 4:  # a few cost models per process at most: start over
            _dense_arrays.clear()
        entry = _dense_arrays[id(table)] = (table, np.ascontiguousarray(table, dtype=np.float64))
    return entry[1]


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
    oldest = arrivals.index(min(arrivals))
    holder = next(b for b, batch in enumerate(plan.batches) if oldest in batch)
    return _serve_oldest(holder, now - arrivals[oldest], lambda: sum(plan.estimated_seconds[: holder + 1]),
                         slo_s, max_wait_s)


def _serve_oldest(holder: int, waited: float, finish_in_order: Callable[[], float], slo_s: float,
                  max_wait_s: float) -> int:
    """next_batch's rule, from the batch holding the oldest request and how long it waited;
    finish_in_order() (when batches 0..holder would be done) is only estimated if it matters."""
    if holder > 0 and (waited >= max_wait_s or waited + finish_in_order() > slo_s):
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
        if hasattr(cost, "dense_table"):  # build the lookup table (and its array) now, not on the first request
            _as_array(cost.dense_table(max_sequences, 512))

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
        start = time.perf_counter()
        items = list(islice(queue, self.window))
        plan = _solve_requests([it.lengths for it in items], self.cost, self.max_sequences, self.max_tokens,
                               self.objective)
        arrivals = [it.arrival for it in items]
        oldest = arrivals.index(min(arrivals))
        holder = plan.batch_holding(oldest)
        chosen = _serve_oldest(holder, now - arrivals[oldest], lambda: sum(map(plan.estimate, range(holder + 1))),
                               self.trigger.slo_s, self.trigger.max_wait_s)
        taken = sorted(plan.batch(chosen))  # arrival order
        batch = [items[i] for i in taken]
        keep = [True] * len(items)
        for i in taken:
            keep[i] = False
        remaining = list(compress(items, keep))
        remaining.extend(islice(queue, len(items), None))
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
