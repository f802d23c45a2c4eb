"""Coalescing of streamed responses when the sender falls behind."""
from __future__ import annotations

import numpy as np

from tritonformer.backend.responses import coalesce


def piece(text, ids, finish=None):
    out = {"text_output": np.array([text.encode()], dtype=np.object_), "output_ids": np.array(ids, dtype=np.int32)}
    if finish:
        out["finish_reason"] = np.array([finish.encode()], dtype=np.object_)
    return out


def test_pieces_of_one_stream_merge_in_order_and_keep_final():
    a, b = object(), object()
    items = [
        (a, piece("Hel", [1]), None, False),
        (b, piece("x", [9]), None, False),
        (a, piece("lo", [2]), None, False),
        (a, piece("!", [3], "stop"), None, True),
        (b, piece("y", [8]), None, False),
    ]
    merged = coalesce(items)
    assert [m[0] for m in merged] == [a, b]
    (ha, oa, ea, fa), (hb, ob, eb, fb) = merged
    assert oa["text_output"][0] == b"Hello!" and oa["output_ids"].tolist() == [1, 2, 3]
    assert oa["finish_reason"][0] == b"stop" and fa and ea is None
    assert ob["text_output"][0] == b"xy" and ob["output_ids"].tolist() == [9, 8] and not fb


def test_errors_and_non_stream_outputs_are_never_merged():
    a = object()
    err = RuntimeError("boom")
    items = [(a, piece("a", [1]), None, False), (a, None, err, True)]
    assert coalesce(items) == items
    emb = {"embedding": np.zeros((1, 4), dtype=np.float32)}
    h1, h2 = object(), object()
    assert len(coalesce([(h1, emb, None, True), (h2, emb, None, True)])) == 2


def test_nothing_after_final_is_merged_into_it():
    a = object()
    items = [(a, piece("a", [1], "stop"), None, True), (a, piece("b", [2]), None, False)]
    assert len(coalesce(items)) == 2
