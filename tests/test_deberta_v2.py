"""Our DeBERTa-v2/v3 against Hugging Face transformers' DebertaV2Model and
DebertaV2ForSequenceClassification on the same random weights.

The config is microsoft/deberta-v3-base's published one (hidden 768, 12 heads of 64, 256
position buckets over 512 relative positions, share_att_key, c2p|p2c, no absolute positions, no
token types) shrunk for the CPU to 2 layers, 4 heads (hidden 256) and a 1,000-word vocabulary;
sequences run from 3 tokens to past the 128 exact distances (log buckets), past the bucket span
(256) and past the 512 relative positions, where the columns saturate. Each HF reference runs
one sequence alone (no padding); ours runs them all packed together. The GPU group checks the full size in fp16.
"""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.backend.encoder.activation_arena import ActivationArena
from tritonformer.backend.models.deberta_v2 import DebertaV2Config, DebertaV2Encoder, log_bucket, relative_column_table
from tritonformer.backend.models.encoder import ENCODER_FAMILIES, ClassifierLabels, load_encoder
from tritonformer.client.bench_runtime import DEBERTA_V3_BASE, DEBERTA_V3_LARGE  # the published configs
from tritonformer.kernels import pool_sequences

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")

# shrunk for the CPU: 2 layers, a 1,000-word vocabulary, 4 heads of the published 64 (hidden 256)
SHRUNK = {"num_hidden_layers": 2, "vocab_size": 1000, "hidden_size": 256, "num_attention_heads": 4,
          "intermediate_size": 1024}
# within the 128 exact distances, past them (log buckets), past the 256-bucket span, past the 512 relative positions
LENGTHS = [3, 130, 600]


def hf_config(overrides: dict | None = None, **head) -> "transformers.DebertaV2Config":
    cfg = {k: v for k, v in DEBERTA_V3_BASE.items() if k not in ("model_type", "architectures")}
    cfg.update(SHRUNK)
    cfg.update(overrides or {})
    cfg.update(head)
    return transformers.DebertaV2Config(**cfg)


def _hf_model(cls, cfg, seed):
    torch.manual_seed(seed)
    model = cls._from_config(cfg, attn_implementation="eager").eval()
    # HF's init leaves norms at 1 and biases at 0: random ones test that we read them. Its small
    # init (std 0.02) makes attention nearly uniform, where positions hardly matter: larger q/k
    # weights give scores of order one.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.copy_((1 if name.endswith("weight") else 0) + 0.2 * torch.randn_like(p))
            elif "query_proj" in name or "key_proj" in name:
                p.mul_(3) if name.endswith("weight") else p.normal_(0, 0.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
    return model


def _packed(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    ids = torch.tensor([t for s in seqs for t in s])
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return seqs, ids, cu


def _cos_min(a, b) -> float:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).min().item()


def _ours(hf_model, labels: bool = False) -> DebertaV2Encoder:
    cfg = hf_model.config.to_dict()
    if labels:
        cfg["architectures"] = ["DebertaV2ForSequenceClassification"]
    return load_encoder(cfg, dict(hf_model.state_dict()), CPU, torch.float32)


def test_last_hidden_state_matches_hf():
    """deberta-v3-base shrunk to 2 layers, packed sequences shorter and longer than the bucket
    span and the relative positions; fp32, per token."""
    hf = _hf_model(transformers.DebertaV2Model, hf_config(), seed=0)
    ours = _ours(hf)
    assert isinstance(ours, DebertaV2Encoder) and ours.config.att_span == 256
    seqs, ids, cu = _packed(LENGTHS, hf.config.vocab_size, seed=1)
    hidden = ours.forward(ids, cu)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = hf(input_ids=torch.tensor([s])).last_hidden_state[0]
            got = hidden[cu[i] : cu[i + 1]]
            torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4)
    # the position terms matter here: with the relative embeddings reversed the output moves
    state = dict(hf.state_dict())
    state["encoder.rel_embeddings.weight"] = state["encoder.rel_embeddings.weight"].flip(0)
    shuffled = DebertaV2Encoder(ours.config, state, CPU, torch.float32).forward(ids[: cu[2]], cu[:3])
    assert (shuffled - hidden[: cu[2]]).abs().max() > 1e-2


