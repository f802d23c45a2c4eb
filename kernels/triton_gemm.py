"""Triton-language GEMM with bias + GELU fused into its epilogue, for many rows: BERT's FFN
up-projection on big packed batches (few rows go to `triton_small_gemm`).

Why fuse: the FFN's first GEMM writes a `[tokens, 4 * hidden]` activation (3072 columns for
bert-base), the widest tensor of the layer. Unfused, that tensor goes to memory once from the
GEMM, is read back and written again by the bias + GELU kernel, and read once more by the
down-projection: the bias + GELU pass alone is a full extra read and write of the layer's
biggest activation, 174 us of a ~1.3 ms bert-base layer at 64 x 512 tokens on an H100 (13% of
the forward). Here the bias and GELU are applied to the fp32 accumulator while it is still in
registers, so the output is written exactly once, already activated. The pre-activation is
never rounded to fp16/bf16, so the result is slightly closer to the exact value than the
unfused ops'.

Why this shape of kernel: the fusion only pays if the GEMM itself keeps up with cuBLAS. A
first version (one program per tile, pointer loads) ran at half cuBLAS's speed on the H100
(0.466 ms vs 0.233 for the GEMM alone at 32768 x 3072 x 768) and lost to cuBLAS + the separate
pass. This one is
- persistent: a fixed number of programs per SM walk tiles `pid, pid + programs, ...`;
- fed by TMA (Hopper's tensor memory accelerator, through host-side tensor descriptors): one
  instruction moves a whole `[BLOCK, BLOCK_K]` tile to shared memory, edges zero-filled by the
  hardware, so there are no address computations or masks in the main loop, and a K that is
  not a multiple of BLOCK_K needs nothing special (the zeros add nothing);
- grouped: consecutive tiles walk down GROUP_M row tiles before moving right, so programs
  working at the same time share a few A row tiles and W column tiles in L2 (`_tile_of_program`);
- split in its epilogue (EPILOGUE_SPLIT): the accumulator is finished and stored in column
  halves, which halves the registers and shared memory the store path holds at once.

What it gets (H100, fp16, N = 3072, K = 768; `tools/gpu/time_ffn_gemm.py`, docs/benchmarks/defaults.md):
its main loop alone runs at 88-100% of cuBLAS's GEMM (0.269 vs 0.237 ms at 32,768 rows), and
with the erf epilogue it is 3-12% faster than cuBLAS + the separate bias + GELU pass from
8,192 rows on (0.380-0.386 vs 0.395-0.406 ms at 32,768 rows; 0.739-0.760 vs 0.818-0.838 at
67,331), a tie at 4,096. It is not the ~0.27 ms a free epilogue would give: the erf GELU of
100 M elements is ~0.1 ms of fp32 arithmetic that this kernel does not overlap with its
tensor-core main loop (two programs per SM, flattening the loops, or Triton 3.6's warp
specialization did not make it overlap; the latter fails to compile for a 4-warp tile).

Layout: C[M, N] = gelu(A[M, K] @ W[N, K]^T + bias[N]). W is nn.Linear's weight as stored; its
descriptor hands the kernel `[BLOCK_N, BLOCK_K]` tiles that `tl.dot` reads transposed, no copy.
TMA needs 16-byte aligned rows (and base addresses): A and W that are not are copied once; K
whose rows can never be aligned (K * itemsize not a multiple of 16) runs the reference. C is
stored by TMA when it is aligned, by masked pointer stores otherwise (an odd N, an arena view).

The wrapper has the signature and result of `reference.linear_bias_gelu`. It needs TMA, i.e.
compute capability 9 (Hopper) or newer, or the CPU interpreter; `supported()` says which.
"""
from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tritonformer.kernels import reference
from tritonformer.kernels.dispatch import register
from tritonformer.kernels.gpu_info import hopper_or_newer, sm_count

# The tanh GELU is the unfused bias_gelu kernel's formula. The exact (erf) one is not: the
# element-wise kernels compute it from a branch-free erfc (triton_elementwise._erf_gelu), 0.78x the
# bias + GELU pass's time on an H200, but this GEMM's epilogue with it made bert-base's (64, 512)
# bf16 forward 1.01x slower (every one of four forwards above every one of six with libdevice's
# erf, `tools/gpu/ab_erf_gelu.py`, docs/benchmarks/fp8-and-prefix-caching.md), so it keeps
# libdevice's. The two agree to a few fp32 ulps but in GELU's far negative tail.
from tritonformer.kernels.triton_elementwise import _tanh_gelu


