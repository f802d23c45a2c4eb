"""`tritonformer bench tensor-parallel`: one model split over the GPUs of this host against one GPU.

For each published shape (client/model_shapes.py) and tensor-parallel size, random weights built
on each rank's own GPU (no checkpoint: a 70B shape is 141 GB) from a fixed seed, the same whole
model at every size (model_shapes.seeded_shard_state), and the engine as served (decode CUDA
graphs with the all-reduces captured, rounds of max_decode_steps). `--parts` picks what runs:

- `steps`: milliseconds per decode iteration with `batch` sequences decoding at a context of
  `--context` tokens, beside the weight-read floor of one rank (its weight bytes over the copy
  bandwidth measured here) and the ratio to the same shape on one GPU where it fits;
- `trace`: the Orca-style trace (bench_serve_decoder's: 256 requests, prompt U[32,512], output
  U[1,128], seed 0, greedy, EOS ignored), every request submitted at once (saturation: the trace
  has no arrival times): useful tokens/s, TTFT p50/p99 and the steps' time by phase (prefill
  launches, decode rounds: engine_drive.PhaseClock) against TP=1's; with `--replicas`, beside N one-GPU
  engines, each its own process on its own GPU serving 1/N of the requests, started together,
  their tokens summed over the wall time of the slowest;
- `profile`: torch.profiler over decode iterations at each batch on rank 0: the GPU time per
  iteration in all-reduce kernels (NCCL's or our own) against all kernels and the whole step,
  and the kernels taking the most time (TP=1 too, to set each rank's kernels beside one GPU's);
- `prefill`: milliseconds per prefill of `--prefill-tokens` prompt tokens (prompts of
  `--context` tokens, fresh random ones each time, in one iteration with their first tokens
  sampled), the prompt tokens per second and the ratio to TP=1; on a GPU also one prefill under
  torch.profiler: its all-reduce time and the kernels taking the most (a prefill's all-reduces
  are past the push kernel's sizes and run through NCCL, outside a graph);
- `agree`: 32 greedy tokens of 3 fixed prompts at each size against TP=1 (and TP=2): identical
  or where they part, the share of identical tokens, and the largest logit difference of the
  first step (fp16 sums in another order: a near tie may part them later). With
  `--quantization fp8` each size is also set against TP=1 without FP8 ("TP=1 16-bit", one more
  configuration): two FP8 models quantise a row-parallel weight in different slices, so they may
  part from each other; what must hold is that TP=N is no further from the 16-bit model than
  TP=1 with FP8 is.

Every size (and all-reduce choice, `--allreduce nccl,auto`, set as TRITONFORMER_ALLREDUCE for
rank 0 and its workers) runs in a process of its own: its GPU memory, NCCL group and worker
processes are gone before the next starts, whatever happened (out of memory, a hang: killed at
`--timeout`). A size above the GPU count, or one the shape's heads do not divide by, is skipped
with a note; a shape that does not fit at a size is reported so.

    tritonformer bench tensor-parallel --model llama-3.1-8b,llama-3.1-70b --sizes 1,2 --batches 1,64
    tritonformer bench tensor-parallel --model llama-3.1-8b --sizes 1,2 --parts trace --replicas
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue as queue_module
import signal
import sys
import time
import traceback

from tritonformer.client.engine_drive import (WARM_STEPS, CountingSink, IdsOnly, iterate, prefill_until_decoding,
                                               run_timed, sync, timed_decode_steps)
from tritonformer.client.traces import TraceRequest, orca_trace, warm_up_copy

PARTS = ("steps", "trace", "profile", "prefill", "agree")
ALLREDUCE = ("nccl", "oneshot", "push", "auto", "fused")
ALLREDUCE_ENV = "TRITONFORMER_ALLREDUCE"
TINY = "tiny:"  # `--model tiny:<shape>`: the shape shrunk to 2 layers (model_shapes.shrunk), for CPU runs
TRACE_MAX_RUNNING = 256  # bench serve-decoder's engine for the trace
AGREE_TOKENS = 32
SIXTEEN_BIT = "16-bit"  # the agree part's reference without FP8 (--quantization fp8), in the all-reduce column
TOP_KERNELS = 20  # the profile part lists this many kernels by time
NAME_CHARS = 60
GRACE_S = 30.0  # a configuration's process, its results sent, has this long to leave its group


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama-3.1-8b",
                        help="comma-separated published shapes (client/model_shapes.py), or tiny:<shape>")
    parser.add_argument("--sizes", default="1,2", help="tensor-parallel sizes, comma-separated (1, 2, 4, 8)")
    parser.add_argument("--parts", default="steps", help="comma-separated: " + ", ".join(PARTS))
    parser.add_argument("--allreduce", default="auto",
                        help="all-reduce of the split sizes: nccl, oneshot, push, auto or fused, or a comma list run one "
                             "after the other (set as TRITONFORMER_ALLREDUCE)")
    parser.add_argument("--batches", default="1,64", help="decode batches of the steps and profile parts")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens of every sequence (steps, profile)")
    parser.add_argument("--steps", type=int, default=48, help="timed decode iterations")
    parser.add_argument("--profile-steps", type=int, default=24, help="decode iterations under the profiler")
    parser.add_argument("--prefill-tokens", type=int, default=4096,
                        help="prompt tokens of one prefill (prefill part; the engine's iteration budget is 4,096)")
    parser.add_argument("--prefill-repeats", type=int, default=8, help="timed prefills (prefill part)")
    parser.add_argument("--replicas", nargs="?", const="sizes", default=None,
                        help="trace part: also N one-GPU engines, one per GPU; N: each split size (no value) or a "
                             "comma list")
    parser.add_argument("--trace-requests", type=int, default=256, help="requests of the Orca trace")
    parser.add_argument("--agree-tokens", type=int, default=AGREE_TOKENS, help="greedy tokens per prompt (agree)")
    parser.add_argument("--kv-fraction", type=float, default=0.5,
                        help="share of the GPU memory free after the weights given to the KV cache")
    parser.add_argument("--seed", type=int, default=0, help="of the random weights")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    parser.add_argument("--quantization", default="none", choices=("none", "fp8"),
                        help="fp8: FP8 linears, each rank quantising its own slices (the floor counts FP8 bytes)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: ranks over gloo, for testing the benchmark itself")
    parser.add_argument("--timeout", type=float, default=480.0, help="seconds one configuration may take")
    parser.add_argument("--json", help="also write the results here (rewritten after each configuration)")


# ---- what runs: pure, tested on the CPU -------------------------------------------------------

def parse_ints(text: str) -> list[int]:
    """"1,2,4" -> [1, 2, 4], repeats dropped, order kept."""
    values: list[int] = []
    for item in text.split(","):
        if item.strip():
            v = int(item)
            if v < 1:
                raise SystemExit(f"sizes and batches must be positive, got {v}")
            if v not in values:
                values.append(v)
    return values


def parse_choices(text: str, known: tuple[str, ...], what: str) -> list[str]:
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen:
        raise SystemExit(f"unknown {what} {', '.join(unknown) or repr(text)} (known: {', '.join(known)})")
    return list(dict.fromkeys(chosen))


def model_config(name: str) -> dict:
    """The config of a published shape, or of `tiny:<shape>` (2 layers, hidden 128, 1,024 positions)."""
    from tritonformer.client.model_shapes import DECODER_SHAPES, shrunk

    base = name[len(TINY):] if name.startswith(TINY) else name
    if base not in DECODER_SHAPES:
        raise SystemExit(f"unknown --model {name!r} (known: {', '.join(DECODER_SHAPES)}, or tiny:<one of them>)")
    if name.startswith(TINY):
        return {**shrunk(base), "max_position_embeddings": 1024}
    return dict(DECODER_SHAPES[base])


def split_problem(config: dict, size: int) -> str | None:
    """Why `config` cannot be split `size` ways (heads, KV heads or MLP columns do not divide), or None.
    A model without attention (Mamba) has no heads to check; the family's loader checks the rest."""
    heads = config.get("num_attention_heads")
    for what, n in (("attention heads", heads), ("KV heads", config.get("num_key_value_heads", heads)),
                    ("MLP columns", config.get("intermediate_size"))):
        if n is not None and n % size:
            return f"its {n} {what} do not divide by {size}"
    return None


