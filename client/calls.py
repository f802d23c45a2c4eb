"""Calling the served models with `tritonclient`: the code behind the CLI, usable as a library."""
from __future__ import annotations

import json
import queue
from dataclasses import dataclass
from typing import Iterator

import numpy as np


def embed(texts: list[str], url: str, protocol: str = "http", model: str = "embedder", truncate: bool = False) -> np.ndarray:
    """Embeddings `[len(texts), hidden]` for `texts` in one request."""
    data = np.array([t.encode("utf-8") for t in texts], dtype=np.object_)
    params = {"truncate": True} if truncate else None
    if protocol == "grpc":
        import tritonclient.grpc as client
    else:
        import tritonclient.http as client
    with client.InferenceServerClient(url) as c:
        inp = client.InferInput("text_input", list(data.shape), "BYTES")
        inp.set_data_from_numpy(data)
        result = c.infer(model, [inp], outputs=[client.InferRequestedOutput("embedding")], parameters=params)
        return result.as_numpy("embedding")


def _client_module(protocol: str):
    if protocol == "grpc":
        import tritonclient.grpc as client
    else:
        import tritonclient.http as client
    return client


def _texts_input(module, name: str, texts: list[str]):
    data = np.array([t.encode("utf-8") for t in texts], dtype=np.object_)
    inp = module.InferInput(name, list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    return inp


def rerank(query: str, texts: list[str], url: str, protocol: str = "http", model: str = "reranker",
           truncate: bool = False, raw_scores: bool = False) -> np.ndarray:
    """Relevance scores `[len(texts)]` of `texts` for `query` in one request, in their order."""
    client = _client_module(protocol)
    params = {"truncate": truncate, "raw_scores": raw_scores}
    with client.InferenceServerClient(url) as c:
        inputs = [_texts_input(client, "query", [query]), _texts_input(client, "texts", texts)]
        return c.infer(model, inputs, parameters=params).as_numpy("scores")


def classify(texts: list[str], url: str, protocol: str = "http", model: str = "classifier",
             truncate: bool = False) -> tuple[np.ndarray, list[str]]:
    """(probabilities `[len(texts), labels]`, each text's most likely label) in one request."""
    client = _client_module(protocol)
    with client.InferenceServerClient(url) as c:
        result = c.infer(model, [_texts_input(client, "text_input", texts)], parameters={"truncate": truncate})
        labels = [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in result.as_numpy("labels")]
        return result.as_numpy("probabilities"), labels


@dataclass
class Piece:
    text: str
    output_ids: list[int]
    finish_reason: str | None


def generate(
    prompt: str, url: str, model: str = "generator", stream: bool = True, sampling_parameters: dict | None = None
) -> Iterator[Piece]:
    """Yield the responses of one generation over gRPC streaming (one piece when stream=False)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    inputs = [
        _bytes_input(grpcclient, "text_input", prompt),
        _bytes_input(grpcclient, "sampling_parameters", json.dumps(sampling_parameters or {})),
    ]
    flag = grpcclient.InferInput("stream", [1], "BOOL")
    flag.set_data_from_numpy(np.array([stream]))
    inputs.append(flag)

    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(model, inputs)
        while True:
            result, error = responses.get()
            if error is not None:
                raise RuntimeError(str(error))
            finish = result.as_numpy("finish_reason")
            text = result.as_numpy("text_output")
            yield Piece(
                text=b"".join(text.tolist()).decode("utf-8") if text is not None else "",
                output_ids=result.as_numpy("output_ids").tolist(),
                finish_reason=finish[0].decode() if finish is not None else None,
            )
            if finish is not None:
                return
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def _bytes_input(module, name: str, value: str):
    inp = module.InferInput(name, [1], "BYTES")
    inp.set_data_from_numpy(np.array([value.encode("utf-8")], dtype=np.object_))
    return inp
