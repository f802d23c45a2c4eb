"""Arrival counters for kernels whose last program finishes a reduction the others began.

Split K (triton_small_gemm.py) cuts one output into parts computed by separate programs; each
program stores its part and adds 1 to its group's counter, and the one that sees it was last
combines the parts and resets the counter to 0. So a counter is zero between launches, and the
buffers are allocated once, not per launch (a CUDA graph captures their addresses). (The decode
attention's split keys tried the same and lost to a second small kernel: docs/benchmarks.md,
"Decode attention with split keys".)
"""
from __future__ import annotations

import torch

_HELD: dict = {}
MIN_COUNTERS = 4096


def zeroed(device: torch.device, count: int, owner: str) -> torch.Tensor:
    """At least `count` int32 counters, zero between launches, for `owner`'s kernels. One set
    per owner, device and stream: launches on one stream never overlap, but two streams'
    could (the stream is kept referenced, so its handle is not reused by another). A set only
    grows: a graph captured with it keeps its address, so the old set stays alive too."""
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    key = (owner, device, None if stream is None else stream.cuda_stream)
    held = _HELD.get(key)
    if held is None or held[0].numel() < count:
        counters = torch.zeros(max(MIN_COUNTERS, count), dtype=torch.int32, device=device)
        held = _HELD[key] = (counters, stream, held)
    return held[0]


def all_zero() -> bool:
    """Whether every counter of every set is back at zero (tests: each launch reset its own)."""
    return not any(held[0].any() for held in _HELD.values())
