"""FP8 (E4M3) weights for the linears: the weight type, its quantisation and what a GPU must have.

Why: a decode step at batch 1 reads every weight once and does little else, so its time is the
weight bytes over the memory bandwidth; E4M3 weights are half the bytes of fp16 ones. Many-row
GEMMs (prefill, encoder batches) are compute-bound instead, and Hopper's FP8 tensor cores have
twice the fp16 peak.

`Fp8Weight` holds an nn.Linear weight `[N, K]` as float8_e4m3fn values and one fp32 scale per
output channel (row), W ~ data * scale[:, None]. It is not a tensor: the linear ops
(`kernels.linear_act`, `kernels.prenorm_qkv_to_cache`) accept it where they take a weight and
route it (triton_small_gemm.route):

* up to WEIGHT_ONLY_MAX_ROWS rows (decode): weight-only, the activations stay 16-bit (the GEMV
  and the small GEMM load the FP8 weights, convert them in registers and apply the row scale
  on the accumulator);
* more rows: the activations are quantised per token too (one scale per row, amax / 448) and
  the GEMM runs on the FP8 tensor cores (`torch._scaled_mm` with row-wise scales).

reference.fp8_linear defines both, and is what runs on the CPU.
"""
from __future__ import annotations

import functools

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite E4M3 value
# An all-zero row (a padding row, a zero weight row) gets this amax: a finite scale, zeros stay 0.
MIN_AMAX = 1e-12
# Rows up to which an FP8 linear is weight-only (the activations stay 16-bit); past it they are
# quantised per token and the GEMM runs on FP8 tensor cores. The reference reads it too, so the
# two agree whatever a benchmark sets it to. Measured on an H200 (llama-3.1-8b decode step,
# `tools/gpu/fp8_report.py --parts crossover`): weight-only 3.99 against 4.98 ms at 32 rows, 5.85
# against 4.94 at 48, 5.94 against 4.97 at 64.
WEIGHT_ONLY_MAX_ROWS = 32
# Compute capability from which a GPU has FP8 (E4M3) arithmetic: Ada (8.9) and Hopper (9.0).
MIN_CAPABILITY = (8, 9)


