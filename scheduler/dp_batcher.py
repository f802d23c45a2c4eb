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
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate, compress, islice
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
    sorted_lengths: Sequence[int]
    pre_seq: Sequence[int]  # prefix sums over the sorted items (ints, or floats holding ints)
    pre_tok: Sequence[int]

    def batch(self, b: int) -> list[int]:
        a, z = self.cuts[b]
        return self.order[a:z]

    def estimate(self, b: int) -> float:
        """From the full model (correction included), for the triggers and metrics."""
        a, z = self.cuts[b]
        return self.cost.batch_seconds(int(self.pre_seq[z] - self.pre_seq[a]), int(self.sorted_lengths[z - 1]),
                                       int(self.pre_tok[z] - self.pre_tok[a]))

    def batch_holding(self, item: int) -> int:
        position = self.order.index(item)
        return bisect_right(self.cuts, (position, len(self.order))) - 1  # the last cut starting at or before it


def _solve(lengths, cost, max_batch_size, max_batch_tokens, objective, seq_counts, token_counts) -> _Solution:
    n = len(lengths)
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
    return _Solution(cost, order, cuts, sl, pre_seq, pre_tok)


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
    group first), so the plan is exactly the loop's plan. A numpy call over the band costs about
    as much as the Python around it, so the band is built in few whole-array passes, over
    contiguous arrays of one dtype (broadcasting or casting costs a pass twice)."""
    lens = np.fromiter(lengths, np.int64, len(lengths))
    n = len(lens)
    order = np.argsort(lens, kind="stable")  # stable like sorted(): equal lengths keep their order
    sl = lens[order]
    one_seq_each = seq_counts is None or max(seq_counts) == min(seq_counts) == 1
    toks = sl if token_counts is None else np.asarray(token_counts, dtype=np.int64)[order]
    tok_sums = _padded_prefix(toks, n)
    pre_tok = tok_sums[n:]
    K = max(1, min(n, max_seqs))  # an item holds a sequence at least: more items exceed the cap
    if token_counts is None and pre_tok[K] > max_tokens:
        # Any k sorted items hold as many tokens as the k shortest at least: when those exceed
        # the cap, so do all groups of k (a cheaper band; but lone items always run).
        K = max(1, int(np.searchsorted(pre_tok, max_tokens, side="right")) - 1)

    dense = _as_array(table)
    band, work, seq_band, index, over = _scratch(K, n)
    toks = _band_sums(tok_sums, K, n, out=band)  # the band holds token counts until the lookup
    sizes, size_offsets, waiting = _constants(K, n, dense.shape[1])
    if one_seq_each:  # a group of k items holds k sequences: constant arrays
        seqs, offsets, pre_seq = sizes, size_offsets, range(n + 1)
    else:
        seq_sums = _padded_prefix(np.asarray(seq_counts, dtype=np.int64)[order], n)
        pre_seq = seq_sums[n:]
        seqs = _band_sums(seq_sums, K, n, out=seq_band)
    over = np.greater(toks[1:], max_tokens, out=over[1:])  # row 0, a lone item, always runs
    if not one_seq_each:
        over |= seqs[1:] > max_seqs
    if getattr(cost, "packed", True):
        # The flat index seqs * W + toks // seqs, by truncation: toks/seqs lies at least 1/seqs
        # below the next integer, and the two roundings (2**-53 relative) add less while
        # index * seqs < 2**50.
        column = np.divide(toks, seqs, out=work)
    else:  # padded: the longest of sorted[e-k:e] is sl[e-1] whatever k
        column = sl.astype(np.float64)
    if not one_seq_each:
        offsets = np.multiply(seqs, dense.shape[1], out=seq_band)  # (seqs is not needed any more)
    np.add(column, offsets, out=work)
    np.copyto(index, work, casting="unsafe")
    band = dense.take(index, mode="clip", out=band)
    np.putmask(band[1:], over, np.inf)
    if objective == "latency":  # weighted by the sequences waiting from the group's start e-k on
        if one_seq_each:
            band *= waiting
        else:
            weight = pre_seq[-1] - pre_seq[:-1]
            band *= _diagonals(np.concatenate((np.ones(K), weight)), K, n, K, -1)  # (1: no inf * 0)
    pred = _band_shortest_path(band, work)
    start = [0] * (n + 1)  # only the backtrack's positions are filled
    i = n
    while i > 0:  # argmin takes the first of ties: the smallest group, as the loop does
        start[i] = i - 1 - int(np.add(pred[:, i - 1], band[:, i - 1]).argmin())
        i = start[i]
    return order.tolist(), sl, pre_seq, pre_tok, start


def _padded_prefix(values, pad: int):
    """`pad` zeros, then the prefix sums of `values` (from 0) as floats: exact for integers
    below 2**53, and of the band's dtype (a mixed-dtype numpy call converts: twice the cost).
    The zeros are what groups reaching before position 0 read: harmless numbers, as the path
    search sees no node before 0 (+inf)."""
    out = np.zeros(pad + len(values) + 1)
    np.cumsum(values, out=out[pad + 1:])
    return out


def _band_sums(padded, K: int, n: int, out):
    """Sums over the groups of k = 1..K sorted items ending at positions e = 1..n into a (K, n)
    array: out[k-1, e-1] = prefix[e] - prefix[e-k], from _padded_prefix(values, n)."""
    return np.subtract(padded[n + 1:], _diagonals(padded, K, n, n, -1), out=out)


def _diagonals(x, K: int, n: int, start: int, step: int):
    """The (K, n) view v[r, j] = x[start + step * r + j] of a contiguous array, without a copy."""
    return np.ndarray((K, n), x.dtype, x, start * x.itemsize, (step * x.itemsize, x.itemsize))


@lru_cache(maxsize=8)
def _constants(K: int, n: int, width: int):
    """(K, n) arrays that depend on the band's shape only, when every item is one sequence:
    the group sizes k (row k-1), the flat table offsets k * width, and the latency weights
    n - (e - k), the sequences waiting from the group's start on. Whole arrays, not (K, 1)
    columns: numpy broadcasting one costs about a pass more. Read-only: shared by threads."""
    sizes = np.repeat(np.arange(1.0, K + 1), n).reshape(K, n)
    ends = np.arange(1.0, n + 1)
    arrays = (sizes, sizes * width, (n - ends) + sizes)
    for a in arrays:
        a.flags.writeable = False
    return arrays


def _band_shortest_path(band, scratch):
    """dist[e] = min_k dist[e-k] + band[k-1, e-1] for e = 1..n, dist[0] = 0; returns the view
    pred[k-1, e-1] = dist[e-k] of the solution (the candidates are pred + band).

    Jacobi (Bellman-Ford) rounds over a window of 2K columns at the frontier: a round relaxes
    all its nodes at once from the values before the round. Every value is the cost of a real
    path and only decreases (a minimum over values that only decrease, starting with the
    one-group plans). Nodes up to the frontier f are final; in a round, every node of the
    window before the first that decreased kept a value computed from final predecessors
    (induction from f), and so did that first one: all are final, and the frontier moves past
    it, or past the window if nothing decreased. Final values are min_k fl(dist[e-k] +
    band[k-1, e-1]) of final values, the very floats the loop computes. Rounds: about the
    number of batches in the plan or n / K, whichever is more. The 2K window measured fastest:
    a wider one computes nodes that cannot be final yet, a narrower one takes more rounds.
    The window's candidates go to a contiguous part of `scratch` (a (K, n) array), which numpy
    writes about twice as fast as a window of a (K, n) array."""
    K, n = band.shape
    padded = np.full(K + n + 1, np.inf)
    padded[K] = 0.0
    dist = padded[K:]  # dist[e] is node e; before node 0, +inf
    dist[1:K + 1] = band.diagonal()  # one group from position 0
    pred = _diagonals(padded, K, n, K, -1)  # pred[k-1, e-1] = dist[e-k]
    new = np.empty(n)
    scratch = scratch.reshape(-1)
    f = 0  # nodes 0..f are final; the window is columns f..f+2K-1 (nodes f+1..f+2K)
    while f < n:
        hi = min(n, f + 2 * K)
        window = np.add(pred[:, f:hi], band[:, f:hi], out=scratch[:K * (hi - f)].reshape(K, hi - f))
        lower = np.minimum.reduce(window, axis=0, out=new[f:hi]) < dist[f + 1:hi + 1]
        first = int(lower.argmax())  # the first True, or 0 if none
        dist[f + 1:hi + 1] = new[f:hi]
        f = f + first + 1 if lower[first] else hi
    return pred


_scratch_space = threading.local()


def _scratch(K: int, n: int):
    """Three float, one int and one bool (K, n) scratch arrays, kept per thread: arrays this
    large are fresh pages from the OS at each call otherwise (the allocator hands them back),
    and the page faults cost more than the arithmetic. The views of the last shape are kept
    too (making five costs several microseconds)."""
    space = getattr(_scratch_space, "arrays", None)
    if space is None or space[1].size < K * n:
        space = _scratch_space.arrays = (np.empty(3 * K * n), np.empty(K * n, dtype=np.intp),
                                         np.empty(K * n, dtype=bool))
        _scratch_space.views = {}
    views = _scratch_space.views.get((K, n))
    if views is None:
        floats, ints, bools = space
        views = [floats[i * K * n:(i + 1) * K * n].reshape(K, n) for i in range(3)]
        views += [ints[: K * n].reshape(K, n), bools[: K * n].reshape(K, n)]
        if len(_scratch_space.views) >= 8:
            _scratch_space.views.clear()
        _scratch_space.views[(K, n)] = views
    return views


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
        lengths = [it.lengths for it in items]
        if max(map(len, lengths)) > 1:  # requests of several sequences, which run together
            plan = _solve(list(map(max, lengths)), self.cost, self.max_sequences, self.max_tokens, self.objective,
                          list(map(len, lengths)), list(map(sum, lengths)))
        else:  # one sequence each: counts and tokens are implied
            plan = _solve([lens[0] for lens in lengths], self.cost, self.max_sequences, self.max_tokens,
                          self.objective, None, None)
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
