"""Throughput at equal median latency per output token: ours against a baseline, from the JSON
of two `tritonformer bench load generate` sweeps (the served benchmark's results).

Orca's comparison: not tokens/s at whatever latency each system happens to have, but how much
each sustains at the same latency. For every baseline point (its median latency per token L
and its output tokens/s), ours at L is read off our own curve: interpolated between our two
measured points that bracket L, or, when every point of ours is faster than L, our highest
measured throughput (then a lower bound, printed as ">=").

    python tools/compare_at_latency.py docs/results/served_generate_ours.json \
        docs/results/served_generate_stock.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys

LATENCY = "latency_per_token_p50_ms"
THROUGHPUT = "output_tok_per_s"


def curve(path: str) -> list[tuple[float, float]]:
    """(latency per token, tokens/s) per measured rate, by increasing throughput."""
    with open(path) as f:
        results = json.load(f)["results"]
    points = [(r[LATENCY], r[THROUGHPUT]) for r in results
              if r.get(LATENCY) is not None and not math.isnan(r[LATENCY]) and r[THROUGHPUT] > 0]
    return sorted(points, key=lambda p: p[1])


def throughput_at(points: list[tuple[float, float]], latency: float) -> tuple[float, bool]:
    """Our tokens/s at `latency` ms per token, and whether it is only a lower bound."""
    within = [p for p in points if p[0] <= latency]
    if not within:
        return 0.0, False  # even our lightest load is slower than that
    best = max(within, key=lambda p: p[1])
    above = [p for p in points if p[0] > latency and p[1] > best[1]]
    if not above:
        return best[1], True  # never that slow at the rates measured: at least this much
    nxt = min(above, key=lambda p: p[1])  # the next heavier load, past the latency
    frac = (latency - best[0]) / (nxt[0] - best[0])
    return best[1] + frac * (nxt[1] - best[1]), False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ours")
    parser.add_argument("baseline")
    args = parser.parse_args(argv)
    ours, base = curve(args.ours), curve(args.baseline)
    if not ours or not base:
        print("no usable points (every request failed?)", file=sys.stderr)
        return 1
    print("| baseline latency/token p50 ms | baseline tok/s | ours tok/s at that latency | ratio |")
    print("|---:|---:|---:|---:|")
    for latency, tokens in base:
        mine, bound = throughput_at(ours, latency)
        sign = ">= " if bound else ""
        print(f"| {latency:.1f} | {tokens:,.0f} | {sign}{mine:,.0f} | {sign}{mine / tokens:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
