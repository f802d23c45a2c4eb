"""The batch cost table: interpolation, persistence keyed by set-up, online correction; and
the DP policy's triggers and decisions on a fake clock."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest

from tritonformer.scheduler.cost_model import GridCostModel
from tritonformer.scheduler.dp_batcher import DpBatchPolicy, TriggerPolicy


def linear_cost(n, length):
    return 0.001 + 1e-6 * n * length  # launch + per token


def test_measured_grid_interpolates_and_extrapolates():
    calls = []

    def time_batch(n, length):
        calls.append((n, length))
        return linear_cost(n, length)

    model = GridCostModel.measure(time_batch, {"gpu": "x"}, seqs=(1, 4, 16), lengths=(16, 64, 256), max_tokens=1024)
    assert (16, 256) not in calls and (1, 256) in calls  # over the token cap: extrapolated, not run
    # On grid points and between them the bilinear estimate is exact for a bilinear truth.
    for n, length in ((4, 64), (2, 40), (10, 100), (16, 256), (3, 200)):
        assert model.batch_seconds(n, length, n * length) == pytest.approx(linear_cost(n, length), rel=1e-6)
    # Packed: a mixed batch costs what its mean length costs, not its longest.
    assert model.batch_seconds(2, 200, 210) == pytest.approx(linear_cost(2, 105), rel=1e-6)
    assert model.batch_seconds(32, 512, 32 * 512) > model.batch_seconds(16, 256, 16 * 256)  # beyond the grid


def test_saved_table_reloads_only_for_the_same_setup(tmp_path):
    model = GridCostModel.measure(linear_cost, {"gpu": "H100", "dtype": "fp16"}, seqs=(1, 2), lengths=(8, 16))
    path = tmp_path / "costs.json"
    model.save(path)
    again = GridCostModel.load(path, {"gpu": "H100", "dtype": "fp16"})
    assert again is not None and again.seconds == model.seconds
    assert GridCostModel.load(path, {"gpu": "H100", "dtype": "bf16"}) is None  # other set-up: re-measure
    path.write_text("{ truncated")
    assert GridCostModel.load(path, {"gpu": "H100", "dtype": "fp16"}) is None


def test_observed_latencies_correct_the_estimates():
    model = GridCostModel.measure(linear_cost, {}, seqs=(1, 8), lengths=(8, 64))
    for _ in range(200):  # the real runtime is twice as slow as measured
        model.observe(4, 32, 128, 2 * linear_cost(4, 32))
    assert model.batch_seconds(4, 32, 128) == pytest.approx(2 * linear_cost(4, 32), rel=0.01)
    assert 0 < model.mean_relative_error < 0.5


@dataclass(eq=False)
class Item:
    lengths: list[int]
    arrival: float
    tag: str = field(default="")


def test_dp_policy_takes_a_length_homogeneous_batch_and_keeps_the_rest():
    model = GridCostModel.measure(linear_cost, {}, seqs=(1, 64), lengths=(8, 512))
    policy = DpBatchPolicy(model, max_sequences=4, max_tokens=10_000)
    queue = deque(Item([n], arrival=i * 1e-4) for i, n in enumerate([500, 10, 480, 12, 11, 490, 9, 13]))
    batch = policy.take(queue, now=0.001)
    assert sorted(max(it.lengths) for it in batch) == [9, 10, 11, 12]  # the short ones together
    assert len(queue) == 4 and all(max(it.lengths) >= 13 for it in queue)
    assert [it.arrival for it in queue] == sorted(it.arrival for it in queue)  # order kept
    assert policy.last_decision_seconds > 0


def test_dp_policy_never_starves_the_oldest():
    model = GridCostModel.measure(linear_cost, {}, seqs=(1, 64), lengths=(8, 512))
    policy = DpBatchPolicy(model, max_sequences=4, max_tokens=10_000, trigger=TriggerPolicy(max_wait_s=0.1))
    queue = deque([Item([500], arrival=0.0)] + [Item([10], arrival=0.05 + i * 1e-3) for i in range(8)])
    batch = policy.take(queue, now=0.2)  # the long request waited past the bound
    assert any(max(it.lengths) == 500 for it in batch)


def test_lazy_trigger_waits_then_fires():
    model = GridCostModel.measure(linear_cost, {}, seqs=(1, 64), lengths=(8, 512))
    policy = DpBatchPolicy(model, trigger=TriggerPolicy(mode="lazy", lazy_timeout_s=0.002, lazy_max_queue=3))
    queue = deque([Item([10], arrival=1.0)])
    assert not policy.ready(queue, now=1.001)
    assert policy.wait_timeout(queue, now=1.001) == pytest.approx(0.001)
    assert policy.ready(queue, now=1.0021)
    queue.extend([Item([10], arrival=1.0005), Item([10], arrival=1.0006)])
    assert policy.ready(queue, now=1.0007)  # queue full
    assert DpBatchPolicy(model).wait_timeout(queue, now=1.0) is None  # hungry never sleeps on a timer
