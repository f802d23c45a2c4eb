"""The gated DeltaNet mixer (backend/models/gated_deltanet.py) on random inputs, CPU fp32: its chunked form (prompt
chunks) against its own one-token recurrence (decode rows), and both against transformers' torch fallbacks of the
gated delta rule; the mixer over DecoderBatches, a prompt in chunks beside decodes, against the same tokens one
iteration each. The family tests (test_decoder_families.py) check whole models against HF."""
from __future__ import annotations

import pytest
import torch

from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.state_cache import StateCache
from tritonformer.backend.models.gated_deltanet import DeltaNetSpec, GatedDeltaNet, l2_normalised
from tritonformer.kernels.reference import gated_delta_chunk, gated_delta_step as recurrent_step


def _inputs(heads: int, length: int, kd: int, vd: int, seed: int):
    """q, k (normalised, q scaled), v, g (log decays, some strong), beta, and a nonzero starting state."""
    g = torch.Generator().manual_seed(seed)
    q = l2_normalised(torch.randn(heads, length, kd, generator=g)) * kd ** -0.5
    k = l2_normalised(torch.randn(heads, length, kd, generator=g))
    v = torch.randn(heads, length, vd, generator=g)
    decay = -torch.rand(heads, length, generator=g) * torch.tensor([0.05, 0.5, 2.0, 8.0])[:heads, None]
    beta = torch.rand(heads, length, generator=g)
    state = torch.randn(heads, kd, vd, generator=g) * 0.5
    return q, k, v, decay, beta, state


def chunked_rule(state, q, k, v, g, beta):
    """The chunked form (reference.gated_delta_chunk) on one sequence held per head first: state `[H, K, V]`, q,
    k `[H, T, K]`, v `[H, T, V]`, g, beta `[H, T]`; returns (o `[H, T, V]`, the state after the last token)."""
    held = state[None].clone()
    o = gated_delta_chunk(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.t(), beta.t(), held,
                          torch.zeros(1, dtype=torch.long))
    return o.transpose(0, 1), held[0]


def _recurrent(state, q, k, v, g, beta):
    """The rule one token at a time (recurrent_step over a batch of one)."""
    out = []
    s = state[None]
    for t in range(k.shape[1]):
        o, s = recurrent_step(s, q[None, :, t], k[None, :, t], v[None, :, t], g[None, :, t], beta[None, :, t])
        out.append(o[0])
    return torch.stack(out, 1), s[0]


