"""Whole decode steps of published shapes under each value of a module-level knob, A/B in one process.

    python3 tools/gpu/ab_decode_step.py --models llama-3.1-8b,smollm3-3b --batches 1,64 \\
        --knob kernels.triton_pdl.USE_PDL --values "False;True" [--quantization fp8] [--rounds 3]

`--knob`: a module attribute under tritonformer that the kernels read when they launch (a
launch parameter, a compile-time constant), or several, ','-separated; `--values`: Python
expressions, ';'-separated, the first the baseline (with several knobs, each a tuple of one
value per knob: `--knob kernels.triton_moe.PDL_MAX_PAIRS,backend.models.moe.ROUTER_NORMALISES
--values "(0, False);(256, False);(256, True)"`). Each model is built once (random weights at the shape,
client/model_shapes.py, bf16); per round and value, a fresh runner captures its decode graph
and the graph's replay is timed (best of --reps x 3 replays). Values alternate within each
round, so a drift of the GPU's clocks shows as a spread, not as a difference. Prints ms per
step per value (best over rounds, and the spread), the weight-read floor, and each value
against the first.
"""
from __future__ import annotations

import argparse
import gc

import torch


def parse_values(text: str) -> list:
    """'False;True' -> [False, True]; each part a Python expression (sets and frozensets too)."""
    return [eval(part, {"__builtins__": {}}, {"set": set, "frozenset": frozenset})  # noqa: S307 - a dev tool's argument
            for part in text.split(";")]


def knob_owner(path: str):
    """(module, attribute) of 'kernels.triton_pdl.USE_PDL'."""
    import importlib

    module, _, attr = path.rpartition(".")
    owner = importlib.import_module(f"tritonformer.{module}")
    if not hasattr(owner, attr):
        raise SystemExit(f"tritonformer.{module} has no attribute {attr}")
    return owner, attr


def replay_ms(runner, entries, reps: int) -> float:
    """ms per replay of the decode graph for `entries` (best of `reps` x 3 replays). The graph's
    inputs are sent again before every replay: a round's last iteration leaves its rows with no
    keys (the advance kernel), so replaying without them would time attention over nothing."""
    def replay():
        runner.graphs.load(entries)[0]()

    for _ in range(3):
        replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(reps):
        start.record()
        for _ in range(3):
            replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 3)
    return best


def step_ms(model, rows: int, context: int, reps: int) -> float:
    from tritonformer.backend.decoder.batch import BatchEntry
    from tritonformer.backend.decoder.runner import DecoderRunner

    bps = -(-(context + 1) // 16)
    cache = model.new_kv_cache(rows * bps + 1, 16)
    cache.state = model.new_state_cache(rows)  # (a hybrid model's recurrent state: slot b for row b)
    slot = (lambda b: b) if cache.state is not None else (lambda b: -1)
    runner = DecoderRunner(model, cache, rows)
    entries = [BatchEntry([1], context, list(range(b * bps, (b + 1) * bps)), True, slot(b)) for b in range(rows)]
    best = replay_ms(runner, entries, reps)
    runner.close()
    del runner, cache
    gc.collect()
    torch.cuda.empty_cache()
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--models", default="llama-3.1-8b,smollm3-3b")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--knob", required=True,
                    help="module attribute(s) under tritonformer, e.g. kernels.triton_pdl.USE_PDL (','-separated)")
    ap.add_argument("--values", required=True, help="';'-separated Python expressions, the baseline first")
    ap.add_argument("--quantization", default="none", choices=("none", "fp8"))
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    from tritonformer.client.gpu_measure import copy_bandwidth, read_bytes_per_step
    from tritonformer.client.model_shapes import random_decoder
    knobs = [knob_owner(k) for k in args.knob.split(",")]
    saved = [getattr(owner, attr) for owner, attr in knobs]
    settings = [value if len(knobs) > 1 else (value,) for value in parse_values(args.values)]
    if any(len(value) != len(knobs) for value in settings):
        raise SystemExit(f"each value must set all {len(knobs)} knobs")
    names = args.values.split(";")
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}, bf16, quantization {args.quantization}, context {args.context}, "
          f"copy bandwidth {bw / 1e9:.0f} GB/s; {args.knob}; ms per decode step, best (spread) over {args.rounds} rounds")
    print("| model | batch | floor ms | " + " | ".join(names) + " | " +
          " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |")
    print("|---|---:|---:|" + "---:|" * (2 * len(names) - 1))
    for name in args.models.split(","):
        model = random_decoder(name, dev, torch.bfloat16, max_model_len=args.context + 64,
                               quantization=args.quantization)
        floor = read_bytes_per_step(model) / bw * 1e3
        for rows in (int(b) for b in args.batches.split(",")):
            times = {n: [] for n in names}
            for _ in range(args.rounds):
                for s, n in zip(settings, names):
                    for (owner, attr), value in zip(knobs, s):
                        setattr(owner, attr, value)
                    times[n].append(step_ms(model, rows, args.context, args.reps))
            best = {n: min(t) for n, t in times.items()}
            cells = [f"{best[n]:.3f} ({max(times[n]) - best[n]:.3f})" for n in names]
            ratios = [f"{best[n] / best[names[0]]:.3f}" for n in names[1:]]
            print(f"| {name} | {rows} | {floor:.3f} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |",
                  flush=True)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    for (owner, attr), value in zip(knobs, saved):
        setattr(owner, attr, value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
