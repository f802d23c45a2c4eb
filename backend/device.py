"""Where and in which precision a model runs: GPU when there is one, the CPU otherwise."""
from __future__ import annotations

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def pick_device(setting: str, instance_device_id: int = 0) -> torch.device:
    """setting: "auto" (CUDA if available), "cpu" or "cuda"."""
    if setting == "cpu":
        return torch.device("cpu")
    if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("parameter device=cuda but no CUDA GPU is visible to this process")
        # Triton does not set CUDA_VISIBLE_DEVICES per instance: the instance's GPU. Not selected
        # here (a CUDA context costs hundreds of MiB of GPU memory): the engine's builder selects
        # it in the process that runs the model, and a stub whose engine runs in an engine
        # process never holds a context.
        return torch.device("cuda", instance_device_id % torch.cuda.device_count())
    return torch.device("cpu")


def pick_dtype(setting: str, device: torch.device) -> torch.dtype:
    """setting: "auto" (float16 on GPU, float32 on CPU) or a dtype name."""
    if setting == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return _DTYPES[setting]


DTYPE_CHOICES = ("auto", *_DTYPES)


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host->device copy that does not wait for the GPU. A blocking copy, or one from pageable
    memory, synchronises the stream: it would wait for every kernel queued before it (the
    previous iteration's forward), which is exactly the overlap the decoder engine relies on.
    The pinned staging block comes from torch's caching host allocator, which does not hand it
    out again before this copy has run."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def copy_to_device_(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) from host memory, without waiting for the GPU (see to_device_async)."""
    if dst.is_cuda:
        dst.copy_(src.pin_memory(), non_blocking=True)
    else:
        dst.copy_(src)
