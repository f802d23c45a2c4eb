"""`tritonformer bench tensor-parallel`: one model split over the GPUs of this host against one GPU.

For each published shape (client/model_shapes.py) and tensor-parallel size, random weights built
on each rank's own GPU (no checkpoint: a 70B shape is 141 GB), the engine as served (decode CUDA
graphs with the all-reduces captured, rounds of max_decode_steps): milliseconds per decode
iteration with `batch` sequences decoding at a context of `--context` tokens, beside the
weight-read floor of one rank (its weight bytes over the copy bandwidth measured here), and
the ratio to the same shape on one GPU where it fits.

    tritonformer bench tensor-parallel --model llama-3.1-8b,llama-3-70b --sizes 1,2 --batches 1,64
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time

from tritonformer.client.engine_drive import WARM_STEPS, CountingSink, IdsOnly, timed_decode_steps
from tritonformer.client.gpu_measure import copy_bandwidth, read_bytes_per_step

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama-3.1-8b", help="comma-separated published shapes")
    parser.add_argument("--sizes", default="1,2", help="tensor-parallel sizes, comma-separated")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens of every sequence")
    parser.add_argument("--steps", type=int, default=48, help="timed decode iterations")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--json", help="also write the results here")


def build(name: str, size: int, dtype: str, max_running: int):
    """(engine, workers or None) for `name` split `size` ways, warmed up."""
    import torch

    from tritonformer.backend.decoder.build import EngineOptions, build_engine
    from tritonformer.backend.decoder.warm_up import warm_up
    from tritonformer.backend.parallel.workers import ShardSource, start_ranks
    from tritonformer.client.model_shapes import DECODER_SHAPES, random_decoder, random_shard_state

    max_len = 4096
    workers = None
    if size == 1:
        model = random_decoder(name, torch.device("cuda:0"), getattr(torch, dtype), max_model_len=max_len)
    else:
        source = ShardSource("", DECODER_SHAPES[name], dtype, "cuda", 0, max_len, state_factory=random_shard_state,
                             factory_args=(name,))
        model, workers = start_ranks(source, size)
    options = EngineOptions(max_running_sequences=max_running, max_tokens_per_iteration=4096,
                            kv_cache_memory_fraction=0.5, cancel_check_interval_s=3600, max_queue_requests=10_000)
    engine = build_engine(model, IdsOnly(), CountingSink(), options, workers=workers)
    warm_up(engine)
    return engine, workers


def step_ms(engine, batch: int, context: int, steps: int, vocab: int) -> float:
    """Milliseconds per decode iteration with `batch` sequences of `context` prompt tokens
    decoding, in steady state (engine_drive.timed_decode_steps)."""
    import numpy as np

    from tritonformer.backend.decoder.sampling_params import SamplingParams

    rng = np.random.default_rng(1)
    new = WARM_STEPS + steps + 4 * engine.scheduler.max_decode_steps + 16
    engine.admit([engine.new_sequence(i, rng.integers(0, min(vocab, 30000), context).tolist(),
                                      SamplingParams(max_tokens=new, ignore_eos=True), False) for i in range(batch)])
    ms, _ = timed_decode_steps(engine, steps)
    while engine.has_work():
        engine.step()
    if engine.sink.errors:
        raise RuntimeError(f"requests failed: {engine.sink.errors[:2]}")
    return ms


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench tensor-parallel needs CUDA GPUs", file=sys.stderr)
        return 2
    names, sizes = args.model.split(","), [int(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    bandwidth = copy_bandwidth()
    results = {"gpus": gpus, "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
               "copy_bandwidth_GBps": bandwidth / 1e9, "rows": []}
    print(f"# bench tensor-parallel on {len(gpus)} x {gpus[0]}, {args.dtype}, context {args.context}, "
          f"{results['date']}; floor = one rank's weight bytes / {bandwidth / 1e9:.0f} GB/s (copy bandwidth)")
    print("| model | TP | batch | ms per step | floor ms | / floor | vs TP=1 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        one: dict[int, float] = {}
        for size in sizes:
            if size > len(gpus):
                print(f"| {name} | {size} | - | needs {size} GPUs, {len(gpus)} here | | | |")
                continue
            try:
                engine, workers = build(name, size, args.dtype, max(batches))
            except torch.OutOfMemoryError:
                print(f"| {name} | {size} | - | does not fit | | | |", flush=True)
                gc.collect()
                torch.cuda.empty_cache()
                continue
            floor = read_bytes_per_step(engine.runner.model) / bandwidth * 1e3
            for batch in batches:
                ms = step_ms(engine, batch, args.context, args.steps, engine.runner.model.vocab_size)
                if size == 1:
                    one[batch] = ms
                ratio = f"{ms / one[batch]:.2f}x" if batch in one and size > 1 else "-"
                results["rows"].append({"model": name, "tp": size, "batch": batch, "ms": ms, "floor_ms": floor})
                print(f"| {name} | {size} | {batch} | {ms:.3f} | {floor:.3f} | {ms / floor:.2f}x | {ratio} |", flush=True)
            if workers is not None:
                workers.stop()
                engine.runner.model.tp.leave()
            engine.runner.graphs = None
            del engine, workers
            gc.unfreeze()
            gc.collect()
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