@triton.jit
def _erf_gelu(h):
    """Exact GELU, 0.5 h (1 + erf(h / sqrt 2)), h fp32, with libdevice's erf."""
    return 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TMA_ALIGN = 16  # bytes: TMA wants base addresses and row strides on 16-byte boundaries


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """One compiled variant of the kernel. `programs_per_sm` > 1 lets programs share an SM when
    the tile's shared memory allows, so one's epilogue can run beside another's main loop;
    `flatten` asks the compiler to pipeline across the tile loop too, `warp_specialize` to
    split loads and math into warp groups (the sweep's options; see the module docstring)."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    epilogue_split: int = 2
    programs_per_sm: int = 1
    flatten: bool = False
    warp_specialize: bool = False

    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages} "
                f"split{self.epilogue_split} {self.programs_per_sm}/SM{' flat' if self.flatten else ''}"
                f"{' ws' if self.warp_specialize else ''}")


# The default tile on the GPU (H100, fp16/bf16; tools/gpu/time_ffn_gemm.py sweeps the others):
# 128 x 256, one program per SM. In three sweeps on two machine starts it never lost to cuBLAS +
# the separate pass from 4,096 rows; two 128 x 128 programs per SM were faster in some runs
# and 40% slower in another. One small tile for the interpreter, where tiles cost time per element.
GPU_CONFIG = TileConfig()
INTERPRETER_CONFIG = TileConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=1, num_stages=1)
# fp32 (tests only) at half the tile: 4-byte stages of the fp16 tile do not fit in shared memory.
GPU_FP32_CONFIG = TileConfig(block_m=64, block_n=128, block_k=32, num_warps=4, num_stages=3)


@triton.jit
def _tile_of_program(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map a linear tile index to its (row tile, column tile), grouped for L2 reuse.

    Row-major order (all column tiles of row tile 0, then row tile 1, ...) streams the whole
    of W through L2 for every row tile. Instead tiles walk down a group of GROUP_M row tiles
    first and then move one column tile right: programs working at the same time then touch
    only GROUP_M row tiles of A and a few column tiles of W, which stay in L2 while reused.
    """
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    group = tile // tiles_per_group
    first_m = group * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)  # the last group may be short
    within = tile % tiles_per_group
    return first_m + within % rows_in_group, within // rows_in_group


