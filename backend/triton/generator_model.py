"""TritonPythonModel for the `generator` model (decoupled: streams tokens).

execute() validates and tokenizes its requests (in one batch), queues them, then returns None;
the engine runs one model iteration at a time over every active sequence and streams responses
back. Reachable over gRPC streaming, HTTP /generate (stream false: exactly one response) and
/generate_stream.

Where the engine runs is the parameter `engine_process`: false, on a thread of this stub
process; true, in a process of its own shared by this model's instances on the GPU
(backend/engine_process/), so that the stub's IPC with tritonserver never competes with the
engine for one GIL; auto (the default), true on a GPU and false on the CPU. Measured on an H100
(docs/benchmarks/serving.md, "Engine process"): 1.30x the output tokens/s of the thread at 1,000 req/s
and a third of its time to first token; on the CPU the model, not the stub, sets the pace.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from tritonformer.backend.triton import inputs
from tritonformer.backend.decoder.build import EngineOptions, ModelSource, build_engine, load_model
from tritonformer.backend.decoder.warm_up import warm_up
from tritonformer.backend.engine_loop import freeze_startup_objects
from tritonformer.backend.engine_process.client import EngineClient
from tritonformer.backend.engine_process.protocol import GeneratorSpec
from tritonformer.backend.engine_process.rendezvous import instance_key
from tritonformer.backend.errors import InvalidRequest
from tritonformer.backend.decoder.outputs import ResponseOptions
from tritonformer.backend.decoder.sampling_params import KNOWN_KEYS as SAMPLING_KEYS
from tritonformer.backend.decoder.sampling_params import SamplingParams, parse_sampling_parameters
from tritonformer.backend.tokenization import TextTokenizer
from tritonformer.backend.triton.glue import (
    TritonSink,
    input_array,
    load_settings,
    reject,
    request_parameters,
)
from tritonformer.backend.triton.metrics import GeneratorMetrics
from tritonformer.backend.checkpoints.defaults import (
    DEFAULT_GENERATOR,
    GENERATOR_CHECKPOINTS,
    prepare_generator_checkpoint,
)

_ENGINE = EngineOptions()
PARAMETERS = {
    "checkpoint": "",  # an HF folder, or a bundled one: "smollm2-135m" (empty = this one), "gemma-3-270m"
    "allow_pickle_checkpoint": "false",  # true: load pickle .bin weights (weights_only) if no safetensors
    "device": "auto",
    "dtype": "auto",
    "tensor_parallel_size": "1",  # GPUs the model is split over: this instance's GPU and the next ones
    "quantization": "none",  # none | fp8: FP8 linears (GPU compute capability >= 8.9); FP8 checkpoints load as FP8
    "max_model_len": "auto",  # longest sequence (prompt + output) served; auto: the checkpoint's max_position_embeddings
    # The engine's settings, defaults from EngineOptions (one place for them).
    "max_running_sequences": str(_ENGINE.max_running_sequences),
    "max_tokens_per_iteration": str(_ENGINE.max_tokens_per_iteration),  # longer prompts continue next iteration
    "max_decode_steps": str(_ENGINE.max_decode_steps),  # decode iterations per launch when all decode and none waits
    "kv_block_size": str(_ENGINE.kv_block_size),  # tokens per KV cache block
    "kv_cache_tokens": _ENGINE.kv_cache_tokens,  # KV cache capacity in tokens; auto: a share of free GPU memory
    "kv_cache_memory_fraction": str(_ENGINE.kv_cache_memory_fraction),
    "cuda_graphs": str(_ENGINE.cuda_graphs).lower(),  # replay captured CUDA graphs for decode iterations (GPU)
    "max_queue_requests": str(_ENGINE.max_queue_requests),
    "max_tokens_limit": "4096",  # the largest max_tokens a request may ask for
    "max_prompt_bytes": "200000",
    "cancel_check_interval_ms": str(round(_ENGINE.cancel_check_interval_s * 1000)),
    "stream_interval": str(_ENGINE.stream_interval),  # tokens per streamed response; pending pieces coalesce when sending lags
    "max_stream_responses_per_s": str(_ENGINE.max_stream_responses_per_s),  # all streams: under load pieces grow
    "prefix_caching": str(_ENGINE.prefix_caching).lower(),  # reuse the KV blocks of prompt prefixes already computed
    # true: the engine runs in a process of its own, one per GPU, shared by this model's instances
    "engine_process": "auto",  # the engine in a process of its own: auto = on a GPU
    "response_threads": "1",  # threads sending responses to Triton (each send is an IPC round trip)
}

log = logging.getLogger("tritonformer")

# The vLLM backend's BOOL flags asking for more outputs (return_finish_reason: the finish reason
# is always on a sequence's last response here, so it is accepted and changes nothing).
VLLM_FLAGS = ("return_num_input_tokens", "return_num_output_tokens", "return_logprobs", "return_finish_reason")


class TritonPythonModel:
    def initialize(self, args):
        p, checkpoint, device, dtype = load_settings(args, PARAMETERS, _default_checkpoint, GENERATOR_CHECKPOINTS)

        max_model_len = None if p.str("max_model_len") == "auto" else p.int("max_model_len", minimum=2)
        source = ModelSource(str(checkpoint), device.type, device.index or 0, str(dtype).removeprefix("torch."),
                             p.int("tensor_parallel_size"), max_model_len,
                             p.choice("allow_pickle_checkpoint", ("true", "false")) == "true",
                             quantization=p.str("quantization"))
        self.tokenizer = TextTokenizer(checkpoint)
        self.max_tokens_limit = p.int("max_tokens_limit")
        self.max_prompt_bytes = p.int("max_prompt_bytes")

        self.sink = TritonSink("generator", threads=p.int("response_threads", minimum=1))
        self.metrics = GeneratorMetrics(args["model_name"], args.get("model_version", "1"))
        options = EngineOptions(
            max_running_sequences=p.int("max_running_sequences"),
            max_tokens_per_iteration=p.int("max_tokens_per_iteration"),
            max_decode_steps=p.int("max_decode_steps"),
            kv_block_size=p.int("kv_block_size"),
            kv_cache_tokens=p.str("kv_cache_tokens"),
            kv_cache_memory_fraction=p.float("kv_cache_memory_fraction"),
            cuda_graphs=p.choice("cuda_graphs", ("true", "false")) == "true",
            max_queue_requests=p.int("max_queue_requests"),
            cancel_check_interval_s=p.int("cancel_check_interval_ms", minimum=0) / 1000.0,
            stream_interval=p.int("stream_interval"),
            max_stream_responses_per_s=p.int("max_stream_responses_per_s"),
            prefix_caching=p.choice("prefix_caching", ("true", "false")) == "true",
        )
        self.engine = self.workers = self.client = None
        where = p.choice("engine_process", ("auto", "true", "false"))
        if where == "true" or (where == "auto" and device.type == "cuda"):
            key = instance_key(args["model_name"], args.get("model_version", "1"), str(device))
            self.client = EngineClient.connect(GeneratorSpec(source, options), self.sink, self.metrics, key,
                                               options.cancel_check_interval_s)
            info = self.client.info
            self.vocab_size, self.max_len = info.vocab_size, info.max_position_embeddings
            freeze_startup_objects()  # (the engine thread does this in the other mode)
            log.info("generator ready: %s on %s (%s), engine process %d, KV cache %d blocks x %d tokens",
                     checkpoint, info.device, dtype, info.pid, info.kv_blocks, info.kv_block_size)
            return
        model, self.workers = load_model(source)  # with tensor parallelism: rank 0, workers meanwhile
        self.vocab_size, self.max_len = model.config.vocab_size, model.config.max_position_embeddings
        # Built before the warm-up: a bad parameter fails the load at once.
        self.engine = build_engine(model, self.tokenizer, self.sink, options, stats=self.metrics, workers=self.workers)
        if self.workers is not None:
            self.workers.on_failure = self._rank_failed
        warm_up(self.engine)  # kernel compilation and graph capture before READY, not on a request
        self.engine.report_occupancy()  # the KV gauges show the empty pool from the start
        self.engine.start()
        cache = self.engine.runner.cache
        log.info("generator ready: %s on %s (%s), KV cache %d blocks x %d tokens", checkpoint, device, dtype,
                 cache.num_blocks, cache.block_size)

    def execute(self, requests):
        parsed = []  # (sender, _Prompt) of the requests valid so far
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed.append((sender, self._parse(request)))
            except Exception as e:
                reject(sender, e)
        ready = []  # (sender, prompt ids, params, stream, options)
        for (sender, prompt), ids in zip(parsed, self._tokenize([prompt for _, prompt in parsed])):
            try:
                ready.append((sender, *self._complete(prompt, ids)))
            except Exception as e:
                reject(sender, e)
        if self.client is not None:
            try:
                self.client.submit(ready)  # one message for the whole call
            except Exception as e:  # the engine process is gone: nothing was queued
                for sender, *_ in ready:
                    reject(sender, e)
            return None
        for sender, prompt_ids, params, stream, options in ready:
            try:
                self.engine.submit(self.engine.new_sequence(sender, prompt_ids, params, stream, options))
            except Exception as e:
                reject(sender, e)
        return None

    def is_ready(self) -> bool:
        """Triton versions with this hook (after 2.51) report the model not ready once its
        engine is gone; on every version its requests then fail with UNAVAILABLE, which is
        what `tritonformer health` sees."""
        if self.client is not None:
            return self.client.failure is None
        return self.workers is None or self.workers.failure is None

    def _parse(self, request) -> "_Prompt":
        """Everything of a request but the tokenization of its text (done for all of an
        execute() call's requests at once): the prompt, its sampling parameters, whether to
        stream, and which outputs to add (the vLLM contract's flags; see README "The vLLM
        backend's contract")."""
        arrays = {name: input_array(request, name) for name in ("text_input", "input_ids")}
        stream = inputs.single_bool(input_array(request, "stream"), "stream", default=True)
        flags = {name: inputs.single_bool(input_array(request, name), name, default=False) for name in VLLM_FLAGS}
        echo = not inputs.single_bool(input_array(request, "exclude_input_in_output"), "exclude_input_in_output",
                                      default=True)
        raw = inputs.single_text(input_array(request, "sampling_parameters"), "sampling_parameters", 65536)
        params = parse_sampling_parameters(
            _merge_request_parameters(raw, request_parameters(request)), self.max_tokens_limit, self.vocab_size
        )
        text = prompt_ids = None
        if inputs.exactly_one(arrays, ("text_input", "input_ids")) == "input_ids":
            if params.apply_chat_template:
                raise InvalidRequest("apply_chat_template needs text_input, not input_ids")
            prompt_ids = inputs.token_ids(arrays["input_ids"], "input_ids", self.vocab_size)
        else:
            (text,) = inputs.decode_texts(arrays["text_input"], "text_input", 1, self.max_prompt_bytes)
            if params.apply_chat_template:
                try:
                    text = self.tokenizer.apply_chat_template(text)
                except Exception as e:
                    raise InvalidRequest(f"cannot apply the chat template: {e}") from None
        options = ResponseOptions(
            echo_prompt=None,  # (set in _complete: a pre-tokenized prompt's echo is its decoded text)
            num_input_tokens=flags["return_num_input_tokens"],
            num_output_tokens=flags["return_num_output_tokens"],
            logprobs=flags["return_logprobs"],
        )
        return _Prompt(text, prompt_ids, params, stream, options, echo)

    def _tokenize(self, prompts: list["_Prompt"]) -> list[list[int] | None]:
        """Every text prompt's ids, in one batch per kind (None where the request sent ids). A
        chat template writes its own special tokens (Llama 3's and Gemma's begin with the BOS):
        the tokenizer adds none then, or the prompt would start with two."""
        ids: list[list[int] | None] = [None] * len(prompts)
        for templated in (False, True):
            which = [i for i, p in enumerate(prompts)
                     if p.text is not None and p.params.apply_chat_template == templated]
            if which:
                encoded = self.tokenizer.encode_batch([prompts[i].text for i in which],
                                                      add_special_tokens=not templated)
                for i, e in zip(which, encoded):
                    ids[i] = e
        return ids

    def _complete(self, prompt: "_Prompt", ids: list[int] | None) -> tuple[list[int], SamplingParams, bool,
                                                                          ResponseOptions]:
        prompt_ids = prompt.ids if ids is None else ids
        if ids is not None:
            inputs.text_ids_in_vocabulary(ids, self.vocab_size)
        limit = self.max_len - 1  # room for at least one new token
        if len(prompt_ids) > limit:
            raise InvalidRequest(f"the prompt is {len(prompt_ids)} tokens; this model allows at most {limit}")
        options = prompt.options
        if prompt.echo:  # the prompt as given (templated, if asked); pre-tokenized ones decoded
            echo_text = prompt.text if prompt.text is not None else self.tokenizer.decode(prompt_ids)
            options = replace(options, echo_prompt=echo_text)
        return prompt_ids, prompt.params, prompt.stream, options

    def _rank_failed(self, problem: str) -> None:
        """A tensor-parallel worker died or failed: the model cannot run any more."""
        log.error("tensor-parallel rank failed, the generator stops serving: %s", problem)
        self.engine.fail(RuntimeError(f"the generator's tensor-parallel rank failed ({problem}); "
                                      f"restart the model"))

    def finalize(self):
        if self.client is not None:
            self.client.close()  # the engine process stops (with its workers) when its last stub has gone
        else:
            self.engine.stop()  # first: its last iterations still need the workers
            if self.workers is not None:
                self.workers.stop()
                if self.workers.failure is None:  # after one, a collective may never complete: wait for none
                    self.engine.runner.close()
        self.sink.close()
        self.metrics.close()


@dataclass(frozen=True)
class _Prompt:
    """A parsed request before its text is tokenized (exactly one of text, ids is set)."""

    text: str | None
    ids: list[int] | None
    params: SamplingParams
    stream: bool
    options: ResponseOptions
    echo: bool


def _merge_request_parameters(raw: str | None, request_params: dict) -> str | None:
    """Sampling keys may also come as request parameters (HTTP /generate puts every JSON key that
    is not an input there): {"text_input": "...", "max_tokens": 8}. The JSON input wins."""
    extra = {k: v for k, v in request_params.items() if k in SAMPLING_KEYS}
    if not extra:
        return raw
    try:
        given = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return raw  # let the parser report the bad JSON
    if not isinstance(given, dict):
        return raw
    return json.dumps({**extra, **given})


def _default_checkpoint(name: str = DEFAULT_GENERATOR) -> Path:
    return prepare_generator_checkpoint(name, progress=False)
