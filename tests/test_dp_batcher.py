"""The DP length batcher against brute force, the paper's example, and the trigger rules."""
from __future__ import annotations

import contextlib
import functools
import itertools
import random
from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonformer.scheduler import dp_batcher
from tritonformer.scheduler.cost_model import GridCostModel
from tritonformer.scheduler.dp_batcher import DpBatchPolicy, TriggerPolicy, next_batch, plan_batches


class PaddedCost:
    """A padded-batch cost: fixed launch cost + per padded token, + per sequence."""

    def __init__(self, launch=1.0, per_token=0.01, per_seq=0.05):
        self.launch, self.per_token, self.per_seq = launch, per_token, per_seq

    def batch_seconds(self, num_seqs, max_len, total_tokens):
        return self.launch + self.per_token * num_seqs * max_len + self.per_seq * num_seqs


def _contiguous_partitions(n):
    for cuts in itertools.product([False, True], repeat=max(0, n - 1)):
        groups, start = [], 0
        for i, cut in enumerate(cuts, start=1):
            if cut:
                groups.append((start, i))
                start = i
        groups.append((start, n))
        yield groups


def _brute_force(lengths, cost, max_bs, max_tokens, objective):
    sl = sorted(lengths)
    best = float("inf")
    for groups in _contiguous_partitions(len(sl)):
        ok = all(b - a <= max_bs and (b - a == 1 or sum(sl[a:b]) <= max_tokens) for a, b in groups)
        if not ok:
            continue
        costs = [cost.batch_seconds(b - a, sl[b - 1], sum(sl[a:b])) for a, b in groups]
        if objective == "throughput":
            total = sum(costs)
        else:  # sum of completion times, batches run in order
            total, clock = 0.0, 0.0
            for (a, b), c in zip(groups, costs):
                clock += c
                total += (b - a) * clock
        best = min(best, total)
    return best


def _objective_value(plan, lengths, objective):
    if objective == "throughput":
        return sum(plan.estimated_seconds)
    total, clock = 0.0, 0.0
    for batch, c in zip(plan.batches, plan.estimated_seconds):
        clock += c
        total += len(batch) * clock
    return total


@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=9),
    max_bs=st.integers(1, 9),
    max_tokens=st.integers(1, 1500),
    launch=st.floats(0.0, 5.0),
    objective=st.sampled_from(["throughput", "latency"]),
)
@settings(max_examples=300, deadline=None)
def test_dp_equals_brute_force(lengths, max_bs, max_tokens, launch, objective):
    cost = PaddedCost(launch=launch)
    plan = plan_batches(lengths, cost, max_bs, max_tokens, objective)
    # Every request exactly once, caps respected, batches sorted by length and run shortest first.
    assert sorted(i for b in plan.batches for i in b) == list(range(len(lengths)))
    for batch in plan.batches:
        assert len(batch) <= max_bs
        assert len(batch) == 1 or sum(lengths[i] for i in batch) <= max_tokens
    flat = [lengths[i] for b in plan.batches for i in b]
    assert flat == sorted(flat)
    assert _objective_value(plan, lengths, objective) == pytest.approx(
        _brute_force(lengths, cost, max_bs, max_tokens, objective), rel=1e-9, abs=1e-9
    )


def test_paper_example_three_batches():
    """TurboTransformers Fig. 8: lengths 17, 18, 52, 63, 77; the optimum is {17,18} {52,63} {77}
    in 15.24 ms against 20.62 ms without batching."""
    measured = {(1, 17): 2.97, (1, 18): 2.97, (1, 52): 4.54, (1, 63): 4.61, (1, 77): 5.53, (2, 18): 4.35, (2, 63): 5.36}

    class TableCost:
        def batch_seconds(self, num_seqs, max_len, total_tokens):
            return measured.get((num_seqs, max_len), 1e9)  # groups the figure does not show: never

    plan = plan_batches([52, 17, 77, 18, 63], TableCost(), max_batch_size=20, max_batch_tokens=10**6)
    assert [[[52, 17, 77, 18, 63][i] for i in b] for b in plan.batches] == [[17, 18], [52, 63], [77]]
    assert sum(plan.estimated_seconds) == pytest.approx(15.24)


