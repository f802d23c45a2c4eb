"""`tritonformer bench serve-encoder --in-process`: batching policies under open-loop load.

The embedder's engine (queue, batching policy, runtime) driven directly, without tritonserver
in between, by an open-loop Poisson load generator: requests arrive on a schedule drawn in
advance whatever the server does, and latency runs from the *scheduled* arrival, so a server
that falls behind is charged for it. Same runtime and weights for every policy:

- none: one request per batch (no batching);
- fifo-count: arrival order, at most 64 sequences (Triton's dynamic batcher semantics);
- fifo-tokens: arrival order up to a token budget (TEI's semantics);
- sort-window: the oldest 64 requests sorted by length, cut by the budget (infinity's semantics);
- dp: our dynamic-programming length batcher over the measured cost table.

For each policy and offered rate it prints p50/p99 latency, and the goodput: the highest
offered rate whose p99 stays within the budget. `--execution padded` makes every batch cost
what it costs a padded runtime (see padded_cost_engine): where batching by length pays. The
same load through a real tritonserver: `tritonformer bench load embed` (client/loadgen.py) and
tools/gpu_served_bench.sh.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from tritonformer.client.traces import DISTRIBUTIONS, lengths_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--in-process", action="store_true", required=True,
                        help="drive the engine directly (the only mode so far)")
    parser.add_argument("--rates", default="500,1000,2000,3000,4000,6000,8000", help="offered req/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=3.0, help="arrivals per rate")
    parser.add_argument("--distribution", default="mixed", choices=DISTRIBUTIONS,
                        help="u2-100 / u5-500: the TurboTransformers paper's §6.3 set-up (with --max-batch 20)")
    parser.add_argument("--policies", default="fifo-count,fifo-tokens,dp",
                        help="none, fifo-count, fifo-tokens, sort-window, dp (comma-separated)")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="sequence cap of every policy (default: 64 by count, 1024 under a token budget)")
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--layers", type=int, default=12, help="bert-base layers (12)")
    parser.add_argument("--execution", choices=("packed", "padded"), default="packed",
                        help="packed: our runtime; padded: every sequence of a batch extended to its longest "
                             "(a padded runtime's cost, for the policy comparison; outputs are not used)")
    parser.add_argument("--json", help="also write the results here")


class LatencySink:
    """Records when each request was answered (the engine calls send exactly once)."""

    def __init__(self):
        self.done: dict[int, float] = {}
        self.errors = 0
        self.lock = threading.Lock()

    def send(self, handle, outputs, error, final):
        with self.lock:
            self.done[handle] = time.perf_counter()
            self.errors += error is not None

    def is_cancelled(self, handle):
        return False


def padded_cost_engine(pad_id: int = 0):
    """EmbedderEngine whose batches cost what they cost a padded runtime (HF, FasterTransformer
    without its remove-padding mode): every sequence is extended to the batch's longest with pad
    tokens and the whole rectangle runs through the same kernels. A cost emulation for comparing
    batching policies: the pads are attended to, so its embeddings are not the served ones."""
    from tritonformer.backend.encoder.engine import EmbedderEngine

    class PaddedCostEngine(EmbedderEngine):
        def launch(self, sequences, token_types=None):
            longest = max(len(s) for s in sequences)
            return super().launch([s + [pad_id] * (longest - len(s)) for s in sequences])

    return PaddedCostEngine


class TimedPolicy:
    """A batching policy whose decisions (`take`) are timed; everything else passes through."""

    def __init__(self, policy):
        self.policy = policy
        self.seconds: list[float] = []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def take(self, queue, now):
        start = time.perf_counter()
        batch = self.policy.take(queue, now)
        self.seconds.append(time.perf_counter() - start)
        return batch


class ExecutedTokens:
    """Counts the token rows the runtime computes (CUDA-graph buckets and padded rectangles
    included), by wrapping the model's and the graphs' forward: padding ratio = 1 - real / this."""

    def __init__(self, model, graphs):
        self.tokens = 0
        model_forward = model.forward

        def counted_model(input_ids, *args, **kwargs):
            self.tokens += int(input_ids.shape[0])
            return model_forward(input_ids, *args, **kwargs)

        model.forward = counted_model
        if graphs is not None:
            graph_forward = graphs.forward

            def counted_graph(input_ids, lengths):
                self.tokens += graphs.bucket(sum(lengths), len(lengths))[0]
                return graph_forward(input_ids, lengths)

            graphs.forward = counted_graph


def run_load(engine_factory, rate: float, seconds: float, distribution: str, vocab: int, seed: int = 0,
             executed: ExecutedTokens | None = None) -> dict:
    from tritonformer.backend.encoder.engine import EmbedRequest
    from tritonformer.backend.engine_loop import Overloaded

    rng = np.random.default_rng(seed)
    n = max(1, int(rate * seconds))
    gaps = rng.exponential(1.0 / rate, n)
    lengths = lengths_for(distribution, n, rng)
    requests = [rng.integers(1000, vocab - 1, int(length)).tolist() for length in lengths]
    sink = LatencySink()
    engine = engine_factory(sink)
    if executed is not None:
        executed.tokens = 0
    engine.start()
    start = time.perf_counter() + 0.05
    scheduled = start + np.cumsum(gaps)
    rejected = 0
    for i in range(n):  # open loop: submit on schedule, never wait for answers
        delay = scheduled[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        try:
            engine.submit(EmbedRequest(i, [requests[i]], arrival=time.monotonic() - max(0.0, -delay)))
        except Overloaded:  # the bounded queue said "retry later": a failed request
            rejected += 1
    deadline = time.perf_counter() + 60
    while len(sink.done) + rejected < n and time.perf_counter() < deadline:
        time.sleep(0.01)
    engine.stop()
    lat = np.array([sink.done[i] - scheduled[i] for i in range(n) if i in sink.done]) * 1e3
    real = sum(int(lengths[i]) for i in sink.done)
    decisions = getattr(engine.policy, "seconds", [])
    return {"offered": rate, "answered": len(lat), "sent": n, "errors": sink.errors, "rejected": rejected,
            "padding_ratio": 1 - real / executed.tokens if executed is not None and executed.tokens else None,
            "decision_us_p50": float(np.median(decisions)) * 1e6 if decisions else None,
            "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("inf"),
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) == n else float("inf"),
            "achieved": len(lat) / (max(sink.done.values()) - start) if sink.done else 0.0}


def run(args) -> int:
    import torch
    import transformers

    from tritonformer.backend.encoder.cost_measure import cost_model_key, load_or_measure
    from tritonformer.backend.encoder.engine import EmbedderEngine
    from tritonformer.backend.models.bert import BertConfig, BertEncoder
    from tritonformer.scheduler.dp_batcher import DpBatchPolicy
    from tritonformer.scheduler.fifo import FifoBatchPolicy
    from tritonformer.scheduler.sort_window import SortWindowPolicy

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    cfg = transformers.BertConfig(num_hidden_layers=args.layers)
    torch.manual_seed(0)
    hf = transformers.BertModel._from_config(cfg, add_pooling_layer=False).eval()
    model = BertEncoder(BertConfig.from_hf(cfg.to_dict()), hf.state_dict(), dev, dtype)
    del hf
    engine_cls = padded_cost_engine() if args.execution == "padded" else EmbedderEngine
    probe = engine_cls(model, LatencySink(), FifoBatchPolicy())
    if probe.graphs is not None:  # as the served embedder does at start-up
        print(f"captured {probe.graphs.warm_up()} CUDA graphs", file=sys.stderr)
    key = cost_model_key(dev, "random-bert-base", dtype, {"cuda_graphs": True, "arena": False, "layers": args.layers,
                                                         "execution": args.execution})
    t0 = time.perf_counter()
    # The cost table's cache (not tritonformer.backend.checkpoints.cache_dir: that package needs
    # gguf, which a bare GPU image may lack).
    cache = Path(os.environ.get("TRITONFORMER_CACHE_DIR", Path.home() / ".cache" / "tritonformer"))
    cost = load_or_measure(probe.embed, key, cache, cfg.vocab_size, 512, dev, packed=args.execution == "packed")
    print(f"cost table ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    executed = ExecutedTokens(model, probe.graphs)
    count_cap, budget_cap = args.max_batch or 64, args.max_batch or 1024
    policies = {
        "none": lambda: FifoBatchPolicy(max_sequences=1, max_tokens=10**9),  # one request per batch
        "fifo-count": lambda: FifoBatchPolicy(max_sequences=count_cap, max_tokens=10**9),
        "fifo-tokens": lambda: FifoBatchPolicy(max_sequences=budget_cap, max_tokens=16384),
        # The same caps as fifo-tokens: the policies differ only in which requests go together.
        "sort-window": lambda: SortWindowPolicy(window=64, max_sequences=budget_cap, max_tokens=16384),
        "dp": lambda: DpBatchPolicy(cost, max_sequences=budget_cap, max_tokens=16384, window=128),
    }
    rates = [float(r) for r in args.rates.split(",")]
    results = {}
    for name in args.policies.split(","):
        results[name] = []
        for rate in rates:
            def factory(sink, name=name):
                engine = engine_cls(model, sink, TimedPolicy(policies[name]()))
                engine.graphs = probe.graphs  # share captured graphs: same runtime for every policy
                return engine

            r = run_load(factory, rate, args.seconds, args.distribution, cfg.vocab_size, executed=executed)
            results[name].append(r)
            print(f"{name:12s} {rate:7.0f} req/s offered: p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms  "
                  f"achieved {r['achieved']:7.0f} req/s, rejected {r['rejected']}, padding "
                  f"{r['padding_ratio'] or 0:.0%}, decision {r['decision_us_p50'] or 0:.0f} us", file=sys.stderr)
            if r["p99_ms"] > 10 * args.slo_ms:
                break  # saturated: higher rates only queue longer
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU"
    print(f"\n{gpu}, bert-base ({args.layers} layers) {dtype}, {args.execution} execution, {args.distribution} "
          f"lengths, open-loop Poisson, {args.seconds:.0f} s per rate, latency from the scheduled arrival")
    print(f"{'policy':12s} {'goodput@p99<=' + str(int(args.slo_ms)) + 'ms':>20s} {'@p99<=' + str(int(args.slo_ms / 2)) + 'ms':>11s}"
          f" {'padding':>8s} {'decision us':>11s}  p50/p99 ms at each offered rate")
    for name, rows in results.items():
        ok = [r["offered"] for r in rows if r["p99_ms"] <= args.slo_ms]
        tight = [r["offered"] for r in rows if r["p99_ms"] <= args.slo_ms / 2]
        padding = np.mean([r["padding_ratio"] for r in rows if r["padding_ratio"] is not None] or [0.0])
        decision = np.median([r["decision_us_p50"] for r in rows if r["decision_us_p50"] is not None] or [0.0])
        cells = "  ".join(f"{r['offered']:.0f}:{r['p50_ms']:.0f}/{r['p99_ms']:.0f}" for r in rows)
        print(f"{name:12s} {max(ok) if ok else 0:>20.0f} {max(tight) if tight else 0:>11.0f} {padding:>8.1%}"
              f" {decision:>11.0f}  {cells}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "execution": args.execution, "results": results}, f, indent=1)
    return 0
