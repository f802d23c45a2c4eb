"""tritonformer.kernels: the ops the runtime is built from.

Every op has a plain-PyTorch reference (`reference.py`) that defines its semantics. The
dispatcher below runs a Triton-language kernel for an op when one is registered and the
tensors are on a CUDA device, and the reference otherwise (CPU, or an op without a kernel).
"""
from tritonformer.kernels.dispatch import (  # noqa: F401
    add_bias_residual_layer_norm,
    advance_decode_inputs,
    apply_rotary,
    argmax_rows,
    apply_penalties,
    bias_gelu,
    conv1d_decode,
    embedding_layer_norm,
    embedding_part,
    embedding_rms_norm,
    feed_tokens,
    gated_act,
    gated_delta_decode,
    gated_rms_norm,
    gelu_activation,
    linear_act,
    linear_bias_gelu,
    mamba_gated_norm,
    mla_kv_to_cache,
    mla_latent_norms,
    moe_mlp,
    qkv_split,
    qkv_split_rotary,
    qkv_to_cache,
    rms_norm,
    rotary_cos_sin,
    rotary_in_place,
    sigmoid_mul,
    silu_and_mul,
    softmax,
    ssd_decode,
    triton_kernels_enabled,
    paged_attention,
    pool_sequences,
    prenorm_qkv_to_cache,
    prenormed,
    varlen_attention,
    write_kv,
    xielu,
)
from tritonformer.kernels.reference import GATED_ACTIVATIONS, PreNorm  # noqa: F401
from tritonformer.kernels.fp8 import Fp8Weight, quantize_weight  # noqa: F401
