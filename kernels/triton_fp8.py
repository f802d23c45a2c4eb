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

An activation fused into the quantisation (`act_quantize_rows_fp8`, reference.act_quantize_rows_fp8):
an FFN's up projection writes its 16-bit output h (bias added in the GEMM's epilogue); the
activation pass would read h and write act(h), and the down projection's quantisation read
act(h) once more. Here one pass reads h, computes act(h) in fp32, rounds it to h's dtype in
registers (the value the activation pass would have stored: same numerics as the unfused
path) and quantises that, writing only the E4M3 values and the row scales (an
fp8.Fp8Activation, which `scaled_mm` takes as x without quantising again). bert-base at
(64, 512) on an H200 spent ~3.1 of its 13.1 ms FP8 forward in the per-token quantisation
passes and the GELU pass, before this.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonformer.kernels import fp8
from tritonformer.kernels.fp8 import Fp8Activation, Fp8Weight
from tritonformer.kernels.reference import FP8_OUT_ACTIVATIONS
from tritonformer.kernels.triton_elementwise import ACT_CODE, apply_act

# The longest row a program holds in registers (one read of x); longer rows take two passes.
_ONE_PASS_K = 16384
_CHUNK_K = 4096  # the two-pass loop's chunk


@triton.jit
def _row_values(x_row, ks, k_ok, ACT: tl.constexpr):
    """Elements `ks` of a row as the quantisation reads them, in fp32; with an activation
    (ACT_CODE's, not a gated one), act(x) computed in fp32 and rounded to x's dtype first: the
    value the unfused activation pass would have written."""
    x = tl.load(x_row + ks, mask=k_ok, other=0.0)  # masked: 0, and act(0) = 0 leaves the amax alone
    if ACT != 0:
        x = apply_act(x.to(tl.float32), x, ACT).to(x.dtype)
    return x.to(tl.float32)


