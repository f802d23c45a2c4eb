"""32 concurrent mixed requests through the real server: all answered, each with its own result."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from helpers import grpc_stream, http_post

pytestmark = pytest.mark.server


def _embed(server, text):
    status, body = http_post(
        server, "/v2/models/embedder/infer",
        {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [text]}]},
    )
    assert status == 200, body
    return np.array(body["outputs"][0]["data"], dtype=np.float32)


def _generate(server, prompt, stream):
    inputs = {
        "text_input": (np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        "stream": (np.array([stream]), "BOOL"),
        "sampling_parameters": (np.array([json.dumps({"max_tokens": 12}).encode()], dtype=np.object_), "BYTES"),
    }
    results, error = grpc_stream(server, "generator", inputs)
    assert error is None, error
    return [i for r in results for i in r.as_numpy("output_ids").tolist()]


def test_32_concurrent_mixed_requests(triton_server):
    texts = [f"Sentence number {i} is about topic {i * 7 % 13}." + " more" * i for i in range(16)]
    prompts = [f"Count from {i}: {i}, {i + 1}," for i in range(16)]
    # Each request alone first: the expected answers.
    solo_embed = [_embed(triton_server, t) for t in texts]
    solo_gen = [_generate(triton_server, p, False) for p in prompts]

    with ThreadPoolExecutor(32) as pool:
        embeds = [pool.submit(_embed, triton_server, t) for t in texts]
        gens = [pool.submit(_generate, triton_server, p, i % 2 == 0) for i, p in enumerate(prompts)]
        embed_results = [f.result(timeout=300) for f in embeds]
        gen_results = [f.result(timeout=300) for f in gens]

    for got, expected in zip(embed_results, solo_embed):
        assert float(got @ expected) >= 0.9999  # its own text's embedding, not a neighbour's
    assert gen_results == solo_gen  # greedy: the same tokens as alone, streamed or not
