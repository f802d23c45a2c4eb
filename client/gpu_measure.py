"""What a GPU can do and what a model must move, for the benchmarks' floors: the device's copy
bandwidth and matmul peak, measured in the run, and a decoder's bytes per decode step and FLOPs
per prefill."""
from __future__ import annotations

import time


def copy_bandwidth() -> float:
    """Bytes/s the GPU reads in a large device-to-device copy (read + write counted)."""
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * src.numel() * 10 / (time.perf_counter() - t0)


def read_bytes_per_step(model, rows: int | None = 1) -> int:
    """Bytes of weights one decode step over `rows` sequences reads: every layer's tensors (FP8
    weights: values and scales; of a mixture-of-experts layer the experts routed to, as many as
    uniform routing of `rows` tokens reaches: models/moe.MoeLayer.read_bytes; rows None: all of
    them), the final norm and the output head (an untied input embedding is only gathered, a
    few rows per step)."""
    import torch

    from tritonformer.kernels.fp8 import Fp8Weight

    seen: set[int] = set()
    total = 0

    def add(t):
        nonlocal total
        if isinstance(t, Fp8Weight):
            if t.data.data_ptr() not in seen:
                seen.add(t.data.data_ptr())
                total += t.nbytes()
        elif isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()

    top_k = getattr(model.config, "top_k", 0)
    for layer in model.layers:
        for name, value in vars(layer).items():
            if hasattr(value, "read_bytes"):  # a MoE layer
                total += int(value.read_bytes(rows))
            elif name.startswith("experts_") and rows is not None and top_k:  # a family's own expert tensors
                experts = value.shape[0]  # [E, ...]: the experts uniform routing of `rows` reaches
                total += int(value.nbytes * (1 - (1 - top_k / experts) ** rows))
            elif hasattr(value, "state_shapes"):  # a recurrent mixer (models/mixers.py): all its tensors
                for t in vars(value).values():
                    add(t)
            else:
                add(value)
    add(model.final_norm)
    add(model.output_head)
    return total


def all_weight_bytes(model) -> int:
    """Every weight byte: every layer's tensors, all of a MoE layer's experts, the final norm, the
    output head and an untied input embedding."""
    untied = model.output_head.data_ptr() != model.embed.data_ptr()
    return read_bytes_per_step(model, None) + (model.embed.numel() * model.embed.element_size() if untied else 0)


def matmul_peak_tflops(dtype) -> float:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 10 / (time.perf_counter() - t0) / 1e12


def prefill_flops(model, tokens: int) -> float:
    """Matmul FLOPs of one causal prefill: 2 per weight per token through the layers (of a MoE
    layer, the weights a token is routed through) and the head (one row of logits), plus QK^T and
    PV over the causal triangle (a hybrid model's recurrent mixers: their projections only)."""
    import torch

    c = model.config
    names = ("qkv_w", "qk_w", "v_w", "o_w", "gate_up_w", "down_w", "attn_gate_w")  # (a family's own layer: some)
    layer_weights = sum(t.numel() for layer in model.layers for t in (getattr(layer, n, None) for n in names)
                        if t is not None)
    top_k = getattr(c, "top_k", 0)  # a family's own expert tensors ([E, ...]): k experts a token
    layer_weights += sum(t[0].numel() * top_k for layer in model.layers for n, t in vars(layer).items()
                         if n.startswith("experts_") and t is not None)
    layer_weights += sum(layer.moe.active_params() for layer in model.layers if getattr(layer, "moe", None))
    layer_weights += sum(layer.mla.params() for layer in model.layers if getattr(layer, "mla", None))  # (latent)
    # (a recurrent mixer, models/mixers.py, or another object with a per-sequence state, RWKV's mixes: its matrices)
    layer_weights += sum(t.numel() for layer in model.layers for part in vars(layer).values()
                         if hasattr(part, "state_shapes")
                         for t in vars(part).values() if isinstance(t, torch.Tensor) and t.dim() == 2)
    attention = 2 * 2 * model.num_kv_layers * c.num_heads * c.head_dim * tokens * (tokens + 1) / 2
    return 2 * layer_weights * tokens + 2 * model.output_head.numel() + attention


def cuda_ms(fn, iters: int = 20, warmup: int = 5) -> float:
    """Median milliseconds of fn() over `iters` calls timed with CUDA events, after `warmup`."""
    import statistics

    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
