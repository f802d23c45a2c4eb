"""Sequence-classification heads (reranker, classifier) and long position tables against Hugging
Face `transformers` on the same random weights, in process on the CPU in fp32: the published
configs of cross-encoder/ms-marco-MiniLM-L-6-v2 (BERT) and BAAI/bge-reranker-v2-m3 (XLM-R with
8,194 positions), shrunk in width and depth but not in their position tables."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.backend.encoder.heads import label_outputs, relevance_outputs
from tritonformer.backend.models.encoder import ClassifierLabels, load_encoder
from tritonformer.backend.pair_tokenization import PairTokenizer
from tritonformer.kernels import pool_sequences

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")
# initializer_range 0.2 (HF: 0.02): logits of order 1, so that a 1e-3 tolerance can tell a wrong
# head or segment apart (with 0.02 every logit is within 1e-2 of 0).
SHRUNK = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, initializer_range=0.2)


def minilm_reranker_config(**overrides):
    """cross-encoder/ms-marco-MiniLM-L-6-v2's config.json (a BertForSequenceClassification with
    one label), shrunk to SHRUNK unless overridden."""
    values = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                  intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu",
                  layer_norm_eps=1e-12, num_labels=1, architectures=["BertForSequenceClassification"])
    values.update(SHRUNK)
    values.update(overrides)
    return transformers.BertConfig(**values)


def bge_reranker_config(**overrides):
    """BAAI/bge-reranker-v2-m3's config.json (an XLMRobertaForSequenceClassification with one
    label and 8,194 positions), shrunk to SHRUNK and a small vocabulary unless overridden."""
    values = dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1, hidden_act="gelu",
                  layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2, num_labels=1,
                  architectures=["XLMRobertaForSequenceClassification"])
    values.update(SHRUNK, vocab_size=1000)
    values.update(overrides)
    return transformers.XLMRobertaConfig(**values)


def _pair(hf_class, cfg, seed=0):
    torch.manual_seed(seed)
    hf = hf_class(cfg).eval()
    ours = load_encoder(cfg.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32)
    return hf, ours


def _packed(seqs, types=None):
    ids = torch.tensor([t for s in seqs for t in s])
    cu = torch.tensor([0] + np.cumsum([len(s) for s in seqs]).tolist(), dtype=torch.int32)
    tt = None if types is None else torch.tensor([t for s in types for t in s])
    return ids, cu, tt


def _hf_logits(hf, seqs, types=None):
    with torch.no_grad():
        return torch.cat([
            hf(torch.tensor([s]), token_type_ids=None if types is None else torch.tensor([types[i]])).logits
            for i, s in enumerate(seqs)
        ])


def test_bert_cross_encoder_scores_pairs_as_hf(minilm_dir):
    """Pairs from the real MiniLM tokenizer's pair encoding: segment 1 on the text part changes
    the scores, and ours equal HF's given the same token_type_ids."""
    hf, ours = _pair(transformers.BertForSequenceClassification, minilm_reranker_config())
    assert ours.labels.num_labels == 1 and ours.pos_type_emb is not None
    tok = PairTokenizer(minilm_dir, ours.config.max_tokens_per_sequence)
    ids, types = tok.encode_pairs("what do cats eat", ["Cats eat fish and mice.", "Paris is in France.",
                                                       "a " * 40 + "very long document about cats"], False)
    assert all(1 in t for t in types)
    flat_ids, cu, tt = _packed(ids, types)
    logits = ours.classify(ours.forward(flat_ids, cu, token_type_ids=tt), cu)
    ref = _hf_logits(hf, ids, types)
    torch.testing.assert_close(logits, ref, atol=1e-3, rtol=0)
    # Segment ids matter: dropping them gives other scores (the test can tell the paths apart).
    assert (ours.classify(ours.forward(flat_ids, cu), cu) - ref).abs().max() > 1e-3
    scores = relevance_outputs(raw=False)(logits.numpy())["scores"]
    np.testing.assert_allclose(scores, torch.sigmoid(ref[:, 0]).numpy(), atol=1e-4)
    np.testing.assert_array_equal(relevance_outputs(raw=True)(logits.numpy())["scores"], logits[:, 0].numpy())


def test_xlmr_reranker_long_positions_match_hf():
    """bge-reranker-v2-m3's 8,194-position table: sequences past 512 tokens (up to 1,400 here,
    CPU time) read positions HF reads, and scores match; max tokens is 8,192 (offset 2)."""
    hf, ours = _pair(transformers.XLMRobertaForSequenceClassification, bge_reranker_config(), seed=1)
    assert ours.config.max_tokens_per_sequence == 8192 and ours.pos_type_emb is None
    g = torch.Generator().manual_seed(2)
    seqs = [[0] + torch.randint(3, 1000, (n,), generator=g).tolist() + [2] for n in (1400, 7, 700)]
    flat_ids, cu, _ = _packed(seqs)
    hidden = ours.forward(flat_ids, cu)
    torch.testing.assert_close(ours.classify(hidden, cu), _hf_logits(hf, seqs), atol=1e-3, rtol=0)


