"""The encoder engine process's host work per request, without a model or a GPU.

A served embedder request costs the engine process: reading the stub's message (unpickling it),
queueing the item, its share of a batch's step (the queue, the response cache, answering) and of
the flush that sends the answers back as one message per stub. This times each on this machine's
CPU around a model that returns rows at once, over batches of `--batch` one-sequence requests of
8-122 tokens (bert-base's row width). On a GPU the step's share overlaps the forward of the
batch after it; what is left of it, and everything else, is the engine thread's and the GIL's.

    python3 tools/encoder_host_cost.py [--batch 120] [--rounds 60] [--repeat 3]
"""
from __future__ import annotations

import argparse
import itertools
import pickle
import random
import threading
import time
from multiprocessing import Pipe

import torch

from tritonformer.backend.encoder.build import EncoderSpec, item_args
from tritonformer.backend.encoder.engine import EmbedRequest, EncoderEngine, PendingRows
from tritonformer.backend.engine_process.batching_sink import BatchingSink
from tritonformer.scheduler.fifo import FifoBatchPolicy

WIDTH = 768  # bert-base


class _NoModel:
    device = torch.device("cpu")


class _RowsAtOnce(EncoderEngine):
    """Rows at once, from buffers made ahead and taken in turn (on a GPU the rows land in pinned
    memory that the caching host allocator hands out again): a fresh tensor a batch would time
    this stand-in's page faults, ~20 us a request, instead of the engine."""

    BUFFERS = [torch.zeros((1024, WIDTH)) for _ in range(8)]
    _turn = itertools.cycle(BUFFERS)

    def launch(self, sequences, token_types=None):
        return PendingRows(next(self._turn)[:len(sequences)], time.perf_counter())


def measure(batch: int, rounds: int, seed: int = 0) -> dict[str, float]:
    """Microseconds per request of each part, over `rounds` batches."""
    rng = random.Random(seed)
    sink = BatchingSink()
    ours, theirs = Pipe()
    sink.connect(0, ours)

    def drain():  # the stub's end: read and drop
        while True:
            try:
                theirs.recv_bytes()
            except (EOFError, OSError):
                return

    threading.Thread(target=drain, daemon=True).start()
    policy = FifoBatchPolicy(EncoderSpec.max_batch_sequences, EncoderSpec.max_batch_tokens)  # the served limits
    engine = _RowsAtOnce(_NoModel(), sink, policy,
                         cuda_graphs=False, cache_entries=1024, max_queue=1 << 20)
    seconds = dict.fromkeys(("read", "queue", "step", "flush"), 0.0)
    for r in range(rounds):
        messages = []
        for i in range(batch):
            ids = [101] + [rng.randrange(1000, 30000) for _ in range(rng.randint(6, 120))] + [102]
            messages.append(pickle.dumps(("submit", [(r * batch + i, item_args(EmbedRequest(None, [ids])))])))
        t = time.perf_counter()
        bodies = [pickle.loads(m)[1] for m in messages]
        seconds["read"] += time.perf_counter() - t
        t = time.perf_counter()
        for body in bodies:
            for rid, args in body:
                sink.opened((0, rid))
                engine.admit([EncoderSpec.new_item(engine, (0, rid), args)])
        seconds["queue"] += time.perf_counter() - t
        t = time.perf_counter()
        while engine.has_work():
            engine.step()
        seconds["step"] += time.perf_counter() - t
        t = time.perf_counter()
        sink.flush()
        seconds["flush"] += time.perf_counter() - t
    ours.close()
    return {part: 1e6 * s / (rounds * batch) for part, s in seconds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=120, help="requests per batch (the served 8,192-token cap "
                                                           "holds about 120 of these)")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the table shows each part's fastest")
    args = ap.parse_args()
    runs = [measure(args.batch, args.rounds, seed) for seed in range(args.repeat)]
    best = {part: min(run[part] for run in runs) for part in runs[0]}
    print(f"encoder engine process, host work per request (batches of {args.batch}, fastest of {args.repeat} runs)")
    print("| read message | queue | step | flush | total |")
    print("|---:|---:|---:|---:|---:|")
    print("| " + " | ".join(f"{best[p]:.1f} us" for p in ("read", "queue", "step", "flush"))
          + f" | {sum(best.values()):.1f} us |")


if __name__ == "__main__":
    main()
