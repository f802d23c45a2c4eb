"""Perplexity of a decoder of ours over a token sequence (FP8 accuracy: tests/test_fp8.py and
tools/gpu/fp8_report.py measure it the same way)."""
from __future__ import annotations

import math

import torch


def forward_all(model, ids: list[int]) -> torch.Tensor:
    """Logits of every row of one fresh sequence `ids`."""
    from tritonformer.backend.decoder.batch import BatchEntry, build_batch

    cache = model.new_kv_cache(-(-len(ids) // 16) + 1, 16)
    batch = build_batch([BatchEntry(ids, 0, list(range(cache.num_blocks)), True)], 16, model.device)
    batch.logits_index = torch.arange(len(ids), device=model.device)
    return model.forward(batch, cache)


def perplexity(model, ids: list[int], window: int = 1024) -> float:
    """exp(mean next-token NLL) of `ids` in non-overlapping windows, each a fresh sequence."""
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window + 1]
        if len(chunk) < 2:
            break
        logits = forward_all(model, chunk[:-1])
        target = torch.tensor(chunk[1:], device=model.device)
        nll += torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum").item()
        count += len(chunk) - 1
    return math.exp(nll / count)
