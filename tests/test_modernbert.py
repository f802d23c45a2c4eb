"""Our ModernBERT against Hugging Face transformers' ModernBertModel and
ModernBertForSequenceClassification on the same random weights.

The configs are the published ones (answerdotai/ModernBERT-base: 22 layers, hidden 768, 12
heads, intermediate 1152, a 128-token local window, a global layer every 3;
Alibaba-NLP/gte-reranker-modernbert-base: the same encoder with a one-logit head) shrunk for
the CPU: fewer and narrower layers, and mostly a narrower window so that short sequences cross
it. Hugging Face's attention implementation is named explicitly (eager and sdpa: its default
can be flash attention, which has padding rules of its own). Each HF reference runs one
sequence alone (no padding); ours runs them all packed together. The GPU group checks the full
size in fp16 and the (8, 8192) shape.
"""
from __future__ import annotations

import pytest
import torch

from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.backend.models.encoder import ENCODER_FAMILIES, ClassifierLabels, load_encoder
from tritonformer.backend.models.modernbert import GLOBAL, LOCAL, ModernBertConfig, ModernBertEncoder
from tritonformer.backend.encoder.activation_arena import ActivationArena
from tritonformer.kernels import pool_sequences

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "ModernBertModel"):
    pytest.skip("this transformers has no ModernBERT", allow_module_level=True)
CPU = torch.device("cpu")

# answerdotai/ModernBERT-base's config.json, as the Hub ships it (the keys that shape the model)
MODERNBERT_BASE = {
    "model_type": "modernbert", "architectures": ["ModernBertForMaskedLM"], "vocab_size": 50368,
    "hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12, "intermediate_size": 1152,
    "hidden_activation": "gelu", "max_position_embeddings": 8192, "norm_eps": 1e-05, "norm_bias": False,
    "global_attn_every_n_layers": 3, "local_attention": 128, "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False, "classifier_pooling": "mean",
    "classifier_activation": "gelu", "classifier_bias": False, "pad_token_id": 50283,
}
# shrunk for the CPU: 4 layers (global, local, local, global), hidden 64 in 4 heads of 16, a
# 16-token window (reach 8)
SHRUNK = {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
          "intermediate_size": 96, "max_position_embeddings": 512, "local_attention": 16, "pad_token_id": 0,
          "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}
# lengths around a 16-token window (reach 8): within it, at it, past it several times over
LENGTHS = [1, 5, 9, 17, 30, 70]


def hf_config(overrides: dict | None = None, attn: str = "eager", **head) -> "transformers.ModernBertConfig":
    cfg = {k: v for k, v in MODERNBERT_BASE.items() if k not in ("model_type", "architectures")}
    cfg.update(SHRUNK)
    cfg.update(overrides or {})
    cfg.update(head)
    return transformers.ModernBertConfig(**cfg, attn_implementation=attn)


def _hf_model(cls, cfg, seed):
    torch.manual_seed(seed)
    model = cls._from_config(cfg, attn_implementation=cfg._attn_implementation).eval()
    # HF's init leaves norms at 1: random ones test that we read them. Its small init (std
    # 0.02) makes attention nearly uniform, where positions (rotary, the window) hardly matter:
    # larger q/k weights give scores of order one.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "Wqkv" in name:
                p.mul_(10)
    return model


def _packed(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    ids = torch.tensor([t for s in seqs for t in s])
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return seqs, ids, cu


def _cos_min(a, b) -> float:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).min().item()


def _ours(hf_model, labels=None) -> ModernBertEncoder:
    state = strip_prefixes_of(dict(hf_model.state_dict()))
    cfg = hf_model.config.to_dict()
    if labels is not None:
        cfg["architectures"] = ["ModernBertForSequenceClassification"]
    return load_encoder(cfg, state, CPU, torch.float32)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("window", [16, 128])
def test_last_hidden_state_matches_hf(attn, window):
    """Packed sequences shorter and longer than the window; fp32, per token."""
    hf = _hf_model(transformers.ModernBertModel, hf_config({"local_attention": window}, attn), seed=window)
    assert hf.config.layer_types == [GLOBAL, LOCAL, LOCAL, GLOBAL]
    ours = _ours(hf)
    assert isinstance(ours, ModernBertEncoder) and ours.config.local_attention == window
    lengths = LENGTHS if window == 16 else [3, 65, 150, 300]
    seqs, ids, cu = _packed(lengths, hf.config.vocab_size, seed=window)
    hidden = ours.forward(ids, cu)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = hf(input_ids=torch.tensor([s])).last_hidden_state[0]
            got = hidden[cu[i] : cu[i + 1]]
            assert _cos_min(got, ref) >= 0.999, (len(s), _cos_min(got, ref))
            torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4)


