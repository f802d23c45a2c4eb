"""Rank 0's runner and the worker processes that mirror it (one per further GPU).

The engine, its scheduler and its sampler live on rank 0, in the model's process. Rank 0's
runner (`ParallelRunner`) sends each call it gets from the engine (run a batch, sample it, run a
round of decode iterations, warm up) to every worker before running it itself; a worker runs the
same call on its own share of the weights and its own KV heads. The collectives inside the
forward (group.py) keep the ranks in step; the workers decide nothing. Sampled ids reach the
workers by broadcast from rank 0 (DecoderRunner's sampling), so every rank feeds the same tokens
to the next iteration; greedy decode graphs take the argmax of the gathered logits on every rank.

A worker that dies or fails is noticed by a monitor thread within a fraction of a second, one
that freezes (stopped, its interpreter hung) when its heartbeat has been silent for SILENCE_S:
`on_failure` is called with what happened (the glue fails the engine, refuses new requests and
reports the model unhealthy). The heartbeat comes from a thread of its own, so a long first-use
compilation in the worker never trips it.
"""
from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from tritonformer.backend.parallel.group import TensorParallelGroup
from tritonformer.backend.spawn import SILENCE_S, LockedConnection, spawn_context, start_heartbeat

POLL_S = 0.2  # how often the monitor looks at the workers
# A worker's heartbeat (BEAT_S, from a thread of its own, so compiling never holds it up) and how
# long one may be unheard before it counts as frozen (SILENCE_S): backend/spawn.py.


@dataclass(frozen=True)
class ShardSource:
    """What a rank needs to load its share of the model (picklable: it crosses to the workers)."""

    checkpoint: str  # a folder of safetensors files (each rank reads only its slices)
    config: dict  # its config.json, as rank 0 read it
    dtype: str  # "float16", "bfloat16", "float32"
    device_type: str  # "cuda" or "cpu"
    first_device: int  # rank r runs on cuda:first_device + r
    max_model_len: int | None = None
    # Instead of the checkpoint's files: state_factory(*factory_args, device) -> {name: tensor-like
    # with .shape, [index] and .to()} (benchmarks: random weights made on each rank's GPU).
    state_factory: Callable | None = None
    factory_args: tuple = ()
    quantization: str = "none"  # none | fp8: each rank quantises its own slices (backend/quantization.py)

    def device(self, rank: int) -> torch.device:
        return torch.device(f"cuda:{self.first_device + rank}") if self.device_type == "cuda" else torch.device("cpu")


def load_rank(source: ShardSource, rank: int, world: int, address: str):
    """Join the group and build this rank's share of the model. Returns (model, group)."""
    from tritonformer.backend.checkpoints.weights import lazy_state_dict
    from tritonformer.backend.models.decoder import load_decoder

    device = source.device(rank)
    tp = TensorParallelGroup.join(rank, world, address, device)
    if source.state_factory is not None:
        state = source.state_factory(*source.factory_args, str(device))
    else:
        state = lazy_state_dict(Path(source.checkpoint))
    model = load_decoder(source.config, state, device, getattr(torch, source.dtype), source.max_model_len, tp=tp,
                         quantization=source.quantization)
    return model, tp


class _Broadcasts:
    """A worker's sampler: it never samples; its runner takes rank 0's ids by broadcast."""

    def sample_ids(self, *args, **kwargs):
        raise AssertionError("a worker rank does not sample")


def worker_main(source: ShardSource, rank: int, world: int, address: str, conn) -> None:
    """A worker's life: load, build its runner when rank 0 says how, then run rank 0's calls."""
    from tritonformer.backend.decoder.runner import DecoderRunner

    conn = LockedConnection(conn)  # the calls' answers and the heartbeat share it
    start_heartbeat(conn.send)
    tp = runner = None
    try:
        model, tp = load_rank(source, rank, world, address)
        conn.send(("loaded", None))
        _, (num_blocks, block_size, max_running, cuda_graphs) = conn.recv()
        cache = model.new_kv_cache(num_blocks, block_size)
        cache.state = model.new_state_cache(max_running)  # (hybrid models: this rank's heads' state, as rank 0's)
        runner = DecoderRunner(model, cache, max_running, cuda_graphs)
        conn.send(("ready", None))
        sampler, forward = _Broadcasts(), None
        while True:
            call, args = conn.recv()
            if call == "run":
                forward = runner.run(*args)
            elif call == "sample":
                runner.sample(forward, sampler, *args)
            elif call == "run_steps":
                entries, steps, params, keys = args
                runner.run_steps(entries, steps, sampler, params, keys)
            elif call == "warm_up":
                runner.warm_up()
            elif call == "stop":
                return
    except EOFError:  # rank 0 went away: nothing left to serve
        return
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass
        raise
    finally:
        if runner is not None:
            runner.close()  # its graphs, then the group
        elif tp is not None:
            tp.leave()


