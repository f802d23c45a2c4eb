"""Our BERT and Llama implementations against Hugging Face transformers on the same weights
(in-process, CPU, fp32). The served models are checked end to end in test_integration_*."""
from __future__ import annotations

import pytest
import torch

from tritonformer.backend.models.bert import BertConfig, BertEncoder, pool, pooling_from_checkpoint
from tritonformer.backend.models.llama import LlamaConfig, LlamaModel
from tritonformer.backend.weights import load_config, load_state_dict

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")


def _packed(seqs):
    ids = torch.tensor([t for s in seqs for t in s])
    cu = torch.tensor([0] + list(torch.tensor([len(s) for s in seqs]).cumsum(0)), dtype=torch.int32)
    return ids, cu


def test_minilm_matches_hf_per_token_and_pooled(minilm_dir):
    hf = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    ours = BertEncoder(BertConfig.from_hf(load_config(minilm_dir)), load_state_dict(minilm_dir), CPU, torch.float32)
    g = torch.Generator().manual_seed(1)
    seqs = [[101] + torch.randint(1000, 30000, (n,), generator=g).tolist() + [102] for n in (3, 17, 1, 40)]
    ids, cu = _packed(seqs)
    hidden = ours.forward(ids, cu)
    mode, normalize = pooling_from_checkpoint(minilm_dir)
    assert (mode, normalize) == ("mean", True)
    pooled = pool(hidden, cu, mode, normalize)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = hf(torch.tensor([s])).last_hidden_state[0]
            torch.testing.assert_close(hidden[cu[i] : cu[i + 1]], ref, atol=1e-4, rtol=1e-4)
            ref_pooled = torch.nn.functional.normalize(ref.mean(0), dim=0)
            torch.testing.assert_close(pooled[i], ref_pooled, atol=1e-5, rtol=1e-4)


def test_random_roberta_matches_hf():
    cfg = transformers.RobertaConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=66, hidden_act="gelu_new",
    )
    torch.manual_seed(0)
    hf = transformers.RobertaModel(cfg, add_pooling_layer=False).eval()
    ours = BertEncoder(BertConfig.from_hf(cfg.to_dict()), {k: v for k, v in hf.state_dict().items()}, CPU, torch.float32)
    assert ours.config.max_tokens_per_sequence == 64
    seqs = [torch.randint(3, 500, (n,)).tolist() for n in (5, 64, 2)]
    ids, cu = _packed(seqs)
    hidden = ours.forward(ids, cu)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = hf(torch.tensor([s])).last_hidden_state[0]
            torch.testing.assert_close(hidden[cu[i] : cu[i + 1]], ref, atol=1e-4, rtol=1e-4)


def _random_llama(tie: bool, kv_heads: int):
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=128, tie_word_embeddings=tie, rope_theta=500.0,
    )
    torch.manual_seed(3)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    return hf, LlamaModel(LlamaConfig.from_hf(cfg.to_dict()), state, CPU, torch.float32)


@pytest.mark.parametrize("tie,kv_heads", [(True, 2), (False, 4), (False, 1)])
def test_llama_iterations_match_hf_full_forward(tie, kv_heads):
    """Sequences join at different iterations, prefill and decode share iterations, and each
    step's logits equal HF's on the whole sequence so far."""
    hf, ours = _random_llama(tie, kv_heads)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (9, 1, 23)]
    history = [list(prompts[0]), None, None]
    caches = [ours.new_cache(), ours.new_cache(), ours.new_cache()]
    steps = [
        [(0, prompts[0])],
        [(0, [5]), (1, prompts[1])],
        [(0, [6]), (1, [7]), (2, prompts[2])],
        [(1, [8]), (2, [9]), (0, [10])],
    ]
    for step in steps:
        token_lists, step_caches = [], []
        for seq, toks in step:
            if history[seq] is None:
                history[seq] = list(toks)
            elif toks is not prompts[seq]:
                history[seq] = history[seq] + toks
            token_lists.append(toks)
            step_caches.append(caches[seq])
        logits = ours.forward(token_lists, step_caches)
        with torch.no_grad():
            for row, (seq, _) in enumerate(step):
                ref = hf(torch.tensor([history[seq]])).logits[0, -1]
                torch.testing.assert_close(logits[row], ref, atol=1e-4, rtol=1e-4)
    assert [c.length for c in caches] == [len(h) for h in history]


def test_kv_cache_grows_past_initial_capacity():
    hf, ours = _random_llama(True, 2)
    seq = torch.randint(0, 300, (100,)).tolist()
    cache = ours.new_cache()
    ours.forward([seq[:70]], [cache])
    logits = ours.forward([seq[70:]], [cache])
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0, -1]
    torch.testing.assert_close(logits[0], ref, atol=1e-4, rtol=1e-4)
    assert cache.capacity >= 100


def test_unsupported_configs_are_clear_errors():
    with pytest.raises(ValueError, match="model_type"):
        BertConfig.from_hf({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="rope_scaling"):
        LlamaConfig.from_hf({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}})


def test_pickle_checkpoints_need_an_opt_in_and_load_weights_only(tmp_path):
    import pickle

    tensors = {"encoder.layer.0.output.dense.bias": torch.randn(4)}
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    with pytest.raises(PermissionError, match="allow_pickle_checkpoint"):
        load_state_dict(tmp_path)
    loaded = load_state_dict(tmp_path, allow_pickle=True)
    torch.testing.assert_close(loaded["encoder.layer.0.output.dense.bias"], tensors["encoder.layer.0.output.dense.bias"])

    class Evil:  # a pickle that would run code when loaded
        def __reduce__(self):
            return (print, ("pwned",))

    evil = tmp_path / "evil"
    evil.mkdir()
    with open(evil / "pytorch_model.bin", "wb") as f:
        pickle.dump({"w": Evil()}, f)
    with pytest.raises(pickle.UnpicklingError):
        load_state_dict(evil, allow_pickle=True)  # weights_only refuses arbitrary callables
