"""The stock set-ups (client/stock_repository: HF models behind Triton's dynamic batcher), served
by a real tritonserver on tiny random-weight checkpoints and driven by the open-loop load
generator the way the served benchmarks drive them: every request answered, the answers equal
to Hugging Face run directly, and requests of different lengths batched together."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import http_post, wait_for_metrics

pytestmark = pytest.mark.server
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parent.parent
VOCAB = 2000


@pytest.fixture(scope="module")
def stock_server(tmp_path_factory):
    from tritonformer.client.server import TritonServer, free_ports

    root = tmp_path_factory.mktemp("stock")
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2))
    repo = root / "repo"
    shutil.copytree(REPO / "client" / "stock_repository", repo, ignore=shutil.ignore_patterns("*.md"))
    for name, model in (("hf_embedder", bert), ("hf_generator", gpt2)):
        model.save_pretrained(root / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace(
            'key: "checkpoint" value: { string_value: "" }', f'key: "checkpoint" value: {{ string_value: "{root / name}" }}'))
    http_port, grpc_port, metrics_port = free_ports(3)
    server = TritonServer(repo, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    server.start()
    try:
        server.wait_ready(["hf_embedder", "hf_generator"], timeout=300)
        yield server, bert.eval(), gpt2.eval()
    finally:
        server.stop()


def _triton_counts(server, model: str, answered: int) -> tuple[float, float]:
    """(requests answered, model executions) from Triton's own metrics, once `answered` requests
    have been counted (or after a timeout, and then the caller's equality check fails)."""
    _, values = wait_for_metrics(server, model, lambda v: v.get("nv_inference_request_success", 0) >= answered,
                                 prefix="nv_inference_")
    return values["nv_inference_request_success"], values["nv_inference_exec_count"]


def test_stock_embedder_answers_like_hf_and_batches_ragged_requests(stock_server):
    from tritonformer.client.loadgen import run_embed_load

    server, bert, _ = stock_server
    ids = [101, *range(1500, 1520), 102]
    status, body = http_post(server, "/v2/models/hf_embedder/infer",
                             {"inputs": [{"name": "input_ids", "shape": [1, len(ids)], "datatype": "INT32", "data": ids}]})
    assert status == 200, body
    with torch.inference_mode():
        expected = bert(torch.tensor([ids])).last_hidden_state.mean(1)[0]
    got = torch.tensor(body["outputs"][0]["data"], dtype=torch.float32)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)

    # A burst of different lengths: the batcher must group them (fewer executions than requests).
    result = run_embed_load(server.http_url, rate=400, seconds=0.2, lengths=[5, 40, 12, 64, 3, 27], seed=1,
                            vocab_size=VOCAB, model="hf_embedder", batch_dim=True)
    s = result["summary"]
    assert s["requests"] >= 40 and s["ok"] == s["requests"], s["first_error"]
    answered, executions = _triton_counts(server, "hf_embedder", s["requests"] + 1)
    assert answered == s["requests"] + 1 and executions < answered


def test_stock_generator_answers_like_hf_generate_under_load(stock_server):
    from tritonformer.client.hf_reference import generate_greedy, left_pad
    from tritonformer.client.loadgen import run_generate_load
    from tritonformer.client.traces import orca_trace

    server, _, gpt2 = stock_server
    trace = orca_trace(12, 3, (4, 40), (1, 6), VOCAB)
    result = run_generate_load(server.http_url, trace, rate=200, seed=3, model="hf_generator", unary=True)
    s = result["summary"]
    assert s["ok"] == len(trace), s["first_error"]
    assert s["output_tokens"] == s["expected_tokens"] == sum(r.max_new_tokens for r in trace)
    assert np.isnan(s["tpot_p50_ms"]) and s["ttft_p50_ms"] > 0  # whole answers: no time between tokens

    prompt = trace[0].prompt_ids
    body = {"inputs": [{"name": "input_ids", "shape": [1, len(prompt)], "datatype": "INT32", "data": prompt},
                       {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [5]}]}
    status, answer = http_post(server, "/v2/models/hf_generator/infer", body)
    assert status == 200, answer
    ids, mask = left_pad([prompt], "cpu")
    expected = generate_greedy(gpt2, ids, mask, 5)[0, len(prompt):].tolist()
    assert answer["outputs"][0]["data"] == expected
    answered, executions = _triton_counts(server, "hf_generator", len(trace) + 1)
    assert executions < answered  # request-level batches
