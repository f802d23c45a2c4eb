"""Reading a sequence's keys back out of the paged KV cache in PyTorch ops, for the families whose attention the
paged kernels cannot take (HY-V4's and MiniMax-M3's per-query choice of keys; Inkling's relative logits):
`table_slots` turns block tables into cache slots in position order, so `cache.keys(layer).view(-1, ...)[slots]` is
a sequence's keys `[L, ...]`, and `causal_mask` is the mask of a prompt chunk's queries over them. Runs on the CPU.
"""
from __future__ import annotations

import torch


def table_slots(tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """Every cache slot of each row's block table `[R, width]`, in position order: `[R, width * block_size]`."""
    offsets = torch.arange(block_size, device=tables.device)
    return (tables.long()[:, :, None] * block_size + offsets).flatten(1)


def causal_mask(rows: int, length: int, device) -> torch.Tensor:
    """The causal mask `[rows, length]` of a sequence's last `rows` positions over its `length` keys."""
    query = torch.arange(length - rows, length, device=device)
    return torch.arange(length, device=device)[None, :] <= query[:, None]
