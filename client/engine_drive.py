"""Driving the generator engine in this process, without a server: what the decoder benchmarks,
the GPU tools and some tests share (a response sink that counts, requests submitted at once,
stepping until every sequence decodes, timing decode iterations in steady state)."""
from __future__ import annotations

import time

import numpy as np

WARM_STEPS = 8  # decode steps before the timed ones: the switch from prefill, the first replays


class CountingSink:
    """Collects final responses only (the benchmarks ask for whole completions)."""

    def __init__(self):
        self.finished = 0
        self.errors: list = []

    def send(self, handle, outputs, error, final):
        if final:
            self.finished += 1
        if error is not None:
            self.errors.append(error)

    def is_cancelled(self, handle):
        return False


class IdsOnly:
    """The random-weight models have no tokenizer; HF's baselines return ids, so do we."""

    def decode(self, ids, **kwargs) -> str:
        return ""


def submit(engine, trace) -> None:
    """Every TraceRequest of `trace` admitted at once, greedy, EOS ignored, not streamed."""
    from tritonformer.backend.decoder.sampling_params import SamplingParams

    seqs = [engine.new_sequence(i, r.prompt_ids, SamplingParams(max_tokens=r.max_new_tokens, ignore_eos=True), False)
            for i, r in enumerate(trace)]
    engine.admit(seqs)


def sync(engine) -> None:
    import torch

    if engine.runner.model.device.type == "cuda":
        torch.cuda.synchronize()


def iterate(engine, seq, n: int) -> None:
    """Step until `seq` has run n more iterations."""
    target = seq.num_computed + n
    while seq.num_computed < target:
        engine.step()


def prefill_until_decoding(engine) -> None:
    """Step until every submitted sequence is past its prompt and decoding."""
    while any(s.num_computed < s.num_tokens - 1 or not s.output_ids for s in engine.scheduler.running) \
            or engine.scheduler.waiting:
        engine.step()


def timed_decode_steps(engine, steps: int) -> tuple[float, np.ndarray]:
    """Milliseconds per decode iteration of the submitted sequences in steady state (after
    their prompts and WARM_STEPS decode iterations), as the engine runs them (a launch may cover
    several iterations: max_decode_steps); and each launch's ms per iteration. The sequences must
    have tokens left for WARM_STEPS + steps + a round's worth of iterations."""
    prefill_until_decoding(engine)
    first = engine.scheduler.running[0]  # all decode in step: one sequence counts the iterations
    iterate(engine, first, WARM_STEPS)
    sync(engine)
    start = first.num_computed
    marks, counts = [time.perf_counter()], []
    while first.num_computed - start < steps:
        if first.finish_reason is not None:
            raise RuntimeError("the counting sequence finished before the timed iterations did")
        before = first.num_computed
        engine.step()
        marks.append(time.perf_counter())
        counts.append(first.num_computed - before)
    sync(engine)
    ms = (time.perf_counter() - marks[0]) / (first.num_computed - start) * 1e3
    return ms, np.diff(marks) * 1e3 / np.maximum(counts, 1)


def decode_entries(engine) -> list:
    """The running sequences' current decode iteration as runner entries; running them again
    rewrites the same cache slots with the same values, so they can be replayed for timing."""
    from tritonformer.backend.decoder.batch import BatchEntry

    return [BatchEntry(s.tokens(s.num_computed - 1, 1), s.num_computed - 1, s.block_table, True)
            for s in engine.scheduler.running]


def forward_ms(engine, repeats: int = 50) -> float:
    """The model's part of a decode iteration alone (graph replay on a GPU)."""
    entries = decode_entries(engine)
    engine.runner.run(entries)
    sync(engine)
    t0 = time.perf_counter()
    for _ in range(repeats):
        engine.runner.run(entries)
    sync(engine)
    return (time.perf_counter() - t0) / repeats * 1e3
