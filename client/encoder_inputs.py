"""Random inputs for the encoder's forward, packed as it takes them: what the encoder benchmark
and the GPU tools run it on."""
from __future__ import annotations


def packed_batch(lengths: list[int], device):
    """Random token ids for sequences of these lengths, packed: (ids, cu_seqlens, max length),
    the encoder's forward arguments."""
    import numpy as np
    import torch

    ids = torch.randint(1000, 20000, (sum(lengths),), device=device)
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32, device=device)
    return ids, cu, max(lengths)
