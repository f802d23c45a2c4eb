"""Facts about the GPU that launch configurations depend on, looked up once per device."""
from __future__ import annotations

import functools

import torch


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device ("cuda" without an index: the current one)."""
    return _sm_count(_index(device))


def hopper_or_newer(device: torch.device) -> bool:
    """Whether `device` is a CUDA GPU of compute capability 9 or more (TMA, programmatic
    dependent launch)."""
    return device.type == "cuda" and _major(_index(device)) >= 9


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]
