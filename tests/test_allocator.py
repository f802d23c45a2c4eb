"""The activation allocator (TurboTransformers Algorithm 1): plans on random usage graphs."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonformer.backend.encoder.activation_arena import (
    ALIGN,
    DEFAULT_CHUNK_BYTES,
    ActivationArena,
    UsageRecord,
    peak_live_bytes,
    plan_chunks,
)


@st.composite
def usage_graphs(draw):
    n_ops = draw(st.integers(1, 30))
    records = []
    for i in range(draw(st.integers(1, 25))):
        first = draw(st.integers(0, n_ops - 1))
        last = draw(st.integers(first, n_ops - 1))
        size = draw(st.integers(1, 6 * 1024 * 1024))
        records.append(UsageRecord(f"t{i}", first, last, size))
    existing = draw(st.lists(st.integers(1, 4 * 1024 * 1024), max_size=3))
    return records, existing


@given(usage_graphs())
@settings(max_examples=300, deadline=None)
def test_no_two_live_tensors_overlap_and_all_fit(graph):
    records, existing = graph
    where, sizes = plan_chunks(records, existing)
    assert sizes[: len(existing)] == existing  # existing chunks are kept as they are
    for r in records:
        chunk, offset = where[r.name]
        assert offset % ALIGN == 0
        assert 0 <= offset and offset + r.size <= sizes[chunk]  # inside its chunk
    for i, a in enumerate(records):
        for b in records[i + 1 :]:
            if not a.overlaps(b) or where[a.name][0] != where[b.name][0]:
                continue
            oa, ob = where[a.name][1], where[b.name][1]
            assert oa + a.size <= ob or ob + b.size <= oa, (a, b, oa, ob)  # disjoint bytes
    for size in sizes[len(existing) :]:  # new chunks: max(2 MiB, 1.2 x the tensor that opened it)
        assert size >= DEFAULT_CHUNK_BYTES


def test_paper_example_bert_layer_seq_200_then_240():
    """TurboTransformers Fig. 6: batch 1, fp32, hidden 768 (op indices as in the figure)."""

    def layer(seq):
        h = seq * 768 * 4
        return [
            UsageRecord("qkv_out", 0, 1, 3 * h), UsageRecord("q", 1, 2, h), UsageRecord("k", 1, 2, h),
            UsageRecord("v", 1, 3, h), UsageRecord("attn_score", 2, 3, seq * seq * 4),
            UsageRecord("ctx_layer", 3, 4, h), UsageRecord("trans_out", 4, 5, h),
            UsageRecord("attn_out", 5, 6, h), UsageRecord("intermediate_out", 7, 8, 4 * h),
            UsageRecord("layer_out", 6, 8, h),
        ]

    _, sizes = plan_chunks(layer(200), [])
    assert sizes[0] == 2949120  # 1.2 x intermediate_out (2457600 B)
    _, sizes240 = plan_chunks(layer(240), sizes)
    assert sizes240[: len(sizes)] == sizes and len(sizes240) >= len(sizes)


def test_arena_views_plan_cache_and_release():
    arena = ActivationArena(torch.device("cpu"), release_after_idle=0)
    small = [UsageRecord("a", 0, 1, 1000), UsageRecord("b", 1, 2, 3000)]
    plan = arena.plan(small)
    a = arena.view(plan, "a", (250,), torch.float32)
    b = arena.view(plan, "b", (750,), torch.float32)
    a.fill_(1.0)
    b.fill_(2.0)
    assert a.sum().item() == 250 and b.sum().item() == 1500  # live together, so disjoint
    assert arena.plan(small) == plan and arena.stats.plan_cache_hits == 1
    big = [UsageRecord("a", 0, 1, 64 * 1024 * 1024)]  # one long request
    arena.plan(big)
    assert arena.stats.reserved_bytes > 64 * 1024 * 1024
    arena.plan(small)  # back to short requests: the big chunk goes at once
    assert arena.stats.reserved_bytes <= DEFAULT_CHUNK_BYTES
    assert peak_live_bytes(small) == 1024 + 3072  # a and b overlap at op 1 (sizes aligned to 256)

    lazy = ActivationArena(torch.device("cpu"), release_after_idle=2)
    lazy.plan(big)
    lazy.plan(small)
    lazy.plan(small)
    assert lazy.stats.reserved_bytes > 64 * 1024 * 1024  # kept for 2 idle inferences
    lazy.plan(small)
    assert lazy.stats.reserved_bytes <= 2 * DEFAULT_CHUNK_BYTES


def test_encoder_forward_in_the_arena_matches_plain_forward(minilm_dir):
    """Every intermediate of the encoder lives in planned arena views: same result, one plan
    per shape, reused across layers and calls; memory comes back after a long batch."""
    from tritonformer.backend.models.bert import BertConfig, BertEncoder
    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict

    model = BertEncoder(
        BertConfig.from_hf(load_config(minilm_dir)), load_state_dict(minilm_dir), torch.device("cpu"), torch.float32
    )
    arena = ActivationArena(torch.device("cpu"), release_after_idle=0)
    gen = torch.Generator().manual_seed(0)
    for lengths in ([7], [30, 2, 100], [7], [512, 512, 300], [5, 6]):
        ids = torch.randint(1000, 30000, (sum(lengths),), generator=gen)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        expected = model.forward(ids, cu)
        got = model.forward(ids, cu, arena=arena)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert arena.stats.plan_cache_hits == 1  # [7] twice
    assert arena.stats.plan_cache_misses == 4
    # After the 1324-token batch, short batches leave at most one default-size chunk.
    assert arena.stats.reserved_bytes <= DEFAULT_CHUNK_BYTES

