"""The reranker and classifier heads on the GPU at full size in fp16 (Triton kernels, CUDA graphs)
against Hugging Face transformers in fp32 on the same random weights: scores within 1e-2 and the
same argmax labels; bge-reranker-v2-m3's shape at 8,192 tokens. Run on the GPU machine:
`pytest -m gpu tests/test_encoder_heads_gpu.py`."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.backend.encoder.engine import EncoderEngine
from tritonformer.backend.models.encoder import load_encoder
from tritonformer.scheduler.fifo import FifoBatchPolicy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
transformers = pytest.importorskip("transformers")
CUDA = torch.device("cuda")


def _full_size(hf_class, config_class, seed, **values):
    """HF in fp32 on the GPU (the reference) and ours in fp16 from the same weights; logits of
    order 1 (initializer_range 0.05), so that 1e-2 separates right from wrong."""
    torch.manual_seed(seed)
    hf = hf_class(config_class(initializer_range=0.05, **values)).to(CUDA).eval()
    ours = load_encoder(hf.config.to_dict(), strip_prefixes_of(hf.state_dict()), CUDA, torch.float16)
    return hf, ours


def _hf_logits(hf, seqs, types=None):
    with torch.no_grad():
        return torch.cat([hf(torch.tensor([s], device=CUDA),
                             token_type_ids=None if types is None else torch.tensor([types[i]], device=CUDA)).logits
                          for i, s in enumerate(seqs)]).float().cpu()


def test_ms_marco_minilm_shape_pairs_through_cuda_graphs_match_hf():
    """Pairs with segment ids through the engine (small batches replay CUDA graphs that carry
    the segment ids; a large one runs eagerly)."""
    hf, ours = _full_size(transformers.BertForSequenceClassification, transformers.BertConfig, 0,
                          hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                          num_labels=1, architectures=["BertForSequenceClassification"])

    class NoSink:
        def send(self, *a, **k): ...
        def is_cancelled(self, handle): return False

    engine = EncoderEngine(ours, NoSink(), FifoBatchPolicy(), head=ours.classify, token_types=True)
    assert engine.graphs is not None
    gen = torch.Generator().manual_seed(1)
    for lengths in ((9, 40, 3), (300, 500, 200, 100, 480)):
        seqs, types = [], []
        for n in lengths:
            q = max(2, n // 4)
            seqs.append([101] + torch.randint(1000, 30000, (n - 2,), generator=gen).tolist() + [102])
            types.append([0] * q + [1] * (n - q))
        logits = engine.embed(seqs, types)
        ref = _hf_logits(hf, seqs, types)
        np.testing.assert_allclose(logits, ref.numpy(), atol=1e-2)
    assert engine.graphs.replays >= 1


def test_bge_reranker_v2_m3_shape_at_8192_tokens_matches_hf():
    hf, ours = _full_size(transformers.XLMRobertaForSequenceClassification, transformers.XLMRobertaConfig, 2,
                          vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                          intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1,
                          layer_norm_eps=1e-5, pad_token_id=1, num_labels=1,
                          architectures=["XLMRobertaForSequenceClassification"])
    gen = torch.Generator().manual_seed(3)
    seqs = [[0] + torch.randint(3, 250000, (n - 2,), generator=gen).tolist() + [2] for n in (8192, 37, 1000)]
    ids = torch.tensor([t for s in seqs for t in s], device=CUDA)
    cu = torch.tensor([0, *np.cumsum([len(s) for s in seqs]).tolist()], dtype=torch.int32, device=CUDA)
    logits = ours.classify(ours.forward(ids, cu, max(len(s) for s in seqs)), cu).cpu()
    np.testing.assert_allclose(logits.numpy(), _hf_logits(hf, seqs).numpy(), atol=1e-2)


def test_classifier_labels_match_hf_at_bert_base_size():
    id2label = {i: f"intent_{i}" for i in range(7)}
    hf, ours = _full_size(transformers.BertForSequenceClassification, transformers.BertConfig, 4,
                          num_labels=7, id2label=id2label, label2id={v: k for k, v in id2label.items()},
                          architectures=["BertForSequenceClassification"])
    gen = torch.Generator().manual_seed(5)
    seqs = [[101] + torch.randint(1000, 30000, (n,), generator=gen).tolist() + [102] for n in (5, 60, 250, 510)]
    ids = torch.tensor([t for s in seqs for t in s], device=CUDA)
    cu = torch.tensor([0, *np.cumsum([len(s) for s in seqs]).tolist()], dtype=torch.int32, device=CUDA)
    logits = ours.classify(ours.forward(ids, cu), cu).cpu()
    ref = _hf_logits(hf, seqs)
    np.testing.assert_allclose(logits.numpy(), ref.numpy(), atol=1e-2)
    assert logits.argmax(-1).tolist() == ref.argmax(-1).tolist()
