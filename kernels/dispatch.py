"""Pick a Triton-language kernel or the PyTorch reference for each op.

A kernel registers itself with `register(op_name)`; it runs only for CUDA tensors and only
when Triton kernels are enabled (env `TRITONFORMER_KERNELS=reference` turns them off, which
is how the GPU tests compare the two paths in one process).
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Callable

from tritonformer.kernels import reference

_KERNELS: dict[str, Callable] = {}
log = logging.getLogger("tritonformer")


def register(op_name: str) -> Callable[[Callable], Callable]:
    def wrap(fn: Callable) -> Callable:
        _KERNELS[op_name] = fn
        return fn

    return wrap


def triton_kernels_enabled() -> bool:
    return os.environ.get("TRITONFORMER_KERNELS", "triton") != "reference"


# Modules holding the Triton-language kernels; imported on the first CUDA call only, so the
# CPU path never imports triton (and works without it installed).
_KERNEL_MODULES = ("triton_norms", "triton_elementwise", "triton_attention", "triton_gemm", "triton_small_gemm",
                   "triton_pooling", "triton_sampling", "triton_decode_steps", "triton_rotary", "triton_moe",
                   "triton_mla", "triton_recurrent", "triton_kda", "triton_recurrent_prefill",
                   "triton_lightning", "triton_disentangled_attention",
                   "triton_relative_attention", "triton_rglru", "triton_cca", "triton_wkv4", "triton_mlstm")
_loaded = False


def load_kernels() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib

    for name in _KERNEL_MODULES:
        try:
            importlib.import_module(f"tritonformer.kernels.{name}")
        except ImportError as e:  # no triton: every op runs its reference
            log.warning("Triton kernels unavailable (%s); using the PyTorch reference ops", e)
            return


def _dispatched(op_name: str) -> Callable:
    ref = getattr(reference, op_name)

    @functools.wraps(ref)
    def op(*args, **kwargs):
        first = args[0] if args else None
        if getattr(first, "is_cuda", False) and triton_kernels_enabled():
            load_kernels()
            kernel = _KERNELS.get(op_name)
            if kernel is not None:
                return kernel(*args, **kwargs)
        return ref(*args, **kwargs)

    return op


add_bias_residual_layer_norm = _dispatched("add_bias_residual_layer_norm")
embedding_layer_norm = _dispatched("embedding_layer_norm")
rms_norm = _dispatched("rms_norm")
embedding_rms_norm = _dispatched("embedding_rms_norm")
segment_rms_norms = _dispatched("segment_rms_norms")
embedding_part = _dispatched("embedding_part")
bias_gelu = _dispatched("bias_gelu")
linear_bias_gelu = _dispatched("linear_bias_gelu")
linear_act = _dispatched("linear_act")
prenormed = _dispatched("prenormed")
moe_mlp = _dispatched("moe_mlp")
silu_and_mul = _dispatched("silu_and_mul")
gated_act = _dispatched("gated_act")
sigmoid_mul = _dispatched("sigmoid_mul")
xielu = _dispatched("xielu")
feed_tokens = _dispatched("feed_tokens")
argmax_rows = _dispatched("argmax_rows")
apply_penalties = _dispatched("apply_penalties")
advance_decode_inputs = _dispatched("advance_decode_inputs")
pool_sequences = _dispatched("pool_sequences")
softmax = _dispatched("softmax")
apply_rotary = _dispatched("apply_rotary")
rotary_in_place = _dispatched("rotary_in_place")
qkv_split = _dispatched("qkv_split")
qkv_split_rotary = _dispatched("qkv_split_rotary")
varlen_attention = _dispatched("varlen_attention")
disentangled_attention = _dispatched("disentangled_attention")
relative_bias_attention = _dispatched("relative_bias_attention")
paged_attention = _dispatched("paged_attention")
write_kv = _dispatched("write_kv")
mla_latent_norms = _dispatched("mla_latent_norms")
mla_kv_to_cache = _dispatched("mla_kv_to_cache")
conv1d_decode = _dispatched("conv1d_decode")
conv1d_chunk = _dispatched("conv1d_chunk")
cca_conv_decode = _dispatched("cca_conv_decode")
gated_delta_chunk = _dispatched("gated_delta_chunk")
gated_delta_decode = _dispatched("gated_delta_decode")
gated_rms_norm = _dispatched("gated_rms_norm")
kda_decode = _dispatched("kda_decode")
kda_gated_norm = _dispatched("kda_gated_norm")
kda_chunk = _dispatched("kda_chunk")
lightning_decode = _dispatched("lightning_decode")
lightning_chunk = _dispatched("lightning_chunk")
ssd_chunk = _dispatched("ssd_chunk")
ssd_decode = _dispatched("ssd_decode")
mamba_gated_norm = _dispatched("mamba_gated_norm")
mamba_gated_squares = _dispatched("mamba_gated_squares")
selective_scan_decode = _dispatched("selective_scan_decode")
selective_scan_chunk = _dispatched("selective_scan_chunk")
rglru_decode = _dispatched("rglru_decode")
wkv4 = _dispatched("wkv4")
mlstm_decode = _dispatched("mlstm_decode")
qkv_to_cache = _dispatched("qkv_to_cache")
qk_squares = _dispatched("qk_squares")
# Tables, not kernels: always computed by torch.
rotary_cos_sin = reference.rotary_cos_sin
gelu_activation = reference.gelu_activation
prenorm_qkv_to_cache = _dispatched("prenorm_qkv_to_cache")
