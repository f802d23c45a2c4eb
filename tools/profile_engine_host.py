"""The decoder engine's host work per decode iteration, without a model or a GPU.

The engine runs one iteration ahead of the GPU (backend/decoder/engine.py): an iteration costs
max(GPU forward, host work) only while the host's share (scheduling, inputs for the decode
graph, sampling bookkeeping, stop checks, responses) stays below the forward. This times that
share alone: the real scheduler, engine, sampler and decode-graph input packing around a runner
that returns logits at once.

    .venv/bin/python tools/profile_engine_host.py --batch 64 [--max-decode-steps 4] [--profile]
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
from tritonformer.client.bench_serve_decoder import _CountingSink, _IdsOnly
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="decoding sequences")
    parser.add_argument("--steps", type=int, default=80, help="iterations per timed round (7 rounds)")
    parser.add_argument("--max-decode-steps", type=int, default=DEFAULT_DECODE_STEPS,
                        help="decode iterations per launch (the served default; 1: one per launch)")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of one round")
    args = parser.parse_args()
    scheduler = IterationScheduler(BlockManager(BLOCKS, BLOCK), args.batch, 4096, max_seq_len=CONTEXT,
                                   max_decode_steps=args.max_decode_steps)
    engine = GeneratorEngine(ModelFreeRunner(args.batch), _IdsOnly(), _CountingSink(), scheduler,
                             max_queue=100_000, cancel_check_interval_s=3600)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=CONTEXT - 129, ignore_eos=True)
    engine.admit([engine.new_sequence(i, rng.integers(1, 50_000, 128).tolist(), params, False)
                  for i in range(args.batch)])
    for _ in range(3):  # prefill, then decoding
        engine.step()
    seq = engine.scheduler.running[0]  # decoding with the others: counts the iterations
    rounds = []
    for _ in range(7):
        start, done = time.perf_counter(), seq.num_computed
        while seq.num_computed - done < args.steps:
            engine.step()
        rounds.append((time.perf_counter() - start) / (seq.num_computed - done) * 1e6)
    print(f"batch {args.batch}: {sorted(rounds)[3]:.0f} us of host work per decode iteration "
          f"(median of 7 rounds; min {min(rounds):.0f})")
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
