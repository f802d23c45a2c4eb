"""How long a batch takes: a sparse measured grid, interpolated, persisted, refined online.

The DP batcher is only as good as its cost estimates. They are measured on the runtime that
actually serves (packed or padded, this GPU, this model, this dtype) over a sparse grid of
(number of sequences, sequence length), interpolated bilinearly in between, saved to a JSON
file keyed by what they depend on, and corrected by observed batch latencies while serving.
Pure Python: measuring is the backend's job (it calls `measure` with a timing function).
"""
from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

DEFAULT_SEQS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_LENGTHS = (8, 16, 32, 64, 128, 256, 512)


@dataclass
class GridCostModel:
    seqs: tuple[int, ...]
    lengths: tuple[int, ...]
    seconds: list[list[float]]  # seconds[i][j]: seqs[i] sequences of lengths[j] tokens each
    packed: bool = True  # packed runtime: cost follows the mean length; padded: the longest
    key: dict = field(default_factory=dict)  # gpu, model, dtype, runtime version, ...
    correction: float = 1.0  # observed / predicted, smoothed
    observations: int = 0
    abs_error_sum: float = 0.0

    # ---- estimates --------------------------------------------------------------------
    def batch_seconds(self, num_seqs: int, max_len: int, total_tokens: int) -> float:
        length = total_tokens / num_seqs if self.packed else max_len
        return self.correction * self._interpolate(num_seqs, length)

    def _interpolate(self, n: float, length: float) -> float:
        i0, i1, wi = _bracket(self.seqs, n)
        j0, j1, wj = _bracket(self.lengths, length)
        s = self.seconds
        low = s[i0][j0] * (1 - wj) + s[i0][j1] * wj
        high = s[i1][j0] * (1 - wj) + s[i1][j1] * wj
        return max(0.0, low * (1 - wi) + high * wi)

    def dense_table(self, max_seqs: int, max_len: int) -> list[list[float]]:
        """Uncorrected estimates for every (sequences 0..max_seqs, mean or longest length
        0..max_len), so the DP's inner loop is a list lookup rather than an interpolation.
        (The correction factor scales every cost alike: it cannot change the DP's choice.)"""
        table = self.__dict__.get("_dense")
        if table is None or len(table) <= max_seqs or len(table[0]) <= max_len:
            # Built once, at least as large as the grid, and only rebuilt for a larger request;
            # it never shrinks in the other dimension (alternating requests would rebuild it).
            seqs = max(max_seqs, self.seqs[-1], len(table) - 1 if table else 0)
            lengths = max(max_len, self.lengths[-1], len(table[0]) - 1 if table else 0)
            table = [[self._interpolate(max(n, 1), max(length, 1)) for length in range(lengths + 1)]
                     for n in range(seqs + 1)]
            self.__dict__["_dense"] = table
        return table

    # ---- learning from what ran -------------------------------------------------------
    def observe(self, num_seqs: int, max_len: int, total_tokens: int, seconds: float, alpha: float = 0.05) -> None:
        """Fold an observed batch latency into a smoothed global correction factor."""
        predicted = self.batch_seconds(num_seqs, max_len, total_tokens)
        if predicted <= 0:
            return
        self.abs_error_sum += abs(seconds - predicted) / seconds if seconds > 0 else 0.0
        self.observations += 1
        self.correction *= (1 - alpha) + alpha * (seconds / predicted)

    @property
    def mean_relative_error(self) -> float:
        return self.abs_error_sum / self.observations if self.observations else 0.0

    # ---- measuring, saving, loading ---------------------------------------------------
    @classmethod
    def measure(
        cls,
        time_batch: Callable[[int, int], float],
        key: dict,
        packed: bool = True,
        seqs: tuple[int, ...] = DEFAULT_SEQS,
        lengths: tuple[int, ...] = DEFAULT_LENGTHS,
        max_tokens: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> "GridCostModel":
        """Time `time_batch(num_seqs, length)` over the grid. Cells over `max_tokens` are
        extrapolated linearly in the number of sequences from the rows above them."""
        table: list[list[float]] = []
        total, done = len(seqs) * len(lengths), 0
        for n in seqs:
            row = []
            for j, length in enumerate(lengths):
                if max_tokens is not None and n * length > max_tokens and table:
                    row.append(_extend(seqs[: len(table)], [r[j] for r in table], n))
                else:
                    row.append(time_batch(n, length))
                done += 1
                if progress:
                    progress(done, total)
            table.append(row)
        return cls(seqs=tuple(seqs), lengths=tuple(lengths), seconds=table, packed=packed, key=dict(key))

    def to_json(self) -> dict:
        return {"key": self.key, "seqs": list(self.seqs), "lengths": list(self.lengths),
                "seconds": self.seconds, "packed": self.packed}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        os.replace(tmp, path)  # never a half-written table

    @classmethod
    def load(cls, path: Path, key: dict) -> "GridCostModel | None":
        """The saved table when it was measured for exactly this key, else None."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
        if data.get("key") != key:
            return None
        return cls(seqs=tuple(data["seqs"]), lengths=tuple(data["lengths"]), seconds=data["seconds"],
                   packed=data["packed"], key=data["key"])


def _bracket(grid: tuple[int, ...], x: float) -> tuple[int, int, float]:
    """Indices around x and the weight of the upper one; linear extrapolation past the ends."""
    if len(grid) == 1:
        return 0, 0, 0.0
    j = bisect.bisect_left(grid, x)
    j = min(max(j, 1), len(grid) - 1)
    lo, hi = grid[j - 1], grid[j]
    return j - 1, j, (x - lo) / (hi - lo)


def _extend(ns: tuple[int, ...], values: list[float], n: int) -> float:
    """Linear extrapolation in the number of sequences through the last two known rows."""
    if len(ns) == 1:
        return values[0] * n / ns[0]
    (n0, v0), (n1, v1) = (ns[-2], values[-2]), (ns[-1], values[-1])
    return v1 + (v1 - v0) * (n - n1) / (n1 - n0)
