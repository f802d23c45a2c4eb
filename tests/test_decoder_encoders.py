"""Decoder families as encoders (models/decoder_encoder.py) against Hugging Face transformers on the
same random weights (CPU, fp32): last-token embeddings of packed sequences against `*Model`'s
last_hidden_state of each sequence alone (Qwen3-Embedding's recipe), and `*ForSequenceClassification`
scores; then through a real tritonserver as the `embedder` and the `reranker`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.models import decoder_encoder
from tritonformer.backend.models.encoder import load_encoder
from tritonformer.client.model_shapes import shrunk

from test_decoder_families import CONFIG_CLASSES

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[1]
# (shape, config changes): q/k norms (Qwen3, Qwen3-Embedding's family), a sliding window shorter
# than the sequences (Mistral, e5-mistral's), soft-capping, sandwich norms and scaled embeddings
# (Gemma 2).
CASES = [("qwen3-8b", {}), ("mistral-7b", {"sliding_window": 8}), ("gemma-2-9b", {})]
BASE_CLASSES = {"qwen3": "Qwen3Model", "mistral": "MistralModel", "gemma2": "Gemma2Model", "llama": "LlamaModel"}


def _hf(shape: str, changes: dict, head: str | None = None, seed: int = 0, **config):
    cfg = {**shrunk(shape), **changes, **config}
    model_type = cfg.pop("model_type")
    hf_cfg = getattr(transformers, CONFIG_CLASSES[model_type])(**cfg)
    torch.manual_seed(seed)
    cls = BASE_CLASSES[model_type] if head is None else BASE_CLASSES[model_type].replace("Model", head)
    hf = getattr(transformers, cls)._from_config(hf_cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # norms away from their initial values, so that they matter
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return hf


def _state(hf) -> dict:
    return {k.removeprefix("model."): v for k, v in hf.state_dict().items()}


def _packed(lengths, seed=5):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, 320, (n,), generator=g) for n in lengths]
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    return seqs, torch.cat(seqs), cu


@pytest.mark.parametrize("shape,changes", CASES, ids=[c[0] for c in CASES])
def test_last_token_embeddings_equal_hf_last_hidden_state(shape, changes):
    hf = _hf(shape, changes)
    ours = load_encoder(hf.config.to_dict(), _state(hf), CPU, torch.float32)
    seqs, ids, cu = _packed([5, 29, 1, 70])
    hidden = ours.forward(ids, cu)
    assert hidden.shape == (len(ids), hf.config.hidden_size)
    got = kernels.pool_sequences(hidden, cu, "last", True)
    with torch.no_grad():
        expected = torch.stack([hf(input_ids=s[None]).last_hidden_state[0, -1] for s in seqs])
    torch.testing.assert_close(got, F.normalize(expected, dim=-1), atol=2e-5, rtol=1e-4)
    # and every row of the longest sequence (causal: each is that prefix's last token)
    with torch.no_grad():
        whole = hf(input_ids=seqs[3][None]).last_hidden_state[0]
    torch.testing.assert_close(hidden[cu[3]:cu[4]], whole, atol=2e-5, rtol=1e-4)


def test_graph_buckets_padding_and_empty_sequences_leave_the_rows_unchanged():
    """The CUDA-graph path's static shapes (backend/cuda_graphs.py, run eagerly here): a padding
    sequence over the bucket's unused tokens and empty sequences after it change no real row,
    and the scratch cache, once made, stays where it is while a larger batch gets its own."""
    from tritonformer.backend.cuda_graphs import EncoderGraphs

    hf = _hf("gemma-2-9b", {"sliding_window": 8})
    ours = load_encoder(hf.config.to_dict(), _state(hf), CPU, torch.float32)
    lengths = [5, 29, 1]
    seqs, ids, cu = _packed(lengths, seed=7)
    eager = ours.forward(ids, cu)
    graphs = EncoderGraphs(ours, capture=False)
    assert graphs.bucket(sum(lengths), len(lengths)) == (64, 4)
    torch.testing.assert_close(graphs.forward(ids, lengths), eager, atol=1e-5, rtol=1e-5)
    kept = ours._cache
    _, more, more_cu = _packed([90, 70], seed=8)
    ours.forward(more, more_cu)
    assert ours._cache is kept  # (captured graphs hold its address)
    torch.testing.assert_close(graphs.forward(ids, lengths), eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape,labels", [("qwen3-8b", 1), ("llama-3.1-8b", 3)])
def test_sequence_classification_scores_equal_hf(shape, labels):
    hf = _hf(shape, {}, head="ForSequenceClassification", num_labels=labels, pad_token_id=0)
    config = {**hf.config.to_dict(), "architectures": [type(hf).__name__]}  # (save_pretrained writes it)
    ours = load_encoder(config, _state(hf), CPU, torch.float32)
    assert ours.labels.num_labels == labels
    seqs, ids, cu = _packed([7, 33, 2], seed=9)
    got = ours.classify(ours.forward(ids, cu), cu)
    with torch.no_grad():
        expected = torch.stack([hf(input_ids=s[None]).logits[0] for s in seqs])
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_a_causal_lm_scores_by_its_next_token_logits():
    """score_tokens: a one-label head of output-head rows, Qwen3-Reranker's logit(yes) - logit(no)
    (tied embedding: Qwen3-0.6B's), or one token's logit (an untied head)."""
    for shape, tied in (("qwen3-8b", True), ("llama-3.1-8b", False)):
        hf = _hf(shape, {}, head="ForCausalLM", tie_word_embeddings=tied)
        config = {**hf.config.to_dict(), "architectures": [type(hf).__name__]}
        seqs, ids, cu = _packed([6, 21, 3], seed=4)
        with torch.no_grad():
            last = torch.stack([hf(input_ids=s[None]).logits[0, -1] for s in seqs])
        two = load_encoder(config, _state(hf), CPU, torch.float32, (17, 42))
        assert two.labels.num_labels == 1
        torch.testing.assert_close(two.classify(two.forward(ids, cu), cu)[:, 0], last[:, 42] - last[:, 17],
                                   atol=2e-5, rtol=1e-4)
        one = load_encoder(config, _state(hf), CPU, torch.float32, (42,))
        torch.testing.assert_close(one.classify(one.forward(ids, cu), cu)[:, 0], last[:, 42], atol=2e-5, rtol=1e-4)


def test_score_tokens_are_single_tokens_of_a_decoder(smollm2_dir):
    from tritonformer.backend.encoder.build import score_token_ids
    from tritonformer.backend.tokenization import TextTokenizer

    tokenizer = TextTokenizer(smollm2_dir)
    no, yes = score_token_ids(tokenizer, "no, yes")
    assert tokenizer.decode([no]) == "no" and tokenizer.decode([yes]) == "yes"
    assert score_token_ids(tokenizer, "") == ()
    with pytest.raises(ValueError, match="not one"):
        score_token_ids(tokenizer, "no,incomprehensibilities")
    with pytest.raises(ValueError, match="3 tokens"):
        score_token_ids(tokenizer, "a,b,c")
    from test_encoder_heads_vs_hf import minilm_reranker_config

    bert = transformers.BertForSequenceClassification(minilm_reranker_config()).eval()
    with pytest.raises(ValueError, match="needs a decoder checkpoint"):
        load_encoder({**bert.config.to_dict(), "model_type": "bert"}, bert.state_dict(), CPU, torch.float32, (1, 2))


def test_what_cannot_be_an_encoder_is_refused():
    hf = _hf("qwen3-8b", {}, head="ForSequenceClassification", num_labels=2, pad_token_id=0)
    config = {**hf.config.to_dict(), "architectures": ["Qwen3ForSequenceClassification"]}
    state = _state(hf)
    del state["score.weight"]
    with pytest.raises(KeyError, match="score.weight"):
        load_encoder(config, state, CPU, torch.float32)
    bidirectional = {**shrunk("gemma-3-1b"), "model_type": "gemma3_text", "use_bidirectional_attention": True}
    with pytest.raises(ValueError, match="bidirectional attention is not supported"):
        load_encoder(bidirectional, {}, CPU, torch.float32)
    with pytest.raises(ValueError, match="unsupported encoder model_type 'lfm2'"):  # (a recurrent state per sequence)
        load_encoder(shrunk("lfm2-1.2b"), {}, CPU, torch.float32)
    with pytest.raises(ValueError, match="recurrent layers and is not supported as an encoder"):  # (if it were listed)
        decoder_encoder.from_hf(shrunk("lfm2-1.2b"))


# --- through a real tritonserver -------------------------------------------------------------

TEXTS = ["what do cats eat", "Cats eat fish and mice.", "naïve café 東京 🚀", "x"]


def _folder(hf, folder: Path, tokenizer_dir: Path, pooling: str | None = None) -> Path:
    hf.save_pretrained(folder)
    # Any tokenizer whose ids the vocabulary covers will do (both sides tokenize with it): SmolLM2's.
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / f, folder / f)
    if pooling:  # sentence-transformers' files: last-token pooling, then Normalize
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    return folder


@pytest.fixture(scope="module")
def decoder_encoders_served(tmp_path_factory, smollm2_dir):
    from helpers import serving
    from tritonformer.client.config_variants import copy_model

    root = tmp_path_factory.mktemp("decoder_encoders")
    vocab = 49152  # SmolLM2's tokenizer's
    embedder = _hf("qwen3-8b", {}, seed=21, vocab_size=vocab)
    reranker = _hf("qwen3-8b", {}, head="ForSequenceClassification", seed=22, vocab_size=vocab, num_labels=1,
                   pad_token_id=0)
    lm = _hf("qwen3-8b", {}, head="ForCausalLM", seed=23, vocab_size=vocab, tie_word_embeddings=True)
    folders = {"embedder": _folder(embedder, root / "embedder", smollm2_dir, pooling="last"),
               "reranker": _folder(reranker, root / "reranker", smollm2_dir),
               "lm": _folder(lm, root / "lm", smollm2_dir)}
    repo = root / "repository"
    copy_model(REPO / "model_repository" / "embedder", repo / "embedder_qwen3", {"checkpoint": str(folders["embedder"])})
    copy_model(REPO / "model_repository" / "reranker", repo / "reranker_qwen3", {"checkpoint": str(folders["reranker"])})
    copy_model(REPO / "model_repository" / "reranker", repo / "reranker_lm",
               {"checkpoint": str(folders["lm"]), "score_tokens": "no,yes"})
    with serving(repo, ["embedder_qwen3", "reranker_qwen3", "reranker_lm"], timeout=600) as server:
        yield server, embedder, reranker, lm, folders


@pytest.mark.server
def test_served_qwen3_embeddings_and_rerank_scores_equal_hf(decoder_encoders_served):
    import tritonclient.http as client

    server, embedder, reranker, lm, folders = decoder_encoders_served
    tok = transformers.AutoTokenizer.from_pretrained(folders["embedder"])
    with client.InferenceServerClient(server.http_url) as c:
        t = client.InferInput("text_input", [len(TEXTS)], "BYTES")
        t.set_data_from_numpy(np.array([x.encode() for x in TEXTS], dtype=object))
        got = c.infer("embedder_qwen3", [t]).as_numpy("embedding")
        tensors = []
        for name, values in (("query", [TEXTS[0]]), ("texts", TEXTS[1:])):
            t = client.InferInput(name, [len(values)], "BYTES")
            t.set_data_from_numpy(np.array([v.encode() for v in values], dtype=object))
            tensors.append(t)
        scores = c.infer("reranker_qwen3", tensors).as_numpy("scores")
        lm_scores = c.infer("reranker_lm", tensors).as_numpy("scores")
    with torch.no_grad():
        expected = torch.stack([embedder(**tok(x, return_tensors="pt")).last_hidden_state[0, -1] for x in TEXTS])
        expected_scores = torch.stack([reranker(**tok(TEXTS[0], x, return_tensors="pt")).logits[0, 0]
                                       for x in TEXTS[1:]])
    np.testing.assert_allclose(got, F.normalize(expected, dim=-1).numpy(), atol=1e-4, rtol=1e-3)
    np.testing.assert_allclose(scores.reshape(-1), torch.sigmoid(expected_scores).numpy(), atol=1e-4, rtol=1e-3)
    no, yes = (tok.convert_tokens_to_ids(t) for t in ("no", "yes"))
    with torch.no_grad():  # Qwen3-Reranker's score: P(yes) of the two next tokens
        last = torch.stack([lm(**tok(TEXTS[0], x, return_tensors="pt")).logits[0, -1] for x in TEXTS[1:]])
    expected_lm = torch.softmax(last[:, [no, yes]], dim=-1)[:, 1]
    np.testing.assert_allclose(lm_scores.reshape(-1), expected_lm.numpy(), atol=1e-4, rtol=1e-3)
