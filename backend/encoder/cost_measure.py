"""Measure the encoder's batch cost table on the runtime that serves, or load a saved one.

The table is keyed by everything it depends on (device name, checkpoint, dtype, runtime
version and options); a restart on the same set-up loads it in milliseconds, and a change
re-measures. Measuring runs real batches through the same `embed` the engine uses.
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from tritonformer.scheduler.cost_model import GridCostModel

log = logging.getLogger("tritonformer")

RUNTIME_VERSION = "2"  # bump when the runtime changes enough to invalidate saved tables

GPU_GRID = ((1, 2, 4, 8, 16, 32, 64, 128, 256), (8, 16, 32, 64, 128, 256, 512), 65536)
CPU_GRID = ((1, 4, 16, 64), (16, 64, 256, 512), 2048)  # CPU batches are slow: measure fewer


def cost_model_key(device: torch.device, checkpoint: Path, dtype: torch.dtype, options: dict) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()}"
    return {"device": name, "checkpoint": str(checkpoint), "dtype": str(dtype), "torch": torch.__version__,
            "runtime_version": RUNTIME_VERSION, **options}


def load_or_measure(
    embed: Callable[[list[list[int]]], object],
    key: dict,
    cache_dir: Path,
    vocab_size: int,
    max_len: int,
    device: torch.device,
    packed: bool = True,
) -> GridCostModel:
    """The cost table for `key`: loaded when saved, else measured with `embed` over the grid and
    saved. `packed`: the runtime's cost follows the mean length (packed), or the longest (a
    padded runtime); the grid's batches have equal lengths, so only the table's reading differs."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cache_dir) / "cost_models" / f"encoder-{digest}.json"
    model = GridCostModel.load(path, key)
    if model is not None:
        log.info("batch cost table loaded from %s", path)
        return model

    seqs, lengths, max_tokens = GPU_GRID if device.type == "cuda" else CPU_GRID
    lengths = tuple(n for n in lengths if n <= max_len) or (max_len,)
    rng = random.Random(0)

    def time_batch(n: int, length: int) -> float:
        batch = [[rng.randrange(1000, vocab_size) for _ in range(length)] for _ in range(n)]
        embed(batch)  # warm-up: compilation, graph capture, allocator growth
        times = []
        for _ in range(2 if device.type == "cpu" else 5):
            start = time.perf_counter()
            embed(batch)  # returns host memory: the device work is finished
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    last_report = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last_report[0] > 2.0:
            last_report[0] = now
            log.info("measuring batch costs for the DP batcher: %d/%d grid points", done, total)

    start = time.perf_counter()
    model = GridCostModel.measure(time_batch, key, packed=packed, seqs=seqs, lengths=lengths,
                                  max_tokens=max_tokens, progress=progress)
    model.save(path)
    log.info("batch cost table measured in %.1f s, saved to %s", time.perf_counter() - start, path)
    return model
