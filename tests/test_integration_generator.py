"""The served `generator` through a real tritonserver: greedy output token-identical to Hugging
Face `generate`, gRPC streaming, HTTP /generate and /generate_stream, stop strings, max_tokens."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import torch

from helpers import grpc_stream, http_post

pytestmark = pytest.mark.server

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "List three colors: red,",
    "Water boils at",
]


def _inputs(prompt: str, stream: bool, **params):
    return {
        "text_input": (np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        "stream": (np.array([stream]), "BOOL"),
        "sampling_parameters": (np.array([json.dumps(params).encode()], dtype=np.object_), "BYTES"),
    }


def _ids(results) -> list[int]:
    return [i for r in results for i in r.as_numpy("output_ids").tolist()]


def _text(results) -> str:
    return "".join(r.as_numpy("text_output")[0].decode() for r in results)


@pytest.fixture(scope="module")
def hf_greedy(smollm2_dir):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            enc = tok(p, return_tensors="pt")
            gen = model.generate(**enc, max_new_tokens=32, do_sample=False, pad_token_id=tok.eos_token_id)
            out.append(gen[0, enc["input_ids"].shape[1] :].tolist())
    return out


def test_greedy_is_token_identical_to_hf(triton_server, hf_greedy):
    for prompt, expected in zip(PROMPTS, hf_greedy):
        results, error = grpc_stream(triton_server, "generator", _inputs(prompt, False, max_tokens=32))
        assert error is None, error
        assert len(results) == 1  # stream=false: one response
        assert _ids(results) == expected, prompt


def test_grpc_streaming_equals_whole_completion(triton_server, hf_greedy):
    results, error = grpc_stream(triton_server, "generator", _inputs(PROMPTS[2], True, max_tokens=32))
    assert error is None, error
    assert len(results) > 3  # really streamed
    assert _ids(results) == hf_greedy[2]
    whole, _ = grpc_stream(triton_server, "generator", _inputs(PROMPTS[2], False, max_tokens=32))
    assert _text(results) == _text(whole)
    assert results[-1].as_numpy("finish_reason")[0].decode() in ("stop", "length")


def test_http_generate_and_generate_stream(triton_server):
    params = json.dumps({"max_tokens": 16})
    status, body = http_post(
        triton_server, "/v2/models/generator/generate", {"text_input": PROMPTS[0], "stream": False, "sampling_parameters": params}
    )
    assert status == 200, body
    assert body["finish_reason"] == "length" and len(body["output_ids"]) == 16

    req = urllib.request.Request(
        f"http://{triton_server.http_url}/v2/models/generator/generate_stream",
        data=json.dumps({"text_input": PROMPTS[0], "sampling_parameters": params}).encode(),
    )
    events = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            line = line.decode().strip()
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == body["text_output"]
    assert events[-1]["finish_reason"] == "length"


def test_sampling_keys_as_generate_parameters(triton_server):
    status, body = http_post(
        triton_server, "/v2/models/generator/generate", {"text_input": PROMPTS[4], "stream": False, "max_tokens": 3}
    )
    assert status == 200, body
    assert len(body["output_ids"]) == 3


def test_stop_string_and_max_tokens(triton_server, hf_greedy, smollm2_dir):
    from tokenizers import Tokenizer

    full = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json")).decode(hf_greedy[0])
    word = full.split()[1]  # a word the greedy completion is known to contain
    results, error = grpc_stream(triton_server, "generator", _inputs(PROMPTS[0], True, max_tokens=32, stop=[word]))
    assert error is None, error
    text = _text(results)
    assert word not in text and full.startswith(text)
    assert results[-1].as_numpy("finish_reason")[0].decode() == "stop"

    results, error = grpc_stream(triton_server, "generator", _inputs(PROMPTS[1], False, max_tokens=5, ignore_eos=True))
    assert error is None and len(_ids(results)) == 5
    assert results[-1].as_numpy("finish_reason")[0].decode() == "length"


def test_chat_template_answers_paris(triton_server):
    results, error = grpc_stream(
        triton_server,
        "generator",
        _inputs("What is the capital of France?", False, max_tokens=16, apply_chat_template=True),
    )
    assert error is None, error
    assert "Paris" in _text(results)
