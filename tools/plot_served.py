"""Latency against offered load, as PNGs, from the load generator's JSON summaries.

    python tools/plot_served.py OUT.png LABEL=summary.json [LABEL=summary.json ...] [--metric latency_p99_ms]

Each JSON is what `tritonformer bench load embed|generate --json` wrote: one line per label
(a policy, an instance count, a stream interval), offered load on x, the latency metric on y
(log scale, so the knee where a configuration saturates stands out).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("series", nargs="+", help="LABEL=path/to/summary.json")
    parser.add_argument("--metric", default="latency_p99_ms", help="summary key on the y axis (latency_p99_ms, latency_per_token_p50_ms, ...)")
    parser.add_argument("--x", default="offered_rate", help="summary key on the x axis")
    parser.add_argument("--title", default="")
    parser.add_argument("--slo-ms", type=float, nargs="*", default=[], help="horizontal budget lines")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for item in args.series:
        label, _, path = item.partition("=")
        points = _points(json.loads(Path(path).read_text()), args.x, args.metric)
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    for slo in args.slo_ms:
        ax.axhline(slo, color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(f"{slo:g} ms", (ax.get_xlim()[0], slo), textcoords="offset points", xytext=(4, 3), fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("offered load (req/s)" if args.x == "offered_rate" else args.x)
    ax.set_ylabel(args.metric)
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


def _points(data, x_key: str, y_key: str) -> list[tuple[float, float]]:
    """(x, y) per measured point of one load-generator JSON file."""
    return sorted((float(row[x_key]), float(row[y_key])) for row in data["results"] if row.get(y_key) is not None)


if __name__ == "__main__":
    main()