class Fp8Weight:
    """An nn.Linear weight `[N, K]` in FP8: `data` float8_e4m3fn `[N, K]` (contiguous) and `scale`
    fp32 `[N]`, one per output channel; W ~ data * scale[:, None]. `dtype` is the dtype of the
    activations it serves (fp16, bf16, or fp32 on the CPU): its linears take and return that.

    It answers the questions the linear ops ask of a weight (`shape`, `dtype`, `device`, `dim()`,
    `is_contiguous()`), and `to(device, dtype)` / `contiguous()` as a checkpoint tensor does, so
    a model's weight getter passes it through: `to` moves it and changes the activation dtype it
    serves, never the stored E4M3 values."""

    __slots__ = ("data", "scale", "dtype")

    def __init__(self, data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        if data.dtype != E4M3 or data.dim() != 2:
            raise ValueError(f"FP8 weight data must be float8_e4m3fn [N, K], got {data.dtype} {list(data.shape)}")
        if scale.shape != (data.shape[0],):
            raise ValueError(f"FP8 weight scale must be [N] = [{data.shape[0]}], got {list(scale.shape)}")
        self.data = data.contiguous()
        self.scale = scale.to(torch.float32).contiguous()
        self.dtype = dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def is_cuda(self) -> bool:
        return self.data.is_cuda

    def dim(self) -> int:
        return 2

    def numel(self) -> int:
        return self.data.numel()

    def nbytes(self) -> int:
        """Bytes a read of the weight moves: the E4M3 values and the scales."""
        return self.data.numel() + 4 * self.scale.numel()

    def contiguous(self) -> "Fp8Weight":
        return self

    def is_contiguous(self) -> bool:
        return True

    def to(self, device=None, dtype=None, **kwargs) -> "Fp8Weight":
        """On `device`, serving activations of `dtype` (the stored values stay E4M3)."""
        data = self.data if device is None else self.data.to(device)
        scale = self.scale if device is None else self.scale.to(device)
        return Fp8Weight(data, scale, self.dtype if dtype is None else dtype)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """data * scale, in `dtype` (default: the activations')."""
        return (self.data.float() * self.scale[:, None]).to(dtype or self.dtype)

    def __repr__(self) -> str:
        return f"Fp8Weight({list(self.shape)}, serves {self.dtype}, on {self.device})"


class Fp8Activation:
    """An activation `[M, K]` already quantised per token, as the many-row FP8 linear's GEMM reads
    it: `q` E4M3 `[M, K]` (contiguous rows) and `scale` fp32 `[M, 1]`, x ~ q * scale (see
    reference.quantize_rows_fp8); `dtype` is the dtype of the 16-bit activation it stands for
    (an FP8 weight serving that dtype takes it). It is what an FP8 linear with `fp8_out` returns
    (its activation fused into the quantisation) and what the next FP8 linear takes as x, which
    then skips its own quantisation pass (kernels.linear_act). Only rows that the FP8 linear
    quantises anyway (more than WEIGHT_ONLY_MAX_ROWS) travel so: a few-row linear reads its
    activation 16-bit."""

    __slots__ = ("q", "scale", "dtype")

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        if q.dtype != E4M3 or q.dim() != 2 or q.stride(1) != 1:
            raise ValueError(f"an FP8 activation is float8_e4m3fn [M, K] with contiguous rows, got {q.dtype} "
                             f"{list(q.shape)}")
        if scale.dtype != torch.float32 or scale.shape != (q.shape[0], 1):
            raise ValueError(f"an FP8 activation's scale is fp32 [M, 1] = [{q.shape[0]}, 1], got {scale.dtype} "
                             f"{list(scale.shape)}")
        self.q = q
        self.scale = scale
        self.dtype = dtype

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def is_cuda(self) -> bool:
        return self.q.is_cuda

    def dim(self) -> int:
        return 2

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """q * scale, in `dtype` (default: the activation's)."""
        return (self.q.float() * self.scale).to(dtype or self.dtype)

    @classmethod
    def empty(cls, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> "Fp8Activation":
        """An uninitialised one, for an op to fill (add_bias_residual_layer_norm's `fp8_out`)."""
        return cls(torch.empty((rows, cols), dtype=E4M3, device=device),
                   torch.empty((rows, 1), dtype=torch.float32, device=device), dtype)

    def __repr__(self) -> str:
        return f"Fp8Activation({list(self.shape)}, stands for {self.dtype}, on {self.device})"


def quantizes_activations(weight, rows: int) -> bool:
    """Whether a linear of `weight` on `rows` rows quantises its activations per token (an FP8
    weight past WEIGHT_ONLY_MAX_ROWS), so that it may take them as an Fp8Activation."""
    return isinstance(weight, Fp8Weight) and rows > WEIGHT_ONLY_MAX_ROWS


def quantize_weight(weight: torch.Tensor, dtype: torch.dtype | None = None) -> Fp8Weight:
    """`weight` `[N, K]` (any float dtype) as E4M3 with one scale per output channel: scale =
    amax(|row|) / 448, data = round-to-nearest(row / scale). Serves `dtype` (default: the
    weight's own)."""
    if weight.dim() != 2:
        raise ValueError(f"a linear weight is [N, K], got {list(weight.shape)}")
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=MIN_AMAX) / E4M3_MAX
    data = (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return Fp8Weight(data, scale, dtype or weight.dtype)


def from_checkpoint(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> Fp8Weight:
    """An FP8 checkpoint's weight: E4M3 `data` `[N, K]` and its `weight_scale`, per tensor (one
    value, any shape) or per output channel (`[N]` or `[N, 1]`), broadcast to per channel."""
    if data.dtype != E4M3:
        raise ValueError(f"FP8 checkpoint weights must be float8_e4m3fn, got {data.dtype}")
    n = data.shape[0]
    s = scale.to(torch.float32).reshape(-1)
    if s.numel() == 1:
        s = s.expand(n).clone()
    elif tuple(scale.shape) not in ((n,), (n, 1)):
        raise ValueError(f"weight_scale of {list(scale.shape)} for a weight of {list(data.shape)}: only per-tensor "
                         f"and per-output-channel scales are supported (not block-wise ones)")
    return Fp8Weight(data, s, dtype)


def cat_rows(parts: list) -> "torch.Tensor | Fp8Weight":
    """Weights stacked along N (a fused QKV or gate/up projection): torch.cat of tensors; FP8
    weights concatenate their values and their scales (a 16-bit part among FP8 ones is
    quantised first)."""
    if not any(isinstance(p, Fp8Weight) for p in parts):
        return torch.cat(parts)
    dtype = next(p.dtype for p in parts if isinstance(p, Fp8Weight))
    fp8 = [p if isinstance(p, Fp8Weight) else quantize_weight(p, dtype) for p in parts]
    return Fp8Weight(torch.cat([p.data for p in fp8]), torch.cat([p.scale for p in fp8]), dtype)


def take_rows(weight, rows: torch.Tensor) -> "torch.Tensor | Fp8Weight":
    """weight[rows] along N, for a tensor or an FP8 weight (its values and their scales)."""
    if isinstance(weight, Fp8Weight):
        rows = rows.to(weight.device)
        return Fp8Weight(weight.data[rows], weight.scale[rows], weight.dtype)
    return weight[rows.to(weight.device)].contiguous()


def scaled(weight, factor: float | None) -> "torch.Tensor | Fp8Weight":
    """weight * factor (None: as it is), for a tensor (computed in fp32) or an FP8 weight (its scales)."""
    if factor is None or factor == 1.0:
        return weight
    if isinstance(weight, Fp8Weight):
        return Fp8Weight(weight.data, weight.scale * factor, weight.dtype)
    return (weight.float() * factor).to(weight.dtype)


def check_device(device: torch.device) -> None:
    """RuntimeError unless `device` can run FP8 linears: a CUDA GPU of compute capability >= 8.9
    (Ada, Hopper and newer). The CPU runs the reference (every call dequantises: tests only)."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    capability = torch.cuda.get_device_capability(index)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        raise RuntimeError(
            f"FP8 (E4M3) linears need a GPU of compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
            f"(Ada, Hopper or newer); {name} is {capability[0]}.{capability[1]}. Set the parameter quantization "
            f"to none, and serve a 16-bit checkpoint rather than an FP8 one")


def scaled_mm_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype | None:
    """The output dtype in which torch._scaled_mm with row-wise scales runs on `device` for
    activations of `dtype`: `dtype` itself, else bfloat16 (older cuBLAS paths produce only
    bf16; the result is then cast), else None (no row-wise FP8 GEMM: the linear dequantises).
    Found by trying once per device and dtype; quantize_model asks at load, before any CUDA graph
    is captured."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _scaled_mm_dtype(index, dtype)


@functools.lru_cache(maxsize=None)
def _scaled_mm_dtype(index: int, dtype: torch.dtype) -> torch.dtype | None:
    dev = torch.device("cuda", index)
    if torch.cuda.get_device_capability(index) < MIN_CAPABILITY:
        return None
    a = torch.zeros(16, 32, device=dev).to(E4M3)
    b = torch.zeros(16, 32, device=dev).to(E4M3)
    sa, sb = torch.ones(16, 1, device=dev), torch.ones(1, 16, device=dev)
    for out_dtype in dict.fromkeys((dtype, torch.bfloat16)):
        try:
            torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
            return out_dtype
        except (RuntimeError, NotImplementedError):
            continue
    return None
