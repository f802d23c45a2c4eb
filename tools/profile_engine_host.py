"""The decoder engine's host work per decode iteration, without a model or a GPU.

The engine runs one iteration ahead of the GPU (backend/decoder/engine.py): an iteration costs
max(GPU forward, host work) only while the host's share (scheduling, inputs for the decode
graph, sampling bookkeeping, stop checks, responses) stays below the forward. This times that
share alone: the real scheduler, engine, sampler and decode-graph input packing around a runner
that returns logits at once.

    .venv/bin/python tools/profile_engine_host.py --batch 64 [--max-decode-steps 4] [--profile]
    .venv/bin/python tools/profile_engine_host.py --batch 64 --compare-prefix-caching

`--compare-prefix-caching` times the engine with prefix caching off and on, alternating, over
prompts that share nothing (the cost it adds where it cannot help), and prints both medians.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from types import SimpleNamespace

import numpy as np
import torch

from engine_phases import phase_table

from tritonformer.backend.decoder.graphs import DecodeGraphs
from tritonformer.backend.decoder.graph_inputs import DecodeInputs
from tritonformer.backend.decoder.runner import DEFAULT_DECODE_STEPS, Forward, SampledTokens
from tritonformer.backend.decoder.engine import GeneratorEngine
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.client.engine_drive import CountingSink, IdsOnly
from tritonformer.scheduler.iteration import IterationScheduler
from tritonformer.scheduler.kv_blocks import BlockManager

BLOCK, BLOCKS, CONTEXT, VOCAB = 16, 8192, 1024, 64


class ModelFreeRunner:
    """DecoderRunner's interface: packs a decode iteration's inputs as the graph replay does
    (into CPU buffers), and returns logits that are already there."""

    def __init__(self, max_running: int):
        self.model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=CONTEXT, eos_token_ids=(0,)))
        self.cache = SimpleNamespace(block_size=BLOCK, scratch_slot=BLOCKS * BLOCK, bytes_per_block=lambda: 1)
        # The graphs' bucket choice (no model: nothing is captured), with CPU input buffers.
        self.graphs = DecodeGraphs(None, self.cache, max_running, CONTEXT // BLOCK, None)
        self.inputs = {b: DecodeInputs(b, CONTEXT // BLOCK, BLOCK, BLOCKS * BLOCK, torch.device("cpu"))
                       for b in self.graphs.buckets}
        self.logits = torch.randn(max_running, VOCAB)

    def run(self, entries):
        if all(len(e.tokens) == 1 for e in entries):
            inputs = self.inputs[self.graphs.bucket(len(entries))]
            inputs.pack(entries)
            inputs.send()
        return Forward(self.logits[: sum(e.sample for e in entries)])

    def sample(self, forward, sampler, params, keys):
        return SampledTokens(sampler.sample_ids(forward.logits, params, keys), len(params))

    def run_steps(self, entries, steps, sampler, params, keys):
        inputs = self.inputs[self.graphs.bucket(len(entries))]
        inputs.pack(entries, steps)
        inputs.send()
        ids = torch.stack([sampler.sample_ids(self.logits[: len(entries)], params, keys) for _ in range(max(steps))])
        return SampledTokens(ids, len(params), steps=max(steps))


def decoding_engine(batch: int, max_decode_steps: int, prefix_caching: bool) -> GeneratorEngine:
    """The engine around a ModelFreeRunner with `batch` sequences of 128-token random prompts
    (no two share a block) past their prefill and decoding."""
    scheduler = IterationScheduler(BlockManager(BLOCKS, BLOCK), batch, 4096, max_seq_len=CONTEXT,
                                   max_decode_steps=max_decode_steps, prefix_caching=prefix_caching)
    engine = GeneratorEngine(ModelFreeRunner(batch), IdsOnly(), CountingSink(), scheduler,
                             max_queue=100_000, cancel_check_interval_s=3600)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=CONTEXT - 129, ignore_eos=True)
    engine.admit([engine.new_sequence(i, rng.integers(1, 50_000, 128).tolist(), params, False)
                  for i in range(batch)])
    for _ in range(3):  # prefill, then decoding
        engine.step()
    return engine


def time_rounds(engine: GeneratorEngine, steps: int, rounds: int) -> list[float]:
    """Microseconds of host work per decode iteration, one number per round of `steps`."""
    seq = engine.scheduler.running[0]  # decoding with the others: counts the iterations
    out = []
    for _ in range(rounds):
        start, done = time.perf_counter(), seq.num_computed
        while seq.num_computed - done < steps:
            engine.step()
        out.append((time.perf_counter() - start) / (seq.num_computed - done) * 1e6)
    return out


def compare_prefix_caching(args) -> int:
    """Host work per decode iteration with prefix caching off and on, in alternating rounds of
    fresh engines (so drift on a shared machine hits both alike), on prompts that share nothing;
    also the admission of the batch (hashing every prompt's full blocks), once per request."""
    per_iteration = {False: [], True: []}
    admission = {False: [], True: []}
    for _ in range(args.repeats):
        for caching in (False, True):
            start = time.perf_counter()
            engine = decoding_engine(args.batch, args.max_decode_steps, caching)
            admission[caching].append((time.perf_counter() - start) * 1e3)
            per_iteration[caching].append(float(np.median(time_rounds(engine, args.steps, 3))))
    off, on = (float(np.median(per_iteration[c])) for c in (False, True))
    print(f"batch {args.batch}, {args.repeats} alternating runs, prompts of 128 random tokens (no shared prefix):")
    print("| prefix caching | host us per decode iteration (median) | admission + prefill + 2 steps ms (median) |")
    print("|---|---:|---:|")
    for caching, value in ((False, off), (True, on)):
        print(f"| {'on' if caching else 'off'} | {value:.1f} | {float(np.median(admission[caching])):.1f} |")
    print(f"\non / off: {on / off:.3f}x per decode iteration "
          f"(spread of the off runs: {min(per_iteration[False]):.1f}..{max(per_iteration[False]):.1f} us)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="decoding sequences")
    parser.add_argument("--steps", type=int, default=80, help="iterations per timed round (7 rounds)")
    parser.add_argument("--max-decode-steps", type=int, default=DEFAULT_DECODE_STEPS,
                        help="decode iterations per launch (the served default; 1: one per launch)")
    parser.add_argument("--repeats", type=int, default=7, help="alternating runs of --compare-prefix-caching")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of one round")
    parser.add_argument("--prefix-caching", action="store_true", help="with the generator's prefix caching on")
    parser.add_argument("--compare-prefix-caching", action="store_true",
                        help="prefix caching off vs on, alternating (prompts share nothing)")
    args = parser.parse_args()
    if args.compare_prefix_caching:
        return compare_prefix_caching(args)
    engine = decoding_engine(args.batch, args.max_decode_steps, args.prefix_caching)
    rounds = time_rounds(engine, args.steps, 7)
    print(f"batch {args.batch}: {sorted(rounds)[3]:.0f} us of host work per decode iteration "
          f"(median of 7 rounds; min {min(rounds):.0f}; prefix caching {'on' if args.prefix_caching else 'off'})")
    print()
    launches = max(1, args.steps // args.max_decode_steps)
    print(phase_table(engine, launches))
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(launches):
            engine.step()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
