"""Zamba (backend/models/zamba.py) beyond the family cases of test_decoder_families.py (CPU, fp32): its published
config read as transformers reads it, and a checkpoint as transformers saves it (the shared block's tied copies left
out of the file) loading, continuing as HF does, its tensors those model_shapes lists."""
from __future__ import annotations

import pytest
import torch

from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
from tritonformer.backend.models import zamba
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.client.model_shapes import DECODER_SHAPES, shrunk, tensor_shapes

from decoder_steps import PagedSteps  # noqa: E402  (tests/ helper)

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")


def test_zamba_reads_its_published_config_as_transformers_does():
    """Zamba-7B-v1's config.json: transformers' layout of the hybrid layers (the third, then every 6th from 7),
    heads of 2 x hidden / heads, dt's rank ceil(hidden / 16), two Mamba heads."""
    cfg = DECODER_SHAPES["zamba-7b"]
    spec = zamba.from_hf(cfg)
    hf = transformers.ZambaConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert list(spec.hybrid_layers) == [i for i, k in enumerate(hf.layers_block_type) if k == "hybrid"]
    assert list(spec.hybrid_layers) == [2] + list(range(7, 76, 6))
    assert spec.head_dim == hf.attention_head_dim == 464 and spec.attn_scale == 232 ** -0.5
    assert spec.mamba1.dt_rank == hf.mamba_dt_rank == 232 and spec.mamba_heads == hf.n_mamba_heads == 2
    assert spec.mamba1.intermediate_size == 2 * 3712 and spec.tied_blocks and spec.block_activation == "gelu_mul"


def test_a_checkpoint_saved_by_transformers_loads_and_its_tensors_are_those_model_shapes_lists(tmp_path):
    """save_pretrained writes the shared block once (the later invocations' tied copies left out): the folder loads
    and continues as HF does; model_shapes lists exactly its tensors (the GPU tests' random models are such files)."""
    cfg = {k: v for k, v in {**shrunk("zamba-7b"), "num_hidden_layers": 4, "initializer_range": 0.2,
                             "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"]}.items() if k != "model_type"}
    torch.manual_seed(0)
    hf = transformers.ZambaForCausalLM._from_config(transformers.ZambaConfig(**cfg), attn_implementation="eager")
    hf.eval().save_pretrained(tmp_path)
    cfg, state = load_config(tmp_path), load_state_dict(tmp_path)
    assert "layers.3.shared_transf.self_attn.q_proj.weight" not in state  # (layer 1's copy: tied)
    ours = load_decoder(cfg, state, CPU, torch.float32)
    assert len(ours.blocks) == 1 and ours.num_kv_layers == 2
    prompt = [5, 17, 42, 8, 99, 3, 250, 31, 77, 12, 140, 9, 66, 201, 18, 4, 93, 57, 160, 22]
    got = PagedSteps(ours, num_blocks=32, block_size=8).greedy([prompt], 12)[0]
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert got == out[0, len(prompt):].tolist()
    listed = tensor_shapes(zamba.from_hf(cfg))
    # (a hybrid layer's norm listed under the name adapt gives it)
    assert listed == {name.replace("mamba_decoder.input_layernorm", "input_layernorm"): tuple(t.shape)
                      for name, t in state.items()}
