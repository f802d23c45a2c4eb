"""tools/soak.py's judgement: memory that levels off after the warm-up (a KV cache's pages being
touched the first time) passes, a steady climb (a leak) fails, whatever the warm-up hides."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import soak  # noqa: E402


def _samples(mib_at):
    return [(t, {"engine:g": mib_at(t / 60), "stub:g": 250.0}) for t in range(0, 30 * 60 + 1, 30)]


def test_memory_that_levels_off_passes_on_the_last_half():
    groups = soak.growth(_samples(lambda m: 1000 + 90 * min(m, 8)), warmup_seconds=5 * 60)
    g = groups["engine:g"]
    assert g["after_warmup_mib"] == 1450 and g["end_mib"] == 1720
    assert g["mib_per_min"] > 1  # the whole window still sees the tail of the climb
    assert abs(g["last_half_mib_per_min"]) < 1e-9
    assert groups["stub:g"]["last_half_mib_per_min"] == 0


def test_a_steady_leak_fails_in_both_halves():
    g = soak.growth(_samples(lambda m: 400 + 2.0 * m), warmup_seconds=5 * 60)["engine:g"]
    assert abs(g["mib_per_min"] - 2.0) < 1e-9 and abs(g["last_half_mib_per_min"] - 2.0) < 1e-9


def test_a_group_seen_only_in_the_warm_up_has_no_points():
    samples = [(0.0, {"engine:x": 100.0}), (600.0, {"stub:y": 5.0}), (660.0, {"stub:y": 5.0})]
    g = soak.growth(samples, warmup_seconds=300)
    assert g["engine:x"]["end_mib"] is None and g["stub:y"]["end_mib"] == 5.0
