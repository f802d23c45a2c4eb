"""One way to build a generator engine from a decoder model: the KV cache sized for it, the
iteration-level scheduler, the runner (decode graphs on a GPU) and the engine loop. The served
model, the benchmarks, the tests and the tools all build it here, so a new knob is one field."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonformer.backend.decoder.engine import GeneratorEngine, GeneratorStats
from tritonformer.backend.decoder.kv_cache import plan_num_blocks
from tritonformer.backend.decoder.runner import DEFAULT_DECODE_STEPS, DecoderRunner
from tritonformer.backend.models.decoder import DecoderModel
from tritonformer.backend.responses import ResponseSink
from tritonformer.scheduler.iteration import IterationScheduler
from tritonformer.scheduler.kv_blocks import BlockManager


@dataclass(frozen=True)
class EngineOptions:
    """The generator's engine settings (config.pbtxt parameters of the same names)."""

    max_running_sequences: int = 64
    max_tokens_per_iteration: int = 2048
    max_decode_steps: int = DEFAULT_DECODE_STEPS
    kv_block_size: int = 16
    kv_cache_tokens: str = "auto"  # a token count, or auto: kv_cache_memory_fraction of free GPU memory
    kv_cache_memory_fraction: float = 0.3
    cuda_graphs: bool = True
    max_queue_requests: int = 256
    cancel_check_interval_s: float = 0.05
    stream_interval: int = 1
    max_stream_responses_per_s: int = 1000
    prefix_caching: bool = True  # reuse the KV blocks of prompt prefixes already computed (scheduler/prefix_cache.py)


@dataclass(frozen=True)
class ModelSource:
    """Which generator model to load and where it runs: what the model's config parameters say
    (picklable: an engine process gets it from the Triton stub that starts it)."""

    checkpoint: str  # a checkpoint folder
    device_type: str  # "cuda" or "cpu"
    device_index: int
    dtype: str  # "float16", "bfloat16", "float32"
    tensor_parallel_size: int = 1  # this device and the next ones
    max_model_len: int | None = None
    allow_pickle: bool = False  # pickle .bin weights (weights_only) when there are no safetensors
    quantization: str = "none"  # none | fp8: FP8 linears (backend/quantization.py)


def load_model(source: ModelSource):
    """The model, on its device; with tensor_parallel_size > 1 this process is rank 0 and the
    workers load their shares meanwhile. Returns (model, workers or None)."""
    import torch

    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
    from tritonformer.backend.models.decoder import load_decoder

    checkpoint = Path(source.checkpoint)
    if source.device_type == "cuda":  # (an engine process starts on GPU 0: kernels launch on the current one)
        torch.cuda.set_device(source.device_index)
    if source.tensor_parallel_size > 1:
        from tritonformer.backend.parallel.workers import ShardSource, start_ranks
        from tritonformer.backend.quantization import parse

        shards = ShardSource(str(checkpoint), load_config(checkpoint), source.dtype, source.device_type,
                             source.device_index, source.max_model_len, quantization=parse(source.quantization))
        return start_ranks(shards, source.tensor_parallel_size)
    device = torch.device("cuda", source.device_index) if source.device_type == "cuda" else torch.device("cpu")
    model = load_decoder(load_config(checkpoint), load_state_dict(checkpoint, allow_pickle=source.allow_pickle),
                         device, getattr(torch, source.dtype), source.max_model_len, quantization=source.quantization)
    return model, None


def build_engine(model: DecoderModel, tokenizer, sink: ResponseSink, options: EngineOptions = EngineOptions(),
                 stats: GeneratorStats | None = None, workers=None) -> GeneratorEngine:
    """The engine, not yet warmed up (`engine.runner.warm_up()` compiles kernels and captures the
    decode graphs) nor started. A bad option fails here, before any warm-up. `workers`: the
    other ranks of a tensor-parallel `model` (backend/parallel/workers.py: `start_ranks`), which
    then build their runners with the KV cache sized here and mirror every runner call."""
    o = options
    # A hybrid model's recurrent state, one slot per running sequence: taken before the KV cache
    # is sized from the memory left. Prefix caching does not apply to it (scheduler/iteration.py).
    state = model.new_state_cache(o.max_running_sequences)
    num_blocks = plan_num_blocks(model, o.kv_block_size, o.kv_cache_tokens, o.kv_cache_memory_fraction,
                                 o.max_running_sequences)
    scheduler = IterationScheduler(
        BlockManager(num_blocks, o.kv_block_size), o.max_running_sequences, o.max_tokens_per_iteration,
        max_seq_len=model.config.max_position_embeddings, max_decode_steps=o.max_decode_steps,
        prefix_caching=o.prefix_caching and state is None, recurrent_state=state is not None,
        whole_prompts=getattr(model, "whole_prompts", False),
    )
    cache = model.new_kv_cache(num_blocks, o.kv_block_size)
    cache.state = state
    runner = DecoderRunner(model, cache, o.max_running_sequences, o.cuda_graphs)
    if workers is not None:
        from tritonformer.backend.parallel.workers import ParallelRunner

        workers.build_runners(num_blocks, o.kv_block_size, o.max_running_sequences, o.cuda_graphs)
        runner = ParallelRunner(runner, workers)
    return GeneratorEngine(runner, tokenizer, sink, scheduler, o.max_queue_requests, o.cancel_check_interval_s,
                           o.stream_interval, o.max_stream_responses_per_s, stats=stats)
