"""The Mamba-1 mixer (models/mamba1.py) and the attention-free families (Mamba, Falcon-Mamba, Mamba-2) on random
weights (CPU, fp32): the prompt form's prefix scan (in blocks smaller than the prompt, from a held state) against
the plain recurrence; prompt chunks against one recurrent step per token, decode rows and chunks in one batch; and
whole models against Hugging Face's full forward on a long-ish prompt fed in chunks of uneven sizes, then decode
steps that carry the state (each step's logits equal HF's on the whole sequence so far)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.state_cache import StateCache
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.backend.models.mamba1 import Mamba1Mixer, Mamba1Spec, tensor_shapes
from tritonformer.kernels import reference
from tritonformer.client.model_shapes import shrunk

from decoder_steps import PagedSteps  # (tests/ helper)

HIDDEN = 24
SPEC = Mamba1Spec(intermediate_size=40, state_size=6, dt_rank=3, conv_kernel=4, conv_bias=True, proj_bias=True,
                  bcdt_norm="weighted")


def _plain_scan(held, x, dt, b, c, z, dt_bias, A, D):
    """The recurrence token by token, as written in mamba1.py's docstring."""
    h, ys = held.clone(), []
    for t in range(x.shape[0]):
        delta = F.softplus(dt[t] + dt_bias)
        h = torch.exp(delta[:, None] * A) * h + (delta * x[t])[:, None] * b[t][None, :]
        ys.append((h @ c[t] + D * x[t]) * F.silu(z[t]))
    return torch.stack(ys), h


def selective_scan(held, x, dt, b, c, z, dt_bias, A, D):
    """The prompt form (reference.selective_scan_chunk) from the state `held` `[I, N]`: returns (y, the state
    after the last token)."""
    state = held[None].clone()
    y = reference.selective_scan_chunk(x, dt, b, c, z, dt_bias, A, D, state, torch.zeros(1, dtype=torch.long))
    return y, state[0]