@pytest.mark.parametrize("length", [1, 37, 64, 150])
def test_chunked_form_equals_the_recurrence_and_continues_from_its_state(length):
    q, k, v, g, beta, state = _inputs(4, length, 16, 24, seed=length)
    want, want_state = _recurrent(state, q, k, v, g, beta)
    got, got_state = chunked_rule(state, q, k, v, g, beta)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_state, want_state, atol=1e-5, rtol=1e-5)
    cut = length // 3  # a prompt in two chunks: the second from the state the first left
    first, mid = chunked_rule(state, q[:, :cut], k[:, :cut], v[:, :cut], g[:, :cut], beta[:, :cut])
    second, end = chunked_rule(mid, q[:, cut:], k[:, cut:], v[:, cut:], g[:, cut:], beta[:, cut:])
    torch.testing.assert_close(torch.cat([first, second], 1), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(end, want_state, atol=1e-5, rtol=1e-5)


def test_the_rule_equals_transformers_torch_fallbacks():
    """From raw q / k of 2 key heads, each serving 2 value heads: our normalisation, grouping and both forms
    against torch_chunk_gated_delta_rule and torch_recurrent_gated_delta_rule (qk L2 norm in the kernel)."""
    hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    g = torch.Generator().manual_seed(3)
    length, nk, nv, kd, vd = 100, 2, 4, 16, 8
    q, k = torch.randn(1, length, nk, kd, generator=g), torch.randn(1, length, nk, kd, generator=g)
    v = torch.randn(1, length, nv, vd, generator=g)
    decay = -torch.rand(1, length, nv, generator=g) * 3
    beta = torch.rand(1, length, nv, generator=g)
    state = torch.randn(1, nv, kd, vd, generator=g)
    want, want_state = hf.torch_chunk_gated_delta_rule(q, k, v, decay, beta, initial_state=state.clone(),
                                                       output_final_state=True, use_qk_l2norm_in_kernel=True)
    want_steps, want_steps_state = hf.torch_recurrent_gated_delta_rule(
        q, k, v, decay, beta, initial_state=state.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True)
    ours_q = (l2_normalised(q[0]) * kd ** -0.5).repeat_interleave(nv // nk, 1).transpose(0, 1)
    ours_k = l2_normalised(k[0]).repeat_interleave(nv // nk, 1).transpose(0, 1)
    args = (ours_q, ours_k, v[0].transpose(0, 1), decay[0].t(), beta[0].t())
    got, got_state = chunked_rule(state[0], *args)
    torch.testing.assert_close(got.transpose(0, 1), want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_state, want_state[0], atol=1e-5, rtol=1e-5)
    steps, steps_state = _recurrent(state[0], *args)
    torch.testing.assert_close(steps.transpose(0, 1), want_steps[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(steps_state, want_steps_state[0], atol=1e-5, rtol=1e-5)


def _mixer(seed: int = 0) -> GatedDeltaNet:
    spec = DeltaNetSpec(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=12, conv_kernel=4, norm_eps=1e-6)
    hidden = 32
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    return GatedDeltaNet(spec, rand(2 * spec.key_dim + 2 * spec.value_dim + 2 * spec.num_v_heads, hidden),
                         rand(spec.conv_dim, spec.conv_kernel, scale=0.5), rand(spec.num_v_heads),
                         rand(spec.num_v_heads, scale=1.0), 1 + rand(spec.head_v_dim), rand(hidden, spec.value_dim))


def _batch(slots: list[int], num_decode: int, prefill_lens: tuple[int, ...]) -> DecoderBatch:
    rows = num_decode + sum(prefill_lens)
    blank = torch.zeros(rows, dtype=torch.long)  # (what the mixer does not read)
    return DecoderBatch(input_ids=blank, positions=blank, slot_mapping=blank, logits_index=blank,
                        num_decode=num_decode, state_slots=torch.tensor(slots), prefill_lens=prefill_lens)


def test_the_mixer_carries_each_sequences_state_across_chunks_and_decodes():
    """Sequence A's 40-token prompt in chunks of 25 and 15, then decodes beside B, whose 70-token prompt (past a
    64-token chunk of the rule) runs in the same iteration as A's second chunk, and C joining with one token:
    every row and the states left equal each sequence run alone one token per iteration."""
    mixer = _mixer()
    x = {s: torch.randn(n, 32, generator=torch.Generator().manual_seed(i)) for i, (s, n) in
         enumerate({"A": 43, "B": 72, "C": 2}.items())}
    slot = {"A": 0, "B": 2, "C": 1}
    cache = StateCache([mixer.state_shapes], num_slots=3, device=torch.device("cpu"))
    state = cache.layer(0)
    # iterations: (decode rows: (seq, row)), (prompt chunks: (seq, rows))
    plan = [([], [("A", slice(0, 25))]),
            ([], [("A", slice(25, 40)), ("B", slice(0, 70))]),
            ([("A", 40), ("C", 0)], []),
            ([("B", 70), ("A", 41), ("C", 1)], []),
            ([("A", 42), ("B", 71)], [])]
    got = {s: torch.empty_like(t) for s, t in x.items()}
    for decodes, chunks in plan:
        rows = [x[s][r : r + 1] for s, r in decodes] + [x[s][part] for s, part in chunks]
        batch = _batch([slot[s] for s, _ in decodes] + [slot[s] for s, _ in chunks], len(decodes),
                       tuple(part.stop - part.start for _, part in chunks))
        out = mixer(torch.cat(rows), None, batch, state)
        for i, (s, r) in enumerate(decodes):
            got[s][r] = out[i]
        row = len(decodes)
        for s, part in chunks:
            got[s][part] = out[row : row + part.stop - part.start]
            row += part.stop - part.start
    alone = StateCache([mixer.state_shapes], num_slots=1, device=torch.device("cpu"))
    for s, t in x.items():
        alone.reset([0])
        want = torch.cat([mixer(t[i : i + 1], None, _batch([0], 1, ()), alone.layer(0)) for i in range(len(t))])
        torch.testing.assert_close(got[s], want, atol=1e-5, rtol=1e-5)
        for name in ("conv", "recurrent"):
            torch.testing.assert_close(state[name][slot[s]], alone.layer(0)[name][0], atol=1e-5, rtol=1e-5)