def test_window_and_rotary_bases_matter():
    """The check above could pass with the window or the local base ignored if sequences were
    short: here each change alone moves the result of a sequence longer than the window."""
    hf = _hf_model(transformers.ModernBertModel, hf_config(), seed=3)
    ours = _ours(hf)
    seqs, ids, cu = _packed([40], hf.config.vocab_size, seed=4)
    base = ours.forward(ids, cu)
    no_window = ModernBertConfig.from_hf(dict(hf.config.to_dict(), local_attention=4096))
    same_base = ModernBertConfig.from_hf(dict(hf.config.to_dict(), rope_parameters=None, local_rope_theta=160000.0))
    state = strip_prefixes_of(dict(hf.state_dict()))
    for cfg in (no_window, same_base):
        other = ModernBertEncoder(cfg, state, CPU, torch.float32).forward(ids, cu)
        assert (other - base).abs().max() > 1e-3


def test_mean_pooled_embedding_matches_hf():
    """The embedder's pooling (sentence-transformers' mean over tokens) on our packed states."""
    hf = _hf_model(transformers.ModernBertModel, hf_config(), seed=5)
    ours = _ours(hf)
    seqs, ids, cu = _packed(LENGTHS, hf.config.vocab_size, seed=5)
    pooled = pool_sequences(ours.forward(ids, cu), cu, "mean", True)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = torch.nn.functional.normalize(hf(input_ids=torch.tensor([s])).last_hidden_state[0].mean(0), dim=0)
            assert _cos_min(pooled[i : i + 1], ref[None]) >= 0.999
            torch.testing.assert_close(pooled[i], ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pooling,num_labels,attn", [("mean", 1, "sdpa"), ("cls", 1, "eager"), ("cls", 3, "sdpa"),
                                                     ("mean", 3, "eager")])
def test_sequence_classification_logits_match_hf(pooling, num_labels, attn):
    """gte-reranker-modernbert-base's shape (one logit) and a three-label classifier, both
    poolings: logits within 1e-3 in fp32, the same argmax."""
    id2label = {i: f"label_{i}" for i in range(num_labels)}
    cfg = hf_config(attn=attn, classifier_pooling=pooling, num_labels=num_labels, id2label=id2label)
    hf = _hf_model(transformers.ModernBertForSequenceClassification, cfg, seed=num_labels)
    with torch.no_grad():  # a non-trivial head bias and classifier
        hf.classifier.bias.normal_()
        hf.classifier.weight.mul_(5)
    ours = _ours(hf, labels=True)
    assert ours.labels == ClassifierLabels(tuple(id2label.values()), False)
    seqs, ids, cu = _packed(LENGTHS, cfg.vocab_size, seed=7)
    logits = ours.classify(ours.forward(ids, cu), cu)
    assert logits.dtype == torch.float32 and logits.shape == (len(seqs), num_labels)
    with torch.no_grad():
        ref = torch.cat([hf(input_ids=torch.tensor([s])).logits for s in seqs])
    torch.testing.assert_close(logits, ref, atol=1e-3, rtol=1e-3)
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))
    assert ref.std() > 0.05  # the scores differ between sequences: the comparison means something