@pytest.mark.parametrize("block", [1, 3, 16, None])
def test_prefix_scan_in_blocks_is_the_plain_recurrence_from_a_held_state(monkeypatch, block):
    g = torch.Generator().manual_seed(block or 0)
    length, inner, n = 37, 10, 5
    x, dt, z = (torch.randn(length, inner, generator=g) for _ in range(3))
    b, c = torch.randn(length, n, generator=g), torch.randn(length, n, generator=g)
    dt_bias, D = torch.randn(inner, generator=g), torch.randn(inner, generator=g)
    A = -torch.rand(inner, n, generator=g) * 3
    held = torch.randn(inner, n, generator=g)
    if block:  # (the scan's blocks: as many tokens as SCAN_ELEMENTS values allow)
        monkeypatch.setattr(reference, "SCAN_ELEMENTS", block * inner * n)
    got, state = selective_scan(held, x, dt, b, c, z, dt_bias, A, D)
    expected, final = _plain_scan(held, x, dt, b, c, z, dt_bias, A, D)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(state, final, atol=1e-5, rtol=1e-4)
    # split anywhere, the second part continuing from the first's state: the same
    first, mid = selective_scan(held, x[:20], dt[:20], b[:20], c[:20], z[:20], dt_bias, A, D)
    second, end = selective_scan(mid, x[20:], dt[20:], b[20:], c[20:], z[20:], dt_bias, A, D)
    torch.testing.assert_close(torch.cat([first, second]), expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(end, final, atol=1e-5, rtol=1e-4)


def _mixer(seed: int = 0) -> Mamba1Mixer:
    g = torch.Generator().manual_seed(seed)
    state = {name: torch.randn(shape, generator=g) * 0.3 for name, shape in tensor_shapes(SPEC, "m.", HIDDEN).items()}
    state["m.A_log"] = torch.rand(SPEC.intermediate_size, SPEC.state_size, generator=g) * 2 - 1
    for name in ("dt_layernorm", "b_layernorm", "c_layernorm"):
        state[f"m.{name}.weight"] += 1.0

    def weight(name, *shape, rows=None, cols=None):  # (the decoder's reader: rows / cols of a rank's share)
        assert tuple(state[name].shape) == shape, name
        t = state[name] if rows is None else state[name][rows]
        return t if cols is None else t[:, cols]

    return Mamba1Mixer(SPEC, "m.", HIDDEN, weight)


def _batch(num_decode: int, prefill_lens: tuple[int, ...], slots: list[int]) -> DecoderBatch:
    rows = num_decode + sum(prefill_lens)
    zeros = torch.zeros(rows, dtype=torch.long)
    return DecoderBatch(input_ids=zeros, positions=zeros, slot_mapping=zeros, logits_index=zeros,
                        num_decode=num_decode, state_slots=torch.tensor(slots), prefill_lens=prefill_lens)


def test_chunked_prefill_equals_step_by_step_decode(monkeypatch):
    """A sequence's chunks continue from its slot, decode rows and chunks share a batch, the scan's blocks (4
    tokens here) cross inside the chunks: outputs and final states equal one step per token's."""
    monkeypatch.setattr(reference, "SCAN_ELEMENTS", 4 * SPEC.intermediate_size * SPEC.state_size)
    mixer = _mixer()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(37, HIDDEN, generator=g), torch.randn(20, HIDDEN, generator=g)
    stepped = StateCache([mixer.state_shapes], num_slots=4, device=torch.device("cpu")).layer(0)
    ref_a, ref_b = [], []
    for t in range(37):
        if t < 17:
            ref_a.append(mixer(a[t : t + 1], None, _batch(1, (), [0]), stepped))
            continue
        out = mixer(torch.stack([a[t], b[t - 17]]), None, _batch(2, (), [0, 2]), stepped)
        ref_a.append(out[:1])
        ref_b.append(out[1:])
    chunked = StateCache([mixer.state_shapes], num_slots=4, device=torch.device("cpu")).layer(0)
    got_a = [mixer(a[:5], None, _batch(0, (5,), [0]), chunked), mixer(a[5:17], None, _batch(0, (12,), [0]), chunked)]
    out = mixer(torch.cat([a[17:30], b[:4]]), None, _batch(0, (13, 4), [0, 2]), chunked)
    got_a.append(out[:13])
    got_b = [out[13:], mixer(b[4:13], None, _batch(0, (9,), [2]), chunked)]
    out = mixer(torch.cat([a[30:31], b[13:]]), None, _batch(1, (7,), [0, 2]), chunked)
    got_a.append(out[:1])
    got_b.append(out[1:])
    for t in range(31, 37):
        got_a.append(mixer(a[t : t + 1], None, _batch(1, (), [0]), chunked))
    torch.testing.assert_close(torch.cat(got_a), torch.cat(ref_a), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat(got_b), torch.cat(ref_b), atol=1e-5, rtol=1e-4)
    for name in ("conv", "ssm"):
        torch.testing.assert_close(chunked[name], stepped[name], atol=1e-5, rtol=1e-4)
    assert chunked["ssm"][0].abs().max() > 0.1  # (the states are not trivially zero)


transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("shape,hf_class,config_class,changes", [
    ("mamba-2.8b", "MambaForCausalLM", "MambaConfig", {"initializer_range": 0.3}),
    ("falcon-mamba-7b", "FalconMambaForCausalLM", "FalconMambaConfig", {}),
    ("mamba-codestral-7b", "Mamba2ForCausalLM", "Mamba2Config", {}),
], ids=["mamba", "falcon-mamba", "mamba2"])
def test_a_long_prompt_in_chunks_then_decode_steps_match_hf(monkeypatch, shape, hf_class, config_class, changes):
    """A 180-token prompt in chunks of 64, 1, 50 and 65 (Mamba-1's scan in 16-token blocks, Mamba-2's 16-token
    chunks: both cross inside the prompt chunks), beside a second sequence's decodes, then 12 decode steps: each
    step's last logits equal HF's full forward over the sequence so far; the model has no KV cache layer."""
    monkeypatch.setattr(reference, "SCAN_ELEMENTS", 16 * 256 * 16)  # (16 tokens of the shrunk Mamba-1's 256 x 16)
    cfg = {**shrunk(shape), **changes}
    cfg.pop("model_type")
    hf_cfg = getattr(transformers, config_class)(**cfg)
    torch.manual_seed(3)
    hf = getattr(transformers, hf_class)._from_config(hf_cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    ours = load_decoder(hf_cfg.to_dict(), strip_prefixes_of(hf.state_dict()), torch.device("cpu"), torch.float32)
    assert ours.num_kv_layers == 0 and ours.new_kv_cache(4, 8).nbytes() == 0
    g = torch.Generator().manual_seed(5)
    long, short = torch.randint(3, 320, (180,), generator=g).tolist(), torch.randint(3, 320, (6,), generator=g).tolist()
    run = PagedSteps(ours, num_blocks=64, block_size=8)
    seen = {0: [], 1: []}

    def check(step):
        logits = run.step(step)
        with torch.no_grad():
            for row, (seq, tokens) in enumerate(step):
                seen[seq] += tokens
                expected = hf(torch.tensor([seen[seq]])).logits[0, -1]
                torch.testing.assert_close(logits[row], expected, atol=2e-4, rtol=1e-4)
        return logits.argmax(-1).tolist()

    check([(1, short)])
    nxt = check([(0, long[:64]), (1, [7])])
    for start, stop in ((64, 65), (65, 115), (115, 180)):
        nxt = check([(0, long[start:stop]), (1, [nxt[1]])])
    tokens = []
    for _ in range(12):
        nxt = check([(0, [nxt[0]]), (1, [nxt[1]])])
        tokens.append(nxt[0])
    assert len(set(tokens)) > 4  # (a continuation that varies: one that repeats a token proves little)


def test_a_model_without_attention_sizes_a_kv_cache_of_no_layer():
    """Mamba's KV cache holds no layer (no bytes a token); its blocks still count tokens for the scheduler: "auto"
    gives each running sequence room for the longest (no free-memory share to divide by zero bytes), a token count
    is taken as it is."""
    from tritonformer.backend.decoder.kv_cache import plan_num_blocks
    from tritonformer.client.model_shapes import random_decoder

    model = random_decoder(shrunk("mamba-2.8b"), torch.device("cpu"), torch.float32)  # (256 tokens a sequence)
    assert model.num_kv_layers == 0 and model.kv_bytes_per_token() == 0
    cache = model.new_kv_cache(8, 16)
    assert cache.nbytes() == 0 and cache.bytes_per_block() == 0
    assert plan_num_blocks(model, 16, "auto", 0.3, max_running=4) == 4 * 256 // 16
    assert plan_num_blocks(model, 16, "512", 0.3, max_running=4) == 32
    with pytest.raises(ValueError, match="less than one sequence"):
        plan_num_blocks(model, 16, "64", 0.3)  # (a pool too short for the longest sequence, as for any model)


@pytest.mark.parametrize("layer", ["Mamba1", "Mamba2"])
def test_a_checkpoint_in_state_spaces_own_format_loads_as_transformers_one(layer):
    """state-spaces' checkpoints (mamba-2.8b, mamba2-2.7b) write their config in the mamba_ssm package's format
    (`d_model`, `n_layer`, `ssm_cfg`, the vocabulary before padding) and name the embeddings `embedding`: the same
    model as transformers' format gives the same logits."""
    shape, hf_class, config_class = (("mamba-2.8b", "MambaForCausalLM", "MambaConfig") if layer == "Mamba1" else
                                     ("mamba-codestral-7b", "Mamba2ForCausalLM", "Mamba2Config"))
    cfg = {**shrunk(shape), "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    cfg.pop("model_type")
    cfg.pop("max_position_embeddings")  # (neither format names one)
    hf_cfg = getattr(transformers, config_class)(**cfg)
    torch.manual_seed(4)
    hf = getattr(transformers, hf_class)._from_config(hf_cfg).eval()
    state = {name.replace("backbone.embeddings.", "backbone.embedding."): t for name, t in hf.state_dict().items()}
    ssm = {"layer": layer} if layer == "Mamba1" else {"layer": layer, "d_state": 16, "headdim": 32, "ngroups": 2,
                                                      "chunk_size": 16}
    own = {"d_model": 128, "d_intermediate": 0, "n_layer": 2, "vocab_size": 317, "ssm_cfg": ssm, "attn_layer_idx": [],
           "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True,
           "pad_vocab_size_multiple": 16, "tie_embeddings": True}
    ours = load_decoder(own, state, torch.device("cpu"), torch.float32)
    reference = load_decoder(hf_cfg.to_dict(), strip_prefixes_of(hf.state_dict()), torch.device("cpu"), torch.float32)
    assert ours.config == reference.config
    prompt = torch.randint(3, 317, (21,), generator=torch.Generator().manual_seed(2)).tolist()
    got = PagedSteps(ours).step([(0, prompt)])
    torch.testing.assert_close(got, PagedSteps(reference).step([(0, prompt)]))
    with torch.no_grad():
        torch.testing.assert_close(got[0], hf(torch.tensor([prompt])).logits[0, -1], atol=1e-4, rtol=1e-4)
    for changes, named in (({"attn_layer_idx": [1]}, "attn_layer_idx"), ({"d_intermediate": 256}, "d_intermediate"),
                           ({"rms_norm": False}, "rms_norm"), ({"ssm_cfg": {"layer": "Mamba3"}}, "layer")):
        with pytest.raises(ValueError, match=f"{named}.*supported: {named}"):
            load_decoder({**own, **changes}, state, torch.device("cpu"), torch.float32)


def test_mamba2_reads_its_output_norm_as_the_config_says():
    """norm_before_gate / rms_norm (the original Mamba-2's options, which transformers' class does not read): the
    gated norm per group, the norm before the gate, or none (mamba2.py runs each; Falcon-H1's cases check them)."""
    from tritonformer.backend.models import mamba2_lm

    cfg = shrunk("mamba-codestral-7b")
    assert mamba2_lm.from_hf(cfg).mamba.norm == "gated"
    assert mamba2_lm.from_hf({**cfg, "norm_before_gate": True}).mamba.norm == "before_gate"
    assert mamba2_lm.from_hf({**cfg, "rms_norm": False}).mamba.norm == "none"
