"""The routes' calls into Triton: the generator's vLLM-format stream and the embedder's infer.

One gRPC bidirectional stream per generation (tritonclient's asyncio client over one shared
channel): cancelling that stream is how Triton learns that the HTTP client went away, and the
generator then drops the sequence within one iteration. Every generation is streamed from
Triton, also for a non-streamed OpenAI response (the pieces are joined here), so both kinds of
response share one path and both can be cancelled.

What is sent (the vLLM backend's request format, which the generator speaks): the prompt as
`input_ids` (the routes tokenize it themselves: they need its length for the default
`max_tokens` and, for chat, render the template, whose special tokens must not get a second
BOS), `stream` true, `sampling_parameters` JSON, and, where the model's config declares them,
`exclude_input_in_output` true (echo is the routes' job: they hold the prompt text),
`return_num_input_tokens`, `return_num_output_tokens` and `return_logprobs`. The request
parameter `triton_enable_empty_final_response` makes Triton mark the last response of a request
(`triton_final_response`), whatever outputs it carries.
"""
from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc
from tritonclient.utils import InferenceServerException

from tritonformer.client.openai_routes.schemas import OpenAIError
from tritonformer.client.openai_routes.served_models import ServedModel

_FINAL_FLAG = {"triton_enable_empty_final_response": True}