@triton.jit
def _finish_and_store(acc, c_desc, c_ptr, bias_ptr, row0, col0, M, N, stride_cm,
                      HAS_BIAS: tl.constexpr, GELU: tl.constexpr, STORE_TMA: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Bias + GELU on an fp32 accumulator tile `[BLOCK_M, BLOCK_N]` at (row0, col0), then its
    only store: by TMA (the hardware clips the edges) or by masked pointer stores."""
    cols = col0 + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if GELU == 2:
        y = _tanh_gelu(acc)
    elif GELU == 1:
        y = _erf_gelu(acc)
    else:  # no activation: only the timing tool's "main loop alone" runs this
        y = acc
    y = y.to(c_ptr.dtype.element_ty)
    if STORE_TMA:
        c_desc.store([row0, col0], y)
    else:
        rows = row0 + tl.arange(0, BLOCK_M)
        c_tile = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
        tl.store(c_tile, y, mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _linear_bias_gelu_kernel(
    a_desc, w_desc, c_desc, c_ptr, bias_ptr,
    M, N, K, stride_cm, PROGRAMS,
    HAS_BIAS: tl.constexpr, GELU: tl.constexpr, DOT_FP32: tl.constexpr, STORE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """C = gelu(A @ W^T + bias), persistent: program p computes tiles p, p + PROGRAMS, ...
    Grid: (PROGRAMS,). GELU: 1 erf, 2 tanh, 0 none. DOT_FP32 runs the dot on fp32 operands at full ("ieee") precision: for
    fp32 inputs (tests), and for bf16 in the CPU interpreter, whose numpy dot has no bf16 (the
    upcast is exact, and so are the bf16 products in fp32)."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        tile_m, tile_n = _tile_of_program(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = tile_m * BLOCK_M
        col0 = tile_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(k_steps):
            a = a_desc.load([row0, step * BLOCK_K])   # [BLOCK_M, BLOCK_K], zero past the edges
            w = w_desc.load([col0, step * BLOCK_K])   # [BLOCK_N, BLOCK_K]: W's rows are C's columns
            if DOT_FP32:
                acc = tl.dot(a.to(tl.float32), w.to(tl.float32).T, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, w.T, acc)
        if EPILOGUE_SPLIT == 2:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            _finish_and_store(left, c_desc, c_ptr, bias_ptr, row0, col0, M, N, stride_cm,
                              HAS_BIAS, GELU, STORE_TMA, BLOCK_M, BLOCK_N // 2)
            _finish_and_store(right, c_desc, c_ptr, bias_ptr, row0, col0 + BLOCK_N // 2, M, N, stride_cm,
                              HAS_BIAS, GELU, STORE_TMA, BLOCK_M, BLOCK_N // 2)
        else:
            _finish_and_store(acc, c_desc, c_ptr, bias_ptr, row0, col0, M, N, stride_cm,
                              HAS_BIAS, GELU, STORE_TMA, BLOCK_M, BLOCK_N)


def supported(device: torch.device) -> bool:
    """TMA needs Hopper (compute capability 9) or newer; the interpreter emulates it."""
    if _INTERPRETED:
        return True
    return hopper_or_newer(device)


def _tma_ready(t: torch.Tensor) -> bool:
    """Can a TMA descriptor cover this 2-D tensor as it is: unit column stride, and the base
    address and row stride on 16-byte boundaries."""
    size = t.element_size()
    return (t.stride(1) == 1 and t.data_ptr() % _TMA_ALIGN == 0
            and (t.stride(0) * size) % _TMA_ALIGN == 0)


def _config_for(dtype: torch.dtype) -> TileConfig:
    if _INTERPRETED:
        return INTERPRETER_CONFIG
    return GPU_FP32_CONFIG if dtype == torch.float32 else GPU_CONFIG


@register("linear_bias_gelu")
def linear_bias_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    approximate: str = "none",
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """GELU(x @ weight^T + bias) in one GEMM kernel; see reference.linear_bias_gelu.

    x: `[M, K]` (rows may be strided, e.g. a column slice of a wider tensor); weight: `[N, K]`
    (nn.Linear layout); bias: `[N]` or None. Returns a contiguous `[M, N]` in x's dtype (in
    `out` when given: an activation-arena view, say). `config` picks a tile other than the
    default (the sweep in tools/gpu/time_ffn_gemm.py). Without TMA (a GPU older than Hopper), or
    when K's rows cannot be 16-byte aligned, it runs the reference ops.
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    assert x.dim() == 2, f"x must be [M, K], got shape {list(x.shape)}"
    assert weight.dim() == 2, f"weight must be [N, K] (nn.Linear layout), got shape {list(weight.shape)}"
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k, (
        f"x is [M, K] = {list(x.shape)} but weight is {list(weight.shape)}: weight must be [N, K={k}]"
    )
    assert x.dtype in _DTYPES, f"x must be float16, bfloat16 or float32, got {x.dtype}"
    assert weight.dtype == x.dtype, f"x and weight dtypes differ: {x.dtype} vs {weight.dtype}"
    assert weight.device == x.device, f"x and weight devices differ: {x.device} vs {weight.device}"
    if bias is not None:
        assert bias.shape == (n,), f"bias must be [N] = [{n}], got shape {list(bias.shape)}"
        assert bias.is_floating_point(), f"bias must be a float tensor, got {bias.dtype}"
        assert bias.device == x.device, f"x and bias devices differ: {x.device} vs {bias.device}"
        bias = bias if bias.stride(0) == 1 else bias.contiguous()

    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1, f"out must be [M, N] = [{m}, {n}] with contiguous rows"
    if m == 0 or n == 0:
        return out
    if k == 0 or (k * x.element_size()) % _TMA_ALIGN or not supported(x.device):
        # k == 0 is an empty sum (gelu(bias) on every row); the others cannot use TMA.
        return reference.linear_bias_gelu(x, weight, bias, approximate, out=out)
    x = x if _tma_ready(x) else x.contiguous()
    weight = weight if _tma_ready(weight) else weight.contiguous()

    return _launch(x, weight, bias, 2 if approximate == "tanh" else 1, out, config or _config_for(x.dtype))


def _launch(x, weight, bias, gelu: int, out, cfg: TileConfig) -> torch.Tensor:
    """The checked call's launch (GELU 1 erf, 2 tanh; 0, none, times the main loop alone)."""
    m, n, k = x.shape[0], weight.shape[0], x.shape[1]
    store_block_n = cfg.block_n // cfg.epilogue_split
    store_tma = _tma_ready(out)
    a_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k])
    # Without a TMA store the kernel still takes a descriptor argument; x's stands in, unused.
    c_desc = TensorDescriptor.from_tensor(out, [cfg.block_m, store_block_n]) if store_tma else a_desc
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    slots = 4 if _INTERPRETED else sm_count(x.device) * cfg.programs_per_sm
    programs = min(tiles, slots)
    _linear_bias_gelu_kernel[(programs,)](
        a_desc, w_desc, c_desc, out, bias if bias is not None else out,
        m, n, k, out.stride(0), programs,
        HAS_BIAS=bias is not None, GELU=gelu,
        DOT_FP32=x.dtype == torch.float32 or (_INTERPRETED and x.dtype == torch.bfloat16),
        STORE_TMA=store_tma,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        EPILOGUE_SPLIT=cfg.epilogue_split, FLATTEN=cfg.flatten, WARP_SPECIALIZE=cfg.warp_specialize,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
