"""Zeroed scratch for kernels whose last program to arrive finishes the work.

Split K in the small GEMM and the split greedy argmax both count their programs in on a
counter (and the argmax keeps its best so far beside it); the program that arrives last reads
what the others left, writes the result and sets its words back to zero, so the scratch is
zero again between launches and no launch clears it first.

One buffer per device, stream and dtype: launches on one stream never overlap, but two
streams' could (the stream is kept referenced, so its handle is not reused by another). A
buffer only grows, and the one it replaces stays alive: a CUDA graph captured with it keeps
its address.
"""
from __future__ import annotations

import torch

HELD: dict = {}  # (device, stream handle, dtype) -> (buffer, stream, the buffer it replaced)


def zeroed(device: torch.device, n: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """At least `n` words of `dtype` on `device`, zero between launches."""
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    key = (device, None if stream is None else stream.cuda_stream, dtype)
    held = HELD.get(key)
    if held is None or held[0].numel() < n:
        buffer = torch.zeros(max(4096, n), dtype=dtype, device=device)
        held = HELD[key] = (buffer, stream, held)
    return held[0]