@triton.jit
def _quantize_row(x_ptr, q_ptr, scale_ptr, stride_xm, K, MIN_AMAX: tl.constexpr, FP8_MAX: tl.constexpr,
                  BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr, ACT: tl.constexpr):
    """This program's row r of x `[M, K]` -> q[r] (E4M3, contiguous rows) and scale[r] =
    max(amax, MIN_AMAX) / FP8_MAX (fp32), of act(x) where ACT is set (`_row_values`)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    q_row = q_ptr + row * K
    ks = tl.arange(0, BLOCK_K)
    if ONE_PASS:
        x = _row_values(x_row, ks, ks < K, ACT)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), MIN_AMAX) / FP8_MAX
        q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
        tl.store(q_row + ks, q.to(q_ptr.dtype.element_ty), mask=ks < K)
    else:
        amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = _row_values(x_row, k0 + ks, k0 + ks < K, ACT)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0), MIN_AMAX) / FP8_MAX
        for k0 in range(0, K, BLOCK_K):  # the activation again: compute, against a third pass over memory
            x = _row_values(x_row, k0 + ks, k0 + ks < K, ACT)
            q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
            tl.store(q_row + k0 + ks, q.to(q_ptr.dtype.element_ty), mask=k0 + ks < K)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, stride_xm, K, MIN_AMAX: tl.constexpr, FP8_MAX: tl.constexpr,
                          BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr):
    """Row r of x `[M, K]` -> q[r] and scale[r] (`_quantize_row`). Grid: (M,)."""
    _quantize_row(x_ptr, q_ptr, scale_ptr, stride_xm, K, MIN_AMAX, FP8_MAX, BLOCK_K, ONE_PASS, 0)


@triton.jit
def _act_quantize_rows_kernel(h_ptr, q_ptr, scale_ptr, stride_hm, K, MIN_AMAX: tl.constexpr,
                              FP8_MAX: tl.constexpr, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr,
                              ACT: tl.constexpr):
    """Row r of act(h) `[M, K]` -> q[r] and scale[r] (`_quantize_row`), act(h) never stored: a
    kernel of its own name, so a profile tells the fused pass from a plain quantisation. Grid: (M,)."""
    _quantize_row(h_ptr, q_ptr, scale_ptr, stride_hm, K, MIN_AMAX, FP8_MAX, BLOCK_K, ONE_PASS, ACT)


def _quantize(x: torch.Tensor, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 `[M, K]`, fp32 scales `[M, 1]`) of activation(x), x `[M, K]` with rows of any stride."""
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
    consts = dict(MIN_AMAX=fp8.MIN_AMAX, FP8_MAX=fp8.E4M3_MAX, BLOCK_K=block, ONE_PASS=one_pass, num_warps=warps)
    if activation == "none":
        _quantize_rows_kernel[(m,)](x, q, scale, x.stride(0), k, **consts)
    else:
        _act_quantize_rows_kernel[(m,)](x, q, scale, x.stride(0), k, ACT=ACT_CODE[activation], **consts)
    return q, scale


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.quantize_rows_fp8 on the GPU: (E4M3 `[M, K]`, fp32 scales `[M, 1]`) of x `[M, K]`
    (rows may be strided; the values come out contiguous, as torch._scaled_mm wants them)."""
    return _quantize(x, "none")


def act_quantize_rows_fp8(h: torch.Tensor, activation: str = "none") -> Fp8Activation:
    """reference.act_quantize_rows_fp8 on the GPU: activation(h) of h `[M, N]` (16-bit, or fp32
    in tests; rows may be strided) quantised per token in one pass, as an Fp8Activation."""
    if activation not in FP8_OUT_ACTIVATIONS:
        raise ValueError(f"activation must be one of {FP8_OUT_ACTIVATIONS}, got {activation!r}")
    q, scale = _quantize(h, activation)
    return Fp8Activation(q, scale, h.dtype)


def supported(x: torch.Tensor, weight: Fp8Weight) -> bool:
    """Whether torch._scaled_mm serves this linear: a GPU with a row-wise FP8 GEMM for the
    weight's activation dtype (fp8.scaled_mm_dtype), and K and N multiples of 16 (cuBLAS's FP8
    layouts)."""
    n, k = weight.shape
    return k % 16 == 0 and n % 16 == 0 and fp8.scaled_mm_dtype(x.device, weight.dtype) is not None


def scaled_mm(x: torch.Tensor | Fp8Activation, weight: Fp8Weight, out_dtype: torch.dtype | None = None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """x `[M, K]` @ W^T + bias `[M, N]` in the weight's activation dtype: x quantised per token (an
    Fp8Activation x is that already: no pass of its own), then the FP8 tensor-core GEMM with both
    scale vectors applied in its epilogue (reference.fp8_linear's many-row case). `bias` (`[N]`,
    the activation dtype) is added to the fp32 product before it is rounded: in the GEMM's
    epilogue where the GEMM writes the activation dtype (cuBLAS takes a 16-bit bias there; a pass
    of its own over the output cost bert-base's (64, 512) forward 2.1 of its 14.2 ms on an H200),
    else to its fp32 output. `out_dtype`: the GEMM's own output dtype
    (default: what fp8.scaled_mm_dtype found for the device; tests on the CPU name one)."""
    q, scale = (x.q, x.scale) if isinstance(x, Fp8Activation) else quantize_rows_fp8(x)
    out_dtype = out_dtype or fp8.scaled_mm_dtype(x.device, weight.dtype)
    fused = bias is not None and out_dtype == weight.dtype
    h = torch._scaled_mm(q, weight.data.t(), scale_a=scale, scale_b=weight.scale.view(1, -1),
                         bias=bias.to(out_dtype) if fused else None, out_dtype=out_dtype)
    if bias is not None and not fused:
        h = h.float().add_(bias.float())
    return h if h.dtype == weight.dtype else h.to(weight.dtype)
