"""The embedder behind Triton's batcher (client/config_variants.with_triton_batching): several
requests per execute() call, each with a leading batch dimension of 1, answered exactly as the
default embedder answers them, with the engine on the stub's thread and in an engine process; a
request holding more than one item is refused clearly."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import http_post, scrape_metrics

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parent.parent
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Le chat est assis sur le tapis.", "short"]


@pytest.fixture(scope="module", params=["false", "true"], ids=["thread", "engine_process"])
def batched_server(request, tmp_path_factory):
    from tritonformer.client.config_variants import copy_model, with_triton_batching
    from helpers import serving

    repo = tmp_path_factory.mktemp("batched") / "repo"
    copy_model(REPO / "model_repository" / "embedder", repo / "embedder", {"engine_process": request.param})
    config = repo / "embedder" / "config.pbtxt"
    config.write_text(with_triton_batching(config.read_text()))
    with serving(repo, ["embedder"], timeout=300) as server:
        yield server


def _embed(server, name, shape, datatype, data):
    return http_post(server, "/v2/models/embedder/infer",
                     {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]})


def test_answers_equal_the_default_embedder_with_a_batch_axis(batched_server, triton_server):
    status, plain = _embed(triton_server, "text_input", [len(TEXTS)], "BYTES", TEXTS)
    assert status == 200, plain
    status, batched = _embed(batched_server, "text_input", [1, len(TEXTS)], "BYTES", TEXTS)
    assert status == 200, batched
    (out,) = batched["outputs"]
    assert out["shape"] == [1, len(TEXTS), plain["outputs"][0]["shape"][1]]
    np.testing.assert_allclose(out["data"], plain["outputs"][0]["data"], rtol=1e-5, atol=1e-6)

    ids = [101, 7592, 2088, 102]
    status, one = _embed(batched_server, "input_ids", [1, len(ids)], "INT32", ids)
    assert status == 200 and one["outputs"][0]["shape"][:2] == [1, 1], one


def test_a_request_with_two_items_is_refused(batched_server):
    status, body = _embed(batched_server, "input_ids", [2, 3], "INT32", [101, 2088, 102, 101, 7592, 102])
    assert status == 400 and "one item" in str(body), body
    status, body = _embed(batched_server, "input_ids", [1, 3], "INT32", [101, 2088, 102])  # the next one is fine
    assert status == 200 and body["outputs"][0]["shape"][:2] == [1, 1], body


def test_a_burst_arrives_in_fewer_execute_calls(batched_server):
    from tritonformer.client.loadgen import run_embed_load

    result = run_embed_load(batched_server.http_url, rate=500, seconds=0.3, lengths=[5, 40, 12, 64, 3, 27],
                            seed=2, model="embedder", batch_dim=True)
    s = result["summary"]
    assert s["requests"] >= 60 and s["ok"] == s["requests"], s["first_error"]
    triton = scrape_metrics(batched_server, "embedder", prefix="nv_inference_")
    assert triton["nv_inference_exec_count"] < triton["nv_inference_request_success"]