def test_batching_wins_when_launch_dominates_and_not_when_padding_does():
    lengths = [10, 11, 12, 500]
    plan = plan_batches(lengths, PaddedCost(launch=5.0, per_token=0.001), 64, 10**6)
    assert [sorted(lengths[i] for i in b) for b in plan.batches] == [[10, 11, 12, 500]]
    plan = plan_batches(lengths, PaddedCost(launch=0.1, per_token=0.01), 64, 10**6)
    assert [sorted(lengths[i] for i in b) for b in plan.batches] == [[10, 11, 12], [500]]


def test_empty_queue_and_bad_objective():
    assert plan_batches([], PaddedCost(), 4, 100).batches == []
    with pytest.raises(ValueError, match="objective"):
        plan_batches([3], PaddedCost(), 4, 100, objective="fast")


def test_trigger_modes_with_a_fake_clock():
    est = lambda: 0.010  # noqa: E731
    hungry = TriggerPolicy(mode="hungry")
    assert hungry.should_dispatch(100.0, 99.999, 1, True, est)
    assert not hungry.should_dispatch(100.0, 99.999, 1, False, est)  # runtime busy
    assert not hungry.should_dispatch(100.0, None, 0, True, est)  # nothing queued

    lazy = TriggerPolicy(mode="lazy", lazy_timeout_s=0.005, lazy_max_queue=8)
    assert not lazy.should_dispatch(100.0, 99.998, 3, True, est)
    assert lazy.should_dispatch(100.0, 99.994, 3, True, est)  # timeout
    assert lazy.should_dispatch(100.0, 99.999, 8, True, est)  # queue full

    slo = TriggerPolicy(mode="slo", slo_s=0.040, lazy_timeout_s=1.0, lazy_max_queue=100)
    assert not slo.should_dispatch(100.0, 99.995, 2, True, est)  # 5 + 10 ms < 20 ms
    assert slo.should_dispatch(100.0, 99.989, 2, True, est)  # 11 + 10 ms > 20 ms

    starving = TriggerPolicy(mode="lazy", lazy_timeout_s=10.0, lazy_max_queue=10**6, max_wait_s=0.5)
    assert starving.should_dispatch(100.0, 99.4, 1, True, est)


def test_next_batch_serves_the_oldest_when_it_would_miss_its_budget():
    lengths = [400, 10, 12, 11]
    plan = plan_batches(lengths, PaddedCost(launch=0.001, per_token=0.0001, per_seq=0.0), 3, 10**6)
    assert [[lengths[i] for i in b] for b in plan.batches] == [[10, 11, 12], [400]]
    arrivals = [0.0, 0.9, 0.95, 0.97]  # the long request is the oldest
    assert next_batch(plan, arrivals, now=1.0, slo_s=10.0, max_wait_s=10.0) == 0  # no risk: shortest first
    holder = 1  # the batch holding request 0 (length 400)
    assert next_batch(plan, arrivals, now=1.0, slo_s=1.0, max_wait_s=10.0) == holder  # would miss 1 s
    assert next_batch(plan, arrivals, now=1.0, slo_s=10.0, max_wait_s=0.5) == holder  # starvation bound