def test_xlmr_cls_pooling_past_512_matches_hf_like_bge_m3():
    """bge-m3 embeds with the [CLS] (<s>) row of an XLM-R reading up to 8,192 tokens."""
    cfg = bge_reranker_config(architectures=["XLMRobertaModel"])
    torch.manual_seed(3)
    hf = transformers.XLMRobertaModel(cfg, add_pooling_layer=False).eval()
    ours = load_encoder(cfg.to_dict(), dict(hf.state_dict()), CPU, torch.float32)
    assert ours.labels is None
    g = torch.Generator().manual_seed(4)
    seqs = [[0] + torch.randint(3, 1000, (n,), generator=g).tolist() + [2] for n in (900, 3)]
    flat_ids, cu, _ = _packed(seqs)
    pooled = pool_sequences(ours.forward(flat_ids, cu), cu, "cls", True)
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([s])).last_hidden_state[0, 0] for s in seqs])
    torch.testing.assert_close(pooled, torch.nn.functional.normalize(ref, dim=-1), atol=1e-4, rtol=1e-4)


def test_bert_position_table_longer_than_512_matches_hf():
    hf, ours = _pair(transformers.BertForSequenceClassification,
                     minilm_reranker_config(max_position_embeddings=2048, num_labels=3), seed=5)
    assert ours.config.max_tokens_per_sequence == 2048
    g = torch.Generator().manual_seed(6)
    seqs = [[101] + torch.randint(1000, 30000, (n,), generator=g).tolist() + [102] for n in (1000, 30)]
    flat_ids, cu, _ = _packed(seqs)
    torch.testing.assert_close(ours.classify(ours.forward(flat_ids, cu), cu), _hf_logits(hf, seqs), atol=1e-3, rtol=0)


@pytest.mark.parametrize("family", ["bert", "xlm-roberta"])
def test_classifier_probabilities_and_labels_match_hf(family):
    """A 3-label single-label head (softmax) and the argmax label names from id2label."""
    id2label = {0: "negative", 1: "neutral", 2: "positive"}
    if family == "bert":
        cfg = minilm_reranker_config(num_labels=3, id2label=id2label, label2id={v: k for k, v in id2label.items()})
        hf, ours = _pair(transformers.BertForSequenceClassification, cfg, seed=7)
    else:
        cfg = bge_reranker_config(num_labels=3, id2label=id2label, label2id={v: k for k, v in id2label.items()},
                                  max_position_embeddings=514)
        hf, ours = _pair(transformers.XLMRobertaForSequenceClassification, cfg, seed=7)
    assert ours.labels == ClassifierLabels(("negative", "neutral", "positive"), multi_label=False)
    g = torch.Generator().manual_seed(8)
    seqs = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 33, 1, 64)]
    flat_ids, cu, _ = _packed(seqs)
    logits = ours.classify(ours.forward(flat_ids, cu), cu)
    ref = _hf_logits(hf, seqs)
    torch.testing.assert_close(logits, ref, atol=1e-3, rtol=0)
    out = label_outputs(ours.labels)(logits.numpy())
    np.testing.assert_allclose(out["probabilities"], torch.softmax(ref, -1).numpy(), atol=1e-4)
    expected = [id2label[i].encode() for i in ref.argmax(-1).tolist()]
    assert out["labels"].tolist() == expected
    assert len(set(expected)) > 1 or len(seqs) < 3  # random heads do pick different labels here


def test_multi_label_head_uses_sigmoid():
    cfg = minilm_reranker_config(num_labels=4, problem_type="multi_label_classification")
    hf, ours = _pair(transformers.BertForSequenceClassification, cfg, seed=9)
    assert ours.labels.multi_label and ours.labels.names == ("LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3")
    seqs = [[101, 2054, 2003, 102], [101, 7592, 102]]
    flat_ids, cu, _ = _packed(seqs)
    probs = label_outputs(ours.labels)(ours.classify(ours.forward(flat_ids, cu), cu).numpy())["probabilities"]
    ref = torch.sigmoid(_hf_logits(hf, seqs)).numpy()
    np.testing.assert_allclose(probs, ref, atol=1e-4)
    assert not np.allclose(probs.sum(1), 1.0, atol=1e-3)  # independent labels, not a softmax


def test_heads_are_checked_at_load():
    cfg = minilm_reranker_config(num_labels=2)
    torch.manual_seed(0)
    state = strip_prefixes_of(transformers.BertForSequenceClassification(cfg).state_dict())
    wrong = dict(cfg.to_dict(), id2label={"0": "a", "1": "b", "2": "c"})
    with pytest.raises(ValueError, match="2 outputs but config.json names 3 labels"):
        load_encoder(wrong, state, CPU, torch.float32)
    with pytest.raises(ValueError, match="unsupported encoder model_type 'gpt2'"):
        load_encoder({"model_type": "gpt2"}, state, CPU, torch.float32)
    no_head = {k: v for k, v in state.items() if not k.startswith("classifier")}
    with pytest.raises(KeyError, match="classifier.weight"):
        load_encoder(cfg.to_dict(), no_head, CPU, torch.float32)
