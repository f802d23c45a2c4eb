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
Long queues over a dense cost table run the same DP as a shortest path solved with numpy
(_dp_vectorised): a decision for 256 queued sequences takes about 0.2 ms instead of 1.7 ms,
with exactly the plain loop's plans.
Pure Python and numpy: no torch, testable with a fake cost model.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from itertools import accumulate, islice
from typing import Callable, Protocol, Sequence

import numpy as np

OBJECTIVES = ("throughput", "latency")
# A dense cost table is searched with numpy (_dp_vectorised) from this many queued items on
# and with batches of this many sequences allowed: with fewer items the plain loop is cheaper
# than numpy's per-call overhead, and with smaller batches than its rounds (one per batch or so).
VECTOR_MIN_ITEMS = 20
VECTOR_MIN_BATCH = 8


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
    n = len(lengths)
    if n == 0:
        return Plan(batches=[], estimated_seconds=[])
    dense = getattr(cost, "dense_table", None)
    # The DP compares uncorrected table entries: the correction factor scales every cost alike.
    most_seqs = 1 if seq_counts is None else max(seq_counts)
    table = None if dense is None else dense(max(max_batch_size, most_seqs), max(lengths))
    vectorised = table is not None and n >= VECTOR_MIN_ITEMS and max_batch_size >= VECTOR_MIN_BATCH
    order, sl, pre_seq, pre_tok, start = (_dp_vectorised if vectorised else _dp_loop)(
        lengths, seq_counts, token_counts, objective, cost, table, max_batch_size, max_batch_tokens)
    cuts, i = [], n
    while i > 0:  # backtrack: the group is start[i]..i-1, then the prefix sorted[0:start[i]]
        cuts.append((start[i], i))
        i = start[i]
    cuts.reverse()
    return Plan(
        batches=[order[a:b] for a, b in cuts],
        # Estimates from the full model (correction included), for the triggers and metrics.
        estimated_seconds=[cost.batch_seconds(pre_seq[b] - pre_seq[a], sl[b - 1], pre_tok[b] - pre_tok[a])
                           for a, b in cuts],
    )


def _dp_loop(lengths, seq_counts, token_counts, objective, cost, table, max_seqs, max_tokens):
    """The DP as a plain loop (any cost model, small queues). Returns the sorted order, the
    sorted lengths, prefix sums of sequences and tokens, and start[i]: where the last group
    of the best plan for sorted[0:i] starts."""
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


def _dp_vectorised(lengths, seq_counts, token_counts, objective, cost, table, max_seqs, max_tokens):
    """_dp_loop over a dense cost table, with whole-array steps instead of n * K Python ones.

    Positions 0..n are nodes and a group of k <= K items an edge; all edge costs are looked up
    at once into a (K, n) band, and _band_shortest_path relaxes many nodes per numpy call. The
    values it converges to are the loop's own floats and ties break the same way (the smallest
    group first), so the plan is exactly the loop's plan."""
    lens = np.asarray(lengths, dtype=np.int64)
    n = len(lens)
    order = np.argsort(lens, kind="stable")  # stable like sorted(): equal lengths keep their order
    sl = lens[order]
    one_seq_each = seq_counts is None or max(seq_counts) == min(seq_counts) == 1
    pre_seq = np.arange(n + 1) if one_seq_each else np.concatenate(([0], np.cumsum(np.asarray(seq_counts)[order])))
    toks = sl if token_counts is None else np.asarray(token_counts, dtype=np.int64)[order]
    pre_tok = np.concatenate(([0], np.cumsum(toks)))

    K = max(1, min(n, max_seqs))  # an item holds a sequence at least: more items exceed the cap
    band_toks, band_seqs, work, index = _scratch(K, n)
    over = _band_sums(pre_tok, K, band_toks) > max_tokens
    if one_seq_each:
        seqs = np.arange(1.0, K + 1)[:, None]  # broadcasts: a group of k items holds k sequences
    else:
        seqs = _band_sums(pre_seq, K, band_seqs)
        over |= seqs > max_seqs
    over[0] = False  # a lone item always runs, even over the caps
    dense = _as_array(table)
    if getattr(cost, "packed", True):
        # The flat index seqs * W + toks // seqs, by truncation: toks/seqs lies at least 1/seqs
        # below the next integer, and the two roundings (2**-53 relative) add less while
        # index * seqs < 2**50.
        np.add(np.divide(band_toks, seqs, out=work), seqs * dense.shape[1], out=work)
    else:  # padded: the longest of sorted[e-k:e] is sl[e-1] whatever k
        np.add(sl, seqs * dense.shape[1], out=work)
    np.copyto(index, work, casting="unsafe")
    band = dense.take(index, mode="clip", out=band_toks)
    np.putmask(band, over, np.inf)
    if objective == "latency":  # weighted by the sequences waiting from the group's start e-k on
        weight = pre_seq[-1] - pre_seq[:-1]
        band *= _diagonals(np.concatenate((np.ones(K), weight)), K, n, K, -1)  # (1: no inf * 0)
    cand = _band_shortest_path(band, out=work)
    start = [0] * (n + 1)  # only the backtrack's positions are filled
    i = n
    while i > 0:  # argmin takes the first of ties: the smallest group, as the loop does
        start[i] = i - 1 - int(cand[:, i - 1].argmin())
        i = start[i]
    return order.tolist(), sl.tolist(), pre_seq.tolist(), pre_tok.tolist(), start