def plan_sizes(sizes: list[int], devices: int | None, config: dict | None = None) -> tuple[list[int], list[str]]:
    """The sizes that can run here (`devices`: the GPU count, None on the CPU: any), and a note
    for each skipped one."""
    runnable, notes = [], []
    for size in sizes:
        if devices is not None and size > devices:
            notes.append(f"TP={size} skipped: needs {size} GPUs, {devices} here")
        elif config is not None and size > 1 and split_problem(config, size):
            notes.append(f"TP={size} skipped: {split_problem(config, size)}")
        else:
            runnable.append(size)
    return runnable, notes


def replica_counts(spec: str | None, sizes: list[int], devices: int | None) -> tuple[list[int], list[str]]:
    """How many one-GPU replicas to run beside the split sizes: none (no --replicas), as many as
    each split size (--replicas alone) or the listed counts, each within the GPU count."""
    if spec is None:
        return [], []
    wanted = [s for s in sizes if s > 1] if spec == "sizes" else parse_ints(spec)
    counts, notes = [], []
    for n in wanted:
        if n < 2:
            notes.append(f"{n} replica: nothing to compare (TP=1 is the one-GPU row)")
        elif devices is not None and n > devices:
            notes.append(f"{n} replicas skipped: needs {n} GPUs, {devices} here")
        else:
            counts.append(n)
    return counts, notes


def kernel_kind(name: str) -> str:
    """"all_reduce" (NCCL's AllReduce kernels, our one-shot and push kernels), "collective"
    (NCCL's other kernels: the logits' gather, the sampled ids' broadcast) or "compute"."""
    low = name.lower()
    if "all_reduce" in low or "allreduce" in low:
        return "all_reduce"
    return "collective" if "nccl" in low else "compute"


def collective_times(kernels, iterations: int) -> dict:
    """Per decode iteration: microseconds and launches of each kernel kind, from (name, us) pairs."""
    sums = {kind: [0.0, 0] for kind in ("all_reduce", "collective", "compute")}
    for name, us in kernels:
        total = sums[kernel_kind(name)]
        total[0] += us
        total[1] += 1
    n = max(iterations, 1)
    out = {"kernel_us": sum(us for us, _ in sums.values()) / n}
    for kind in ("all_reduce", "collective"):
        out[f"{kind}_us"], out[f"{kind}_count"] = sums[kind][0] / n, sums[kind][1] / n
    return out


def top_kernels(kernels, iterations: int, count: int = TOP_KERNELS) -> list:
    """The `count` kernels (by name, cut to NAME_CHARS) taking the most GPU time per decode
    iteration: [name, us per iteration, launches per iteration], most first."""
    by_name: dict[str, list] = {}
    for name, us in kernels:
        total = by_name.setdefault(name[:NAME_CHARS], [0.0, 0])
        total[0] += us
        total[1] += 1
    n = max(iterations, 1)
    ranked = sorted(by_name.items(), key=lambda item: -item[1][0])[:count]
    return [[name, us / n, launches / n] for name, (us, launches) in ranked]