@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=9),
    max_bs=st.integers(1, 9),
    max_tokens=st.integers(1, 1500),
    objective=st.sampled_from(["throughput", "latency"]),
)
@settings(max_examples=150, deadline=None)
def test_dp_with_a_measured_grid_equals_brute_force(lengths, max_bs, max_tokens, objective):
    """The fast path (a dense cost table, inlined loop) finds the same optimum."""
    from tritonformer.scheduler.cost_model import GridCostModel

    grid = GridCostModel.measure(lambda n, length: 0.5 + 0.01 * n * length + 0.002 * n * n, {},
                                 seqs=(1, 3, 9), lengths=(1, 50, 300))

    class Exact:  # what the dense table holds: the grid at the mean length, rounded down
        def batch_seconds(self, num_seqs, max_len, total_tokens):
            return grid.batch_seconds(num_seqs, max_len, (total_tokens // num_seqs) * num_seqs)

    plan = plan_batches(lengths, grid, max_bs, max_tokens, objective)
    exact = Exact()
    costs = [exact.batch_seconds(len(b), max(lengths[i] for i in b), sum(lengths[i] for i in b)) for b in plan.batches]
    if objective == "throughput":
        value = sum(costs)
    else:
        value, clock = 0.0, 0.0
        for batch, c in zip(plan.batches, costs):
            clock += c
            value += len(batch) * clock
    assert value == pytest.approx(_brute_force(lengths, exact, max_bs, max_tokens, objective), rel=1e-9)
    assert sorted(i for b in plan.batches for i in b) == list(range(len(lengths)))


@contextlib.contextmanager
def _dp_path(native: bool):
    """Plan with the compiled loop (scheduler/_dp_native.c, with a dense table) or the Python one."""
    saved = dp_batcher.USE_NATIVE
    dp_batcher.USE_NATIVE = native
    try:
        yield
    finally:
        dp_batcher.USE_NATIVE = saved


@functools.lru_cache(maxsize=None)
def _grid(packed=True):
    return GridCostModel.measure(lambda n, length: 0.5 + 0.01 * n * length + 0.002 * n * n, {},
                                 seqs=(1, 3, 9), lengths=(1, 50, 300), packed=packed)


def _table_value(groups, table, packed, objective):
    """A plan's objective from the dense table, as the DP sees it; groups: (seqs, tokens, longest)."""
    total, waiting = 0.0, sum(s for s, _, _ in groups)
    for n_seq, n_tok, longest in groups:
        c = table[n_seq][n_tok // n_seq if packed else longest]
        total += c if objective == "throughput" else waiting * c
        waiting -= n_seq
    return total


@given(
    items=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 3)), min_size=1, max_size=9),
    max_bs=st.integers(1, 9),
    max_tokens=st.integers(1, 1500),
    packed=st.booleans(),
    objective=st.sampled_from(["throughput", "latency"]),
)
@settings(max_examples=150, deadline=None)
def test_native_dp_equals_brute_force(items, max_bs, max_tokens, packed, objective):
    """The compiled loop on small queues of requests (one to three sequences each), packed or
    padded, with both objectives: the optimum of every partition, and the caps kept."""
    lengths = [length for length, _ in items]
    seqs = [count for _, count in items]
    tokens = [length * count - (count - 1) for length, count in items]  # the others shorter
    grid = _grid(packed)
    with _dp_path(native=True):
        plan = plan_batches(lengths, grid, max_bs, max_tokens, objective, seq_counts=seqs, token_counts=tokens)
    table = grid.dense_table(max(max_bs, 3), 300)

    def group(batch):
        return sum(seqs[i] for i in batch), sum(tokens[i] for i in batch), max(lengths[i] for i in batch)

    assert sorted(i for b in plan.batches for i in b) == list(range(len(items)))
    for batch in plan.batches:
        n_seq, n_tok, _ = group(batch)
        assert len(batch) == 1 or (n_seq <= max_bs and n_tok <= max_tokens)
    order = sorted(range(len(items)), key=lambda i: lengths[i])
    best = float("inf")
    for cuts in _contiguous_partitions(len(items)):
        groups = [group(order[a:b]) for a, b in cuts]
        if all(b - a == 1 or (g[0] <= max_bs and g[1] <= max_tokens) for (a, b), g in zip(cuts, groups)):
            best = min(best, _table_value(groups, table, packed, objective))
    value = _table_value([group(b) for b in plan.batches], table, packed, objective)
    assert value == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("objective", ["throughput", "latency"])
def test_native_dp_plans_exactly_like_the_loop_on_long_queues(objective):
    """Long queues, caps that bind or not, requests of several sequences, packed and padded:
    the compiled loop returns the loop's very plan (same floats, same tie-breaks)."""
    rng = random.Random(0)
    models = {packed: _grid(packed) for packed in (True, False)}
    for case in range(24):
        n = rng.randint(20, 260)
        lengths = [rng.randint(1, 300) for _ in range(n)]
        seqs = [rng.randint(1, 3) for _ in range(n)] if case % 3 == 0 else None
        tokens = [length * count - (count - 1) for length, count in zip(lengths, seqs)] if seqs else None
        max_bs, max_tokens = rng.choice([8, 9, 64, 300]), rng.choice([600, 4000, 10**9])
        cost = models[case % 2 == 0]
        plans = []
        for native in (False, True):
            with _dp_path(native):
                plans.append(plan_batches(lengths, cost, max_bs, max_tokens, objective, seqs, tokens))
        assert plans[0] == plans[1], (case, n, max_bs, max_tokens)
        for batch in plans[1].batches:
            n_seq = sum(seqs[i] for i in batch) if seqs else len(batch)
            n_tok = sum(tokens[i] for i in batch) if seqs else sum(lengths[i] for i in batch)
            assert len(batch) == 1 or (n_seq <= max_bs and n_tok <= max_tokens)


