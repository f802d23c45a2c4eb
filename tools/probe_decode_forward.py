"""Where a batch-64 GPT-2 decode iteration's time goes on the GPU: the engine's iteration, the
runner's launch (inputs packed and sent, then the replay), the replay alone, and the replay with
the sampled ids' copy back. CUDA events around back-to-back calls, 64 sequences decoding at
context ~140.

    python3 tools/probe_decode_forward.py [--max-decode-steps 1]   # (GPU)

(After the first replay alone, the graph's last kernel has turned every row into padding, since
`runner.run` packs no further iterations: only the first two lines compare with each other and
with the engine's.)
"""
from __future__ import annotations

import argparse
import time

import torch

from tritonformer.client import bench_decoder_baselines as hf
from tritonformer.client.bench_serve_decoder import _submit, _sync, decode_entries, prefill_until_decoding, random_engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-decode-steps", type=int, default=None, help="default: the served default")
    args = parser.parse_args()
    engine, vocab = random_engine("gpt2", torch.device("cuda"), max_running=256, token_budget=4096,
                                  max_decode_steps=args.max_decode_steps)
    _submit(engine, hf.fixed_trace(128, 400, 64, seed=1, vocab_size=vocab))
    prefill_until_decoding(engine)
    for _ in range(10):
        engine.step()
    _sync(engine)

    def timed(fn, n: int) -> tuple[float, float]:
        """ms per call: (wall clock, GPU time between events around the calls)."""
        _sync(engine)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e3, start.elapsed_time(end) / n

    first = engine.scheduler.running[0]
    before = first.num_computed
    wall, _ = timed(engine.step, 40)
    iterations = first.num_computed - before
    print(f"engine: {wall * 40 / iterations:.3f} ms per iteration ({iterations / 40:.1f} per launch)")
    entries = decode_entries(engine)
    print("runner.run (pack + send + replay): wall %.3f, GPU %.3f ms" % timed(lambda: engine.runner.run(entries), 50))
    graph = engine.runner.graphs._graphs[engine.runner.graphs.bucket(len(entries))][0]
    print("replay alone:                      wall %.3f, GPU %.3f ms" % timed(graph.replay, 50))
    ids = engine.runner.last_ids[: len(entries)]
    host = torch.empty(len(entries), dtype=torch.long, pin_memory=True)

    def replay_and_copy():
        graph.replay()
        host.copy_(ids, non_blocking=True)

    print("replay + ids to the host:          wall %.3f, GPU %.3f ms" % timed(replay_and_copy, 50))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
