"""OLMo hybrid's config read as transformers reads it (backend/models/olmo_hybrid.py): the default layer kinds, the
rope base (null: no rotary), the DeltaNet's default sizes, and the tensors a checkpoint at the published shape holds
(client/model_shapes.tensor_shapes) named as transformers' model names them. The models themselves are checked
against transformers in test_decoder_families.py."""
from __future__ import annotations

import pytest

from tritonformer.backend.models import olmo_hybrid
from tritonformer.client.model_shapes import DECODER_SHAPES, shrunk, tensor_shapes

transformers = pytest.importorskip("transformers")


def _hf_config(**changes):
    cfg = {k: v for k, v in {**shrunk("olmo-hybrid-7b"), **changes}.items() if k != "model_type"}
    return transformers.OlmoHybridConfig(**cfg)


@pytest.mark.parametrize("layers", [2, 3, 4, 8, 11])
def test_default_layer_kinds_are_transformers(layers):
    hf = _hf_config(num_hidden_layers=layers)
    kinds = olmo_hybrid.layer_kinds({"num_hidden_layers": layers})
    assert [k is None for k in kinds] == [t == "full_attention" for t in hf.layer_types]


@pytest.mark.parametrize("changes,rotates", [
    ({"rope_theta": None}, False),
    ({"rope_theta": 5e5}, True),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": None}}, False),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 2e5}, "rope_theta": None}, True),
    ({"rope_parameters": None}, True),  # (no base anywhere: transformers' default, 10,000)
])
def test_rope_base_is_resolved_as_transformers_resolves_it(changes, rotates):
    cfg = {k: v for k, v in shrunk("olmo-hybrid-7b").items() if k != "rope_theta"}
    hf = transformers.OlmoHybridConfig(**{k: v for k, v in {**cfg, **changes}.items() if k != "model_type"})
    want = hf.rope_parameters.get("rope_theta") if hf.rope_parameters else None
    assert olmo_hybrid.rope_theta({**cfg, **changes}) == want
    spec = olmo_hybrid.from_hf({**cfg, **changes})
    assert (not spec.rope_layers) == rotates
    if rotates:
        assert spec.rope.theta == want


def test_deltanet_sizes_default_as_transformers_defaults_them():
    cfg = {k: v for k, v in shrunk("olmo-hybrid-7b").items() if not k.startswith("linear_")}
    hf = transformers.OlmoHybridConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    d = olmo_hybrid.from_hf(cfg).deltanet
    assert (d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim, d.conv_kernel, d.beta_scale) == (
        hf.linear_num_key_heads, hf.linear_num_value_heads, hf.linear_key_head_dim, hf.linear_value_head_dim,
        hf.linear_conv_kernel_dim, 2.0)
    assert olmo_hybrid.from_hf({**cfg, "linear_allow_neg_eigval": False}).deltanet.beta_scale == 1.0


def test_published_shape_tensors_are_transformers_names_and_shapes():
    """tensor_shapes at the published widths (layers cut to 4: three DeltaNet layers, then attention) against the
    parameters of transformers' model at a hundredth of them (its names; shapes compared at the small size)."""
    import torch

    published = {**DECODER_SHAPES["olmo-hybrid-7b"], "num_hidden_layers": 4}
    names = set(tensor_shapes(olmo_hybrid.from_hf(published)))
    small = shrunk("olmo-hybrid-7b", layers=4)
    with torch.device("meta"):
        hf = transformers.OlmoHybridForCausalLM(_hf_config(num_hidden_layers=4))
    theirs = {name.removeprefix("model."): tuple(p.shape) for name, p in hf.named_parameters()}
    assert names == set(theirs)
    assert tensor_shapes(olmo_hybrid.from_hf(small)) == theirs