class WorkerPool:
    """Ranks 1 .. world - 1 of one model, each a process; see the module docstring."""

    def __init__(self, source: ShardSource, world: int, address: str):
        ctx = spawn_context()
        self.world = world
        self._conns, self.processes = [], []
        self.failure: str | None = None
        self.on_failure: Callable[[str], None] | None = None
        self._lock = threading.Lock()
        for rank in range(1, world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(source, rank, world, address, child),
                               name=f"tritonformer-rank{rank}", daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self.processes.append(proc)
        self._stopping = False
        self._monitor = None

    def wait(self, expected: str) -> None:
        """Every worker's next message, which must be `expected` (else its error is raised)."""
        for rank, conn in enumerate(self._conns, start=1):
            while not conn.poll(POLL_S):
                if not self.processes[rank - 1].is_alive():
                    raise RuntimeError(f"tensor-parallel rank {rank} exited (code {self.processes[rank - 1].exitcode})")
            kind, detail = conn.recv()
            while kind == "beat":
                kind, detail = conn.recv()
            if kind != expected:
                raise RuntimeError(f"tensor-parallel rank {rank} failed:\n{detail}")

    def build_runners(self, num_blocks: int, block_size: int, max_running: int, cuda_graphs: bool) -> None:
        self.send("runner", (num_blocks, block_size, max_running, cuda_graphs))
        self.wait("ready")
        self._monitor = threading.Thread(target=self._watch, name="tritonformer-ranks", daemon=True)
        self._monitor.start()

    def send(self, call: str, args: tuple = ()) -> None:
        if self.failure is not None:
            raise RuntimeError(f"a tensor-parallel rank failed: {self.failure}")
        for conn in self._conns:
            conn.send((call, args))

    def alive(self) -> bool:
        return self.failure is None and all(p.is_alive() for p in self.processes)

    def _watch(self) -> None:
        """Notice a worker that died, reported an error or went silent (it would leave rank 0
        waiting in a collective for ever): record it and tell `on_failure`, once."""
        heard = [time.monotonic()] * len(self.processes)
        while not self._stopping:
            for rank, (proc, conn) in enumerate(zip(self.processes, self._conns), start=1):
                problem = None
                if not proc.is_alive():
                    problem = f"rank {rank} exited (code {proc.exitcode})"
                else:
                    try:
                        while problem is None and conn.poll():
                            kind, detail = conn.recv()
                            heard[rank - 1] = time.monotonic()
                            problem = f"rank {rank}: {detail}" if kind == "error" else None
                    except (EOFError, OSError):
                        problem = f"rank {rank} closed its pipe"
                    silent = time.monotonic() - heard[rank - 1]
                    if problem is None and silent > SILENCE_S:
                        problem = f"rank {rank} stopped answering (no heartbeat for {silent:.1f} s)"
                if problem and not self._stopping:
                    self.failure = problem
                    if self.on_failure is not None:
                        self.on_failure(problem)
                    return
            time.sleep(POLL_S)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the workers to leave, then make sure they did: no process outlives the model."""
        self._stopping = True
        for conn in self._conns:
            try:
                conn.send(("stop", ()))
            except Exception:
                pass
        for proc in self.processes:
            proc.join(timeout)
        self.kill()

    def kill(self) -> None:
        """Kill the workers still running, without asking: after a rank failed, the others may
        sit in a collective that will never complete."""
        self._stopping = True
        for proc in self.processes:
            if proc.is_alive():
                proc.kill()
                proc.join(1)


class ParallelRunner:
    """Rank 0's DecoderRunner, each engine call sent to the workers first (module docstring).
    Everything else (the model, the cache, the graphs) is the local runner's."""

    def __init__(self, local, workers: WorkerPool):
        self.local = local
        self.workers = workers

    def __getattr__(self, name):
        return getattr(self.local, name)

    def run(self, entries):
        self.workers.send("run", (entries,))
        return self.local.run(entries)

    def sample(self, forward, sampler, params, keys):
        self.workers.send("sample", (params, keys))
        return self.local.sample(forward, sampler, params, keys)

    def run_steps(self, entries, steps, sampler, params, keys):
        self.workers.send("run_steps", (entries, steps, params, keys))
        return self.local.run_steps(entries, steps, sampler, params, keys)

    def warm_up(self) -> None:
        self.workers.send("warm_up")
        self.local.warm_up()


def start_ranks(source: ShardSource, world: int):
    """Rank 0's share of the model, here, and the workers with theirs. Returns (model, workers);
    the workers wait for `workers.build_runners` (the KV cache is sized on rank 0)."""
    from tritonformer.backend.models.decoder import check_tensor_parallel
    from tritonformer.backend.parallel.group import free_address

    check_tensor_parallel(source.config, world)  # before a group exists: a refused split leaves nothing behind
    if source.device_type == "cuda" and torch.cuda.device_count() < source.first_device + world:
        raise ValueError(f"tensor_parallel_size {world} needs GPUs {source.first_device} .. "
                         f"{source.first_device + world - 1}; this process sees {torch.cuda.device_count()}")
    address = free_address()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    workers = WorkerPool(source, world, address)
    try:
        model, _ = load_rank(source, 0, world, address)
        workers.wait("loaded")
    except BaseException:
        workers.stop()
        raise
    return model, workers
