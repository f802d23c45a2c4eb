"""The many-row FP8 linear: per-token activation quantisation (a Triton kernel) and the FP8
tensor-core GEMM (torch._scaled_mm with row-wise scales).

Why: past a few dozen rows a linear is compute-bound, and Hopper's FP8 tensor cores run twice
the fp16 peak. Both operands must then be FP8: the weights are (kernels/fp8.py, one scale per
output channel), and the activations are quantised here per token, one scale per row (amax /
448), so an outlier token costs only its own row's precision. cuBLAS applies both scale vectors
in its epilogue: out[m, n] = scale_a[m] * scale_b[n] * sum_k a8[m, k] * w8[n, k].

One program quantises one row: its amax, then the scaled values cast to E4M3 (round to nearest,
the same as reference.quantize_rows_fp8). Rows up to _ONE_PASS_K elements are loaded once and
held in registers; longer ones are read twice (amax, then values), the second time from L2.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels import fp8
from tritonformer.kernels.fp8 import Fp8Weight

# The longest row a program holds in registers (one read of x); longer rows take two passes.
_ONE_PASS_K = 16384
_CHUNK_K = 4096  # the two-pass loop's chunk


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, stride_xm, K, MIN_AMAX: tl.constexpr, FP8_MAX: tl.constexpr,
                          BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr):
    """Row r of x `[M, K]` -> q[r] (E4M3, contiguous rows) and scale[r] = max(amax, MIN_AMAX) /
    FP8_MAX (fp32). Grid: (M,)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    q_row = q_ptr + row * K
    ks = tl.arange(0, BLOCK_K)
    if ONE_PASS:
        x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), MIN_AMAX) / FP8_MAX
        q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
        tl.store(q_row + ks, q.to(q_ptr.dtype.element_ty), mask=ks < K)
    else:
        amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_row + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0), MIN_AMAX) / FP8_MAX
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_row + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
            q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
            tl.store(q_row + k0 + ks, q.to(q_ptr.dtype.element_ty), mask=k0 + ks < K)
    tl.store(scale_ptr + row, scale)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.quantize_rows_fp8 on the GPU: (E4M3 `[M, K]`, fp32 scales `[M, 1]`) of x `[M, K]`
    (rows may be strided; the values come out contiguous, as torch._scaled_mm wants them)."""
    assert x.dim() == 2, f"x must be [M, K], got {list(x.shape)}"
    x = x if x.stride(1) == 1 else x.contiguous()
    m, k = x.shape
    q = torch.empty((m, k), dtype=fp8.E4M3, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, scale
    one_pass = k <= _ONE_PASS_K
    block = triton.next_power_of_2(k) if one_pass else _CHUNK_K
    warps = 4 if block <= 2048 else (8 if block <= 8192 else 16)
    _quantize_rows_kernel[(m,)](x, q, scale, x.stride(0), k, MIN_AMAX=fp8.MIN_AMAX, FP8_MAX=fp8.E4M3_MAX,
                                BLOCK_K=block, ONE_PASS=one_pass, num_warps=warps)
    return q, scale


def supported(x: torch.Tensor, weight: Fp8Weight) -> bool:
    """Whether torch._scaled_mm serves this linear: a GPU with a row-wise FP8 GEMM for the
    weight's activation dtype (fp8.scaled_mm_dtype), and K and N multiples of 16 (cuBLAS's FP8
    layouts)."""
    n, k = weight.shape
    return k % 16 == 0 and n % 16 == 0 and fp8.scaled_mm_dtype(x.device, weight.dtype) is not None


def scaled_mm(x: torch.Tensor, weight: Fp8Weight, out_dtype: torch.dtype | None = None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """x `[M, K]` @ W^T + bias `[M, N]` in the weight's activation dtype: x quantised per token, then the
    FP8 tensor-core GEMM with both scale vectors applied in its epilogue (reference.fp8_linear's
    many-row case). `bias` (`[N]`, the activation dtype) is added to the fp32 product before it is
    rounded: in the GEMM's epilogue where the GEMM writes the activation dtype (cuBLAS takes a
    16-bit bias there; a pass of its own over the output cost bert-base's (64, 512) forward 2.1 of
    its 14.2 ms on an H200), else to its fp32 output. `out_dtype`: the GEMM's own output dtype
    (default: what fp8.scaled_mm_dtype found for the device; tests on the CPU name one)."""
    q, scale = quantize_rows_fp8(x)
    out_dtype = out_dtype or fp8.scaled_mm_dtype(x.device, weight.dtype)
    fused = bias is not None and out_dtype == weight.dtype
    h = torch._scaled_mm(q, weight.data.t(), scale_a=scale, scale_b=weight.scale.view(1, -1),
                         bias=bias.to(out_dtype) if fused else None, out_dtype=out_dtype)
    if bias is not None and not fused:
        h = h.float().add_(bias.float())
    return h if h.dtype == weight.dtype else h.to(weight.dtype)
