"""`tritonformer health`: is every model really able to answer?

Triton keeps `/v2/health/ready` and `/v2/models/<m>/ready` at 200 after a model's Python stub
has died (measured with tritonserver 2.51: the model reports ready while every inference fails
with "Stub process ... is not healthy"). So readiness and liveness probes must send a real,
tiny request to each model. This is that request, with a timeout, exiting 0 or 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

# One tiny request per model, over plain HTTP (no client library needed in a probe).
PROBES = {
    "embedder": ("infer", {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["ping"]}]}),
    "generator": ("generate", {"text_input": "ping", "stream": False, "max_tokens": 1}),
}


def check(url: str, models: list[str], timeout: float) -> list[str]:
    """Problems found, one line per failing model (empty: healthy)."""
    problems = []
    for model in models:
        if model not in PROBES:
            problems.append(f"{model}: no health probe defined for this model")
            continue
        endpoint, body = PROBES[model]
        req = urllib.request.Request(
            f"http://{url}/v2/models/{model}/{endpoint}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                json.loads(resp.read())
        except urllib.error.HTTPError as e:
            problems.append(f"{model}: HTTP {e.code}: {e.read().decode(errors='replace')[:200]}")
        except Exception as e:  # refused, timed out, garbage
            problems.append(f"{model}: {e}")
    return problems


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="HTTP host:port (default 127.0.0.1:$TRITONFORMER_HTTP_PORT or 8000)")
    parser.add_argument("--models", nargs="+", default=list(PROBES), help="models to probe (default: all)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")


def run(args) -> int:
    url = args.url or f"127.0.0.1:{os.environ.get('TRITONFORMER_HTTP_PORT', '8000')}"
    problems = check(url, args.models, args.timeout)
    for p in problems:
        print(f"unhealthy: {p}", file=sys.stderr)
    if not problems:
        print(f"healthy: {', '.join(args.models)}")
    return 1 if problems else 0
