"""MXFP4 expert weights (gpt-oss checkpoints): dequantised exactly as Hugging Face's model holds
them, and presented by both checkpoint readers under the parameter's plain name."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from tritonformer.backend.checkpoints.mxfp4 import dequantize_mxfp4, mxfp4_pairs
from tritonformer.backend.checkpoints.weights import lazy_state_dict, load_state_dict

# Nibbles 0..15 in order, low nibble first: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated
_ALL_NIBBLES = [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _random_mxfp4(experts: int, rows: int, groups: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (experts, rows, groups, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(120, 135, (experts, rows, groups), dtype=torch.uint8, generator=g)
    return blocks, scales


def test_matches_transformers_convert_moe_packed_tensors():
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    blocks, scales = _random_mxfp4(3, 8, 2)
    want = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
    assert want.shape == (3, 64, 8)
    for rows_per_chunk in (2048, 3, 1):  # one chunk per expert, a ragged last chunk, one row at a time
        got = dequantize_mxfp4(blocks, scales, rows_per_chunk=rows_per_chunk)
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))  # bit for bit, -0.0 included
    got32 = dequantize_mxfp4(blocks, scales, torch.float32)
    assert torch.equal(got32, mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))


def test_known_values():
    # one expert, two stored rows (output features) of one 32-value block each, scales x1 and x2
    blocks = torch.tensor([[[_ALL_NIBBLES * 2], [_ALL_NIBBLES * 2]]], dtype=torch.uint8)
    scales = torch.tensor([[[127], [128]]], dtype=torch.uint8)
    out = dequantize_mxfp4(blocks, scales)
    assert out.shape == (1, 32, 2)  # [experts, input features, output features]
    want = torch.tensor(_VALUES * 2, dtype=torch.bfloat16)
    assert torch.equal(out[0, :, 0], want)
    assert torch.equal(out[0, :, 1], 2 * want)
    assert out[0, 8, 0].item() == 0.0 and torch.signbit(out[0, 8, 0])  # nibble 8 is -0.0
    # a lower scale halves, and the high nibble is the second value: 0x71 is 0.5 then 6
    small = dequantize_mxfp4(torch.tensor([[[[0x71] * 16]]], dtype=torch.uint8),
                             torch.tensor([[[126]]], dtype=torch.uint8))
    assert small[0, :2, 0].tolist() == [0.25, 3.0]


def test_bad_shapes_are_refused():
    blocks, scales = _random_mxfp4(1, 2, 2)
    with pytest.raises(ValueError, match="scales"):
        dequantize_mxfp4(blocks, scales[:, :, :1])
    with pytest.raises(ValueError, match="experts"):
        dequantize_mxfp4(blocks[0], scales[0])


def test_pairs():
    names = ["a.x_blocks", "a.x_scales", "b_scales", "c_blocks", "d_blocks", "d_scales", "d", "e"]
    assert mxfp4_pairs(names) == {"a.x": ("a.x_blocks", "a.x_scales")}


def _checkpoint(folder):
    """A two-file gpt-oss-like checkpoint: gate_up_proj's blocks in one file and its scales in the
    other, down_proj's pair in the second, plain bf16 tensors beside them."""
    gate_blocks, gate_scales = _random_mxfp4(3, 8, 2, seed=1)  # [E, 2I, H/32, 16]: H = 64, 2I = 8
    down_blocks, down_scales = _random_mxfp4(3, 64, 1, seed=2)  # [E, H, I/32, 16]: I = 32
    g = torch.Generator().manual_seed(3)
    embed = torch.randn(10, 64, generator=g).to(torch.bfloat16)
    bias = torch.randn(3, 8, generator=g).to(torch.bfloat16)
    p = "model.layers.0.mlp.experts."
    save_file({p + "gate_up_proj_blocks": gate_blocks, p + "gate_up_proj_bias": bias,
               "model.embed_tokens.weight": embed}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({p + "gate_up_proj_scales": gate_scales, p + "down_proj_blocks": down_blocks,
               p + "down_proj_scales": down_scales}, str(folder / "model-00002-of-00002.safetensors"))
    return {"layers.0.mlp.experts.gate_up_proj": dequantize_mxfp4(gate_blocks, gate_scales),
            "layers.0.mlp.experts.down_proj": dequantize_mxfp4(down_blocks, down_scales),
            "layers.0.mlp.experts.gate_up_proj_bias": bias, "embed_tokens.weight": embed}


def test_readers_present_the_dequantised_tensor(tmp_path):
    want = _checkpoint(tmp_path)
    assert want["layers.0.mlp.experts.gate_up_proj"].shape == (3, 64, 8)  # [E, H, 2I]
    assert want["layers.0.mlp.experts.down_proj"].shape == (3, 32, 64)  # [E, I, H]

    eager = load_state_dict(tmp_path)
    assert set(eager) == set(want)
    for name, tensor in want.items():
        assert eager[name].dtype == tensor.dtype and torch.equal(eager[name], tensor), name
    unstripped = load_state_dict(tmp_path, strip_prefixes=False)
    assert "model.layers.0.mlp.experts.down_proj" in unstripped
    assert not any(n.endswith(("_blocks", "_scales")) for n in unstripped)

    lazy = lazy_state_dict(tmp_path)
    assert set(lazy) == set(want)
    for name, tensor in want.items():
        entry = lazy[name]
        assert tuple(entry.shape) == tuple(tensor.shape) and entry.dtype == tensor.dtype, name
        assert torch.equal(entry.read(), tensor), name
        assert torch.equal(entry.to(dtype=torch.float32), tensor.float()), name
    # the reads a model's build makes: whole experts, and tensor-parallel shares of rows or columns
    # (a share of the input features need not start on a 32-value block); then other indexes
    indexes = (1, -1, slice(1, 3), slice(2, 1), (), (slice(None), slice(16, 48)), (slice(None), 30),
               (slice(0, 2), slice(None), slice(2, 6)), (1, slice(33, 64), slice(3, 8)), (2, slice(None), 7),
               (slice(None), slice(64, 64)), (slice(None), slice(-20, None)),
               slice(0, 3, 2), (Ellipsis, slice(0, 4)), torch.tensor([0, 2]), (slice(None), None))
    for name in ("layers.0.mlp.experts.gate_up_proj", "layers.0.mlp.experts.down_proj"):
        for index in indexes:
            got, expected = lazy[name][index], want[name][index]
            assert got.shape == expected.shape and torch.equal(got, expected), (name, index)
    with pytest.raises(IndexError):
        lazy["layers.0.mlp.experts.gate_up_proj"][3]


def test_lazy_share_reads_only_its_part(tmp_path, monkeypatch):
    from tritonformer.backend.checkpoints import weights

    _checkpoint(tmp_path)
    shapes = []

    def recording(blocks, scales, dtype):
        shapes.append(tuple(blocks.shape))
        return dequantize_mxfp4(blocks, scales, dtype)

    monkeypatch.setattr(weights, "dequantize_mxfp4", recording)
    gate = lazy_state_dict(tmp_path)["layers.0.mlp.experts.gate_up_proj"]
    gate[1, 33:64, 3:8]
    gate[:, :, 4:]
    gate.read()
    assert shapes == [(1, 5, 1, 16), (3, 4, 2, 16), (3, 8, 2, 16)]


def test_checkpoint_without_pairs_is_unchanged(tmp_path):
    # a lone `_blocks` (no `_scales` beside it) is an ordinary tensor
    tensors = {"model.w_blocks": torch.arange(6, dtype=torch.uint8).reshape(2, 3), "model.b": torch.ones(2)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    eager, lazy = load_state_dict(tmp_path), lazy_state_dict(tmp_path)
    assert set(eager) == set(lazy) == {"w_blocks", "b"}
    assert torch.equal(eager["w_blocks"], tensors["model.w_blocks"]) and torch.equal(lazy["b"].read(), torch.ones(2))