def test_triton_attention_and_rotary_kernels_in_the_model(monkeypatch):
    """The GPU path's two new kernels inside the model, in Triton's CPU interpreter: rotary in
    place on the QKV buffer's q and k heads, then the windowed attention reading strided views
    of it (a global and a local layer; sequences inside and past the 16-token window)."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1) or a GPU")
    pytest.importorskip("triton")
    from tritonformer import kernels
    from tritonformer.kernels import triton_attention, triton_rotary

    hf = _hf_model(transformers.ModernBertModel, hf_config({"num_hidden_layers": 2}), seed=11)
    ours = _ours(hf)
    seqs, ids, cu = _packed([5, 40], hf.config.vocab_size, seed=11)
    expected = ours.forward(ids, cu)
    monkeypatch.setattr(kernels, "varlen_attention", triton_attention.varlen_attention)
    monkeypatch.setattr(kernels, "rotary_in_place", triton_rotary.rotary_in_place)
    got = ours.forward(ids, cu)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([seqs[1]])).last_hidden_state[0]
    assert _cos_min(got[5:], ref) >= 0.999


def test_arena_forward_equals_plain_forward():
    hf = _hf_model(transformers.ModernBertModel, hf_config(), seed=8)
    ours = _ours(hf)
    _, ids, cu = _packed(LENGTHS, hf.config.vocab_size, seed=8)
    arena = ActivationArena(CPU)
    plain = ours.forward(ids, cu, max(LENGTHS))
    for _ in range(2):  # the second forward reuses the plan
        torch.testing.assert_close(ours.forward(ids, cu, max(LENGTHS), arena=arena), plain, atol=0, rtol=0)
    records = {r.name for r in ours.usage_records(10)}
    assert {"qkv", "ctx", "residual_a", "residual_b", "attn_in"} <= records


def test_hub_config_and_transformers_config_agree():
    """config.json as the Hub ships it (`global_attn_every_n_layers`, the two thetas) and as
    transformers writes it (`layer_types`, `rope_parameters`) give one config."""
    hub = ModernBertConfig.from_hf(MODERNBERT_BASE)
    written = ModernBertConfig.from_hf(transformers.ModernBertConfig(
        **{k: v for k, v in MODERNBERT_BASE.items() if k not in ("model_type", "architectures")}).to_dict())
    assert hub == written
    assert hub.layer_types[:4] == (GLOBAL, LOCAL, LOCAL, GLOBAL) and hub.layer_types.count(GLOBAL) == 8
    assert (hub.global_rope_theta, hub.local_rope_theta, hub.local_attention) == (160000.0, 10000.0, 128)
    assert hub.max_tokens_per_sequence == 8192 and hub.position_offset == 0
    assert ENCODER_FAMILIES["modernbert"] == "modernbert"


def test_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="rope_type"):
        ModernBertConfig.from_hf(dict(MODERNBERT_BASE, rope_parameters={GLOBAL: {"rope_type": "yarn", "factor": 2.0}}))
    with pytest.raises(ValueError, match="hidden_activation"):
        ModernBertConfig.from_hf(dict(MODERNBERT_BASE, hidden_activation="relu6"))
    hf = _hf_model(transformers.ModernBertModel, hf_config(), seed=9)
    ours = _ours(hf)
    _, ids, cu = _packed([4], hf.config.vocab_size)
    with pytest.raises(ValueError, match="token types"):
        ours.forward(ids, cu, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(ValueError, match="classification head"):
        ours.classify(ours.forward(ids, cu), cu)


# ---------------------------------------------------------------- GPU: full size, fp16

def _full_size(cls, **head):
    cfg = {k: v for k, v in MODERNBERT_BASE.items() if k not in ("model_type", "architectures")}
    cfg.update(head)
    hf_cfg = transformers.ModernBertConfig(**cfg, attn_implementation="sdpa")
    torch.manual_seed(0)
    return cls._from_config(hf_cfg, attn_implementation="sdpa").eval()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_full_size_fp16_matches_hf_sdpa():
    """ModernBERT-base at full size in fp16 on our Triton kernels against HF SDPA (in fp32: HF
    cast to fp16 with `.to` rounds its rotary inv_freq buffers too, which moves far positions):
    the BERT GPU tests' cosine >= 0.999 per token, packed lengths from 1 to past 8 windows; and
    (8, 8192) runs, every row finite."""
    cuda = torch.device("cuda")
    hf = _full_size(transformers.ModernBertModel).to(cuda)
    ours = ModernBertEncoder(ModernBertConfig.from_hf(hf.config.to_dict()),
                             strip_prefixes_of(dict(hf.state_dict())), cuda, torch.float16)
    lengths = [1, 7, 64, 129, 300, 512, 1100]
    seqs, ids, cu = _packed(lengths, hf.config.vocab_size, seed=10)
    ids, cu = ids.to(cuda), cu.to(cuda)
    hidden = ours.forward(ids, cu, max(lengths))
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            ref = hf(input_ids=torch.tensor([s], device=cuda)).last_hidden_state[0]
            assert _cos_min(hidden[cu[i] : cu[i + 1]], ref) >= 0.999, len(s)
    _, ids, cu = _packed([8192] * 8, hf.config.vocab_size, seed=11)
    long = ours.forward(ids.to(cuda), cu.to(cuda), 8192)
    assert long.shape == (8 * 8192, 768) and torch.isfinite(long).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_reranker_scores_fp16_match_hf_fp32():
    """gte-reranker-modernbert-base's shape: our fp16 one-logit scores within 1e-2 of HF's fp32."""
    cuda = torch.device("cuda")
    hf = _full_size(transformers.ModernBertForSequenceClassification, num_labels=1,
                    classifier_pooling="mean").to(cuda)
    ours = ModernBertEncoder(ModernBertConfig.from_hf(hf.config.to_dict()), strip_prefixes_of(dict(hf.state_dict())),
                             cuda, torch.float16, ClassifierLabels(("LABEL_0",), False))
    lengths = [12, 200, 700, 40]
    seqs, ids, cu = _packed(lengths, hf.config.vocab_size, seed=12)
    ids, cu = ids.to(cuda), cu.to(cuda)
    logits = ours.classify(ours.forward(ids, cu, max(lengths)), cu)
    with torch.inference_mode():
        ref = torch.cat([hf(input_ids=torch.tensor([s], device=cuda)).logits for s in seqs])
    torch.testing.assert_close(torch.sigmoid(logits), torch.sigmoid(ref), atol=1e-2, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_graph_replay_and_reference_path_equal_eager(monkeypatch):
    """A 4-layer ModernBERT-base in fp16: a CUDA-graph replay (its padding sequence at position
    0) equals the eager forward, and the Triton path agrees with the PyTorch reference path."""
    from tritonformer.backend.cuda_graphs import EncoderGraphs

    cuda = torch.device("cuda")
    cfg = dict(MODERNBERT_BASE, num_hidden_layers=4)
    hf_cfg = transformers.ModernBertConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(2)
    hf = transformers.ModernBertModel._from_config(hf_cfg, attn_implementation="eager").eval()
    ours = ModernBertEncoder(ModernBertConfig.from_hf(hf.config.to_dict()), strip_prefixes_of(dict(hf.state_dict())),
                             cuda, torch.float16)
    lengths = [5, 140, 31]
    _, ids, cu = _packed(lengths, hf_cfg.vocab_size, seed=13)
    ids, cu = ids.to(cuda), cu.to(cuda)
    eager = ours.forward(ids, cu, max(lengths)).clone()
    graphs = EncoderGraphs(ours)
    assert graphs.bucket(sum(lengths), len(lengths)) is not None
    replayed = graphs.forward(ids, lengths).clone()
    assert _cos_min(replayed, eager) >= 0.9999
    monkeypatch.setenv("TRITONFORMER_KERNELS", "reference")
    slow = ours.forward(ids, cu, max(lengths))
    assert _cos_min(eager, slow) >= 0.9995
