"""Zamba2 (backend/models/zamba2.py) beyond the family cases of test_decoder_families.py (CPU, fp32): its published
config read as transformers reads it, a checkpoint as transformers saves it (the shared blocks' tied copies left out
of the file), the tensors model_shapes lists being the checkpoint's, and an untied checkpoint saved with the ties."""
from __future__ import annotations

import pytest
import torch

from tritonformer.backend.checkpoints.weights import load_config, load_state_dict, strip_prefixes_of
from tritonformer.backend.models import zamba2
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.client.model_shapes import DECODER_SHAPES, shrunk, tensor_shapes

from decoder_steps import PagedSteps  # noqa: E402  (tests/ helper)

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")
# Two blocks in turn over three hybrid layers (the first block's second invocation at layer 4), attention adapters
LAYOUT = {"num_hidden_layers": 5, "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "hybrid"],
          "use_shared_attention_adapter": True, "initializer_range": 0.1}


def _hf(changes: dict, seed: int = 0):
    cfg = {k: v for k, v in {**shrunk("zamba2-2.7b"), **LAYOUT, **changes}.items() if k != "model_type"}
    torch.manual_seed(seed)
    hf = transformers.Zamba2ForCausalLM._from_config(transformers.Zamba2Config(**cfg),
                                                     attn_implementation="eager").eval()
    with torch.no_grad():  # (norms start at 1: make them matter)
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return hf


def _greedy(model, prompt: list[int], tokens: int = 12) -> list[int]:
    return PagedSteps(model, num_blocks=32, block_size=8).greedy([prompt], tokens)[0]


def _hf_greedy(hf, prompt: list[int], tokens: int = 12) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


PROMPT = [5, 17, 42, 8, 99, 3, 250, 31, 77, 12, 140, 9, 66, 201, 18, 4, 93, 57, 160, 22]


def test_zamba2_reads_its_published_config_as_transformers_does():
    """Zamba2-2.7B's config.json: nine hybrid layers (transformers' hybrid_layer_ids), the attention 2 x hidden wide
    in heads of 160, Mamba-2 heads of 64 (mamba_expand x hidden / n_mamba_heads), the shared MLP's width, two blocks
    tied with the head."""
    cfg = DECODER_SHAPES["zamba2-2.7b"]
    spec = zamba2.from_hf(cfg)
    hf = transformers.Zamba2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert list(spec.hybrid_layers) == hf.hybrid_layer_ids == [6, 12, 18, 24, 30, 36, 42, 47, 51]
    assert spec.head_dim == hf.attention_head_dim == 160 and spec.num_heads * spec.head_dim == hf.attention_hidden_size
    assert spec.mamba.head_dim == hf.mamba_headdim == 64 and spec.mamba.num_heads == 80
    assert spec.intermediate_size == hf.intermediate_size == 10240 and spec.attn_scale == 80 ** -0.5
    assert spec.num_mem_blocks == 2 and spec.tied_blocks and spec.block_activation == "gelu_mul"
    assert spec.mamba.time_step_limit == (0.001, float("inf")) and spec.mamba.norm_eps == 1e-5


def test_a_checkpoint_saved_by_transformers_loads_and_its_tensors_are_those_model_shapes_lists(tmp_path):
    """save_pretrained writes each shared block once (the later invocations' tied copies left out): the folder loads
    as the served model reads it and continues as HF does; model_shapes lists exactly its tensors (the random models
    of the GPU tests are such checkpoints)."""
    hf = _hf({})
    hf.save_pretrained(tmp_path)
    cfg, state = load_config(tmp_path), load_state_dict(tmp_path)
    assert "layers.4.shared_transformer.self_attn.q_proj.weight" not in state  # (layer 1's copy: tied)
    ours = load_decoder(cfg, state, CPU, torch.float32)
    assert len(ours.blocks) == 2 and ours.num_kv_layers == 3
    assert _greedy(ours, PROMPT) == _hf_greedy(hf, PROMPT)
    _, adapted = zamba2.adapt(cfg, state)
    listed = tensor_shapes(zamba2.from_hf(cfg))
    assert listed == {name: tuple(t.shape) for name, t in adapted.items()}


def test_untied_blocks_are_each_layers_own_and_a_file_saved_tied_reads_the_first_copies():
    """With tie_word_embeddings false transformers unties the blocks too: each hybrid layer's copy is its own (three
    blocks read, model_shapes listing each copy and its invocation's adapters); a checkpoint holding only the first
    copies loads as the shared model."""
    hf = _hf({"tie_word_embeddings": False})
    cfg, state = hf.config.to_dict(), strip_prefixes_of(hf.state_dict())
    ours = load_decoder(cfg, state, CPU, torch.float32)
    assert len(ours.blocks) == 3 and _greedy(ours, PROMPT) == _hf_greedy(hf, PROMPT)
    listed, adapted = tensor_shapes(zamba2.from_hf(cfg)), zamba2.adapt(cfg, state)[1]
    assert all(tuple(adapted[name].shape) == shape for name, shape in listed.items())
    # (what is not read: each copy's adapters of its block's other invocations, which transformers never runs)
    assert {name.split(".")[1] for name in set(adapted) - set(listed) if "_adapter_list." in name} == {"1", "4"}
    assert all("_adapter_list." in name for name in set(adapted) - set(listed))
    tied = _hf({})
    state = {name: t for name, t in strip_prefixes_of(tied.state_dict()).items()
             if not name.startswith("layers.4.shared_transformer.")}
    state["lm_head.weight"] = state["embed_tokens.weight"].clone()
    shared = load_decoder({**tied.config.to_dict(), "tie_word_embeddings": False}, state, CPU, torch.float32)
    assert len(shared.blocks) == 2 and _greedy(shared, PROMPT) == _hf_greedy(tied, PROMPT)


def test_the_published_shape_splits_and_a_split_that_does_not_divide_is_refused_by_name():
    """Tensor parallelism (test_tensor_parallel.py runs it): Zamba2-2.7B splits 2 and 8 ways; its 80 Mamba-2 heads
    do not split 3 ways, nor 20 shared-block heads 8 ways, and the load says which."""
    from tritonformer.backend.models.decoder import check_tensor_parallel

    published = DECODER_SHAPES["zamba2-2.7b"]
    check_tensor_parallel(published, 2)
    check_tensor_parallel(published, 8)
    with pytest.raises(ValueError, match=r"Mamba-2 heads \(n_mamba_heads\) \(80\) do not divide by tensor_parallel"):
        check_tensor_parallel(published, 3)
    with pytest.raises(ValueError, match=r"attention heads \(20\) do not divide by tensor_parallel_size 8"):
        check_tensor_parallel({**published, "num_attention_heads": 20, "num_key_value_heads": 20}, 8)
