"""Everything a generator's first requests would otherwise pay for, paid before it reports READY.

`DecoderRunner.warm_up` compiles the kernels of a few fixed launch shapes and captures every
decode graph. That is not what traffic looks like: under load an iteration packs several
prompts of different lengths, chunks of long ones, and decode rows beside them, and a Triton
kernel is compiled once per *specialisation* of its integer arguments (equal to 1, divisible by
16, neither) and per block-size choice its launcher makes from the shape. Each first sight of a
new combination compiles for 0.1-1 s while every stream in the batch waits: measured through
tritonserver on an H100, a fresh server's first two seconds at 128 req/s had a time to first
token of 756 ms at p50 (docs/benchmarks/serving.md, "Orca trace, served").

So the engine serves a short synthetic burst of its own before READY, through its real scheduler
and runner: prompts from one token to several iteration budgets long arriving in waves while
earlier ones decode, greedy and sampled, so that the mixes the scheduler builds under load have
all been compiled once. Responses go nowhere and nothing is counted in the metrics.
"""
from __future__ import annotations

import random

from tritonformer.backend.decoder.sampling_params import SamplingParams

WAVES = 4  # bursts of arrivals, each joining while the ones before decode


class _Discard:
    """A response sink for the warm-up's own requests."""

    def send(self, handle, outputs, error, final) -> None:
        if error is not None:
            raise RuntimeError(f"warm-up request failed: {error}")

    def is_cancelled(self, handle) -> bool:
        return False


def warm_up_traffic(engine, requests: int = 96, max_new_tokens: int = 24, seed: int = 0) -> int:
    """Serve `requests` synthetic requests on `engine` (not yet started: this runs its steps on
    the calling thread) and leave it empty. Returns the iterations run."""
    rng = random.Random(seed)
    cfg, scheduler = engine.config, engine.scheduler
    budget = scheduler.max_tokens_per_iteration
    # Long enough to be chunked, short enough that a few fit the KV pool together.
    pool_tokens = scheduler.blocks.num_blocks * scheduler.blocks.block_size
    longest = max(2, min(cfg.max_position_embeddings - max_new_tokens - 1, 2 * budget, pool_tokens // 8))
    prompts = [rng.randint(1, 32) for _ in range(requests // 3)]  # short: decode-heavy mixes
    prompts += [rng.randint(1, longest) for _ in range(requests - len(prompts))]
    rng.shuffle(prompts)
    # Total prompt tokens bounded (a few iterations' budget): seconds at most, even at 8B.
    total_cap, total = 8 * budget, 0
    seqs = []
    for i, n in enumerate(prompts):
        if total + n > total_cap:
            break
        total += n
        sampled = i % 4 == 3  # the sampling kernels too, not only greedy argmax
        params = SamplingParams(max_tokens=rng.randint(1, max_new_tokens), ignore_eos=True,
                                temperature=0.7 if sampled else 0.0, top_p=0.9 if sampled else 1.0,
                                top_k=50 if sampled else 0, seed=i if sampled else None)
        ids = [rng.randrange(cfg.vocab_size) for _ in range(n)]
        seqs.append(engine.new_sequence(None, ids, params, stream=True))

    sink, stats = engine.sink, engine.stats
    engine.sink, engine.stats = _Discard(), None
    iterations = 0
    try:
        wave = -(-len(seqs) // WAVES)
        for start in range(0, len(seqs), wave):
            engine.admit(seqs[start : start + wave])
            for _ in range(3):  # the next wave joins running decodes
                engine.step()
                iterations += 1
        while engine.has_work():
            engine.step()
            iterations += 1
    finally:
        engine.sink, engine.stats = sink, stats
    return iterations


def warm_up(engine) -> None:
    """The whole warm-up of a built engine, before it starts: the runner's fixed shapes and decode
    graphs, then (on a GPU, where kernels compile) the synthetic burst above."""
    engine.runner.warm_up()
    if engine.runner.model.device.type == "cuda":
        warm_up_traffic(engine)
