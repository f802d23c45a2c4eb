"""The served reranker benchmark's pieces on the CPU: the stock `hf_reranker`
(client/stock_repository, HF behind Triton's batcher) and our `reranker` on the same random-weight
cross-encoder in one real tritonserver, both driven by the open-loop `rerank` load the benchmark
runs: every request answered, and the two models' scores equal to each other and to HF."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import http_post
from test_encoder_heads_vs_hf import minilm_reranker_config  # noqa: E402

pytestmark = pytest.mark.server
transformers = pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory, minilm_dir):
    from helpers import serving

    root = tmp_path_factory.mktemp("rerank_load")
    torch.manual_seed(21)
    hf = transformers.BertForSequenceClassification(minilm_reranker_config()).eval()
    checkpoint = root / "cross-encoder"
    hf.save_pretrained(checkpoint)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir / f, checkpoint / f)
    repo = root / "repo"
    for source, name in ((REPO / "client" / "stock_repository" / "hf_reranker", "hf_reranker"),
                         (REPO / "model_repository" / "reranker", "reranker")):
        shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        config = repo / name / "config.pbtxt"
        text, n = re.subn(r'(key: "checkpoint" value: \{ string_value: )""', rf'\1"{checkpoint}"', config.read_text())
        assert n == 1
        config.write_text(text)
    with serving(repo, ["hf_reranker", "reranker"], timeout=300) as server:
        yield server, hf, checkpoint


def test_stock_and_ours_score_alike_and_answer_the_rerank_load(rerank_server):
    from tritonformer.client.loadgen import goodput, rerank_jobs, run_rerank_load

    server, hf, checkpoint = rerank_server
    jobs = rerank_jobs(server.http_url, np.zeros(1), distribution="short", documents=5)
    body = json.loads(jobs[0].data)
    query, texts = body["inputs"][0]["data"][0], body["inputs"][1]["data"]
    tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    with torch.no_grad():
        ref = torch.sigmoid(hf(**tok([query] * len(texts), texts, padding=True, return_tensors="pt")).logits[:, 0])
    status, ours = http_post(server, "/v2/models/reranker/infer", body)
    assert status == 200, ours
    stock_body = json.loads(rerank_jobs(server.http_url, np.zeros(1), distribution="short", documents=5,
                                        batch_dim=True)[0].data)
    status, stock = http_post(server, "/v2/models/hf_reranker/infer", stock_body)
    assert status == 200, stock
    np.testing.assert_allclose(ours["outputs"][0]["data"], ref.numpy(), atol=1e-4)
    np.testing.assert_allclose(stock["outputs"][0]["data"], ref.numpy(), atol=1e-4)
    for model, batch_dim in (("reranker", False), ("hf_reranker", True)):
        s = run_rerank_load(server.http_url, 4, 1.0, distribution="short", documents=8, model=model,
                            batch_dim=batch_dim)["summary"]
        assert s["requests"] > 0 and s["ok"] == s["requests"], s
        assert s["pairs_per_s"] == pytest.approx(8 * s["throughput_rps"])
        assert goodput([s], slo_ms=1e9) is s and goodput([s], slo_ms=0.0) is None


def test_locust_reranker_user(rerank_server, tmp_path, monkeypatch):
    import importlib.util

    # Look for locust without importing it: the import monkey-patches this process with gevent.
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed")
    from test_locust import _locust

    server, _, _ = rerank_server
    monkeypatch.setenv("TRITONFORMER_LOAD_DOCUMENTS", "8")  # CPU time; the user's default is 32
    # One user: with two, both may pass --iterations' check at once and a fifth request goes out.
    proc, stats, failures = _locust(server, tmp_path, "--tags", "rerank-http", "--iterations", "4", "-u", "1",
                                    "-r", "1", "--run-time", "60s")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert failures == [], failures
    assert int(stats[("POST", "reranker http")]["Request Count"]) == 4
