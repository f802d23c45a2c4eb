"""LFM3's config read as transformers reads it (backend/models/lfm3.py): the default layer kinds and the tensors a
checkpoint at the published shape holds (client/model_shapes.tensor_shapes) named and shaped as transformers' model
has them once `adapt` has made each per-head gate a per-element one. The models themselves are checked against
transformers in test_decoder_families.py."""
from __future__ import annotations

import pytest

from tritonformer.backend.models import lfm3
from tritonformer.client.model_shapes import DECODER_SHAPES, shrunk, tensor_shapes

transformers = pytest.importorskip("transformers")


def _hf_config(**changes):
    cfg = {k: v for k, v in {**shrunk("lfm3-1.7b"), **changes}.items() if k != "model_type"}
    return transformers.Lfm3Config(**cfg)


@pytest.mark.parametrize("layers", [1, 3, 5, 9, 24])
def test_default_layer_kinds_are_transformers(layers):
    assert lfm3.layer_types({"num_hidden_layers": layers}) == _hf_config(num_hidden_layers=layers,
                                                                          layer_types=None).layer_types


@pytest.mark.parametrize("gated", [True, False])
def test_published_shape_tensors_are_transformers_after_adapt(gated):
    """tensor_shapes at the published widths (8 layers: convolutions, two global layers, a windowed one) against
    transformers' model's parameters at the shrunk widths (names; shapes there), its gates through `adapt`."""
    import torch

    published = {**DECODER_SHAPES["lfm3-1.7b"], "num_hidden_layers": 8, "use_attention_gate": gated}
    names = set(tensor_shapes(lfm3.from_hf(published)))
    small = {**shrunk("lfm3-1.7b", layers=8), "layer_types": None, "use_attention_gate": gated}
    with torch.device("meta"):
        hf = transformers.Lfm3ForCausalLM(_hf_config(**small))
    theirs = {name.removeprefix("model."): p for name, p in hf.named_parameters()}
    theirs.pop("lm_head.weight", None)  # (tied: the embeddings)
    adapted = lfm3.adapt(small, theirs)[1]
    assert names == set(adapted)
    assert tensor_shapes(lfm3.from_hf(small)) == {name: tuple(t.shape) for name, t in adapted.items()}
