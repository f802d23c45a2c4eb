"""DistilBERT, ELECTRA and MPNet (backend/models/bert.py's LAYOUTS) against Hugging Face
transformers on the same random weights: the last hidden state per token, the embedder's pooled
vector, and the classifier's logits, in fp32 on the CPU; each family's published config (in
client/bench_runtime.py, beside the other encoders' published shapes) shrunk to 2 layers and a
small width. HF runs each sequence alone (no padding); ours runs them packed. Weights are drawn larger than HF's init
(std 0.2, not 0.02) so that attention is far from uniform and logits are of order one: a wrong
position, bias or head shows at a 1e-4 / 1e-3 tolerance. The GPU group checks the published
widths in fp16 (`pytest -m gpu tests/test_encoder_families_vs_hf.py`)."""
from __future__ import annotations

import pytest
import torch

from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.backend.encoder.activation_arena import ActivationArena
from tritonformer.backend.models.bert import BertConfig, BertEncoder, relative_bias_by_distance, relative_bucket
from tritonformer.backend.models.encoder import ENCODER_FAMILIES, ClassifierLabels, load_encoder
from tritonformer.client.bench_runtime import DISTILBERT_BASE, ELECTRA_BASE_DISCRIMINATOR, MPNET_BASE
from tritonformer.kernels import pool_sequences

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")
SHRUNK = {"vocab_size": 300, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
          "num_hidden_layers": 2}
DISTIL_SHRUNK = {"vocab_size": 300, "dim": 64, "n_heads": 4, "hidden_dim": 96, "n_layers": 2}
# family -> (published config, HF config class, bare model class, classification class, shrunk sizes)
FAMILIES = {
    "distilbert": (DISTILBERT_BASE, "DistilBertConfig", "DistilBertModel", "DistilBertForSequenceClassification",
                   DISTIL_SHRUNK),
    "electra": (ELECTRA_BASE_DISCRIMINATOR, "ElectraConfig", "ElectraModel", "ElectraForSequenceClassification",
                dict(SHRUNK, embedding_size=32)),  # narrower embeddings, as electra-small's
    "mpnet": (MPNET_BASE, "MPNetConfig", "MPNetModel", "MPNetForSequenceClassification", SHRUNK),
}
LENGTHS = [1, 5, 40, 150]  # past MPNet's exact buckets (8) and its log-spaced ones (128)


def hf_config(family: str, **overrides):
    published, config_class, _, _, shrunk = FAMILIES[family]
    published = {k: v for k, v in published.items() if k != "model_type"}
    return getattr(transformers, config_class)(**{**published, **shrunk, **overrides})


def hf_model(family: str, head: bool = False, seed: int = 0, **overrides):
    _, _, bare, classifier, _ = FAMILIES[family]
    cfg = hf_config(family, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, classifier if head else bare)._from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                p.copy_((1 if name.endswith("weight") else 0) + 0.2 * torch.randn_like(p))
            elif "position_embeddings" not in name or not getattr(cfg, "sinusoidal_pos_embds", False):
                p.normal_(0.0, 0.2)
    return model.eval()


def ours_of(hf, **config_overrides) -> BertEncoder:
    cfg = dict(hf.config.to_dict(), **config_overrides)
    return load_encoder(cfg, strip_prefixes_of(dict(hf.state_dict())), CPU, torch.float32)


