"""Pick a Triton-language kernel or the PyTorch reference for each op.

A kernel registers itself with `register(op_name)`; it runs only for CUDA tensors and only
when Triton kernels are enabled (env `TRITONFORMER_KERNELS=reference` turns them off, which
is how the GPU tests compare the two paths in one process).
"""
from __future__ import annotations

import functools
import os
from typing import Callable

from tritonformer.kernels import reference

_KERNELS: dict[str, Callable] = {}


def register(op_name: str) -> Callable[[Callable], Callable]:
    def wrap(fn: Callable) -> Callable:
        _KERNELS[op_name] = fn
        return fn

    return wrap


def triton_kernels_enabled() -> bool:
    return os.environ.get("TRITONFORMER_KERNELS", "triton") != "reference"


def _dispatched(op_name: str) -> Callable:
    ref = getattr(reference, op_name)

    @functools.wraps(ref)
    def op(*args, **kwargs):
        kernel = _KERNELS.get(op_name)
        first = args[0] if args else None
        if kernel is not None and getattr(first, "is_cuda", False) and triton_kernels_enabled():
            return kernel(*args, **kwargs)
        return ref(*args, **kwargs)

    return op


add_bias_residual_layer_norm = _dispatched("add_bias_residual_layer_norm")
rms_norm = _dispatched("rms_norm")
bias_gelu = _dispatched("bias_gelu")
silu_and_mul = _dispatched("silu_and_mul")
softmax = _dispatched("softmax")
apply_rotary = _dispatched("apply_rotary")
qkv_split = _dispatched("qkv_split")
qkv_split_rotary = _dispatched("qkv_split_rotary")
varlen_attention = _dispatched("varlen_attention")
# Tables, not kernels: always computed by torch.
rotary_cos_sin = reference.rotary_cos_sin