@pytest.mark.parametrize("num_labels", [1, 3])
def test_sequence_classification_logits_match_hf(num_labels):
    """A cross-encoder reranker's one logit and an NLI head's three: ContextPooler (dense + GELU
    on the first token) then the classifier, within 1e-4 in fp32."""
    id2label = {i: f"label_{i}" for i in range(num_labels)}
    cfg = hf_config(num_labels=num_labels, id2label=id2label)
    hf = _hf_model(transformers.DebertaV2ForSequenceClassification, cfg, seed=num_labels)
    with torch.no_grad():  # a classifier whose scores differ visibly between sequences
        hf.classifier.weight.mul_(20)
        hf.pooler.dense.weight.mul_(5)
    ours = _ours(hf, labels=True)
    assert ours.labels == ClassifierLabels(tuple(id2label.values()), False)
    lengths = [3, 40, 300]
    seqs, ids, cu = _packed(lengths, cfg.vocab_size, seed=num_labels)
    logits = ours.classify(ours.forward(ids, cu), cu)
    assert logits.dtype == torch.float32 and logits.shape == (len(seqs), num_labels)
    with torch.no_grad():
        ref = torch.cat([hf(input_ids=torch.tensor([s])).logits for s in seqs])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
    assert ref.std() > 0.05


def test_v2_style_embeddings_and_unbucketed_positions_match_hf():
    """The other embedding options (absolute positions, two token types with a pair's segment
    ids, an `embedding_size` projection) and relative positions without buckets (a 32-distance
    span that the sequences run past), at a small width."""
    cfg = hf_config({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96, "embedding_size": 48,
                     "position_biased_input": True, "type_vocab_size": 2, "position_buckets": -1,
                     "max_relative_positions": 32, "hidden_act": "gelu_new"})
    hf = _hf_model(transformers.DebertaV2Model, cfg, seed=4)
    ours = _ours(hf)
    assert ours.config.att_span == 32 and ours.embed_proj is not None
    lengths = [2, 33, 90]
    seqs, ids, cu = _packed(lengths, cfg.vocab_size, seed=4)
    types = [torch.tensor([0] * (n // 2) + [1] * (n - n // 2)) for n in lengths]
    hidden = ours.forward(ids, cu, token_type_ids=torch.cat(types))
    single = ours.forward(ids, cu)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            got, alone = hidden[cu[i] : cu[i + 1]], single[cu[i] : cu[i + 1]]
            ref = hf(input_ids=torch.tensor([s]), token_type_ids=types[i][None]).last_hidden_state[0]
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(alone, hf(input_ids=torch.tensor([s])).last_hidden_state[0],
                                       atol=1e-4, rtol=1e-4)


def test_mean_pooled_embedding_matches_hf():
    """The embedder's pooling (sentence-transformers' mean over tokens) on our packed states."""
    hf = _hf_model(transformers.DebertaV2Model, hf_config({"hidden_size": 64, "num_attention_heads": 4,
                                                           "intermediate_size": 96}), seed=5)
    ours = _ours(hf)
    seqs, ids, cu = _packed([4, 150, 280], hf.config.vocab_size, seed=5)
    pooled = pool_sequences(ours.forward(ids, cu), cu, "mean", True)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = torch.nn.functional.normalize(hf(input_ids=torch.tensor([s])).last_hidden_state[0].mean(0), dim=0)
            torch.testing.assert_close(pooled[i], ref, atol=1e-5, rtol=1e-4)


def test_relative_columns_are_hf_buckets():
    """The kernel's column table against Hugging Face's own bucket function and its c2p / p2c
    index rules (clamp(bucket(i - j) + span) and clamp(span - bucket(j - i))), for every pair of
    a 700-token sequence."""
    from transformers.models.deberta_v2 import modeling_deberta_v2 as hf_mod

    config = DebertaV2Config.from_hf(DEBERTA_V3_BASE)
    table = relative_column_table(config).long()
    reach, span, n = (table.shape[0] - 1) // 2, config.att_span, 700
    pos = torch.arange(n)
    dist = pos[:, None] - pos[None, :]
    ours = table[dist.clamp(-reach, reach) + reach]
    rel = hf_mod.make_log_bucket_position(dist, 256, 512).long()
    assert torch.equal(ours, (rel + span).clamp(0, 2 * span - 1))  # c2p[i, j]
    assert torch.equal(ours, (span - rel.t()).clamp(0, 2 * span - 1))  # p2c, read at key j for query i
    assert torch.equal(log_bucket(dist, 256, 512), hf_mod.make_log_bucket_position(dist, 256, 512))
    assert table.min() == 0 and table.max() == 2 * span - 1


def test_arena_forward_equals_plain_forward():
    hf = _hf_model(transformers.DebertaV2Model, hf_config({"hidden_size": 64, "num_attention_heads": 4,
                                                           "intermediate_size": 96}), seed=8)
    ours = _ours(hf)
    lengths = [5, 40, 3]
    _, ids, cu = _packed(lengths, hf.config.vocab_size, seed=8)
    arena = ActivationArena(CPU)
    plain = ours.forward(ids, cu, max(lengths))
    for _ in range(2):  # the second forward reuses the plan
        torch.testing.assert_close(ours.forward(ids, cu, max(lengths), arena=arena), plain, atol=0, rtol=0)
    assert {"qkv", "c2p", "p2c", "ctx", "hidden"} <= {r.name for r in ours.usage_records(10)}


def test_padded_graph_buckets_equal_the_plain_forward():
    """The CUDA graphs' padded static shapes (a padding sequence over the bucket's spare slots,
    max_seqlen the bucket's size), run eagerly on the CPU: the real tokens' rows are unchanged."""
    from tritonformer.backend.cuda_graphs import EncoderGraphs

    hf = _hf_model(transformers.DebertaV2Model, hf_config({"hidden_size": 64, "num_attention_heads": 4,
                                                           "intermediate_size": 96}), seed=12)
    ours = _ours(hf)
    lengths = [5, 40, 3]
    _, ids, cu = _packed(lengths, hf.config.vocab_size, seed=12)
    graphs = EncoderGraphs(ours, token_buckets=(64, 128), sequence_buckets=(4, 8), capture=False)
    torch.testing.assert_close(graphs.forward(ids, lengths), ours.forward(ids, cu), atol=1e-5, rtol=1e-5)


def test_classifier_engine_from_a_checkpoint_folder(tmp_path, minilm_dir):
    """The served path: a DebertaV2ForSequenceClassification folder (safetensors under `deberta.`,
    config.json naming the head) built by EncoderSpec into the classifier engine, whose logits for
    tokenized texts equal HF's. (The tokenizer is MiniLM's: any one does for random weights.)"""
    import json
    import shutil

    from safetensors.torch import save_file

    from tritonformer.backend.encoder.build import EncoderSpec
    from tritonformer.backend.tokenization import TextTokenizer

    cfg = hf_config({"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 48, "vocab_size": 30522},
                    num_labels=3, id2label={0: "entailment", 1: "neutral", 2: "contradiction"})
    hf = _hf_model(transformers.DebertaV2ForSequenceClassification, cfg, seed=13)
    hf.config.architectures = ["DebertaV2ForSequenceClassification"]
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (minilm_dir / name).is_file():
            shutil.copy(minilm_dir / name, tmp_path / name)
    engine, _, info = EncoderSpec("classifier", str(tmp_path), "cpu", "float32", warm_up=False).build(None)
    assert info.labels.names == ("entailment", "neutral", "contradiction") and not info.token_types
    texts = ["A man is playing a guitar.", "short", "A very long sentence about relative positions, " * 20]
    ids = TextTokenizer(tmp_path).encode_batch(texts)
    rows = engine.embed(ids)
    with torch.no_grad():
        ref = torch.cat([hf(input_ids=torch.tensor([s])).logits for s in ids])
    torch.testing.assert_close(torch.from_numpy(rows), ref, atol=1e-4, rtol=1e-4)


def test_published_config_and_family_table():
    cfg = DebertaV2Config.from_hf(DEBERTA_V3_BASE)
    assert (cfg.att_span, cfg.max_relative_positions, cfg.head_dim, cfg.embedding_size) == (256, 512, 64, 768)
    assert not cfg.position_biased_input and cfg.type_vocab_size == 0
    assert cfg.max_tokens_per_sequence == 512 and cfg.position_offset == 0
    assert DebertaV2Config.from_hf(dict(DEBERTA_V3_BASE, pos_att_type=["c2p", "p2c"])) == cfg
    assert ENCODER_FAMILIES["deberta-v2"] == "deberta_v2"
    assert "deberta" not in ENCODER_FAMILIES


@pytest.mark.parametrize("override,match", [
    ({"share_att_key": False}, "share_att_key"),
    ({"pos_att_type": "p2c|c2p|p2p"}, "pos_att_type"),
    ({"pos_att_type": "c2p"}, "pos_att_type"),
    ({"conv_kernel_size": 3}, "conv_kernel_size"),
    ({"relative_attention": False}, "relative_attention"),
    ({"norm_rel_ebd": "none"}, "norm_rel_ebd"),
    ({"attention_head_size": 32}, "attention_head_size"),
    ({"pooler_hidden_size": 1024}, "pooler_hidden_size"),
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"model_type": "deberta"}, "model_type"),
])
def test_refuses_what_it_cannot_run(override, match):
    with pytest.raises(ValueError, match=match):
        DebertaV2Config.from_hf(dict(DEBERTA_V3_BASE, **override))
    if override.get("model_type") == "deberta":  # v1 has no family entry
        with pytest.raises(ValueError, match="unsupported encoder model_type 'deberta'"):
            load_encoder(dict(DEBERTA_V3_BASE, **override), {}, CPU, torch.float32)


def test_refuses_token_types_and_missing_head():
    hf = _hf_model(transformers.DebertaV2Model, hf_config({"hidden_size": 64, "num_attention_heads": 4,
                                                           "intermediate_size": 96}), seed=9)
    ours = _ours(hf)
    _, ids, cu = _packed([4], hf.config.vocab_size)
    with pytest.raises(ValueError, match="token types"):
        ours.forward(ids, cu, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(ValueError, match="classification head"):
        ours.classify(ours.forward(ids, cu), cu)


def test_triton_kernel_in_the_model(monkeypatch):
    """The GPU path's attention kernel inside the model, in Triton's CPU interpreter, at a small
    width with 8 buckets over 16 relative positions (sequences past both)."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1) or a GPU")
    pytest.importorskip("triton")
    from tritonformer import kernels
    from tritonformer.kernels import triton_disentangled_attention

    cfg = hf_config({"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 48, "position_buckets": 8,
                     "max_relative_positions": 16})
    hf = _hf_model(transformers.DebertaV2Model, cfg, seed=11)
    ours = _ours(hf)
    seqs, ids, cu = _packed([5, 40], cfg.vocab_size, seed=11)
    expected = ours.forward(ids, cu)
    monkeypatch.setattr(kernels, "disentangled_attention", triton_disentangled_attention.disentangled_attention)
    got = ours.forward(ids, cu)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([seqs[1]])).last_hidden_state[0]
    torch.testing.assert_close(got[5:], ref, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- GPU: full size, fp16

def _full_size(cls, published=DEBERTA_V3_BASE, **head):
    cfg = {k: v for k, v in published.items() if k not in ("model_type", "architectures")}
    cfg.update(head)
    torch.manual_seed(0)
    return _hf_model(cls, transformers.DebertaV2Config(**cfg), seed=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_full_size_fp16_matches_hf():
    """deberta-v3-base at full size in fp16 on our Triton kernels against HF in fp32: cosine
    >= 0.999 per token, packed lengths from 1 to past the 512 relative positions; (64, 512) runs,
    every row finite."""
    cuda = torch.device("cuda")
    hf = _full_size(transformers.DebertaV2Model).to(cuda)
    ours = DebertaV2Encoder(DebertaV2Config.from_hf(hf.config.to_dict()), dict(hf.state_dict()), cuda,
                            torch.float16)
    lengths = [1, 7, 64, 129, 300, 512, 700]
    seqs, ids, cu = _packed(lengths, hf.config.vocab_size, seed=10)
    ids, cu = ids.to(cuda), cu.to(cuda)
    hidden = ours.forward(ids, cu, max(lengths))
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            ref = hf(input_ids=torch.tensor([s], device=cuda)).last_hidden_state[0]
            assert _cos_min(hidden[cu[i] : cu[i + 1]], ref) >= 0.999, len(s)
    _, ids, cu = _packed([512] * 64, hf.config.vocab_size, seed=11)
    long = ours.forward(ids.to(cuda), cu.to(cuda), 512)
    assert long.shape == (64 * 512, 768) and torch.isfinite(long).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_large_fp16_matches_hf():
    """deberta-v3-large's shape (24 layers, 16 heads of 64) in fp16 against HF in fp32."""
    cuda = torch.device("cuda")
    hf = _full_size(transformers.DebertaV2Model, DEBERTA_V3_LARGE).to(cuda)
    ours = DebertaV2Encoder(DebertaV2Config.from_hf(hf.config.to_dict()), dict(hf.state_dict()), cuda,
                            torch.float16)
    lengths = [9, 260, 513]
    seqs, ids, cu = _packed(lengths, hf.config.vocab_size, seed=14)
    hidden = ours.forward(ids.to(cuda), cu.to(cuda), max(lengths))
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            ref = hf(input_ids=torch.tensor([s], device=cuda)).last_hidden_state[0]
            assert _cos_min(hidden[cu[i] : cu[i + 1]], ref) >= 0.999, len(s)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_classifier_fp16_matches_hf_fp32():
    """An NLI head (three labels) on the full-size encoder: our fp16 probabilities within 1e-2 of
    HF's fp32."""
    cuda = torch.device("cuda")
    hf = _full_size(transformers.DebertaV2ForSequenceClassification, num_labels=3).to(cuda)
    ours = DebertaV2Encoder(DebertaV2Config.from_hf(hf.config.to_dict()), dict(hf.state_dict()), cuda,
                            torch.float16, ClassifierLabels(("a", "b", "c"), False))
    lengths = [12, 200, 511, 40]
    seqs, ids, cu = _packed(lengths, hf.config.vocab_size, seed=12)
    ids, cu = ids.to(cuda), cu.to(cuda)
    logits = ours.classify(ours.forward(ids, cu, max(lengths)), cu)
    with torch.inference_mode():
        ref = torch.cat([hf(input_ids=torch.tensor([s], device=cuda)).logits for s in seqs])
    torch.testing.assert_close(logits.softmax(-1), ref.softmax(-1), atol=1e-2, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_graph_replay_and_reference_path_equal_eager(monkeypatch):
    """A 4-layer deberta-v3-base in fp16: a CUDA-graph replay equals the eager forward, and the
    Triton path agrees with the PyTorch reference path."""
    from tritonformer.backend.cuda_graphs import EncoderGraphs

    cuda = torch.device("cuda")
    hf = _hf_model(transformers.DebertaV2Model, transformers.DebertaV2Config(
        **{k: v for k, v in DEBERTA_V3_BASE.items() if k not in ("model_type", "architectures")}
        | {"num_hidden_layers": 4}), seed=2)
    ours = DebertaV2Encoder(DebertaV2Config.from_hf(hf.config.to_dict()), dict(hf.state_dict()), cuda,
                            torch.float16)
    lengths = [5, 300, 31]
    _, ids, cu = _packed(lengths, hf.config.vocab_size, seed=13)
    ids, cu = ids.to(cuda), cu.to(cuda)
    eager = ours.forward(ids, cu, max(lengths)).clone()
    graphs = EncoderGraphs(ours)
    assert graphs.bucket(sum(lengths), len(lengths)) is not None
    replayed = graphs.forward(ids, lengths).clone()
    assert _cos_min(replayed, eager) >= 0.9999
    monkeypatch.setenv("TRITONFORMER_KERNELS", "reference")
    slow = ours.forward(ids, cu, max(lengths))
    assert _cos_min(eager, slow) >= 0.9995
