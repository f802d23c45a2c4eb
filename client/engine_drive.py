"""Driving the generator engine in this process, without a server: what the decoder benchmarks,
the GPU tools and some tests share (the engine built as served on a model's weights, a response
sink that counts, requests submitted at once or at a rate, stepping until every sequence
decodes, timing decode iterations in steady state and whole traces)."""
from __future__ import annotations

import time
from dataclasses import replace

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


def our_engine(hf_model, device, dtype, max_running: int, token_budget: int, kv_fraction: float = 0.4,
               max_decode_steps: int | None = None, prefix_caching: bool | None = None):
    """Our engine on the HF model's weights, configured as served; returns (engine, sink)."""
    from tritonformer.backend.checkpoints.weights import strip_prefixes_of
    from tritonformer.backend.models.decoder import load_decoder

    model = load_decoder(hf_model.config.to_dict(), strip_prefixes_of(hf_model.state_dict()), device, dtype)
    return engine_for(model, max_running, token_budget, kv_fraction, max_decode_steps, prefix_caching)


def engine_for(model, max_running: int, token_budget: int, kv_fraction: float = 0.4,
               max_decode_steps: int | None = None, prefix_caching: bool | None = None):
    """Our engine on `model`, configured as served (prefix caching as served unless given),
    warmed up; returns (engine, sink)."""
    from tritonformer.backend.decoder.build import EngineOptions, build_engine
    from tritonformer.backend.decoder.runner import DEFAULT_DECODE_STEPS
    from tritonformer.backend.engine_loop import freeze_startup_objects

    options = EngineOptions(max_running_sequences=max_running, max_tokens_per_iteration=token_budget,
                            max_decode_steps=max_decode_steps or DEFAULT_DECODE_STEPS,
                            kv_cache_memory_fraction=kv_fraction, max_queue_requests=100_000,
                            cancel_check_interval_s=3600)
    if prefix_caching is not None:
        options = replace(options, prefix_caching=prefix_caching)
    sink = CountingSink()
    engine = build_engine(model, IdsOnly(), sink, options)
    engine.runner.warm_up()
    freeze_startup_objects()  # as the served engine does when it starts (engine_loop.py)
    return engine, sink