@dataclass
class Piece:
    """One generator response, for one choice (`index`)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict] | None  # per new token: {token_id: {"logprob", "rank", "decoded_token"}}
    num_input_tokens: int | None
    num_output_tokens: int | None  # this response's new tokens
    finish_reason: str | None
    final: bool  # the request's last response (all choices done)


def error_from_triton(message: str, status: str | None = None) -> OpenAIError:
    """An OpenAI error for a Triton error. A stream's errors carry no status code, only text:
    the generator words its overload and health errors recognisably (README, "Errors")."""
    lowered, status = message.lower(), status or ""
    if "UNAVAILABLE" in status or "overloaded" in lowered or "retry later" in lowered:
        return OpenAIError(503, message, type="server_error", code="overloaded")
    if "NOT_FOUND" in status:
        return OpenAIError(404, message, code="model_not_found")
    if "INTERNAL" in status or "stub process" in lowered or "not healthy" in lowered:
        return OpenAIError(500, message, type="server_error")
    return OpenAIError(400, message)


def _tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _texts(name: str, texts: list[str]) -> grpcclient.InferInput:
    """A BYTES tensor of UTF-8 texts."""
    return _tensor(name, np.array([t.encode("utf-8") for t in texts], dtype=np.object_), "BYTES")


@functools.cache
def _true(name: str) -> grpcclient.InferInput:
    """A BOOL input holding true, made once: building one costs more than its request does
    (tritonclient only reads an input when it builds a request, so one object serves all)."""
    return _tensor(name, np.array([True], dtype=bool), "BOOL")


def generator_inputs(model: ServedModel, prompt_ids: list[int], sampling: dict,
                     logprobs: bool) -> list[grpcclient.InferInput]:
    """The vLLM-format request for `prompt_ids` (see the module docstring)."""
    inputs = [
        _tensor("input_ids", np.asarray(prompt_ids, dtype=np.int32), "INT32"),
        _true("stream"),
        _tensor("sampling_parameters", np.array([json.dumps(sampling).encode()], dtype=np.object_), "BYTES"),
    ]
    if logprobs:
        if "return_logprobs" not in model.inputs:
            raise OpenAIError(400, f"model {model.name!r} does not return logprobs (its config has no "
                                   "return_logprobs input)", param="logprobs")
        inputs.append(_true("return_logprobs"))
    for flag in ("exclude_input_in_output", "return_num_input_tokens", "return_num_output_tokens"):
        if flag in model.inputs:
            inputs.append(_true(flag))
    return inputs


def _scalar(result, name: str) -> int | None:
    array = result.as_numpy(name)
    return None if array is None or array.size == 0 else int(array.reshape(-1)[0])


def parse_piece(result) -> Piece:
    """A Piece from one streamed InferResult (the outputs it lacks are None / empty)."""
    text = result.as_numpy("text_output")
    ids = result.as_numpy("output_ids")
    finish = result.as_numpy("finish_reason")
    logprobs = result.as_numpy("logprobs")
    parameters = result.get_response().parameters
    final = "triton_final_response" in parameters and parameters["triton_final_response"].bool_param
    return Piece(
        index=_scalar(result, "index") or 0,
        text=b"".join(text.reshape(-1).tolist()).decode("utf-8", errors="replace") if text is not None else "",
        token_ids=ids.reshape(-1).tolist() if ids is not None else [],
        logprobs=json.loads(logprobs.reshape(-1)[0]) if logprobs is not None and logprobs.size else None,
        num_input_tokens=_scalar(result, "num_input_tokens"),
        num_output_tokens=_scalar(result, "num_output_tokens"),
        finish_reason=finish.reshape(-1)[0].decode() if finish is not None and finish.size else None,
        final=final,
    )


class TritonCalls:
    """The asyncio gRPC client of one tritonserver, shared by every request of the routes."""

    def __init__(self, grpc_url: str) -> None:
        self.grpc_url = grpc_url
        self.client = aiogrpc.InferenceServerClient(grpc_url)

    async def close(self) -> None:
        await self.client.close()

    async def model_configs(self) -> dict[str, dict]:
        """{name: config JSON} of every model Triton reports READY."""
        index = await self.client.get_model_repository_index(as_json=True)
        configs = {}
        for entry in index.get("models", []):
            if entry.get("state") == "READY":
                name = entry["name"]
                configs[name] = (await self.client.get_model_config(name, as_json=True))["config"]
        return configs

    async def generate(self, model: ServedModel, prompt_ids: list[int], sampling: dict,
                       logprobs: bool) -> AsyncIterator[Piece]:
        """The generator's responses for one request, as they arrive.

        Leaving the iteration early (the HTTP client disconnected: the task is cancelled, or the
        caller stops reading) cancels the gRPC stream, and with it the Triton request."""
        inputs = generator_inputs(model, prompt_ids, sampling, logprobs)
        done = asyncio.Event()

        async def one_request():
            # The request stream stays open until the last response: a half-closed stream is
            # not something every Triton release treats alike.
            yield {"model_name": model.name, "inputs": inputs, "parameters": _FINAL_FLAG}
            await done.wait()

        responses = self.client.stream_infer(one_request())
        finished = False
        try:
            async for result, error in responses:
                if error is not None:  # a stream's error: its message only, no status code
                    raise error_from_triton(error.message())
                piece = parse_piece(result)
                yield piece
                if piece.final:
                    finished = True
                    return
        except InferenceServerException as e:
            raise error_from_triton(str(e.message()), e.status()) from None
        finally:
            done.set()
            if not finished:
                responses.cancel()

    async def _infer(self, model: ServedModel, tensors: list, parameters: dict | None = None):
        """One unary /infer call; a Triton error becomes the OpenAI error for it."""
        try:
            return await self.client.infer(model.name, tensors, parameters=parameters)
        except InferenceServerException as e:
            raise error_from_triton(str(e.message()), e.status()) from None

    async def rerank(self, model: ServedModel, query: str, texts: list[str], truncate: bool,
                     raw_scores: bool) -> np.ndarray:
        """The reranker's `scores` [len(texts)] of `texts` for `query`, exactly as /infer gives them."""
        result = await self._infer(model, [_texts("query", [query]), _texts("texts", texts)],
                                   {"truncate": truncate, "raw_scores": raw_scores})
        return result.as_numpy("scores")

    async def classify(self, model: ServedModel, texts: list[str], truncate: bool) -> tuple[np.ndarray, list[str]]:
        """The classifier's `probabilities` [len(texts), labels] and each text's `labels` entry."""
        result = await self._infer(model, [_texts("text_input", texts)], {"truncate": truncate})
        labels = [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in result.as_numpy("labels")]
        return result.as_numpy("probabilities"), labels

    async def embed_ids(self, model: ServedModel, sequences: list[list[int]]) -> np.ndarray:
        """The embedder's `embedding` [len(sequences), hidden] of pre-tokenized sequences: the
        model takes one `input_ids` sequence per request, so one request each, all at once."""
        async def one(ids: list[int]) -> np.ndarray:
            result = await self._infer(model, [_tensor("input_ids", np.array(ids, np.int32), "INT32")])
            return result.as_numpy("embedding")[0]

        return np.stack(await asyncio.gather(*(one(ids) for ids in sequences)))

    async def embed(self, model: ServedModel, texts: list[str]) -> np.ndarray:
        """The embedder's `embedding` [len(texts), hidden] for `texts`, exactly as /infer gives it."""
        result = await self._infer(model, [_texts("text_input", texts)])
        return result.as_numpy("embedding")
