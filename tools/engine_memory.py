"""Does the embedder's engine process keep memory per request, or only its largest batch's?

Starts the embedder's engine process (the bundled all-MiniLM-L6-v2 by default) without
tritonserver, as a stub would, and sends it rounds of requests in bursts (1-8 random texts of 1-60
words each), printing the engine process's resident memory after every round. A per-request leak
climbs round after round; an allocator that keeps the heap of the largest batch it has run levels
off once the bursts have formed the largest batches. Run it again with glibc's mmap threshold
fixed (`--mmap-threshold 1048576`: activations above 1 MiB are returned to the system when freed)
to see the difference and what it costs in time. CPU or GPU; about 2 minutes on 2 CPU cores.

    python3 tools/engine_memory.py --rounds 15
    python3 tools/engine_memory.py --rounds 15 --mmap-threshold 1048576
"""
from __future__ import annotations

import argparse
import os
import random
import time

from soak import random_text


def resident_mib(pid: int | str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None, help="an encoder folder (default: the bundled MiniLM)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=100, help="per round, sent in bursts of 10")
    parser.add_argument("--mmap-threshold", type=int, default=None,
                        help="bytes: sets MALLOC_MMAP_THRESHOLD_ for the engine process (glibc's default adapts)")
    args = parser.parse_args()
    if args.mmap_threshold is not None:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)  # the spawned engine reads it at start

    from tritonformer.backend.checkpoints.defaults import minilm_dir
    from tritonformer.backend.encoder.build import EncoderSpec, item_args
    from tritonformer.backend.encoder.engine import EmbedRequest
    from tritonformer.backend.engine_process.client import EngineClient
    from tritonformer.backend.tokenization import TextTokenizer
    from tritonformer.client.engine_drive import CountingSink

    checkpoint = args.checkpoint or str(minilm_dir())
    tokenizer, sink, rng = TextTokenizer(checkpoint), CountingSink(), random.Random(0)
    client = EngineClient.connect(EncoderSpec("embedder", checkpoint, args.device, args.dtype), sink, name="embedder")
    sent, start = 0, time.perf_counter()
    try:
        print(f"engine process {client.info.pid}: {resident_mib(client.info.pid):,.0f} MiB after start-up")
        for round_ in range(args.rounds):
            for i in range(args.requests):
                sent += 1
                texts = [random_text(rng) for _ in range(rng.randint(1, 8))]
                client.submit([(sent, *item_args(EmbedRequest(None, tokenizer.encode_batch(texts))))])
                if i % 10 == 9:
                    time.sleep(0.005)
            while sink.finished < sent:
                time.sleep(0.01)
            print(f"round {round_:3d}  requests {sent:6d}  engine process {resident_mib(client.info.pid):,.0f} MiB",
                  flush=True)
    finally:
        client.close()
    print(f"{sent} requests in {time.perf_counter() - start:.1f} s"
          + (f"; {len(sink.errors)} errors, the first: {sink.errors[0]}" if sink.errors else ""))
    return 1 if sink.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