@dataclass(eq=False)
class _Request:
    lengths: list[int]
    arrival: float


@pytest.mark.parametrize("objective", ["throughput", "latency"])
def test_policy_take_on_a_long_queue_matches_the_loop(objective):
    """DpBatchPolicy.take over a long window, compiled loop and Python loop, with requests of one
    and of several sequences: the loop's batch, in arrival order, and the rest kept in order."""
    rng = random.Random(1)
    requests = [_Request([rng.randint(1, 300) for _ in range(rng.choice([1, 1, 1, 2, 3]))], arrival=i * 1e-4)
                for i in range(150)]
    taken = []
    for native in (False, True):
        policy = DpBatchPolicy(_grid(), max_sequences=16, max_tokens=3000, objective=objective, window=100)
        queue = deque(requests)
        with _dp_path(native):
            taken.append((policy.take(queue, now=0.1), list(queue)))
    (batch, rest), (batch_native, rest_native) = taken
    assert batch_native == batch and rest_native == rest
    assert sorted(batch + rest, key=lambda r: r.arrival) == requests
    assert [r.arrival for r in rest] == sorted(r.arrival for r in rest)


@given(
    items=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 3)), min_size=1, max_size=90),
    several=st.booleans(),
    max_bs=st.integers(1, 70),
    max_tokens=st.one_of(st.integers(1, 6000), st.just(10**9)),
    packed=st.booleans(),
    objective=st.sampled_from(["throughput", "latency"]),
)
@settings(max_examples=200, deadline=None)
def test_native_dp_plans_exactly_like_the_loop_on_random_queues(items, several, max_bs, max_tokens, packed,
                                                                    objective):
    """Fresh random queues (many equal lengths, caps that bind on the shortest items or not,
    one sequence per item or several): the compiled loop's plan is the loop's, floats included."""
    lengths = [length for length, _ in items]
    seqs = [count for _, count in items] if several else None
    tokens = [length * count - (count - 1) for length, count in items] if several else None
    plans = []
    for native in (False, True):
        with _dp_path(native):
            plans.append(plan_batches(lengths, _grid(packed), max_bs, max_tokens, objective, seqs, tokens))
    assert plans[0] == plans[1]


@given(
    requests=st.lists(st.tuples(st.lists(st.integers(1, 300), min_size=1, max_size=3), st.floats(0.0, 1.0)),
                      min_size=1, max_size=60),
    now=st.floats(1.0, 1.2),
    slo_s=st.floats(0.001, 100.0),  # the grid estimates a batch at 1 to 30 s
    max_wait_s=st.floats(0.5, 2.0),
    window=st.integers(1, 60),
    native=st.booleans(),
    objective=st.sampled_from(["throughput", "latency"]),
)
@settings(max_examples=150, deadline=None)
def test_policy_take_runs_the_batch_next_batch_picks(requests, now, slo_s, max_wait_s, window, native, objective):
    """take (which estimates batch times only when the oldest request is at risk) takes the
    batch next_batch picks from the full plan of its window, in arrival order, and keeps the
    rest of the queue in order; arrivals need not be sorted."""
    queue = deque(_Request(lengths, arrival) for lengths, arrival in requests)
    everything = list(queue)
    items = everything[:window]
    trigger = TriggerPolicy(slo_s=slo_s, max_wait_s=max_wait_s)
    policy = DpBatchPolicy(_grid(), max_sequences=8, max_tokens=1200, objective=objective, trigger=trigger,
                           window=window)
    several = any(len(r.lengths) > 1 for r in items)
    with _dp_path(native):
        plan = plan_batches([max(r.lengths) for r in items], _grid(), 8, 1200, objective,
                            [len(r.lengths) for r in items] if several else None,
                            [sum(r.lengths) for r in items] if several else None)
        expected = sorted(plan.batches[next_batch(plan, [r.arrival for r in items], now, slo_s, max_wait_s)])
        batch = policy.take(queue, now)
    assert batch == [items[i] for i in expected]
    assert list(queue) == [r for r in everything if r not in batch]  # (_Request compares by identity)


