"""tools/compare_at_latency.py: throughput read off our curve at the baseline's latency."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import compare_at_latency as cmp  # noqa: E402


def _write(path, points):
    path.write_text(json.dumps({"results": [
        {"latency_per_token_p50_ms": lat, "output_tok_per_s": tok} for lat, tok in points]}))
    return str(path)


def test_interpolates_between_bracketing_points_and_bounds_beyond(tmp_path, capsys):
    ours = [(1.0, 1000.0), (2.0, 5000.0), (10.0, 20000.0)]
    assert cmp.throughput_at(ours, 6.0) == (12500.0, False)  # halfway from 2 ms to 10 ms
    assert cmp.throughput_at(ours, 50.0) == (20000.0, True)  # never that slow: a lower bound
    assert cmp.throughput_at(ours, 0.5) == (0.0, False)
    ours_file = _write(tmp_path / "ours.json", ours + [(float("nan"), 0.0)])
    base_file = _write(tmp_path / "base.json", [(40.0, 800.0), (6.0, 400.0)])
    assert cmp.main([ours_file, base_file]) == 0
    out = capsys.readouterr().out
    assert "| 6.0 | 400 | 12,500 | 31.2x |" in out and "| 40.0 | 800 | >= 20,000 | >= 25.0x |" in out