def _band_sums(prefix, K: int, out):
    """Sums over the groups of k = 1..K sorted items ending at positions e = 1..n into a (K, n)
    array: out[k-1, e-1] = prefix[e] - prefix[e-k]. Where e < k (no such group) prefix[e-k]
    reads 0: a harmless number, as the path search sees no node before 0 (+inf)."""
    padded = np.concatenate((np.zeros(K), prefix))
    return np.subtract(padded[K + 1:], _diagonals(padded, K, len(prefix) - 1, K, -1), out=out)


def _diagonals(x, K: int, n: int, start: int, step: int):
    """The (K, n) view v[r, j] = x[start + step * r + j] of a contiguous array, without a copy."""
    return np.ndarray((K, n), x.dtype, x, start * x.itemsize, (step * x.itemsize, x.itemsize))


def _band_shortest_path(band, out):
    """dist[e] = min_k dist[e-k] + band[k-1, e-1] for e = 1..n, dist[0] = 0; returns `out`
    holding the candidates dist[e-k] + band[k-1, e-1] at the solution.

    Jacobi (Bellman-Ford) rounds over a window of 2K columns at the frontier: a round relaxes
    all its nodes at once from the values before the round. Every value is the cost of a real
    path and only decreases (a minimum over values that only decrease, starting with the
    one-group plans). Nodes up to the frontier f are final; in a round, every node of the
    window before the first that decreased kept a value computed from final predecessors
    (induction from f), and so did that first one: all are final, and the frontier moves past
    it, or past the window if nothing decreased. Final values are min_k fl(dist[e-k] +
    band[k-1, e-1]) of final values, the very floats the loop computes. Rounds: about the
    number of batches in the plan or n / K, whichever is more. The 2K window measured fastest:
    a wider one computes nodes that cannot be final yet, a narrower one takes more rounds."""
    K, n = band.shape
    padded = np.full(K + n + 1, np.inf)
    padded[K] = 0.0
    dist = padded[K:]  # dist[e] is node e; before node 0, +inf
    dist[1:K + 1] = band.diagonal()  # one group from position 0
    pred = _diagonals(padded, K, n, K, -1)  # pred[k-1, e-1] = dist[e-k]
    new = np.empty(n)
    f = 0  # nodes 0..f are final; the window is columns f..f+2K-1 (nodes f+1..f+2K)
    while f < n:
        hi = min(n, f + 2 * K)
        window = np.add(pred[:, f:hi], band[:, f:hi], out=out[:, f:hi])
        lower = np.minimum.reduce(window, axis=0, out=new[f:hi]) < dist[f + 1:hi + 1]
        first = int(lower.argmax())  # the first True, or 0 if none
        dist[f + 1:hi + 1] = new[f:hi]
        f = f + first + 1 if lower[first] else hi
    return out


_scratch_space = threading.local()


def _scratch(K: int, n: int):
    """Three float and one int (K, n) scratch arrays, kept per thread: arrays this large are
    fresh pages from the OS at each call otherwise (the allocator hands them back), and the
    page faults cost more than the arithmetic."""
    space = getattr(_scratch_space, "arrays", None)
    if space is None or space[1].size < K * n:
        space = _scratch_space.arrays = (np.empty((3, K * n)), np.empty(K * n, dtype=np.intp))
    floats, ints = space
    return [a[: K * n].reshape(K, n) for a in floats] + [ints[: K * n].reshape(K, n)]


_dense_arrays: dict[int, tuple[list, np.ndarray]] = {}  # id(table) -> (table, its numpy copy)


def _as_array(table: list[list[float]]) -> np.ndarray:
    """The dense table as a numpy array, converted once per table (about 5 ms for the GPU
    grid's): a cost model builds its table once and never edits it; a larger request makes a
    new list. Holding the table keeps its id from being reused while cached."""
    entry = _dense_arrays.get(id(table))
    if entry is None or entry[0] is not table:
        if len(_dense_arrays) >= 4:  # a few cost models per process at most: start over
            _dense_arrays.clear()
        entry = _dense_arrays[id(table)] = (table, np.array(table, dtype=float))
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
        lengths = [it.lengths for it in items]
        seqs = list(map(len, lengths))
        several = max(seqs) > 1  # else every item is one sequence: counts and tokens are implied
        plan = plan_batches(
            list(map(max, lengths)), self.cost, self.max_sequences, self.max_tokens, self.objective,
            seq_counts=seqs if several else None, token_counts=list(map(sum, lengths)) if several else None,
        )
        chosen = set(plan.batches[next_batch(plan, [it.arrival for it in items], now, self.trigger.slo_s,
                                             self.trigger.max_wait_s)])
        batch = [it for i, it in enumerate(items) if i in chosen]  # arrival order
        remaining = [it for i, it in enumerate(items) if i not in chosen]
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
