"""Our BERT, Llama and GPT-2 implementations against Hugging Face transformers on the same weights
(in-process, CPU, fp32); the other decoder families in test_decoder_families.py. The served models
are checked end to end in test_integration_*."""
from __future__ import annotations

import pytest
import torch

from tritonformer.backend.models.bert import BertConfig, BertEncoder, pooling_from_checkpoint
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.backend.models.gpt2 import GPT2Config
from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
from tritonformer.kernels import pool_sequences

from decoder_steps import PagedSteps, check_joining_iterations_match  # noqa: E402  (tests/ helper)

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
    pooled = pool_sequences(hidden, cu, mode, normalize)
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
    return hf, load_decoder(cfg.to_dict(), state, CPU, torch.float32)


@pytest.mark.parametrize("tie,kv_heads", [(True, 2), (False, 4), (False, 1)])
def test_llama_iterations_match_hf_full_forward(tie, kv_heads):
    """Sequences join at different iterations, prefill chunks and decodes share iterations, keys
    cross block boundaries, and each step's logits equal HF's on the whole sequence so far."""
    hf, ours = _random_llama(tie, kv_heads)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (9, 1, 23)]
    check_joining_iterations_match(hf, ours, prompts)


def _random_gpt2():
    cfg = transformers.GPT2Config()  # the gpt2 (124M) shape
    torch.manual_seed(5)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    ours = load_decoder(cfg.to_dict(), load_state_dict_from(hf), CPU, torch.float32)
    return hf, ours


def load_state_dict_from(hf_model) -> dict:
    return {k.removeprefix("transformer."): v for k, v in hf_model.state_dict().items()}


def _hf_greedy(hf, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_gpt2_greedy_is_token_identical_to_hf():
    """Random weights from the gpt2 config; five prompts decoded together for 32 tokens."""
    hf, ours = _random_gpt2()
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 50257, (n,), generator=g).tolist() for n in (5, 17, 1, 40, 9)]
    ours_out = PagedSteps(ours, num_blocks=64, block_size=16).greedy(prompts, 32)
    for prompt, got in zip(prompts, ours_out):
        assert got == _hf_greedy(hf, prompt, 32)


def test_llama_greedy_is_token_identical_to_hf():
    hf, ours = _random_llama(False, 2)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (3, 30, 12)]
    ours_out = PagedSteps(ours, num_blocks=64, block_size=8).greedy(prompts, 32)
    for prompt, got in zip(prompts, ours_out):
        assert got == _hf_greedy(hf, prompt, 32)


def test_decoder_family_comes_from_model_type():
    with pytest.raises(ValueError, match="unsupported decoder model_type"):
        load_decoder({"model_type": "t5"}, {}, CPU, torch.float32)
    with pytest.raises(ValueError, match="activation_function"):
        GPT2Config.from_hf({**transformers.GPT2Config().to_dict(), "activation_function": "relu"})


def test_unsupported_configs_are_clear_errors():
    with pytest.raises(ValueError, match="model_type"):
        BertConfig.from_hf({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="unsupported rope type 'ntk'"):
        load_decoder({**transformers.LlamaConfig().to_dict(), "rope_scaling": {"type": "ntk", "factor": 2.0}}, {}, CPU,
                     torch.float32)


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


def test_build_batch_marks_iterations_whose_logits_are_every_row():
    """logits_every_row (the models then skip the logits gather) holds exactly when every entry
    is one token that samples; the llama/gpt2 tests above run both kinds of iteration."""
    from tritonformer.backend.decoder.batch import BatchEntry, build_batch

    decode = [BatchEntry([5], 3, [0], True), BatchEntry([6], 7, [1, 2], True)]
    batch = build_batch(decode, 4, CPU)
    assert batch.logits_every_row and batch.logits_index.tolist() == [0, 1]
    assert not build_batch([*decode, BatchEntry([1, 2], 0, [3], True)], 4, CPU).logits_every_row
    assert not build_batch([decode[0], BatchEntry([6], 7, [1, 2], False)], 4, CPU).logits_every_row
