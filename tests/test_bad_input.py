"""Bad requests get a clear error at once, and the server answers the next good request."""
from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import grpc_stream, http_post

pytestmark = pytest.mark.server

GOOD_EMBED = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["fine"]}]}


def _text_input(data, shape=None, datatype="BYTES", name="text_input"):
    return {"name": name, "shape": shape if shape is not None else [len(data)], "datatype": datatype, "data": data}


EMBEDDER_CASES = {
    "missing input": ({"inputs": []}, "exactly one of the inputs text_input or input_ids"),
    "both inputs": (
        {"inputs": [_text_input(["a"]), {"name": "input_ids", "shape": [2], "datatype": "INT32", "data": [101, 102]}]},
        "got both",
    ),
    "empty list": ({"inputs": [_text_input([])]}, "text_input is empty"),
    "empty string": ({"inputs": [_text_input(["ok", ""])]}, "text_input[1] is an empty string"),
    "wrong dtype": ({"inputs": [_text_input([1, 2], datatype="INT32")]}, "expects 'BYTES'"),
    "wrong shape": ({"inputs": [_text_input(["a", "b"], shape=[1, 2])]}, "shape"),
    "unknown input": ({"inputs": [_text_input(["a"], name="text")]}, "text"),
    "ids outside vocabulary": (
        {"inputs": [{"name": "input_ids", "shape": [2], "datatype": "INT32", "data": [101, 999999]}]},
        "outside the vocabulary",
    ),
    "text too long": ({"inputs": [_text_input(["word " * 700])]}, "longer than the model's maximum of 512"),
}


@pytest.mark.parametrize("case", list(EMBEDDER_CASES))
def test_embedder_bad_input_then_good(triton_server, case):
    body, expected = EMBEDDER_CASES[case]
    status, answer = http_post(triton_server, "/v2/models/embedder/infer", body)
    assert status == 400, (status, answer)
    assert expected in answer["error"], answer
    status, answer = http_post(triton_server, "/v2/models/embedder/infer", GOOD_EMBED)
    assert status == 200, answer


def test_embedder_truncates_when_asked(triton_server):
    body = {"inputs": [_text_input(["word " * 700])], "parameters": {"truncate": True}}
    status, answer = http_post(triton_server, "/v2/models/embedder/infer", body)
    assert status == 200, answer
    assert answer["outputs"][0]["shape"] == [1, 384]


def test_embedder_non_utf8_bytes(triton_server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with httpclient.InferenceServerClient(triton_server.http_url) as c:
        inp = httpclient.InferInput("text_input", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"caf\xe9 \xff"], dtype=np.object_))
        with pytest.raises(InferenceServerException, match="not valid UTF-8"):
            c.infer("embedder", [inp])
    assert http_post(triton_server, "/v2/models/embedder/infer", GOOD_EMBED)[0] == 200


def _bytes(value: bytes | str):
    return (np.array([value.encode() if isinstance(value, str) else value], dtype=np.object_), "BYTES")


def _params(obj) -> tuple:
    return _bytes(obj if isinstance(obj, str) else json.dumps(obj))


GENERATOR_CASES = {
    "missing input": ({"stream": (np.array([False]), "BOOL")}, "exactly one of the inputs text_input or input_ids"),
    "both inputs": (
        {"text_input": _bytes("hi"), "input_ids": (np.array([1, 2], dtype=np.int32), "INT32")},
        "got both",
    ),
    "empty string": ({"text_input": _bytes("")}, "empty string"),
    "invalid JSON": ({"text_input": _bytes("hi"), "sampling_parameters": _params("{max_tokens: 5")}, "not valid JSON"),
    "unknown key": ({"text_input": _bytes("hi"), "sampling_parameters": _params({"max_new_tokens": 5})}, "unknown key"),
    "negative max_tokens": ({"text_input": _bytes("hi"), "sampling_parameters": _params({"max_tokens": -4})}, "max_tokens"),
    "absurd max_tokens": ({"text_input": _bytes("hi"), "sampling_parameters": _params({"max_tokens": 10**12})}, "max_tokens"),
    "non-UTF-8 prompt": ({"text_input": _bytes(b"\xc3\x28 bad")}, "not valid UTF-8"),
    "wrong dtype": ({"text_input": (np.array([1], dtype=np.int32), "INT32")}, "expects 'BYTES'"),
    "ids outside vocabulary": ({"input_ids": (np.array([1, 10**6], dtype=np.int32), "INT32")}, "outside the vocabulary"),
    "prompt too long": ({"text_input": _bytes("hello " * 9000)}, "this model allows at most"),
}


@pytest.mark.parametrize("case", list(GENERATOR_CASES))
def test_generator_bad_input_then_good(triton_server, case):
    inputs, expected = GENERATOR_CASES[case]
    results, error = grpc_stream(triton_server, "generator", inputs)
    assert error is not None and expected in error, (results, error)
    good = {"text_input": _bytes("Hello"), "sampling_parameters": _params({"max_tokens": 2}), "stream": (np.array([False]), "BOOL")}
    results, error = grpc_stream(triton_server, "generator", good)
    assert error is None and len(results) == 1
