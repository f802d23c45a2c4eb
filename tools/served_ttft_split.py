"""Where a served generator's time to first token goes: the client's TTFT beside the engine's
own two parts, from the server's metrics (a running tritonserver, e.g. tools/gpu_server.sh).

For each rate, the Orca trace (as tools/gpu_served_bench.sh sends it) is streamed over
/generate_stream; the generator's histograms are read before and after, so their means cover
exactly that point:

- client TTFT: scheduled arrival -> first event with tokens (p50 / p99 / mean);
- engine TTFT: execute() -> first token on the engine's host thread (mean), of which
- queue: execute() -> the first iteration that runs the prompt (mean);
- the rest of the client's mean (client - engine): Triton's HTTP front, the request's IPC into
  the stub, the first response's trip through the sender thread and back out.

    python3 tools/served_ttft_split.py --url 127.0.0.1:8000 --metrics 127.0.0.1:8002 --rates 128,1000
"""
from __future__ import annotations

import argparse
import re
import urllib.request

import numpy as np


def generator_means(metrics_url: str, model: str = "generator") -> dict[str, tuple[float, float]]:
    """(sum, count) of the generator's TTFT and prompt-queue histograms."""
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    out = {}
    for name in ("time_to_first_token_seconds", "prompt_queue_seconds"):
        values = {}
        for part in ("sum", "count"):
            m = re.search(rf'^tritonformer_{name}_{part}\{{[^}}]*model="{model}"[^}}]*\}} ([0-9.e+-]+)$', text, re.M)
            values[part] = float(m.group(1)) if m else float("nan")
        out[name] = (values["sum"], values["count"])
    return out


def main() -> None:
    from tritonformer.client.loadgen import run_generate_load
    from tritonformer.client.traces import orca_trace, shifted_prompts

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8000")
    parser.add_argument("--metrics", default="127.0.0.1:8002")
    parser.add_argument("--rates", default="128,1000")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=50256)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()

    trace = orca_trace(args.requests, 0, (32, 512), (1, 128), args.vocab_size)
    print("| req/s | tok/s | client TTFT p50 / p99 / mean ms | engine TTFT mean ms | of which queue ms | "
          "outside the engine ms | TPOT p50 ms |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for point, rate in enumerate(float(r) for r in args.rates.split(",")):
        before = generator_means(args.metrics)
        # each point its own prompts (token ids shifted by its index): none found in the prefix cache
        result = run_generate_load(args.url, shifted_prompts(trace, point, args.vocab_size), rate, 0,
                                   processes=args.processes)
        after = generator_means(args.metrics)
        summary = result["summary"]
        engine = {k: (after[k][0] - before[k][0]) / max(1.0, after[k][1] - before[k][1]) * 1e3 for k in after}
        ttft = np.array([r.first - r.scheduled for r in result["records"] if r.ok and r.tokens]) * 1e3
        mean = float(ttft.mean())
        print(f"| {rate:g} | {summary['output_tok_per_s']:,.0f} | {np.percentile(ttft, 50):.1f} / "
              f"{np.percentile(ttft, 99):.1f} / {mean:.1f} | {engine['time_to_first_token_seconds']:.1f} | "
              f"{engine['prompt_queue_seconds']:.1f} | {mean - engine['time_to_first_token_seconds']:.1f} | "
              f"{summary['tpot_p50_ms']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