def compare_tokens(a: list[list[int]], b: list[list[int]]) -> dict:
    """Greedy outputs of the same prompts: identical, the first (prompt, token) where they part,
    and the share of positions holding the same token."""
    same = total = 0
    first = None
    for i, (x, y) in enumerate(zip(a, b)):
        for j in range(max(len(x), len(y))):
            equal = j < len(x) and j < len(y) and x[j] == y[j]
            same += equal
            total += 1
            if not equal and first is None:
                first = (i, j)
    return {"identical": first is None and len(a) == len(b), "first_divergence": first,
            "identical_fraction": same / total if total else 1.0}


def agree_prompts(vocab: int) -> list[list[int]]:
    """Three fixed prompts of token ids (7, 24 and 61 tokens), below the special tokens."""
    high = min(vocab, 30000)
    return [[(17 * i + 3) % high for i in range(7)], [(101 * i + 29) % high for i in range(24)],
            [(7919 * i + 11) % high for i in range(61)]]


def merge_replicas(results: list[dict]) -> dict:
    """N replicas' trace results as one server's: tokens summed over the slowest one's time,
    TTFT percentiles over every request."""
    import numpy as np

    ttft = np.concatenate([np.asarray(r["ttft_ms"]) for r in results])
    tokens, seconds = sum(r["useful_tokens"] for r in results), max(r["seconds"] for r in results)
    return {"useful_tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds,
            "ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "preemptions": sum(r.get("preemptions", 0) for r in results), "requests": int(ttft.size),
            "slowest_s": seconds, "fastest_s": min(r["seconds"] for r in results)}


# ---- one configuration, in a process of its own -------------------------------------------

def build(task: dict):
    """(engine, workers or None): the model of `task` split task["size"] ways, warmed up."""
    import functools

    import torch

    from tritonformer.backend.decoder.build import EngineOptions, build_engine
    from tritonformer.backend.decoder.warm_up import warm_up
    from tritonformer.backend.models.decoder import load_decoder
    from tritonformer.backend.parallel.workers import ShardSource, start_ranks
    from tritonformer.client.model_shapes import seeded_shard_state

    cfg, size, cuda = task["config"], task["size"], task["device"] == "cuda"
    max_len = min(4096, cfg.get("max_position_embeddings", 4096))  # (a Mamba has no position limit)
    workers = None
    if size == 1:
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        state = seeded_shard_state(cfg, task["seed"], str(device), task["dtype"])
        model = load_decoder(cfg, state, device, getattr(torch, task["dtype"]), max_len,
                             quantization=task["quantization"])
    else:
        source = ShardSource("", cfg, task["dtype"], task["device"], 0, max_len,
                             state_factory=functools.partial(seeded_shard_state, dtype=task["dtype"]),
                             factory_args=(cfg, task["seed"]), quantization=task["quantization"])
        model, workers = start_ranks(source, size)
    try:
        if cuda:
            torch.cuda.empty_cache()  # what loading left cached: not the KV cache's to lose
        options = EngineOptions(max_running_sequences=task["max_running"], max_tokens_per_iteration=4096,
                                kv_cache_memory_fraction=task["kv_fraction"], cuda_graphs=cuda,
                                cancel_check_interval_s=3600, max_queue_requests=100_000)
        engine = build_engine(model, IdsOnly(), CountingSink(), options, workers=workers)
        warm_up(engine)
    except BaseException:
        if workers is not None:  # (bounded; rank 0 leaves no group: its process ends with the error sent)
            workers.stop()
        raise
    return engine, workers


def release(engine, workers) -> None:
    """Stop the workers and leave the group (the process ends next: that frees the rest)."""
    if workers is not None:
        workers.stop()
    if engine is not None:
        engine.runner.close()  # its graphs, then the group


def step_ms(engine, batch: int, context: int, steps: int, vocab: int) -> float:
    """Milliseconds per decode iteration with `batch` sequences of `context` prompt tokens
    decoding, in steady state (engine_drive.timed_decode_steps)."""
    ms, _ = timed_decode_steps(engine, _admit_decoding(engine, batch, context, steps, vocab, seed=1))
    _drain(engine)
    return ms


def _admit_decoding(engine, batch: int, context: int, steps: int, vocab: int, seed: int) -> int:
    """`batch` sequences of `context` random prompt tokens with tokens to spare for `steps`
    timed iterations after the warm ones; returns `steps`."""
    import numpy as np

    from tritonformer.backend.decoder.sampling_params import SamplingParams

    rng = np.random.default_rng(seed)
    new = WARM_STEPS + steps + 4 * engine.scheduler.max_decode_steps + 16
    engine.admit([engine.new_sequence(i, rng.integers(0, min(vocab, 30000), context).tolist(),
                                      SamplingParams(max_tokens=new, ignore_eos=True), False) for i in range(batch)])
    return steps


def _drain(engine) -> None:
    while engine.has_work():
        engine.step()
    if engine.sink.errors:
        raise RuntimeError(f"requests failed: {engine.sink.errors[:2]}")
    engine.sink.finished = 0