def test_the_compiled_loop_is_built_by_the_install():
    """`pip install` builds scheduler/_dp_native.c; without it every decision takes the Python
    loop (~1.7 ms for 256 queued), so a missing build must fail here, not pass slowly."""
    assert dp_batcher._dp_native is not None and dp_batcher.USE_NATIVE


def test_the_compiled_loop_refuses_bad_input():
    import numpy as np

    solve = dp_batcher._dp_native.solve
    table = np.ones((4, 8))
    order, cuts, stats = solve([3, 1, 2, 1], None, None, False, table, True, 2, 100)
    assert order == [1, 3, 2, 0] and cuts[-1][1] == 4 and sum(s[0] for s in stats) == 4
    assert solve([], None, None, True, table, True, 2, 100) == ([], [], [])
    with pytest.raises(ValueError, match="seq_counts has 1 items"):
        solve([3, 1], [1], None, False, table, True, 2, 100)
    with pytest.raises(ValueError, match="seq_counts\\[1\\] is 0"):
        solve([3, 1], [1, 0], None, False, table, True, 2, 100)
    with pytest.raises(ValueError, match="out of range"):
        solve([3, -1], None, None, False, table, True, 2, 100)
    with pytest.raises(TypeError):
        solve([3, 1.5], None, None, False, table, True, 2, 100)
    with pytest.raises(TypeError, match="2-D C-contiguous float64"):
        solve([3, 1], None, None, False, np.ones((4, 8), dtype=np.float32), True, 2, 100)
    with pytest.raises(TypeError, match="2-D C-contiguous float64"):
        solve([3, 1], None, None, False, np.ones(8), True, 2, 100)
    with pytest.raises(IndexError, match="these items need 3 x 9"):  # the caller grows the table
        solve([8, 1], [2, 1], None, False, np.ones((3, 8)), True, 2, 100)
    # Requests as their sequences' lengths: the same plan as their longest / count / sum.
    requests = [[3], [1, 1, 4], [2, 2]]
    assert solve(requests, None, None, True, table, True, 3, 100) == solve(
        [3, 4, 2], [1, 3, 2], [3, 6, 4], True, table, True, 3, 100)
    with pytest.raises(ValueError, match="carry their own counts"):
        solve(requests, [1, 3, 2], None, False, table, True, 4, 100)
    with pytest.raises(ValueError, match="items\\[1\\] is empty"):
        solve([[3], []], None, None, False, table, True, 4, 100)


@pytest.mark.parametrize("objective", ["throughput", "latency"])
def test_longer_items_than_the_table_has_seen_grow_it(objective):
    """A length past the cost table's columns (or a request larger than its rows) grows the
    table and plans like the Python loop on the grown table."""
    rng = random.Random(3)
    lengths = [rng.randint(1, 300) for _ in range(40)] + [900, 1200]
    requests = [_Request(r, arrival=i) for i, r in enumerate([[n] for n in lengths[:-1]] + [[5] * 12])]
    plans = []
    for native in (False, True):
        grid = GridCostModel.measure(lambda n, length: 0.5 + 0.01 * n * length, {}, seqs=(1, 3, 9),
                                     lengths=(1, 50, 300), packed=True)
        with _dp_path(native):
            policy = DpBatchPolicy(grid, max_sequences=8, max_tokens=3000, objective=objective, window=64)
            plans.append((plan_batches(lengths, grid, 8, 3000, objective),
                          policy.take(deque(requests), now=1.0)))
    assert plans[0] == plans[1]
    assert len(grid.dense_table(8, 0)[0]) > 1200 and len(grid.dense_table(8, 0)) > 12
