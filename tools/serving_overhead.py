"""What one embedder instance can answer when the model costs nothing: the serving overhead.

Every request repeats one of a few texts, so after the first round the embedder's response
cache answers without running the model: what remains is the server, the IPC between it and
the model's stub process, validation, tokenization and the response. Compares the shipped
config (one request per execute() call) with the embedder behind Triton's batcher
(client/config_variants.with_triton_batching: every request queued meanwhile in one call).

    .venv/bin/python tools/serving_overhead.py --variants default,batched --rates 1000,1500,2000

Runs on the CPU (client and server share the machine: the client's CPU is printed).
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tritonformer.client.config_variants import with_triton_batching
from tritonformer.client.loadgen import run_embed_load
from tritonformer.client.server import TritonServer, free_ports

REPO = Path(__file__).resolve().parent.parent
TEXTS = [f"sentence number {i} about serving" for i in range(8)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="default,batched")
    parser.add_argument("--rates", default="1000,1500,2000,2500")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print("| config | offered req/s | answered req/s | p50 ms | p99 ms | client CPU cores |")
    print("|---|---:|---:|---:|---:|---:|")
    for variant in args.variants.split(","):
        batched = variant == "batched"
        with tempfile.TemporaryDirectory() as tmp:
            repo = Path(tmp) / "repo"
            shutil.copytree(REPO / "model_repository" / "embedder", repo / "embedder",
                            ignore=shutil.ignore_patterns("__pycache__"))
            config = repo / "embedder" / "config.pbtxt"
            if batched:
                config.write_text(with_triton_batching(config.read_text()))
            http, grpc, metrics = free_ports(3)
            with TritonServer(repo, http_port=http, grpc_port=grpc, metrics_port=metrics) as server:
                server.wait_ready(["embedder"], timeout=300)
                run_embed_load(server.http_url, 200, 1, texts=TEXTS, batch_dim=batched)  # fill the cache
                for rate in (float(r) for r in args.rates.split(",")):
                    s = run_embed_load(server.http_url, rate, args.seconds, texts=TEXTS, batch_dim=batched,
                                       warmup=0.5)["summary"]
                    print(f"| {variant} | {rate:.0f} | {s['throughput_rps']:.0f} | {s['latency_p50_ms']:.1f} | "
                          f"{s['latency_p99_ms']:.1f} | {s['client_cpu_cores']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