def random_engine(name: str, device, dtype=None, max_running: int = 256, token_budget: int = 2048,
                  max_decode_steps: int | None = None):
    """Our engine on a random-weight model, "gpt2" (124M) or "llama" (the Llama-3.2-1B shape),
    fp16 by default, for the GPU tools; returns (engine, vocabulary size)."""
    import torch

    from tritonformer.client import hf_reference as hf

    dtype = dtype or torch.float16
    hf_model = {"gpt2": hf.random_gpt2, "llama": hf.random_llama_1b}[name](device, dtype)
    engine, _ = our_engine(hf_model, device, dtype, max_running=max_running, token_budget=token_budget,
                           max_decode_steps=max_decode_steps)
    return engine, hf_model.config.vocab_size


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
    rewrites the same cache slots with the same values, so they can be replayed for timing (a
    hybrid model's recurrent state moves on each time: the timing is the same)."""
    from tritonformer.backend.decoder.batch import BatchEntry

    return [BatchEntry(s.tokens(s.num_computed - 1, 1), s.num_computed - 1, s.block_table, True, s.state_slot)
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


def run_ours(engine, sink, trace) -> dict:
    """All requests at once; iterations until every one finished. Useful tokens/s and the mean
    share of reserved KV blocks in use."""
    submit(engine, trace)
    used, iterations, preempted_before = [], 0, engine.scheduler.num_preemptions
    sync(engine)
    t0 = time.perf_counter()
    while engine.has_work():
        engine.step()
        blocks = engine.scheduler.blocks
        held = sum(len(s.block_table) for s in engine.scheduler.running)
        cached = sum(s.num_computed for s in engine.scheduler.running)
        if held:
            used.append(cached / (held * blocks.block_size))
        iterations += 1
    sync(engine)
    seconds = time.perf_counter() - t0
    useful = sum(r.max_new_tokens for r in trace)
    if sink.errors or sink.finished < len(trace):
        raise RuntimeError(f"{len(trace) - sink.finished} requests unfinished; errors: {sink.errors[:3]}")
    sink.finished = 0
    return {"useful_tokens": useful, "seconds": seconds, "tok_per_s": useful / seconds, "iterations": iterations,
            "kv_token_utilisation": float(np.mean(used)) if used else 0.0,
            "preemptions": engine.scheduler.num_preemptions - preempted_before}


PHASES = ("prefill", "round", "single decode", "none")


class PhaseClock:
    """Wall time of `engine.step()` calls by what the scheduler launched in them: "prefill" (an
    iteration with prompt chunks), "round" (several decode iterations in one launch), "single
    decode", "none" (nothing scheduled: only results collected). A step's time includes the
    host waiting for the GPU work of the step before, so the split is approximate where steps
    overlap; the total is the pass's. Use as a context (it wraps the scheduler's `schedule`)."""

    def __init__(self, engine):
        self.scheduler = engine.scheduler
        self.phases = {kind: [0.0, 0, 0] for kind in PHASES}  # seconds, launches, iterations
        self._last = None

    def __enter__(self) -> "PhaseClock":
        plain = self.scheduler.schedule

        def schedule():
            self._last = it = plain()
            return it

        self.scheduler.schedule = schedule
        return self

    def __exit__(self, *exc) -> None:
        del self.scheduler.schedule

    def step(self, engine) -> None:
        self._last = None
        start = time.perf_counter()
        engine.step()
        it = self._last
        kind = "none" if not it else "prefill" if it.prefill else "round" if it.steps > 1 else "single decode"
        phase = self.phases[kind]
        phase[0] += time.perf_counter() - start
        phase[1] += 1
        phase[2] += it.steps if it else 0

    def as_dict(self) -> dict:
        return {kind: {"seconds": t, "launches": n, "iterations": its} for kind, (t, n, its) in self.phases.items()}


def run_timed(engine, sink, trace, rate: float = 0.0) -> dict:
    """The trace through the engine, greedy, EOS ignored: all requests at once (rate 0) or one
    every 1/rate seconds. Time to first token from the engine's own timestamps (a sequence's
    first token reaching the host minus its arrival), useful tokens/s from the first arrival
    to the last finish, each request's output ids, the prefix cache's counts, and the steps'
    time by phase (PhaseClock)."""
    from tritonformer.backend.decoder.sampling_params import SamplingParams

    def new(i: int):
        r = trace[i]
        return engine.new_sequence(i, r.prompt_ids, SamplingParams(max_tokens=r.max_new_tokens, ignore_eos=True), False)

    cache = engine.scheduler.prefix_cache
    before = (cache.queries, cache.hits, cache.hit_tokens) if cache is not None else (0, 0, 0)
    sync(engine)
    t0 = time.perf_counter()
    with PhaseClock(engine) as clock:
        if rate > 0:
            seqs, start = [], time.monotonic()
            while len(seqs) < len(trace) or engine.has_work():
                due = start + len(seqs) / rate
                if len(seqs) < len(trace) and time.monotonic() >= due:
                    seq = new(len(seqs))
                    seq.arrival = due  # when it was due, whatever the step in progress then
                    engine.admit([seq])
                    seqs.append(seq)
                elif engine.has_work():
                    clock.step(engine)
                else:
                    time.sleep(max(0.0, due - time.monotonic()))
        else:
            seqs = [new(i) for i in range(len(trace))]
            engine.admit(seqs)
            while engine.has_work():
                clock.step(engine)
    sync(engine)
    seconds = time.perf_counter() - t0
    if sink.errors or sink.finished < len(trace):
        raise RuntimeError(f"{len(trace) - sink.finished} requests unfinished; errors: {sink.errors[:3]}")
    sink.finished = 0
    ttft = np.array([s.first_token_at - s.arrival for s in seqs]) * 1e3
    useful = sum(r.max_new_tokens for r in trace)
    after = (cache.queries, cache.hits, cache.hit_tokens) if cache is not None else (0, 0, 0)
    queries, hits, hit_tokens = (a - b for a, b in zip(after, before))
    return {"ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "ttft_ms": ttft.tolist(), "useful_tokens": useful,
            "tok_per_s": useful / seconds, "seconds": seconds, "outputs": [list(s.output_ids) for s in seqs],
            "cache_queries": queries, "cache_hits": hits, "cache_hit_tokens": hit_tokens,
            "phases": clock.as_dict()}
