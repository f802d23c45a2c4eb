"""Host time of each decoder-engine phase per step, by wall clock (no profiler).

A profiler slows the host 2-3x and so hides which phase a step really waits for; wrapping each
phase in two perf_counter reads costs well under a microsecond. Shared by
tools/profile_engine_host.py (no GPU) and tools/gpu/trace_engine_step.py (GPU).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

PHASES = {  # engine phase -> (object attribute path, method); None: the engine itself
    "schedule": ("scheduler", "schedule"),
    "forward launch (inputs + replay)": ("runner", "run"),
    "sampling + ids to the host": ("runner", "sample"),
    "round of iterations (inputs, replays, sampling, ids)": ("runner", "run_steps"),
    "scheduler commit": ("scheduler", "commit"),
    "complete previous (wait + bookkeeping)": (None, "_complete"),
    "drop cancelled": (None, "_drop_cancelled"),
}


def wrap_phases(engine, wrapper) -> list:
    """Replace every phase's method by wrapper(original, label); returns how to undo it."""
    undo = []
    for label, (path, method) in PHASES.items():
        obj = engine if path is None else getattr(engine, path)
        undo.append((obj, method, obj.__dict__.get(method)))
        setattr(obj, method, wrapper(getattr(obj, method), label))
    return undo


def unwrap_phases(undo: list) -> None:
    for obj, method, previous in undo:
        if previous is None:
            delattr(obj, method)
        else:
            setattr(obj, method, previous)


@contextmanager
def timed_phases(engine):
    """Within the block, accumulates each phase's seconds into the yielded dict."""
    seconds = defaultdict(float)

    def timer(original, label):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[label] += time.perf_counter() - t0
        return timed

    undo = wrap_phases(engine, timer)
    try:
        yield seconds
    finally:
        unwrap_phases(undo)


def phase_table(engine, steps: int) -> str:
    """Run `steps` engine steps with phase timers; a markdown table of microseconds per decode
    iteration (a step may launch several: max_decode_steps). "The engine's own code" is the rest
    of a step: building entries, reserving tokens."""
    seq = engine.scheduler.running[0]  # decoding with the others: counts the iterations
    start = seq.num_computed
    with timed_phases(engine) as seconds:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        total = time.perf_counter() - t0
    n = max(1, seq.num_computed - start)
    rows = [f"| host phase (wall clock; {n / steps:.1f} iterations per step) | us per iteration |", "|---|---:|",
            f"| engine.step | {total / n * 1e6:.1f} |"]
    for label in PHASES:
        rows.append(f"| {label} | {seconds[label] / n * 1e6:.1f} |")
    rows.append(f"| the engine's own code between phases | {(total - sum(seconds.values())) / n * 1e6:.1f} |")
    return "\n".join(rows)
