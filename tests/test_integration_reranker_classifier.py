"""The served `reranker` and `classifier` through a real tritonserver over HTTP and gRPC, against
Hugging Face transformers (tokenizer and model) on the same random-weight checkpoints, written
into a temporary model repository: a BERT cross-encoder (ms-marco-MiniLM-L-6-v2's config, named
through the environment variable the bundled server sets), an XLM-R reranker (bge-reranker-v2-m3's
config), a 3-label classifier, and a classifier folder with no checkpoint, which must load and
answer UNAVAILABLE while the others serve. The BERT reranker and the classifier run their engine in
a process of its own (engine_process true), the XLM-R reranker on its stub's thread. Bad input is
answered with clear errors."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from test_encoder_heads_vs_hf import bge_reranker_config, minilm_reranker_config  # noqa: E402

pytestmark = pytest.mark.server
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
MAX_POSITIONS = 64  # the BERT cross-encoder's table: long pairs are cheap to make
QUERY = "what do cats eat"
DOCS = ["Cats eat fish and mice.", "Paris is the capital of France.", "Kittens drink milk, adult cats eat meat.",
        "naïve café 東京 🚀", "cat " * 80, "The stock market fell on Monday."]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def _checkpoint(hf_model, folder: Path, tokenizer_dir: Path) -> Path:
    hf_model.save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tokenizer_dir / f).is_file():
            shutil.copy(tokenizer_dir / f, folder / f)
    return folder


def _model_folder(repo: Path, source: str, name: str, parameters: dict[str, str]) -> None:
    from tritonformer.client.config_variants import copy_model

    copy_model(REPO / "model_repository" / source, repo / name, parameters)


@pytest.fixture(scope="module")
def served(tmp_path_factory, minilm_dir, monkeypatch_module):
    from helpers import serving

    root = tmp_path_factory.mktemp("rerank")
    torch.manual_seed(11)
    bert = transformers.BertForSequenceClassification(
        minilm_reranker_config(max_position_embeddings=MAX_POSITIONS)).eval()
    torch.manual_seed(12)
    xlmr = transformers.XLMRobertaForSequenceClassification(bge_reranker_config(vocab_size=30522)).eval()
    torch.manual_seed(13)
    classifier = transformers.BertForSequenceClassification(minilm_reranker_config(
        num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})).eval()
    folders = {name: _checkpoint(model, root / name, minilm_dir)
               for name, model in (("bert", bert), ("xlmr", xlmr), ("classifier", classifier))}
    repo = root / "repository"
    # (checkpoint: the environment; the BERT reranker and the classifier run in an engine process)
    _model_folder(repo, "reranker", "reranker", {"max_texts_per_request": "16", "engine_process": "true"})
    _model_folder(repo, "reranker", "reranker_xlmr", {"checkpoint": str(folders["xlmr"]), "batch_policy": "fifo"})
    _model_folder(repo, "classifier", "classifier", {"checkpoint": str(folders["classifier"]), "engine_process": "true"})
    _model_folder(repo, "classifier", "classifier_unset", {})
    monkeypatch_module.setenv("TRITONFORMER_RERANKER_CHECKPOINT", str(folders["bert"]))
    monkeypatch_module.delenv("TRITONFORMER_CLASSIFIER_CHECKPOINT", raising=False)
    with serving(repo, ["reranker", "reranker_xlmr", "classifier", "classifier_unset"], timeout=600) as server:
        yield server, {"reranker": bert, "reranker_xlmr": xlmr, "classifier": classifier}, folders


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _client(server, protocol):
    if protocol == "grpc":
        import tritonclient.grpc as client

        return client, client.InferenceServerClient(server.grpc_url)
    import tritonclient.http as client

    return client, client.InferenceServerClient(server.http_url)


def _rerank(server, protocol, model, query, texts, parameters=None):
    client, c = _client(server, protocol)
    with c:
        tensors = []
        for name, values in (("query", [query]), ("texts", texts)):
            t = client.InferInput(name, [len(values)], "BYTES")
            t.set_data_from_numpy(np.array([v if isinstance(v, bytes) else v.encode() for v in values], dtype=object))
            tensors.append(t)
        return c.infer(model, tensors, parameters=parameters).as_numpy("scores")


def _classify(server, protocol, model, texts):
    client, c = _client(server, protocol)
    with c:
        t = client.InferInput("text_input", [len(texts)], "BYTES")
        t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=object))
        result = c.infer(model, [t])
        return result.as_numpy("probabilities"), result.as_numpy("labels")


def _hf_scores(hf, checkpoint, query, texts, token_types: bool, **tokenize):
    tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    with torch.no_grad():
        logits = []
        for text in texts:
            enc = tok(query, text, return_tensors="pt", **tokenize)
            logits.append(hf(input_ids=enc["input_ids"],
                             token_type_ids=enc["token_type_ids"] if token_types else None).logits[0, 0])
    return torch.stack(logits).numpy()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bert_reranker_scores_match_hf(served, protocol):
    server, hf, folders = served
    docs = [d for d in DOCS if len(d) < 200]
    got = _rerank(server, protocol, "reranker", QUERY, docs)
    ref = _hf_scores(hf["reranker"], folders["bert"], QUERY, docs, token_types=True)
    assert got.shape == (len(docs),) and got.dtype == np.float32
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-ref)), atol=1e-4)
    raw = _rerank(server, protocol, "reranker", QUERY, docs, {"raw_scores": True})
    np.testing.assert_allclose(raw, ref, atol=1e-3)
    assert np.ptp(ref) > 1e-2  # the documents do score differently


def test_truncate_cuts_the_text_as_hf_only_second(served):
    server, hf, folders = served
    long_doc = DOCS[4]
    got = _rerank(server, "http", "reranker", QUERY, [long_doc, DOCS[0]], {"truncate": True, "raw_scores": True})
    ref = _hf_scores(hf["reranker"], folders["bert"], QUERY, [long_doc, DOCS[0]], token_types=True,
                     truncation="only_second", max_length=MAX_POSITIONS)
    np.testing.assert_allclose(got, ref, atol=1e-3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_xlmr_reranker_matches_hf(served, protocol):
    server, hf, folders = served
    got = _rerank(server, protocol, "reranker_xlmr", QUERY, DOCS, {"raw_scores": True})
    # XLM-R has one token type: HF's XLM-R tokenizers give the model no token_type_ids.
    np.testing.assert_allclose(got, _hf_scores(hf["reranker_xlmr"], folders["xlmr"], QUERY, DOCS, token_types=False),
                               atol=1e-3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classifier_matches_hf(served, protocol):
    server, hf, folders = served
    docs = [d for d in DOCS if len(d) < 200]
    probabilities, labels = _classify(server, protocol, "classifier", docs)
    tok = transformers.AutoTokenizer.from_pretrained(folders["classifier"])
    with torch.no_grad():
        ref = torch.cat([hf["classifier"](**tok(d, return_tensors="pt")).logits for d in docs])
    assert probabilities.shape == (len(docs), 3)
    np.testing.assert_allclose(probabilities, torch.softmax(ref, -1).numpy(), atol=1e-4)
    assert [x.decode() if isinstance(x, bytes) else x for x in labels] == [LABELS[i] for i in ref.argmax(-1).tolist()]


def _error(server, protocol, call, expected):
    import tritonclient.utils

    with pytest.raises(tritonclient.utils.InferenceServerException) as info:
        result = call()
        print(f"expected an error with {expected!r}, got {result!r}")
    return str(info.value)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_input_gets_clear_errors_and_the_server_keeps_serving(served, protocol):
    server, _, _ = served
    too_long = "cat " * 600  # past both models' maxima (64 and 512 tokens)
    cases = [
        (lambda: _rerank(server, protocol, "reranker", QUERY, []), "texts is empty"),
        (lambda: _rerank(server, protocol, "reranker", QUERY, ["x"] * 17), "at most 16 per request"),
        (lambda: _rerank(server, protocol, "reranker", QUERY, [b"\xff\xfe bad"]), "not valid UTF-8"),
        (lambda: _rerank(server, protocol, "reranker", b"\xc3", ["fine"]), "query[0] is not valid UTF-8"),
        (lambda: _rerank(server, protocol, "reranker", "", ["fine"]), "query[0] is an empty string"),
        (lambda: _rerank(server, protocol, "reranker", QUERY, ["ok", too_long]), "(query, texts[1])"),
        (lambda: _rerank(server, protocol, "reranker", too_long, ["ok"], {"truncate": True}), "the query alone"),
        (lambda: _rerank(server, protocol, "reranker", QUERY, ["ok"], {"raw_scores": "maybe"}), "raw_scores"),
        (lambda: _classify(server, protocol, "classifier", [too_long]), "truncate"),
        (lambda: _classify(server, protocol, "classifier_unset", ["hello"]), "TRITONFORMER_CLASSIFIER_CHECKPOINT"),
    ]
    for call, message in cases:
        assert message in _error(server, protocol, call, message)
    # A missing query is refused by Triton itself (the input is required in config.pbtxt).
    client, c = _client(server, protocol)
    with c:
        t = client.InferInput("texts", [1], "BYTES")
        t.set_data_from_numpy(np.array([b"doc"], dtype=object))
        with pytest.raises(Exception, match="query"):
            c.infer("reranker", [t])
    assert _rerank(server, protocol, "reranker", QUERY, ["still serving"]).shape == (1,)


def test_unconfigured_model_is_ready_and_says_how_to_configure_it(served):
    from helpers import http_post

    server, _, _ = served
    assert server.model_ready("classifier_unset")
    status, body = http_post(server, "/v2/models/classifier_unset/infer", {"inputs": [
        {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hello"]}]})
    assert status == 503 and "checkpoint" in body["error"] and "--classifier-checkpoint" in body["error"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cli_rerank_and_classify(served, protocol, capsys):
    from tritonformer.client import calls
    from tritonformer.client.cli import main

    server, _, _ = served
    url = server.grpc_url if protocol == "grpc" else server.http_url
    docs = DOCS[:3]
    scores = calls.rerank(QUERY, docs, url=url, protocol=protocol)
    assert main(["rerank", QUERY, *docs, "--url", url, "--protocol", protocol]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [int(line.split("[")[1].split("]")[0]) for line in lines] == np.argsort(-scores).tolist()
    probabilities, labels = calls.classify(docs, url=url, protocol=protocol)
    assert main(["classify", *docs, "--url", url, "--protocol", protocol]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == labels and set(labels) <= set(LABELS.values())
    assert [LABELS[i] for i in probabilities.argmax(1)] == labels


# ---- the rerank route of the bundled server's OpenAI-style routes (Cohere / Jina / vLLM format)

@pytest.fixture(scope="module")
def routes(served):
    pytest.importorskip("fastapi")
    from tritonformer.client.openai_routes.runner import OpenAIRoutes
    from tritonformer.client.server import free_port

    server, _, _ = served
    running = OpenAIRoutes("127.0.0.1", free_port()).start(server.grpc_url)
    try:
        yield running
    finally:
        running.stop()


def _post(routes, path: str, body: dict) -> tuple[int, dict]:
    from helpers import post_json

    return post_json(routes.url.removesuffix("/v1") + path, body, timeout=60)


@pytest.mark.parametrize("model", ["reranker", "reranker_xlmr"])
def test_rerank_route_orders_the_models_own_scores(served, routes, model):
    server, _, folders = served
    docs = [d for d in DOCS if len(d) < 200]
    direct = _rerank(server, "grpc", model, QUERY, docs)
    status, body = _post(routes, "/v1/rerank", {"model": model, "query": QUERY, "documents": docs})
    assert status == 200, body
    assert body["model"] == model and body["id"].startswith("rerank-")
    results = body["results"]
    assert [r["index"] for r in results] == sorted(range(len(docs)), key=lambda i: -direct[i])
    assert [r["relevance_score"] for r in results] == [float(direct[r["index"]]) for r in results]
    assert all(r["document"] == {"text": docs[r["index"]]} for r in results)
    tok = transformers.AutoTokenizer.from_pretrained(folders["bert" if model == "reranker" else "xlmr"])
    assert body["usage"]["total_tokens"] == sum(len(tok(QUERY, d)["input_ids"]) for d in docs)
    # top_n, documents as objects, no documents back, TEI's raw scores, the /rerank path
    status, top = _post(routes, "/rerank", {"model": model, "query": QUERY, "top_n": 2, "return_documents": False,
                                            "raw_scores": True, "documents": [{"text": d} for d in docs]})
    raw = _rerank(server, "grpc", model, QUERY, docs, {"raw_scores": True})
    assert status == 200, top
    assert [(r["index"], r["relevance_score"]) for r in top["results"]] == \
        [(i, float(raw[i])) for i in sorted(range(len(docs)), key=lambda i: -raw[i])[:2]]
    assert all("document" not in r for r in top["results"])


def test_score_route_gives_each_pair_the_models_own_score(served, routes):
    """vLLM's /score: one text_1 against each text_2, or pairs of two lists (grouped by text_1
    into rerank calls here), in request order; usage counts every pair's tokens."""
    server, _, folders = served
    docs = [d for d in DOCS if len(d) < 200][:3]
    direct = _rerank(server, "grpc", "reranker", QUERY, docs)
    status, body = _post(routes, "/score", {"model": "reranker", "text_1": QUERY, "text_2": docs})
    assert status == 200, body
    assert body["object"] == "list" and body["id"].startswith("score-") and body["model"] == "reranker"
    assert [(d["index"], d["object"], d["score"]) for d in body["data"]] == \
        [(i, "score", float(v)) for i, v in enumerate(direct)]
    tok = transformers.AutoTokenizer.from_pretrained(folders["bert"])
    assert body["usage"]["total_tokens"] == sum(len(tok(QUERY, d)["input_ids"]) for d in docs)
    other = "which animal purrs"
    second = _rerank(server, "grpc", "reranker", other, docs[1:2])
    status, paired = _post(routes, "/v1/score", {"model": "reranker", "text_1": [QUERY, other, QUERY],
                                                 "text_2": [docs[0], docs[1], docs[2]], "raw_scores": False})
    assert status == 200, paired
    assert [d["score"] for d in paired["data"]] == pytest.approx(  # (other batches: rounding may differ)
        [float(direct[0]), float(second[0]), float(direct[2])], rel=1e-5)
    status, error = _post(routes, "/score", {"model": "reranker", "text_1": [QUERY, other], "text_2": docs})
    assert status == 400 and "text_1 has 2 texts and text_2 3" in error["error"]["message"]
    status, again = _post(routes, "/score", {"model": "reranker", "text_1": QUERY, "text_2": docs})  # (still serving)
    assert status == 200 and again["data"] == body["data"]


