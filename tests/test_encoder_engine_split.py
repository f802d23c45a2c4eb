"""The encoder engine with a classification head and split requests (the reranker's path),
without Triton: every (query, text) pair queues on its own, pairs of one request run in
different batches beside other requests', and each request is answered once, in order."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.backend.encoder.engine import EmbedRequest, EncoderEngine, SplitRequest
from tritonformer.backend.encoder.heads import label_outputs, relevance_outputs
from tritonformer.backend.engine_loop import Overloaded
from tritonformer.backend.models.encoder import load_encoder
from tritonformer.backend.pair_tokenization import PairTokenizer
from tritonformer.scheduler.fifo import FifoBatchPolicy

from test_encoder_heads_vs_hf import minilm_reranker_config  # noqa: E402  (tests/ module)

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")


class Sink:
    def __init__(self):
        self.responses: dict = {}
        self.cancelled: set = set()
        self._cv = threading.Condition()

    def send(self, handle, outputs, error, final):
        with self._cv:
            assert handle not in self.responses, f"second response for {handle}"
            assert final
            self.responses[handle] = (outputs, error)
            self._cv.notify_all()

    def is_cancelled(self, handle):
        return handle in self.cancelled

    def wait(self, handles, timeout=60.0):
        deadline = time.monotonic() + timeout
        with self._cv:
            while not all(h in self.responses for h in handles):
                assert self._cv.wait(deadline - time.monotonic()), "timed out waiting for responses"
        return {h: self.responses[h] for h in handles}


class Stats:
    def __init__(self):
        self.batches = []

    def batch_done(self, **kw):
        self.batches.append(kw)


@pytest.fixture(scope="module")
def cross_encoder(minilm_dir):
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification(minilm_reranker_config()).eval()
    model = load_encoder(hf.config.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32)
    return model, PairTokenizer(minilm_dir, model.config.max_tokens_per_sequence)


def _alone(model, ids, types):
    """One pair's logit, run on its own."""
    cu = torch.tensor([0, len(ids)], dtype=torch.int32)
    hidden = model.forward(torch.tensor(ids), cu, token_type_ids=torch.tensor(types))
    return model.classify(hidden, cu)[0, 0].item()


def test_split_requests_are_reassembled_in_order(cross_encoder):
    model, pairs = cross_encoder
    sink, stats = Sink(), Stats()
    engine = EncoderEngine(model, sink, FifoBatchPolicy(max_sequences=3, max_tokens=4096), head=model.classify,
                           token_types=True, stats=stats)
    docs = [("word " * (1 + (i * 29) % 60)).strip() for i in range(7)]
    requests = {}
    for name, query, raw in (("a", "what is a word", False), ("b", "another query", True)):
        ids, types = pairs.encode_pairs(query, docs, False)
        requests[name] = (ids, types, raw)
        engine.submit(SplitRequest(name, ids, relevance_outputs(raw), types))
    one_ids, one_types = pairs.encode_pairs("q", ["one doc"], False)
    engine.submit(SplitRequest("single", one_ids, relevance_outputs(False), one_types))
    engine.start()
    got = sink.wait(["a", "b", "single"])
    engine.stop()
    for name, (ids, types, raw) in requests.items():
        outputs, error = got[name]
        assert error is None
        expected = np.array([_alone(model, i, t) for i, t in zip(ids, types)], dtype=np.float32)
        if not raw:
            expected = 1 / (1 + np.exp(-expected))
        np.testing.assert_allclose(outputs["scores"], expected, atol=1e-5)
        assert outputs["scores"].shape == (7,)
    assert len(stats.batches) >= 5 and max(b["sequences"] for b in stats.batches) <= 3  # 15 pairs, 3 a batch
    assert engine.num_queued() == 0


