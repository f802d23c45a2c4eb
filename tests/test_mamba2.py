"""The Mamba-2 mixer's two forms against each other on random weights (CPU, fp32): prompt chunks
(the chunked SSD, its inner chunks smaller than the prompt chunks) give the outputs and final
states that one recurrent step per token gives, decode rows and chunks in one batch and a
sequence's chunks continuing from its slot. And the Mamba-2 hybrids' refused options."""
from __future__ import annotations

import re

import pytest
import torch

from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.state_cache import StateCache
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.backend.models.mamba2 import Mamba2Mixer, Mamba2Spec, tensor_shapes
from tritonformer.client.model_shapes import shrunk

HIDDEN = 32
SPEC = Mamba2Spec(num_heads=4, head_dim=8, state_size=6, num_groups=2, intermediate_size=32, conv_kernel=4,
                  chunk_size=8, conv_bias=True, proj_bias=True)


def _mixer(seed: int = 0) -> Mamba2Mixer:
    g = torch.Generator().manual_seed(seed)
    state = {name: torch.randn(shape, generator=g) * 0.3 for name, shape in tensor_shapes(SPEC, "m.", HIDDEN).items()}
    state["m.A_log"] = torch.rand(SPEC.num_heads, generator=g) * 2 - 1  # (decays from fast to slow)
    state["m.dt_bias"] = torch.randn(SPEC.num_heads, generator=g)

    def weight(name, *shape, rows=None, cols=None):  # (the decoder's reader: rows / cols of a rank's share)
        assert tuple(state[name].shape) == shape, name
        t = state[name] if rows is None else state[name][rows]
        return t if cols is None else t[:, cols]

    return Mamba2Mixer(SPEC, "m.", HIDDEN, weight, out_scale=0.5)


def _batch(num_decode: int, prefill_lens: tuple[int, ...], slots: list[int]) -> DecoderBatch:
    rows = num_decode + sum(prefill_lens)
    zeros = torch.zeros(rows, dtype=torch.long)
    return DecoderBatch(input_ids=zeros, positions=zeros, slot_mapping=zeros, logits_index=zeros,
                        num_decode=num_decode, state_slots=torch.tensor(slots), prefill_lens=prefill_lens)


def _cache() -> tuple[StateCache, dict]:
    mixer_shapes = _mixer().state_shapes
    cache = StateCache([mixer_shapes], num_slots=4, device=torch.device("cpu"))
    return cache, cache.layer(0)


def test_chunked_prefill_equals_step_by_step_decode():
    mixer = _mixer()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(37, HIDDEN, generator=g), torch.randn(20, HIDDEN, generator=g)
    # Stepwise: each token of sequence a (slot 0) and b (slot 2) as decode rows, b joining later
    _, stepped = _cache()
    ref_a, ref_b = [], []
    for t in range(37):
        if t < 17:
            ref_a.append(mixer(a[t : t + 1], None, _batch(1, (), [0]), stepped))
            continue
        out = mixer(torch.stack([a[t], b[t - 17]]), None, _batch(2, (), [0, 2]), stepped)
        ref_a.append(out[:1])
        ref_b.append(out[1:])
    ref_a, ref_b = torch.cat(ref_a), torch.cat(ref_b)
    # Chunked: a's first 17 tokens as chunks of 5 and 12; then a's next 13 in one chunk beside b's first 13 in
    # two; then both decoding, a as a one-token row beside b's last 7 in a chunk
    _, chunked = _cache()
    got_a = [mixer(a[:5], None, _batch(0, (5,), [0]), chunked),
             mixer(a[5:17], None, _batch(0, (12,), [0]), chunked)]
    out = mixer(torch.cat([a[17:30], b[:4]]), None, _batch(0, (13, 4), [0, 2]), chunked)
    got_a.append(out[:13])
    got_b = [out[13:], mixer(b[4:13], None, _batch(0, (9,), [2]), chunked)]
    for t in range(30, 37):
        rows = [a[t : t + 1]] + ([b[13:]] if t == 30 else [])
        out = mixer(torch.cat(rows), None, _batch(1, (7,) if t == 30 else (), [0, 2] if t == 30 else [0]), chunked)
        got_a.append(out[:1])
        if t == 30:
            got_b.append(out[1:])
    torch.testing.assert_close(torch.cat(got_a), ref_a, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat(got_b), ref_b, atol=1e-5, rtol=1e-4)
    for name in ("conv", "ssm"):
        torch.testing.assert_close(chunked[name], stepped[name], atol=1e-5, rtol=1e-4)
    assert chunked["ssm"][0].abs().max() > 0.1  # (the states are not trivially zero)


def test_a_zeroed_slot_starts_the_sequence_afresh():
    """A slot reset (a sequence's first token) forgets the previous holder's state."""
    mixer = _mixer()
    x = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(3))
    cache, state = _cache()
    first = mixer(x, None, _batch(0, (9,), [1]), state)
    cache.reset([1])
    again = mixer(x, None, _batch(0, (9,), [1]), state)
    torch.testing.assert_close(again, first)


@pytest.mark.parametrize("model_type,shape,changes,message", [
    ("granitemoehybrid", "granite-4.0-h-tiny", {"position_embedding_type": "alibi"}, "position_embedding_type 'alibi'"),
    ("granitemoehybrid", "granite-4.0-h-tiny", {"layer_types": ["mamba", "conv"]}, "layer 1's type 'conv'"),
    ("bamba", "bamba-9b", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("nemotron_h", "nemotron-h-8b", {"hybrid_override_pattern": "M-E-"}, "block 2 is a mixture of experts that"),
    ("nemotron_h", "nemotron-h-8b", {"hybrid_override_pattern": "M--"}, "block 2 is an MLP that follows no"),
    ("nemotron_h", "nemotron-h-8b", {"mlp_hidden_act": "silu"}, "mlp_hidden_act 'silu'"),
    ("falcon_h1", "falcon-h1-0.5b", {"ssm_multipliers": [1.0, 1.0]}, "ssm_multipliers lists 2"),
])
def test_unsupported_options_are_load_errors_that_name_them(model_type, shape, changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_decoder({**shrunk(shape), **changes}, {}, torch.device("cpu"), torch.float32)


def test_nemotron_h_blocks_pair_into_layers_with_and_without_mlps():
    from tritonformer.backend.models.nemotron_h import layers

    assert layers({"hybrid_override_pattern": "M-M*-MM-"}) == [(0, 1), (2, None), (3, 4), (5, None), (6, 7)]
    assert layers({"layers_block_type": ["mamba", "moe", "attention", "mlp", "mamba"]}) == [(0, 1), (2, 3), (4, None)]


def test_a_saved_config_with_an_infinite_time_step_limit_loads(tmp_path):
    """transformers writes Mamba-2's default time_step_limit (0.0, inf) as [0.0, {"__float__": "Infinity"}]
    (JSON has no inf): config.json as saved loads into the same spec as the config object."""
    transformers = pytest.importorskip("transformers")
    from tritonformer.backend.checkpoints.weights import load_config

    cfg = {k: v for k, v in shrunk("bamba-9b").items() if k != "model_type"}
    transformers.BambaConfig(**cfg).save_pretrained(tmp_path)
    assert "__float__" in (tmp_path / "config.json").read_text()
    loaded = load_config(tmp_path)
    assert loaded["time_step_limit"] == [0.0, float("inf")]
    assert Mamba2Spec.from_hf(loaded, "bamba").time_step_limit == (0.0, float("inf"))
