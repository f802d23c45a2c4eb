"""Soak: mixed traffic for a long while, every request answered, resident memory flat.

Starts a real tritonserver with the repository's `embedder` and `generator` (engine_process as
given, for both), or drives one already running (--url, with --server-pid for its memory). Workers
send, in a loop: embeddings of 1-8 texts of 1-60 words (HTTP infer), and streamed generations of
2-16 tokens (HTTP generate_stream), one in five of them dropped by the client after its first
event (a cancellation). Every --sample-seconds the resident memory (VmRSS) of tritonserver and of
every process under it is read from /proc, grouped as tritonserver, each model's stubs and each
model's engine process. At the end: per group, the memory at the end of the warm-up and at the
end, and the growth per minute after the warm-up and over its last half (least-squares slopes);
it fails if a group still grows faster than --limit-mib-per-min (1) over the last half (a leak
grows in both halves; memory that is first touched under load, like a KV cache's pages, levels
off) or a request got anything but an answer or "overloaded".

    python3 tools/soak.py --minutes 30 --warmup-minutes 5          (CPU or GPU; ~35 min)
    python3 tools/soak.py --url 127.0.0.1:8000 --server-pid $(cat /tmp/tritonserver.pid) --minutes 30
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = ("serve", "model", "token", "graph", "queue", "batch", "kernel", "memory", "stream", "answer",
         "Triton", "naïve", "café", "東京", "🚀", "12345", "long", "short", "request", "engine")


# ---- memory ---------------------------------------------------------------------------------
def processes_under(root: int) -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, command line, RSS KiB) of `root` and every process under it."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rss = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
        ppid = int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))
        found[int(name)] = (ppid, cmd, int(rss.group(1)) if rss else 0)
    return {pid: info for pid, info in found.items() if _under(pid, root, found)}


def _under(pid: int, ancestor: int, table) -> bool:
    """Whether `pid` is `ancestor` or a process under it."""
    while pid > 1:
        if pid == ancestor:
            return True
        pid = table[pid][0] if pid in table else 0
    return False


def memory_groups(root: int) -> dict[str, float]:
    """MiB per group: tritonserver, stub:<model> (all its instances), engine:<model> (what the
    stubs of <model> started), other."""
    procs = processes_under(root)
    stub_of = {}
    for pid, (_, cmd, _) in procs.items():
        if "triton_python_backend_stub" in cmd:
            match = re.search(r"/([^/ ]+)/1/model\.py", cmd)
            stub_of[pid] = match.group(1) if match else "?"
    groups: dict[str, float] = {}
    for pid, (_, cmd, rss) in procs.items():
        if pid == root:
            group = "tritonserver"
        elif pid in stub_of:
            group = f"stub:{stub_of[pid]}"
        else:
            group = next((f"engine:{m}" for s, m in stub_of.items() if _under(pid, s, procs)), "other")
        groups[group] = groups.get(group, 0.0) + rss / 1024
    return groups


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(samples) < 2:
        return float("nan")
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    return 60 * sum((t - mt) * (v - mv) for t, v in samples) / var if var else float("nan")


def growth(samples: list[tuple[float, dict[str, float]]], warmup_seconds: float) -> dict[str, dict]:
    """Per process group, from (seconds, {group: MiB}) samples: the memory at the end of the
    warm-up and at the end, and the slopes after the warm-up and over its last half."""
    after = [(t, g) for t, g in samples if t >= warmup_seconds]
    out = {}
    for name in sorted({name for _, g in samples for name in g}):
        points = [(t, g[name]) for t, g in after if name in g]
        out[name] = {"after_warmup_mib": points[0][1] if points else None,
                     "end_mib": points[-1][1] if points else None,
                     "mib_per_min": slope_per_minute(points),
                     "last_half_mib_per_min": slope_per_minute(points[len(points) // 2:])}
    return out


# ---- traffic --------------------------------------------------------------------------------
class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.values = {"embed": 0, "generate": 0, "cancelled": 0, "overloaded": 0, "errors": 0}
        self.first_error: str | None = None

    def add(self, kind: str, error: str | None = None) -> None:
        with self.lock:
            self.values[kind] += 1
            if error and self.first_error is None:
                self.first_error = error


def random_text(rng: random.Random) -> str:
    """1-60 words, some of them multi-byte (what the soak's requests carry)."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))


def _embed(host: str, port: int, rng: random.Random, counts: Counts) -> None:
    texts = [random_text(rng) for _ in range(rng.randint(1, 8))]
    body = {"inputs": [{"name": "text_input", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.request("POST", "/v2/models/embedder/infer", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status == 200 and len(json.loads(data)["outputs"][0]["data"]) % len(texts) == 0:
        counts.add("embed")
    elif resp.status == 503 or b"overloaded" in data:
        counts.add("overloaded")
    else:
        counts.add("errors", f"embed HTTP {resp.status}: {data[:200]!r}")


def _generate(host: str, port: int, rng: random.Random, counts: Counts, cancel: bool) -> None:
    body = {"text_input": random_text(rng), "max_tokens": rng.randint(2, 16), "ignore_eos": True}
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.request("POST", "/v2/models/generator/generate_stream", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            data = resp.read()
            kind = "overloaded" if resp.status == 503 or b"overloaded" in data else "errors"
            counts.add(kind, None if kind == "overloaded" else f"generate HTTP {resp.status}: {data[:200]!r}")
            return
        events = 0
        for line in resp:
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                kind = "overloaded" if "overloaded" in event["error"] else "errors"
                counts.add(kind, None if kind == "overloaded" else f"generate: {event['error'][:200]}")
                return
            events += 1
            if cancel:
                counts.add("cancelled")  # the connection closes with the stream still running
                return
        counts.add("generate" if events else "errors", None if events else "generate: no event")
    finally:
        conn.close()


def worker(i: int, host: str, port: int, deadline: float, counts: Counts) -> None:
    rng = random.Random(i)
    n = 0
    while time.monotonic() < deadline:
        n += 1
        try:
            if n % 3:
                _embed(host, port, rng, counts)
            else:
                _generate(host, port, rng, counts, cancel=(n // 3) % 5 == 0)
        except Exception as e:  # refused, reset, timed out: the server failed this request
            counts.add("errors", f"{type(e).__name__}: {e}")


# ---- the run --------------------------------------------------------------------------------
def start_server(engine_process: str, instances: int):
    from tritonformer.client.config_variants import copy_model
    from tritonformer.client.server import TritonServer, free_ports

    repo = Path(tempfile.mkdtemp(prefix="tritonformer-soak-")) / "repository"
    for model in ("embedder", "generator"):
        copy_model(REPO / "model_repository" / model, repo / model, {"engine_process": engine_process},
                   instances=instances)
    http_port, grpc_port, metrics_port = free_ports(3)
    server = TritonServer(repo, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    server.start()
    server.wait_ready(["embedder", "generator"], timeout=900)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup-minutes", type=float, default=5.0, help="excluded from the growth")
    parser.add_argument("--workers", type=int, default=4, help="clients sending one request at a time each")
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--engine-process", choices=("true", "false", "auto"), default="true")
    parser.add_argument("--instances", type=int, default=1, help="model instances (own server only)")
    parser.add_argument("--url", help="HTTP host:port of a running server (default: start one)")
    parser.add_argument("--server-pid", type=int, help="with --url: tritonserver's pid, for its memory")
    parser.add_argument("--limit-mib-per-min", type=float, default=1.0)
    parser.add_argument("--json", help="write the samples and the result here")
    args = parser.parse_args(argv)

    server = None
    if args.url:
        host, port = args.url.rsplit(":", 1)
        root = args.server_pid
    else:
        server = start_server(args.engine_process, args.instances)
        host, port = server.http_url.rsplit(":", 1)
        root = server.process.pid
    try:
        counts = Counts()
        start = time.monotonic()
        deadline = start + args.minutes * 60
        threads = [threading.Thread(target=worker, args=(i, host, int(port), deadline, counts), daemon=True)
                   for i in range(args.workers)]
        for t in threads:
            t.start()
        samples: list[tuple[float, dict[str, float]]] = []
        while True:
            now = time.monotonic() - start
            groups = memory_groups(root) if root else {}
            samples.append((now, groups))
            with counts.lock:
                done = dict(counts.values)
            print(f"{now / 60:6.1f} min  " + "  ".join(f"{g} {v:,.0f}" for g, v in sorted(groups.items()))
                  + f" MiB  | {done}", flush=True)
            if time.monotonic() >= deadline:
                break
            time.sleep(min(args.sample_seconds, max(0.0, deadline - time.monotonic())))
        for t in threads:
            t.join(180)
    finally:
        if server is not None:
            server.stop()

    groups = growth(samples, args.warmup_minutes * 60)
    result = {"minutes": args.minutes, "warmup_minutes": args.warmup_minutes, "counts": counts.values,
              "first_error": counts.first_error, "groups": groups}
    print(f"\n| process group | MiB after warm-up | MiB at end | MiB/min after warm-up | MiB/min, last half "
          f"(limit {args.limit_mib_per_min:g}) |\n|---|---:|---:|---:|---:|")
    failed = counts.values["errors"] > 0
    for name, g in groups.items():
        failed = failed or not g["last_half_mib_per_min"] < args.limit_mib_per_min
        first, last = ((f"{g['after_warmup_mib']:,.0f}", f"{g['end_mib']:,.0f}") if g["end_mib"] is not None
                       else ("-", "-"))
        print(f"| {name} | {first} | {last} | {g['mib_per_min']:+.2f} | {g['last_half_mib_per_min']:+.2f} |")
    print(f"\nrequests: {counts.values}" + (f"; first error: {counts.first_error}" if counts.first_error else ""))
    print("FAILED" if failed else "passed")
    if args.json:
        result["samples"] = samples
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