def test_split_request_cancelled_is_answered_once_and_stops_computing(cross_encoder):
    model, pairs = cross_encoder
    sink, stats = Sink(), Stats()
    engine = EncoderEngine(model, sink, FifoBatchPolicy(max_sequences=2, max_tokens=4096), head=model.classify,
                           token_types=True, stats=stats, cancel_check_after_s=0.0)
    ids, types = pairs.encode_pairs("query", [f"document {i}" for i in range(10)], False)
    engine.submit(SplitRequest("gone", ids, relevance_outputs(False), types))
    engine.submit(SplitRequest("kept", ids[:2], relevance_outputs(False), types[:2]))
    sink.cancelled.add("gone")
    engine.start()
    got = sink.wait(["gone", "kept"])
    time.sleep(0.2)
    engine.stop()
    assert "cancelled" in str(got["gone"][1]) and got["kept"][1] is None
    assert sum(b["sequences"] for b in stats.batches) == 2  # only the kept request's pairs ran
    assert engine.num_queued() == 0


def test_queue_bound_counts_requests_not_pairs(cross_encoder):
    model, pairs = cross_encoder
    engine = EncoderEngine(model, Sink(), FifoBatchPolicy(), head=model.classify, token_types=True, max_queue=2)
    ids, types = pairs.encode_pairs("query", [f"document {i}" for i in range(20)], False)
    engine.submit(SplitRequest("a", ids, relevance_outputs(False), types))
    engine.submit(SplitRequest("b", ids, relevance_outputs(False), types))
    with pytest.raises(Overloaded):
        engine.submit(SplitRequest("c", ids, relevance_outputs(False), types))


def test_classifier_request_through_the_engine(cross_encoder):
    model, pairs = cross_encoder
    torch.manual_seed(1)
    cfg = minilm_reranker_config(num_labels=3, id2label={0: "x", 1: "y", 2: "z"})
    hf = transformers.BertForSequenceClassification(cfg).eval()
    classifier = load_encoder(cfg.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32)
    sink = Sink()
    engine = EncoderEngine(classifier, sink, FifoBatchPolicy(), head=classifier.classify)
    seqs = [[101, 2054, 2003, 102], [101, 7592, 2088, 2003, 2307, 102]]
    engine.submit(EmbedRequest("r", seqs, outputs=label_outputs(classifier.labels)))
    engine.start()
    (outputs, error), = sink.wait(["r"]).values()
    engine.stop()
    with torch.no_grad():
        ref = torch.cat([hf(torch.tensor([s])).logits for s in seqs])
    np.testing.assert_allclose(outputs["probabilities"], torch.softmax(ref, -1).numpy(), atol=1e-4)
    assert outputs["labels"].tolist() == [b"xyz"[i : i + 1] for i in ref.argmax(-1).tolist()]


def test_split_requests_under_the_dp_policy(cross_encoder):
    """The DP batcher sorts pairs by length across requests; every request still gets its own
    scores back in its own order."""
    from tritonformer.scheduler.cost_model import GridCostModel
    from tritonformer.scheduler.dp_batcher import DpBatchPolicy, TriggerPolicy

    model, pairs = cross_encoder
    cost = GridCostModel.measure(lambda n, length: 0.001 + 1e-6 * n * length, {}, seqs=(1, 64), lengths=(8, 512))
    policy = DpBatchPolicy(cost, max_sequences=4, max_tokens=1024, trigger=TriggerPolicy(mode="lazy", lazy_timeout_s=0.01))
    sink = Sink()
    engine = EncoderEngine(model, sink, policy, head=model.classify, token_types=True)
    expected = {}
    for r in range(4):
        docs = [("text " * (1 + (r * 7 + i * 13) % 50)).strip() for i in range(5)]
        ids, types = pairs.encode_pairs(f"query {r}", docs, False)
        expected[r] = np.array([_alone(model, i, t) for i, t in zip(ids, types)], dtype=np.float32)
        engine.submit(SplitRequest(r, ids, relevance_outputs(True), types))
    engine.start()
    got = sink.wait(list(expected))
    engine.stop()
    for r, scores in expected.items():
        np.testing.assert_allclose(got[r][0]["scores"], scores, atol=1e-5)
