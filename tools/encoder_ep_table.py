"""The table of tools/encoder_engine_process_bench.sh, from the files it leaves in a results
folder (also after a run cut short: the configurations and load points that finished).

    python3 tools/encoder_ep_table.py RESULTS_DIR SLO_MS CONFIG [CONFIG ...]   (CONFIG: true:4, true:1:b, false:1/4)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tritonformer.client.loadgen import goodput


def mean_busy(path: Path) -> float:
    values = [float(x) for x in path.read_text().split() if x.replace(".", "").isdigit()] if path.exists() else []
    return sum(values) / len(values) if values else float("nan")


def parse(config: str) -> tuple[str, str, list[str], str]:
    """"engine_process:instances[:b][/threads]" -> (ep, instances, ["b"] or [], threads or "")."""
    base, _, threads = config.partition("/")
    ep, instances, *batching = base.split(":")
    return ep, instances, batching, threads


def load_points(out: Path, config: str) -> list[dict]:
    """One configuration's load points, by offered rate, with GPU busy % and server CPU cores."""
    ep, instances, batching, threads = parse(config)
    tag = f"ep{ep}_x{instances}" + "".join(f"_{b}" for b in batching) + (f"_t{threads}" if threads else "")
    rows = []
    for path in sorted(out.glob(f"encoder_ep_{tag}_[0-9]*.json"), key=lambda p: float(p.stem.rsplit("_", 1)[1])):
        rate = path.stem.rsplit("_", 1)[1]
        (s,) = json.loads(path.read_text())["results"]
        cpu_file = out / f"encoder_ep_cpu_{tag}_{rate}.txt"
        s["gpu_busy"] = mean_busy(out / f"encoder_ep_gpu_{tag}_{rate}.txt")
        s["server_cpu"] = float(cpu_file.read_text()) if cpu_file.exists() else float("nan")
        rows.append(s)
    return rows


def main(argv: list[str]) -> int:
    out, slo, configs = Path(argv[0]), float(argv[1]), argv[2:]
    print("| engine_process | instances (b: Triton's batcher) | response threads | offered req/s | answered req/s "
          "| p50 / p99 ms | GPU busy % | server CPU cores | failed |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|")
    best = {}
    for config in configs:
        ep, instances, batching, threads = parse(config)
        rows = load_points(out, config)
        for s in rows:
            p50, p99 = (f"{s[k]:.1f}" if s[k] is not None else "-" for k in ("latency_p50_ms", "latency_p99_ms"))
            print(f"| {ep} | {' '.join([instances, *batching])} | {threads or 'default'} | {s['offered_rate']:g} | {s['throughput_rps']:,.0f} | "
                  f"{p50} / {p99} | {s['gpu_busy']:.0f} | {s['server_cpu']:.2f} | {s['requests'] - s['ok']} |")
        for s in rows:  # (goodput needs numbers where the JSON has null)
            s["latency_p99_ms"] = s["latency_p99_ms"] if s["latency_p99_ms"] is not None else float("inf")
        best[config] = goodput(rows, slo) if rows else None
    print(f"\ngoodput at p99 <= {slo:g} ms, every request answered:")
    for config, s in best.items():
        ep, instances, batching, threads = parse(config)
        print(f"  engine_process={ep}, {instances} instance(s){', Triton batcher' if batching else ''}"
              f"{f', {threads} response threads' if threads else ''}: " +
              (f"{s['throughput_rps']:,.0f} req/s (offered {s['offered_rate']:g}, p99 {s['latency_p99_ms']:.1f} ms, "
               f"GPU busy {s['gpu_busy']:.0f}%)" if s else "none"))
    print("targets (H100): goodput >= 10,000 req/s with one engine per GPU; GPU busy >= 70% at saturation")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
