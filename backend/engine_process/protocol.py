"""What crosses between a Triton stub and the engine process (pickled tuples, `(kind, body)`).

stub -> engine:
  ("submit", [(request id, args), ...])  one message per execute() call; args are what the
      spec's new_item takes: for the generator (prompt ids, SamplingParams, stream,
      ResponseOptions), prompts already tokenized; for an encoder encoder.build.item_args
  ("cancel", [request id, ...])  requests whose client cancelled (the stub polls Triton)
  ("bye", None)  the stub unloads; its requests still running are dropped
engine -> stub:
  ("ready", info)  the engine is warm and serves this connection (GeneratorInfo, EncoderInfo)
  ("error", traceback)  the engine process failed to start (the starter's connection only)
  ("out", (responses, arrays, stats))  one per iteration with outputs for this stub: responses
      are (request id, packed outputs or None, error or None, final); stats are the engine's
      stats calls (GeneratorStats, EmbedderStats) to replay on the stub's metrics,
      [(name, args, kwargs)] or None; arrays: the responses' large output arrays, concatenated
      (gather_arrays), which their packed outputs name as Rows
  ("failed", reason)  the engine cannot run any more (a tensor-parallel rank died); it exits
  ("beat", None)  every BEAT_S (backend/spawn.py), from a thread of its own
Request ids are the stub's own; the engine keys a request by (connection, request id).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from tritonformer.backend.decoder.build import EngineOptions, ModelSource


class EngineSpec(Protocol):
    """What the engine process serves, as the starting stub describes it (pickled to the engine
    process): GeneratorSpec below, encoder.build.EncoderSpec."""

    def build(self, sink, stats) -> tuple[Any, Any, Any]:
        """(engine, tensor-parallel workers or None, info for the stubs); not started."""

    def new_item(self, engine, handle, args: tuple) -> Any:
        """What engine.submit takes for a request submitted with `args`."""


@dataclass(frozen=True)
class GeneratorSpec:
    """What the engine process serves: the generator's model and engine settings (its config
    parameters), and whether to warm up before READY (tests on tiny models skip it). The server
    knows an engine only through `build` and `new_item`: the encoders' engine is another spec
    with these two methods (encoder/build.py)."""

    source: ModelSource
    options: EngineOptions
    warm_up: bool = True

    def build(self, sink, stats):
        """Load, build, warm up: (engine, tensor-parallel workers or None, GeneratorInfo). The
        engine is not started."""
        import os

        from tritonformer.backend.decoder.build import build_engine, load_model
        from tritonformer.backend.decoder.warm_up import warm_up
        from tritonformer.backend.tokenization import TextTokenizer

        model, workers = load_model(self.source)
        engine = build_engine(model, TextTokenizer(self.source.checkpoint), sink, self.options, stats=stats,
                              workers=workers)
        if self.warm_up:
            warm_up(engine)
        engine.report_occupancy()  # the KV gauges show the empty pool from the start
        cache = engine.runner.cache
        info = GeneratorInfo(model.config.vocab_size, model.config.max_position_embeddings, cache.num_blocks,
                          cache.block_size, str(model.device), os.getpid())
        return engine, workers, info

    @staticmethod
    def new_item(engine, handle, args: tuple):
        """What `engine.submit` takes for a request whose submit carried `args` (prompt ids,
        SamplingParams, stream, ResponseOptions)."""
        return engine.new_sequence(handle, *args)


@dataclass(frozen=True)
class GeneratorInfo:
    """What a stub needs of the engine's model to validate requests, and what to log."""

    vocab_size: int
    max_position_embeddings: int
    kv_blocks: int
    kv_block_size: int
    device: str
    pid: int


LIST_LIMIT = 64  # elements: a smaller output array crosses as a list, a larger one as an array


def pack_outputs(outputs: dict[str, np.ndarray] | None) -> dict | None:
    """A response's small output arrays as plain lists and their dtypes: pickled, numpy arrays
    cost ~9 us each to write and ~6 us to read (a batch of 256 streams: 2.3 ms of the engine's
    thread, measured on the 2-core dev machine), plain lists a tenth of that. Large ones (an
    encoder's head rows) stay arrays: their pickle is one copy of the buffer, while a list is a
    Python float per element."""
    if outputs is None:
        return None
    return {name: array if array.size > LIST_LIMIT else (array.dtype.str, array.tolist())
            for name, array in outputs.items()}


class Rows(NamedTuple):
    """A large output array of one response: rows start:stop of the message's arrays[group]."""

    group: int
    start: int
    stop: int


def gather_arrays(responses: list[tuple]) -> tuple[list[tuple], list[np.ndarray]]:
    """One message's responses with their large output arrays (an encoder's head rows) moved
    into one array per dtype and row shape: pickled, every array costs ~10 us whatever its size,
    so a batch of 256 rows crosses as 1 array instead of 256. Returns the responses, their arrays
    replaced by Rows (in place: the packed outputs are the sink's own), and the arrays."""
    groups: dict[tuple, int] = {}
    parts: list[list[np.ndarray]] = []
    sizes: list[int] = []
    for _, packed, _, _ in responses:
        if not packed:
            continue
        for name, value in packed.items():
            if type(value) is np.ndarray and value.ndim:
                key = (value.dtype, value.shape[1:])
                group = groups.get(key)
                if group is None:
                    group = groups[key] = len(parts)
                    parts.append([])
                    sizes.append(0)
                parts[group].append(value)
                start = sizes[group]
                sizes[group] = start + len(value)
                packed[name] = Rows(group, start, sizes[group])
    return responses, [np.concatenate(arrays) for arrays in parts]


def unpack_outputs(packed: dict | None, arrays: list[np.ndarray] = ()) -> dict[str, np.ndarray] | None:
    if packed is None:
        return None
    return {name: value if isinstance(value, np.ndarray)
            else arrays[value.group][value.start:value.stop] if isinstance(value, Rows)
            else np.array(value[1], dtype=value[0])
            for name, value in packed.items()}
