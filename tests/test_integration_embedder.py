"""The served `embedder` through a real tritonserver, against Hugging Face transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import http_post

pytestmark = pytest.mark.server

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar.",
    "Triton Inference Server serves models over HTTP and gRPC.",
    "How do I bake sourdough bread at home?",
    "Stock markets fell sharply on Monday.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le chat est assis sur le tapis.",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "Emoji are text too 🚀🔥👍",
    "short",
    "12345 67890 3.14159",
    "def add(a, b):\n    return a + b",
    "  leading and trailing whitespace  ",
    "UPPER CASE AND lower case",
    "¿Dónde está la biblioteca?",
    "naïve café résumé",
    "A very long sentence about transformers and batching, " * 30,  # > 256 tokens
    "tabs\tand\nnewlines",
    "Last one: what is the capital of France?",
]


@pytest.fixture(scope="module")
def hf_embeddings(minilm_dir):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    model = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    out = []
    with torch.no_grad():
        for text in TEXTS:
            enc = tok(text, return_tensors="pt")
            hidden = model(**enc).last_hidden_state[0]
            out.append(torch.nn.functional.normalize(hidden.mean(0), dim=0).numpy())
    assert len(tok(TEXTS[17])["input_ids"]) > 256
    return np.stack(out)


def _infer(server, protocol, texts, parameters=None):
    if protocol == "grpc":
        import tritonclient.grpc as client

        url = server.grpc_url
    else:
        import tritonclient.http as client

        url = server.http_url
    data = np.array([t.encode() for t in texts], dtype=np.object_)
    with client.InferenceServerClient(url) as c:
        inp = client.InferInput("text_input", [len(texts)], "BYTES")
        inp.set_data_from_numpy(data)
        return c.infer("embedder", [inp], parameters=parameters).as_numpy("embedding")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batch_of_texts_matches_hf(triton_server, hf_embeddings, protocol):
    got = _infer(triton_server, protocol, TEXTS)
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    cosine = (got * hf_embeddings).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(hf_embeddings, axis=1)
    assert cosine.min() >= 0.999, cosine
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_one_text_per_request_matches_batched(triton_server, hf_embeddings):
    for i in (0, 7, 17):
        got = _infer(triton_server, "http", [TEXTS[i]])
        assert got.shape == (1, 384)
        assert float(got[0] @ hf_embeddings[i]) >= 0.999


def test_pre_tokenized_input_ids(triton_server, minilm_dir, hf_embeddings):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.no_padding()  # this tokenizer.json pads to 128 by default
    ids = tok.encode(TEXTS[1]).ids
    status, body = http_post(
        triton_server,
        "/v2/models/embedder/infer",
        {"inputs": [{"name": "input_ids", "shape": [len(ids)], "datatype": "INT32", "data": ids}]},
    )
    assert status == 200, body
    out = body["outputs"][0]
    assert out["name"] == "embedding" and out["shape"] == [1, 384]
    assert float(np.array(out["data"]) @ hf_embeddings[1]) >= 0.999


def test_curl_style_json_request(triton_server):
    status, body = http_post(
        triton_server,
        "/v2/models/embedder/infer",
        {"inputs": [{"name": "text_input", "shape": [2], "datatype": "BYTES", "data": ["hello", "world"]}]},
    )
    assert status == 200, body
    assert body["outputs"][0]["shape"] == [2, 384]