def packed(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    ids = torch.tensor([t for s in seqs for t in s])
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return seqs, ids, cu


def check_hidden_and_pooled(hf, ours, lengths=LENGTHS, seed=1):
    seqs, ids, cu = packed(lengths, hf.config.vocab_size, seed)
    hidden = ours.forward(ids, cu)
    pooled = pool_sequences(hidden, cu, "mean", True)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = hf(input_ids=torch.tensor([s])).last_hidden_state[0]
            torch.testing.assert_close(hidden[cu[i] : cu[i + 1]], ref, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(pooled[i], torch.nn.functional.normalize(ref.mean(0), dim=0),
                                       atol=1e-5, rtol=1e-4)
    return hidden


def check_logits(hf, ours, lengths=LENGTHS, seed=2):
    seqs, ids, cu = packed(lengths, hf.config.vocab_size, seed)
    logits = ours.classify(ours.forward(ids, cu), cu)
    with torch.no_grad():
        ref = torch.cat([hf(input_ids=torch.tensor([s])).logits for s in seqs])
    assert logits.dtype == torch.float32 and logits.shape == ref.shape
    torch.testing.assert_close(logits, ref, atol=1e-3, rtol=1e-3)
    assert ref.std() > 0.05  # the scores differ between sequences: the comparison means something


# ---------------------------------------------------------------- DistilBERT

@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_distilbert_hidden_and_pooled_match_hf(activation):
    hf = hf_model("distilbert", activation=activation)
    ours = ours_of(hf)
    assert ours.config.position_offset == 0 and ours.config.type_vocab_size == 1 and ours.type_emb0 is None
    check_hidden_and_pooled(hf, ours)


def test_distilbert_sinusoidal_positions_match_hf():
    """sinusoidal_pos_embds: a checkpoint without the position table gets the fixed one."""
    hf = hf_model("distilbert", seed=3, sinusoidal_pos_embds=True)
    state = {k: v for k, v in strip_prefixes_of(dict(hf.state_dict())).items() if "position_embeddings" not in k}
    ours = load_encoder(hf.config.to_dict(), state, CPU, torch.float32)
    torch.testing.assert_close(ours.pos_emb, hf.embeddings.position_embeddings.weight, atol=1e-6, rtol=0)
    check_hidden_and_pooled(hf, ours, [7, 60])


@pytest.mark.parametrize("num_labels", [2, 5])
def test_distilbert_classifier_logits_match_hf(num_labels):
    """distilbert-base-uncased-finetuned-sst-2-english's head (pre_classifier + ReLU + classifier)."""
    id2label = {i: f"label_{i}" for i in range(num_labels)}
    hf = hf_model("distilbert", head=True, seed=num_labels, num_labels=num_labels, id2label=id2label,
                  architectures=["DistilBertForSequenceClassification"])
    ours = ours_of(hf)
    assert ours.labels == ClassifierLabels(tuple(id2label.values()), False)
    check_logits(hf, ours)


def test_bare_distilbert_checkpoint_names_load():
    """A bare DistilBertModel's tensors start `transformer.`, which the loader strips."""
    hf = hf_model("distilbert", seed=4)
    state = strip_prefixes_of(dict(hf.state_dict()))
    assert "layer.0.attention.q_lin.weight" in state
    check_hidden_and_pooled(hf, load_encoder(hf.config.to_dict(), state, CPU, torch.float32), [9])


# ---------------------------------------------------------------- ELECTRA

@pytest.mark.parametrize("embedding_size", [32, 64])
def test_electra_hidden_and_pooled_match_hf(embedding_size):
    """Embeddings narrower than the layers (electra-small's 128 under 256) are projected;
    as wide (electra-base's) they are not."""
    hf = hf_model("electra", seed=embedding_size, embedding_size=embedding_size)
    ours = ours_of(hf)
    assert (ours.emb_proj is None) == (embedding_size == 64)
    check_hidden_and_pooled(hf, ours)


@pytest.mark.parametrize("embedding_size", [32, 64])
def test_electra_cross_encoder_scores_pairs_as_hf(embedding_size):
    """cross-encoder/ms-marco-electra-base's head (dense + GELU + out_proj, one label) over
    (query, text) pairs with segment ids, as the reranker sends them."""
    hf = hf_model("electra", head=True, seed=5, embedding_size=embedding_size, num_labels=1,
                  architectures=["ElectraForSequenceClassification"])
    ours = ours_of(hf)
    assert ours.labels.num_labels == 1 and ours.pos_type_emb is not None
    seqs, ids, cu = packed([6, 33, 90], hf.config.vocab_size, seed=6)
    types = [[0] * (len(s) // 3) + [1] * (len(s) - len(s) // 3) for s in seqs]
    logits = ours.classify(ours.forward(ids, cu, token_type_ids=torch.tensor([t for ts in types for t in ts])), cu)
    with torch.no_grad():
        ref = torch.cat([hf(input_ids=torch.tensor([s]), token_type_ids=torch.tensor([t])).logits
                         for s, t in zip(seqs, types)])
    torch.testing.assert_close(logits, ref, atol=1e-3, rtol=1e-3)
    assert (ours.classify(ours.forward(ids, cu), cu) - ref).abs().max() > 1e-3  # segment ids matter


def test_electra_classifier_logits_match_hf():
    id2label = {0: "negative", 1: "neutral", 2: "positive"}
    hf = hf_model("electra", head=True, seed=7, num_labels=3, id2label=id2label,
                  architectures=["ElectraForSequenceClassification"])
    check_logits(hf, ours_of(hf))


# ---------------------------------------------------------------- MPNet

def test_mpnet_buckets_equal_hf():
    """Our T5 buckets (by clamped distance) against HF's own function, distances past 128 too."""
    distance = torch.arange(-400, 401)
    ref = transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(distance[None, :])[0]
    assert torch.equal(relative_bucket(distance), ref)
    table = torch.randn(32, 3)
    by_distance = relative_bias_by_distance(table, 32, 128)
    assert by_distance.shape == (3, 257)
    torch.testing.assert_close(by_distance[:, distance.clamp(-128, 128) + 128], table[ref].t())


def test_mpnet_hidden_and_pooled_match_hf():
    """all-mpnet-base-v2's embedding: mean-pooled, normalised; sequences past 128 tokens read the
    last buckets, and positions start at 2."""
    hf = hf_model("mpnet", seed=8)
    ours = ours_of(hf)
    assert ours.config.position_offset == 2 and ours.config.max_tokens_per_sequence == 512
    assert ours.relative_bias is not None and ours.type_emb0 is None
    check_hidden_and_pooled(hf, ours)


def test_mpnet_relative_bias_matters():
    """The check above would fail without the bias: zeroing the table moves every long sequence."""
    hf = hf_model("mpnet", seed=9)
    ours = ours_of(hf)
    _, ids, cu = packed([50], hf.config.vocab_size, seed=9)
    base = ours.forward(ids, cu)
    ours.relative_bias = torch.zeros_like(ours.relative_bias)
    assert (ours.forward(ids, cu) - base).abs().max() > 1e-2


@pytest.mark.parametrize("num_labels", [1, 3])
def test_mpnet_classifier_logits_match_hf(num_labels):
    """MPNetForSequenceClassification's head: dense + tanh + out_proj on <s>."""
    hf = hf_model("mpnet", head=True, seed=10 + num_labels, num_labels=num_labels,
                  architectures=["MPNetForSequenceClassification"])
    check_logits(hf, ours_of(hf))


def test_arena_and_graph_shapes_equal_plain_forward():
    """ELECTRA's projected embeddings and MPNet's biased attention write arena views too, and
    the CUDA graphs' padded static shapes (a padding sequence after the batch, run eagerly
    here) give the same rows."""
    from tritonformer.backend.cuda_graphs import EncoderGraphs

    for hf in (hf_model("electra", seed=12, embedding_size=32), hf_model("mpnet", seed=13)):
        ours = ours_of(hf)
        lengths = [1, 5, 40]
        _, ids, cu = packed(lengths, hf.config.vocab_size, seed=14)
        plain = ours.forward(ids, cu)
        arena = ActivationArena(CPU)
        for _ in range(2):
            torch.testing.assert_close(ours.forward(ids, cu, max(lengths), arena=arena), plain, atol=0, rtol=0)
        graphs = EncoderGraphs(ours, capture=False)
        torch.testing.assert_close(graphs.forward(ids, lengths), plain, atol=1e-5, rtol=1e-5)


def test_relative_bias_kernel_in_the_model(monkeypatch):
    """The GPU path's attention kernel inside MPNet, in Triton's CPU interpreter."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":  # (CPU tensors: the GPU group checks the kernel on CUDA)
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1)")
    from tritonformer import kernels
    from tritonformer.kernels import triton_relative_attention

    hf = hf_model("mpnet", seed=15)
    ours = ours_of(hf)
    seqs, ids, cu = packed([3, 40], hf.config.vocab_size, seed=15)
    monkeypatch.setattr(kernels, "relative_bias_attention", triton_relative_attention.relative_bias_attention)
    hidden = ours.forward(ids, cu)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = hf(input_ids=torch.tensor([s])).last_hidden_state[0]
            torch.testing.assert_close(hidden[cu[i] : cu[i + 1]], ref, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- shared

@pytest.mark.parametrize("name", ["distilbert-base", "electra-base-discriminator"])
def test_benchmark_baseline_dispatches_sdpa_and_ours_matches_it(name):
    """`bench runtime --model distilbert-base` / `electra-base-discriminator`: the HF baseline
    (two layers, a small vocabulary, on the CPU) makes one SDPA call per layer, and ours built
    from its weights through the family table computes its hidden states."""
    from tritonformer.client import bench_runtime as bench

    hf, _ = bench.build_family_baseline(name, layers=2, overrides={"vocab_size": 2048})
    assert hf.config.num_hidden_layers == 2
    assert bench.verify_dispatch({"hf_sdpa": hf}, torch.randint(3, 2048, (2, 16)))["hf_sdpa"]["sdpa_calls"] == 2
    ours = bench.build_ours(name, hf, CPU, torch.float32)
    ids = torch.randint(3, 2048, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = hf(input_ids=ids).last_hidden_state
    hidden = ours.forward(ids.reshape(-1), torch.tensor([0, 40, 80], dtype=torch.int32), 40)
    assert bench._min_cosine(hidden, ref) >= 0.9999



def test_family_table_and_refusals():
    for family in FAMILIES:
        assert ENCODER_FAMILIES[family] == "bert"
    with pytest.raises(ValueError, match="unsupported hidden_act 'silu'"):
        BertConfig.from_hf(hf_config("distilbert", activation="silu").to_dict())
    with pytest.raises(ValueError, match="position embeddings"):
        BertConfig.from_hf(dict(hf_config("distilbert").to_dict(), position_embedding_type="relative_key"))
    with pytest.raises(ValueError, match="position embeddings"):
        BertConfig.from_hf(dict(hf_config("electra").to_dict(), position_embedding_type="relative_key_query"))
    with pytest.raises(ValueError, match="relative_attention_num_buckets 64 is not supported"):
        BertConfig.from_hf(dict(hf_config("mpnet").to_dict(), relative_attention_num_buckets=64))
    with pytest.raises(ValueError, match="token type"):
        ours = ours_of(hf_model("distilbert"))
        ids = torch.tensor([5, 6, 7])
        ours.forward(ids, torch.tensor([0, 3], dtype=torch.int32), token_type_ids=torch.ones_like(ids))


# ---------------------------------------------------------------- GPU: published widths, fp16

def _published(family: str, head: bool, **overrides):
    """HF at the family's published config in fp32 on the GPU (the reference) with HF's own
    init (initializer_range 0.05 with a head: logits of order one), MPNet's relative bias drawn
    at std 1 (HF's init leaves it near zero, where it would not matter); ours in fp16 from the
    same weights through the family table."""
    published, config_class, bare, classifier, _ = FAMILIES[family]
    values = {k: v for k, v in published.items() if k != "model_type"}
    if head:
        values.update(initializer_range=0.05, architectures=[classifier])
    cfg = getattr(transformers, config_class)(**{**values, **overrides})
    torch.manual_seed(20)
    hf = getattr(transformers, classifier if head else bare)._from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("relative_attention_bias.weight"):
                p.normal_(0.0, 1.0)
    hf = hf.to("cuda").eval()
    ours = load_encoder(hf.config.to_dict(), strip_prefixes_of(dict(hf.state_dict())), torch.device("cuda"),
                        torch.float16)
    return hf, ours


def _cos_min(a, b) -> float:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).min().item()


def _cuda_packed(lengths, vocab, seed):
    seqs, ids, cu = packed(lengths, vocab, seed)
    return seqs, ids.cuda(), cu.cuda()


GPU_LENGTHS = [1, 7, 130, 300, 512]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gpu_published_width_fp16_matches_hf(family):
    """distilbert-base, electra-base-discriminator, mpnet-base: our fp16 last hidden states
    (Triton kernels; MPNet's relative-bias attention kernel) at cosine >= 0.999 per token to HF
    fp32, packed lengths up to 512, the mean-pooled embeddings likewise; and a CUDA-graph replay
    equals the eager forward."""
    from tritonformer.backend.cuda_graphs import EncoderGraphs

    hf, ours = _published(family, head=False)
    seqs, ids, cu = _cuda_packed(GPU_LENGTHS, hf.config.vocab_size, seed=21)
    hidden = ours.forward(ids, cu, max(GPU_LENGTHS))
    pooled = pool_sequences(hidden, cu, "mean", True)
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            ref = hf(input_ids=torch.tensor([s], device="cuda")).last_hidden_state[0]
            assert _cos_min(hidden[cu[i] : cu[i + 1]], ref) >= 0.999, (family, len(s))
            assert _cos_min(pooled[i : i + 1], ref.mean(0, keepdim=True)) >= 0.999, (family, len(s))
    lengths = [5, 140, 31]
    _, ids, cu = _cuda_packed(lengths, hf.config.vocab_size, seed=22)
    eager = ours.forward(ids, cu, max(lengths)).clone()
    graphs = EncoderGraphs(ours)
    assert graphs.bucket(sum(lengths), len(lengths)) is not None
    assert _cos_min(graphs.forward(ids, lengths), eager) >= 0.9999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family,num_labels", [("distilbert", 2), ("electra", 1), ("mpnet", 3)])
def test_gpu_classifier_logits_fp16_match_hf(family, num_labels):
    """distilbert-base-uncased-finetuned-sst-2-english's head (2 labels), cross-encoder/
    ms-marco-electra-base's (1), an MPNet classifier's (3): fp16 logits within 1e-2 of HF fp32,
    the same argmax."""
    hf, ours = _published(family, head=True, num_labels=num_labels)
    seqs, ids, cu = _cuda_packed(GPU_LENGTHS, hf.config.vocab_size, seed=23)
    logits = ours.classify(ours.forward(ids, cu, max(GPU_LENGTHS)), cu).cpu()
    with torch.inference_mode():
        ref = torch.cat([hf(input_ids=torch.tensor([s], device="cuda")).logits for s in seqs]).float().cpu()
    torch.testing.assert_close(logits, ref, atol=1e-2, rtol=0)
    if num_labels > 1:
        assert logits.argmax(-1).tolist() == ref.argmax(-1).tolist()