def profile_batch(engine, batch: int, context: int, steps: int, vocab: int) -> dict:
    """torch.profiler (CUDA kernels, those inside graph replays too) over `steps` decode
    iterations of `batch` sequences on this rank: time per iteration by kernel kind."""
    import torch

    _admit_decoding(engine, batch, context, steps, vocab, seed=2)
    prefill_until_decoding(engine)
    first = engine.scheduler.running[0]
    iterate(engine, first, WARM_STEPS)
    sync(engine)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start, t0 = first.num_computed, time.perf_counter()
        while first.num_computed - start < steps:
            engine.step()
        sync(engine)
        wall = time.perf_counter() - t0
    iterations = first.num_computed - start
    _drain(engine)
    kernels = [(e.name, e.device_time) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"batch": batch, "iterations": iterations, "step_us": wall / iterations * 1e6,
            **collective_times(kernels, iterations), "top": top_kernels(kernels, iterations)}


def prefill_time(engine, tokens: int, context: int, repeats: int, vocab: int, profile: bool) -> dict:
    """Milliseconds per prefill of `tokens` prompt tokens: prompts of `context` tokens (fresh
    random ones each time, so nothing comes from the prefix cache), each asking for one token,
    so the prefill and its sampling are all there is; the mean of `repeats` after one untimed.
    With `profile` (a GPU), one more under torch.profiler: its all-reduce time and top kernels."""
    import numpy as np

    from tritonformer.backend.decoder.sampling_params import SamplingParams

    rng = np.random.default_rng(3)
    per = max(1, min(context, tokens))
    count = max(1, tokens // per)

    def one() -> int:
        engine.admit([engine.new_sequence(i, rng.integers(0, min(vocab, 30000), per).tolist(),
                                          SamplingParams(max_tokens=1, ignore_eos=True), False) for i in range(count)])
        steps = 0
        while engine.has_work():
            engine.step()
            steps += 1
        sync(engine)
        return steps

    one()
    t0 = time.perf_counter()
    steps = sum(one() for _ in range(repeats))
    seconds = (time.perf_counter() - t0) / repeats
    result = {"tokens": per * count, "prompts": count, "steps_each": steps / repeats, "ms": seconds * 1e3,
              "tok_per_s": per * count / seconds}
    if profile:
        import torch

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            one()
        kernels = [(e.name, e.device_time) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        result.update(collective_times(kernels, 1), top=top_kernels(kernels, 1))
    _drain(engine)
    return result


def trace_share(task: dict, vocab: int) -> list:
    """The Orca trace, or this replica's share of it (every N-th request)."""
    trace = orca_trace(task["trace_requests"], 0, vocab_size=min(vocab, 30000))
    index, count = task.get("share") or (0, 1)
    return trace[index::count]


def warm_trace(engine, trace) -> None:
    """An eighth of the trace untimed (traces.warm_up_copy): the prefill shapes compile, and the
    timed pass finds none of its prompts in the prefix cache."""
    run_timed(engine, engine.sink, warm_up_copy(trace, 8))


def timed_trace(engine, trace) -> dict:
    """Every request at once (saturation): useful tokens/s, TTFT, preemptions."""
    preempted = engine.scheduler.num_preemptions
    result = run_timed(engine, engine.sink, trace)
    result.pop("outputs")
    return {**result, "preemptions": engine.scheduler.num_preemptions - preempted, "requests": len(trace)}


def greedy_and_logits(engine, vocab: int, new_tokens: int = AGREE_TOKENS) -> dict:
    """The agree prompts' greedy tokens, then the logits of their first step (a prefill of each
    on the first blocks: run last, the engine is left as it was only in its cache's contents,
    which nothing reads after this)."""
    import torch

    from tritonformer.backend.decoder.batch import BatchEntry

    prompts = agree_prompts(vocab)
    tokens = run_timed(engine, engine.sink, [TraceRequest(p, new_tokens) for p in prompts])["outputs"]
    size, rows = engine.runner.cache.block_size, []
    slot = 0 if engine.runner.cache.state is not None else -1  # (hybrid models: one state slot, zeroed each time)
    for p in prompts:  # (one at a time: the engine may have fewer state slots than prompts)
        entry = BatchEntry(p, 0, list(range(-(-len(p) // size))), True, slot)
        rows.append(engine.runner.run([entry]).logits[:1, :vocab].float().cpu())
    return {"tokens": tokens, "logits": torch.cat(rows).numpy()}


def measure(engine, task: dict, out: dict) -> dict:
    """The parts of `task` on a built engine into `out` (what was measured stays there if a later
    part fails), in an order that leaves each the engine it needs."""
    parts = task["parts"]
    vocab = engine.runner.model.vocab_size
    if "steps" in parts:
        out["steps"] = {b: step_ms(engine, b, task["context"], task["steps"], vocab) for b in task["batches"]}
    if "profile" in parts and task["device"] == "cuda":
        out["profile"] = [profile_batch(engine, b, task["context"], task["profile_steps"], vocab)
                          for b in task["batches"]]
    if "prefill" in parts:
        out["prefill"] = prefill_time(engine, task["prefill_tokens"], task["context"], task["prefill_repeats"], vocab,
                                      profile=task["device"] == "cuda")
    if "trace" in parts:
        trace = trace_share(task, vocab)
        warm_trace(engine, trace)
        out["trace"] = timed_trace(engine, trace)
    if "agree" in parts:
        out["agree"] = greedy_and_logits(engine, vocab, task["agree_tokens"])
    return out


def _device_info(task: dict) -> dict:
    """This process's GPU, the copy bandwidth (measured before the model takes the memory) and
    whether the all-reduce switch exists in this tree."""
    import importlib.util

    info = {"gpu": "cpu", "gpu_count": 0, "bandwidth": None, "allreduce_env": os.environ.get(ALLREDUCE_ENV),
            "allreduce_switch": importlib.util.find_spec("tritonformer.backend.parallel.allreduce") is not None}
    if task["device"] == "cuda":
        import torch

        from tritonformer.client.gpu_measure import copy_bandwidth

        info.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(), bandwidth=copy_bandwidth())
        torch.cuda.empty_cache()
    return info


def _error(exc: BaseException) -> dict:
    text = str(exc).strip().splitlines()
    message = text[-1] if text else type(exc).__name__
    return {"oom": "out of memory" in str(exc).lower(), "message": f"{type(exc).__name__}: {message}"[:400],
            "traceback": traceback.format_exc()[-4000:]}


def configuration_main(task: dict, results) -> None:
    """A configuration's process: measure, send ("done", results) or ("error", why), then leave.
    A part that fails after others were measured sends theirs, with the failure."""
    engine = workers = None
    info, measured = {}, {}
    try:
        info = _device_info(task)
        engine, workers = build(task)
        if info["bandwidth"]:
            from tritonformer.client.gpu_measure import read_bytes_per_step

            info["floor_ms"] = read_bytes_per_step(engine.runner.model) / info["bandwidth"] * 1e3
        results.put(("done", {**info, **measure(engine, task, measured)}))
    except BaseException as exc:
        results.put(("done", {**info, **measured, "failed": _error(exc)}) if measured else ("error", _error(exc)))
    finally:
        release(engine, workers)


def replica_main(task: dict, results, go, abort) -> None:
    """One one-GPU replica: build and warm, say "ready", wait for the common start, serve its share."""
    engine = None
    try:
        engine, _ = build(task)
        trace = trace_share(task, engine.runner.model.vocab_size)
        warm_trace(engine, trace)
        results.put(("ready", task["share"][0]))
        if not go.wait(task["timeout"]) or abort.is_set():
            return
        results.put(("done", timed_trace(engine, trace)))
    except BaseException as exc:
        results.put(("error", _error(exc)))


# ---- the parent: one process per configuration ---------------------------------------------

class Interrupted(BaseException):
    """SIGTERM (the run's own timeout): print what was measured, then stop."""


def _interrupt(signum, frame):
    raise Interrupted()


@contextlib.contextmanager
def _environment(values: dict):
    before = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it: each is stopped first (a stopped process starts
    no more), the tree read twice (a fork in flight shows up the second time), then all killed."""
    found: list[int] = []
    for _ in range(2):
        children, todo = _children(), [pid]
        while todo:
            p = todo.pop()
            if p not in found:
                found.append(p)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGSTOP)
            todo.extend(children.get(p, []))
        time.sleep(0.05)
    for p in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


def _finish(procs, grace: float) -> None:
    """Let the processes end within `grace` seconds, then kill them and everything they started."""
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            _kill_tree(p.pid)
            p.join(5)


def _next_message(results, procs, deadline: float):
    """The next message from the processes, or ("error", why) when they died or time ran out."""
    while True:
        try:
            return results.get(timeout=0.5)
        except queue_module.Empty:
            pass
        dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
        if dead or not any(p.is_alive() for p in procs):
            try:
                return results.get(timeout=2.0)
            except queue_module.Empty:
                code = dead[0].exitcode if dead else 0
                return "error", {"oom": False, "message": f"process exited (code {code}) before reporting"}
        if time.monotonic() > deadline:
            return "error", {"oom": False, "message": "timed out (--timeout)", "timed_out": True}


def run_configuration(ctx, task: dict, env: dict):
    """("done", result) or ("error", why) of one configuration in a process of its own."""
    results = ctx.Queue()
    with _environment(env):
        proc = ctx.Process(target=configuration_main, args=(task, results), name=f"tp-bench-{task['size']}")
        proc.start()
    grace = 0.0
    try:
        kind, detail = _next_message(results, [proc], time.monotonic() + task["timeout"])
        grace = 0.0 if detail.get("timed_out") else GRACE_S
        return kind, detail
    finally:
        _finish([proc], grace)


def run_replicas(ctx, task: dict, count: int):
    """("done", merged result) or ("error", why) of `count` one-GPU replicas started together."""
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] or \
        [str(i) for i in range(count)]
    results, go, abort = ctx.Queue(), ctx.Event(), ctx.Event()
    procs = []
    try:
        for i in range(count):
            env = {"CUDA_VISIBLE_DEVICES": visible[i]} if task["device"] == "cuda" else {}
            with _environment(env):
                proc = ctx.Process(target=replica_main, args=({**task, "share": (i, count)}, results, go, abort),
                                   name=f"tp-bench-replica{i}")
                proc.start()
            procs.append(proc)
        deadline = time.monotonic() + task["timeout"]
        ready = 0
        while ready < count:
            kind, detail = _next_message(results, procs, deadline)
            if kind != "ready":
                return "error", detail
            ready += 1
        go.set()
        done = []
        while len(done) < count:
            kind, detail = _next_message(results, procs, deadline)
            if kind != "done":
                return "error", detail
            done.append(detail)
        return "done", merge_replicas(done)
    finally:
        abort.set()
        go.set()
        _finish(procs, GRACE_S)


def _why_not(out: dict) -> str:
    """Why a configuration that did not finish did not: out of memory, or its message."""
    return "does not fit (out of memory)" if out["oom"] else out["message"]


def _mode(size: int, mode: str | None) -> str:
    return mode if mode and (size > 1 or mode == SIXTEEN_BIT) else "-"


def _task(args, name: str, cfg: dict, size: int, parts: list[str], batches: list[int]) -> dict:
    prompts = -(-args.prefill_tokens // max(1, min(args.context, args.prefill_tokens))) if "prefill" in parts else 1
    max_running = max(batches + [prompts] + ([TRACE_MAX_RUNNING] if "trace" in parts else []))
    return {"name": name, "config": cfg, "size": size, "device": args.device, "dtype": args.dtype,
            "quantization": args.quantization, "parts": parts,
            "batches": batches, "context": args.context, "steps": args.steps, "profile_steps": args.profile_steps,
            "kv_fraction": args.kv_fraction, "trace_requests": args.trace_requests, "seed": args.seed,
            "agree_tokens": args.agree_tokens, "prefill_tokens": args.prefill_tokens,
            "prefill_repeats": args.prefill_repeats, "max_running": max_running, "timeout": args.timeout}


def _log(message: str) -> None:
    print(f"[bench tensor-parallel] {message}", file=sys.stderr, flush=True)


def run_model(ctx, args, name: str, parts: list[str], modes: list[str], sizes: list[int], devices: int | None,
              results: dict, save) -> None:
    """Every configuration of one shape; rows into results["rows"], notes into results["notes"]."""
    cfg = model_config(name)
    batches = parse_ints(args.batches)
    runnable, notes = plan_sizes(sizes, devices, cfg)
    counts, more = replica_counts(args.replicas, runnable, devices) if "trace" in parts else ([], [])
    for note in notes + more:
        results["notes"].append(f"{name}: {note}")
    rows, outputs = results["rows"], {}

    def add(row: dict) -> None:
        rows.append({"model": name, **row})
        save()

    for size in runnable:
        for mode in ([None] if size == 1 else modes):
            label = f"{name} TP={size} all-reduce {_mode(size, mode)}"
            _log(f"{label}: starting")
            t0 = time.monotonic()
            env = {ALLREDUCE_ENV: mode} if mode else {}
            kind, out = run_configuration(ctx, _task(args, name, cfg, size, parts, batches), env)
            _log(f"{label}: {kind} in {time.monotonic() - t0:.0f} s")
            if kind != "done":
                why = _why_not(out)
                if not out["oom"] and out.get("traceback"):
                    print(out["traceback"], file=sys.stderr)
                add({"part": "skipped", "tp": size, "allreduce": _mode(size, mode), "why": why})
                continue
            if mode and out.get("allreduce_env") != mode:
                results["notes"].append(f"{label}: the process saw {ALLREDUCE_ENV}={out.get('allreduce_env')}")
            results.setdefault("gpu", out["gpu"])
            results.setdefault("gpu_count", out["gpu_count"])
            results.setdefault("allreduce_switch", out["allreduce_switch"])
            if out["bandwidth"]:
                results.setdefault("copy_bandwidth_GBps", out["bandwidth"] / 1e9)
            common = {"tp": size, "allreduce": _mode(size, mode)}
            for batch, ms in out.get("steps", {}).items():
                add({"part": "steps", **common, "batch": batch, "ms": ms, "floor_ms": out.get("floor_ms")})
            for p in out.get("profile", []):
                add({"part": "profile", **common, **p})
            if "prefill" in out:
                add({"part": "prefill", **common, **out["prefill"]})
            if "trace" in out:
                trace = {k: v for k, v in out["trace"].items() if k != "ttft_ms"}
                add({"part": "trace", **common, "serving": f"TP={size}", "replicas": 1, "gpus": size, **trace})
            if "agree" in out:
                outputs[(size, mode)] = out["agree"]
            if "failed" in out:
                failed = out["failed"]
                why = "out of memory" if failed["oom"] else failed["message"]
                print(failed.get("traceback", ""), file=sys.stderr)
                add({"part": "skipped", **common, "why": f"stopped after {', '.join(p for p in PARTS if p in out)}: "
                                                         f"{why}"})
    if "agree" in parts and args.quantization != "none" and 1 in runnable:
        _log(f"{name} TP=1 16-bit (the agree part's reference): starting")
        task = {**_task(args, name, cfg, 1, ["agree"], batches), "quantization": "none"}
        kind, out = run_configuration(ctx, task, {})
        _log(f"{name} TP=1 16-bit: {kind}")
        if kind == "done":
            outputs[(1, SIXTEEN_BIT)] = out["agree"]
        else:
            add({"part": "skipped", "tp": 1, "allreduce": "-", "why": f"16-bit reference: {_why_not(out)}"})
    for count in counts:
        _log(f"{name}: {count} TP=1 replicas: starting")
        kind, out = run_replicas(ctx, _task(args, name, cfg, 1, ["trace"], [1]), count)
        _log(f"{name}: {count} TP=1 replicas: {kind}")
        if kind != "done":
            why = _why_not(out)
            add({"part": "skipped", "tp": 1, "allreduce": "-", "why": f"{count} replicas: {why}"})
            continue
        add({"part": "trace", "tp": 1, "allreduce": "-", "serving": f"TP=1 x{count} replicas", "replicas": count,
             "gpus": count, **out})
    if "agree" in parts:
        agreement(name, outputs, results)
        save()


def agreement(name: str, outputs: dict, results: dict) -> None:
    """Agree rows: each split size against TP=1, sizes above 2 against TP=2 (same all-reduce), and
    with FP8 every size (TP=1 too) against the 16-bit TP=1 reference where it ran."""
    import numpy as np

    base, sixteen = outputs.get((1, None)), outputs.get((1, SIXTEEN_BIT))
    if base is None:
        results["notes"].append(f"{name}: agree compares with TP=1, which did not run (add 1 to --sizes)")
    for (size, mode), out in outputs.items():
        if mode == SIXTEEN_BIT:
            continue
        against = [(1, None, base)] if size > 1 and base is not None else []
        if size > 2 and (2, mode) in outputs:
            against.append((2, mode, outputs[(2, mode)]))
        if sixteen is not None:
            against.append((1, SIXTEEN_BIT, sixteen))
        for other, other_mode, ref in against:
            diff = np.abs(out["logits"] - ref["logits"])
            results["rows"].append({
                "part": "agree", "model": name, "tp": size, "allreduce": _mode(size, mode), "against": other,
                "against_allreduce": _mode(other, other_mode), **compare_tokens(out["tokens"], ref["tokens"]),
                "argmax_equal_step0": bool((out["logits"].argmax(-1) == ref["logits"].argmax(-1)).all()),
                "max_logit_diff_step0": float(diff.max()), "logit_scale_step0": float(np.abs(ref["logits"]).max())})


# ---- tables ------------------------------------------------------------------------------

def tables(results: dict, name: str) -> list[str]:
    """The markdown tables of one shape's rows."""
    rows = [r for r in results["rows"] if r["model"] == name]
    lines: list[str] = []
    of = lambda part: [r for r in rows if r["part"] == part]  # noqa: E731
    one = {r["batch"]: r["ms"] for r in of("steps") if r["tp"] == 1}
    if of("steps"):
        lines += [f"\n## decode step, {name}, context {results['context']}",
                  "| model | TP | all-reduce | batch | ms per step | floor ms | / floor | vs TP=1 |",
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        for r in of("steps"):
            floor = r["floor_ms"]
            vs = f"{r['ms'] / one[r['batch']]:.2f}x" if r["tp"] > 1 and r["batch"] in one else "-"
            lines.append(f"| {name} | {r['tp']} | {r['allreduce']} | {r['batch']} | {r['ms']:.3f} | "
                         + (f"{floor:.3f} | {r['ms'] / floor:.2f}x" if floor else "- | -") + f" | {vs} |")
    if of("trace"):
        lines += _trace_table(name, of("trace"), results)
    if of("profile"):
        lines += [f"\n## all-reduce time per decode iteration, {name}, rank 0, torch.profiler",
                  "| model | TP | all-reduce | batch | step us (profiled) | kernels us | all-reduce us | all-reduces "
                  "| share of kernels / of step | other collectives us (n) |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in of("profile"):
            lines.append(f"| {name} | {r['tp']} | {r['allreduce']} | {r['batch']} | {r['step_us']:.1f} | "
                         f"{r['kernel_us']:.1f} | {r['all_reduce_us']:.1f} | {r['all_reduce_count']:.1f} | "
                         f"{r['all_reduce_us'] / max(r['kernel_us'], 1e-9):.1%} / "
                         f"{r['all_reduce_us'] / r['step_us']:.1%} | "
                         f"{r['collective_us']:.1f} ({r['collective_count']:.1f}) |")
            if r["all_reduce_count"] == 0 and r["tp"] > 1:
                lines.append("(no all-reduce kernel seen: names matched case-insensitively on all_reduce / allreduce)")
        for r in of("profile"):
            lines += [f"\nkernels by time per iteration, TP={r['tp']} ({r['allreduce']}), batch {r['batch']}:",
                      "| kernel | us | launches |", "|---|---:|---:|"]
            lines += [f"| `{k}` | {us:.1f} | {n:.1f} |" for k, us, n in r.get("top", [])]
    if of("prefill"):
        lines += _prefill_table(name, of("prefill"))
    if of("agree"):
        lines += [f"\n## greedy agreement, {name}: {results['agree_tokens']} tokens of 3 prompts, the same weights "
                  "at every size",
                  "| model | TP | all-reduce | against | identical | first divergence (prompt, token) | identical "
                  "tokens | step 0 argmax equal | max abs logit diff, step 0 (of max abs logit) |",
                  "|---|---:|---|---|---|---|---:|---|---:|"]
        for r in of("agree"):
            first = r["first_divergence"]
            lines.append(f"| {name} | {r['tp']} | {r['allreduce']} | TP={r['against']} ({r['against_allreduce']}) | "
                         f"{'yes' if r['identical'] else 'no'} | {tuple(first) if first else '-'} | "
                         f"{r['identical_fraction']:.1%} | {'yes' if r['argmax_equal_step0'] else 'no'} | "
                         f"{r['max_logit_diff_step0']:.4f} ({r['logit_scale_step0']:.2f}) |")
    for r in of("skipped"):
        lines.append(f"- {name} TP={r['tp']} (all-reduce {r['allreduce']}): {r['why']}")
    return lines


def _prefill_table(name: str, rows: list[dict]) -> list[str]:
    one = next((r["ms"] for r in rows if r["tp"] == 1), None)
    first = rows[0]
    lines = [f"\n## prefill, {name}: {first['prompts']} prompts of {first['tokens'] // first['prompts']} tokens, "
             f"{first['tokens']} tokens, one token sampled each",
             "| model | TP | all-reduce | ms per prefill | prompt tok/s | vs TP=1 | steps | all-reduce us (n), profiled "
             "| share of kernels |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        vs = f"{r['ms'] / one:.2f}x" if one and r["tp"] > 1 else "-"
        profiled = (f"{r['all_reduce_us']:.0f} ({r['all_reduce_count']:.0f}) | "
                    f"{r['all_reduce_us'] / max(r['kernel_us'], 1e-9):.1%}") if "kernel_us" in r else "- | -"
        lines.append(f"| {name} | {r['tp']} | {r['allreduce']} | {r['ms']:.2f} | {r['tok_per_s']:,.0f} | {vs} | "
                     f"{r['steps_each']:g} | {profiled} |")
    for r in rows:
        if r.get("top"):
            lines += [f"\nkernels by time in one prefill, TP={r['tp']} ({r['allreduce']}):",
                      "| kernel | us | launches |", "|---|---:|---:|"]
            lines += [f"| `{k}` | {us:.1f} | {n:.0f} |" for k, us, n in r["top"]]
    return lines


def _trace_table(name: str, rows: list[dict], results: dict) -> list[str]:
    one = next((r for r in rows if r["tp"] == 1 and r["replicas"] == 1), None)
    lines = [f"\n## Orca trace, {name}: {results['trace_requests']} requests all at once (saturation), "
             "greedy, EOS ignored",
             "| model | serving | all-reduce | GPUs | useful tok/s | tok/s per GPU | TTFT p50 ms | TTFT p99 ms "
             "| preemptions | vs TP=1 |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        vs = f"{r['tok_per_s'] / one['tok_per_s']:.2f}x" if one is not None and r is not one else "-"
        lines.append(f"| {name} | {r['serving']} | {r['allreduce']} | {r['gpus']} | {r['tok_per_s']:,.0f} | "
                     f"{r['tok_per_s'] / r['gpus']:,.0f} | {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | "
                     f"{r.get('preemptions', 0)} | {vs} |")
    lines += _phase_lines(rows, one)
    for r in rows:
        if r["replicas"] > 1:
            continue
        if r["tp"] == 2 and one is not None:
            ratio = r["tok_per_s"] / one["tok_per_s"]
            lines.append(f"- TP=2 ({r['allreduce']}): {ratio:.2f}x the tokens/s of TP=1 "
                         f"(target >= 1.6x: {'met' if ratio >= 1.6 else 'missed'})")
        twin = next((x for x in rows if x["replicas"] == r["tp"] > 1), None)
        if twin is not None:
            more = twin["tok_per_s"] / r["tok_per_s"]
            winner = f"{r['tp']} TP=1 replicas serve {more:.2f}x" if more > 1 else \
                f"TP={r['tp']} serves {1 / more:.2f}x"
            lines.append(f"- TP={r['tp']} ({r['allreduce']}) vs {twin['serving']}: {winner} the tokens/s; TTFT p50 "
                         f"{r['ttft_p50_ms']:.0f} vs {twin['ttft_p50_ms']:.0f} ms, p99 {r['ttft_p99_ms']:.0f} vs "
                         f"{twin['ttft_p99_ms']:.0f} ms")
    return lines


def _phase_lines(rows: list[dict], one: dict | None) -> list[str]:
    """Each one-engine row's trace time by phase (engine_drive.PhaseClock), against TP=1's."""
    lines = []
    for r in rows:
        phases = r.get("phases")
        if r["replicas"] > 1 or not phases:
            continue
        cells = []
        for kind, p in phases.items():
            if not p["launches"]:
                continue
            base = (one or {}).get("phases", {}).get(kind)
            vs = f", {p['seconds'] / base['seconds']:.2f}x TP=1's" if r is not one and base and base["seconds"] else ""
            cells.append(f"{kind} {p['seconds']:.3f} s in {p['launches']} launches ({p['iterations']} iterations{vs})")
        lines.append(f"- {r['serving']} ({r['allreduce']}) by phase: " + "; ".join(cells))
    return lines


def header(results: dict) -> str:
    gpu = results.get("gpu", "?")
    where = f"{results.get('gpu_count', '?')} x {gpu}" if gpu != "cpu" else "the CPU (gloo)"
    bandwidth = results.get("copy_bandwidth_GBps")
    switch = "" if results.get("allreduce_switch", True) else \
        " (backend/parallel/allreduce.py absent here: the switch changes nothing)"
    fp8 = " with FP8 linears" if results.get("quantization") == "fp8" else ""
    return (f"# bench tensor-parallel on {where}, {results['dtype']}{fp8}, all-reduce {results['allreduce']} "
            f"({ALLREDUCE_ENV}){switch}, KV cache {results['kv_fraction']:g} of free memory, {results['date']}"
            + (f"; floor = one rank's weight bytes / {bandwidth:.0f} GB/s (copy bandwidth)" if bandwidth else ""))


def run(args) -> int:
    import multiprocessing

    parts = [p for p in PARTS if p in parse_choices(args.parts, PARTS, "part")]
    modes = parse_choices(args.allreduce, ALLREDUCE, "all-reduce")
    names = [n.strip() for n in args.model.split(",") if n.strip()]
    for name in names:
        model_config(name)  # an unknown name fails before anything starts
    sizes = parse_ints(args.sizes)
    devices = None
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("bench tensor-parallel needs CUDA GPUs (--device cpu runs the ranks on the CPU)", file=sys.stderr)
            return 2
        devices = torch.cuda.device_count()  # (no CUDA context here: the configurations' processes own the GPUs)
    results = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "dtype": args.dtype,
               "quantization": args.quantization,
               "allreduce": ",".join(modes), "kv_fraction": args.kv_fraction, "context": args.context,
               "trace_requests": args.trace_requests, "agree_tokens": args.agree_tokens, "parts": parts, "notes": [],
               "rows": []}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, default=str)

    ctx = multiprocessing.get_context("spawn")
    previous = signal.signal(signal.SIGTERM, _interrupt)
    done: list[str] = []
    code = 0
    try:
        for name in names:
            run_model(ctx, args, name, parts, modes, sizes, devices, results, save)
            done.append(name)
    except (Interrupted, KeyboardInterrupt):
        print("interrupted: the rows measured so far follow", file=sys.stderr)
        code = 124
        done += [n for n in names if n not in done and any(r["model"] == n for r in results["rows"])]
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(header(results))
    for name in done:
        print("\n".join(tables(results, name)))
    for note in results["notes"]:
        print(f"- {note}")
    save()
    return code