@pytest.mark.parametrize("body, status, words", [
    ({"model": "nope", "query": QUERY, "documents": ["a"]}, 404, ["nope", "reranker"]),
    ({"model": "classifier", "query": QUERY, "documents": ["a"]}, 404, ["classifier", "reranker"]),
    ({"model": "reranker", "query": QUERY, "documents": []}, 400, ["documents"]),
    ({"model": "reranker", "query": QUERY, "documents": ["a"], "top_n": 0}, 400, ["top_n"]),
    ({"model": "reranker", "query": QUERY, "documents": ["a"], "rank_fields": ["title"]}, 400, ["rank_fields"]),
    ({"model": "reranker", "query": QUERY, "documents": [{"text": "a", "title": "b"}]}, 400, ["documents"]),
    ({"model": "reranker", "query": QUERY, "documents": ["a"] * 17}, 400, ["17", "16"]),
    ({"model": "reranker", "query": QUERY, "documents": ["cat " * 80]}, 400, ["truncate"]),
])
def test_rerank_route_errors_are_openai_error_objects(routes, body, status, words):
    got_status, got = _post(routes, "/v1/rerank", body)
    assert got_status == status, got
    assert all(w in got["error"]["message"] for w in words), got["error"]["message"]


def test_classify_route_gives_the_models_probabilities_and_labels(served, routes):
    server, _, folders = served
    texts = DOCS[:3]
    probabilities, labels = _classify(server, "grpc", "classifier", texts)
    labels = [x.decode() if isinstance(x, bytes) else x for x in labels]
    status, body = _post(routes, "/classify", {"model": "classifier", "input": texts})
    assert status == 200, body
    assert body["model"] == "classifier" and body["object"] == "list" and body["id"].startswith("classify-")
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert [d["label"] for d in body["data"]] == labels
    assert [d["probs"] for d in body["data"]] == [[float(p) for p in row] for row in probabilities]
    assert all(d["num_classes"] == 3 for d in body["data"])
    tok = transformers.AutoTokenizer.from_pretrained(folders["classifier"])
    assert body["usage"]["prompt_tokens"] == sum(len(tok(t)["input_ids"]) for t in texts)
    status, one = _post(routes, "/v1/classify", {"model": "classifier", "input": texts[1]})
    assert status == 200 and one["data"][0]["probs"] == body["data"][1]["probs"]


@pytest.mark.parametrize("body, status, words", [
    ({"model": "reranker", "input": "a"}, 404, ["reranker", "classifier"]),
    ({"model": "classifier", "input": []}, 400, ["input"]),
    ({"model": "classifier", "input": "a", "top_k": 2}, 400, ["top_k"]),
    ({"model": "classifier", "input": ["cat " * 600]}, 400, ["truncate"]),
    ({"model": "classifier_unset", "input": "a"}, 503, ["TRITONFORMER_CLASSIFIER_CHECKPOINT"]),
])
def test_classify_route_errors(routes, body, status, words):
    got_status, got = _post(routes, "/classify", body)
    assert got_status == status, got
    assert all(w in got["error"]["message"] for w in words), got["error"]["message"]
