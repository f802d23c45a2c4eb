"""Why some decoder families decode slower per weight byte than others (GPU).

Each linear kind timed alone, its variants, the GEMV's register budget, the whole decode step
and the decode attention:

    python3 tools/gpu/time_family_linears.py [--models gemma-2-9b,phi-3-mini,llama-3.1-8b,qwen2.5-7b]
        [--rows 1] [--layers 8] [--context 512] [--no-sweep] [--attention-configs] [--fp8] [--deadline-s 330]

Each family is built as the engine builds it (client/model_shapes.random_decoder, bf16, random
weights at the published shape) with `--layers` of its layers, so every call below is the
model's own: its layer weights, norms, rotary table, KV cache and the kernels.* calls forward
makes. Per family, at each of `--rows` decode rows:

1. every linear kind (qkv with its PreNorm prologue and QKV epilogue, o, gate_up with its
   PreNorm (and Gemma's sandwich norm, `x_norm`) and activation, down, the output head) timed
   alone over all layers' distinct weights, one CUDA graph replay (best of --reps), as GB/s =
   weight bytes / time beside the copy bandwidth measured in the run; with the GEMV's tile
   (BLOCK_N, programs, registers and spills of the compiled kernel, programs per SM, weight
   bytes in flight per SM);
2. variants of each kind: the same weight as a plain linear (no prologue, no epilogue), without
   the activation, without x_norm, with the norm weights in bf16 (Gemma keeps (1 + w) in fp32),
   the norm kernels before a prologue-free GEMV (the PreNorm unfused), cuBLAS
   (torch.nn.functional.linear); and the GEMV's register budget x warps swept
   (triton_gemv._BYTES_PER_WARP x _WARPS, rows <= 2), the best per kind; with --fp8 also each
   kind's weights as FP8 (E4M3, `quantization: fp8`'s decode route), timed and swept the same way;
3. the whole decode step (the decode graph's replay) at --layers and half as many layers: the
   per-layer cost and the fixed part (embedding, final norms, head, soft-cap, argmax) against
   the kinds alone, the layer chain in model order without attention, and the weight (+ KV)
   floor, projected to the published depth; and the decode attention alone (one layer's launch
   and its combine, the model's heads, head_dim, scale, window and soft-cap) over key splits.
   Alone, nothing overlaps it; in a step the next GEMV's weight loads run under it (PDL), so a
   split count that wins here can lose there (H200, 2026-12-01: 8.6 against 18.4 us a layer
   alone at batch 4, no faster in the step): compare splits in whole steps,
   tools/gpu/ab_decode_step.py --knob backend.decoder.graphs.FILL.

Everything past the essentials (sweeps, attention configurations) is skipped, with a note, once
the run nears --deadline-s.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import subprocess
import time
import traceback

FAMILIES = ("gemma-2-9b", "phi-3-mini", "llama-3.1-8b", "qwen2.5-7b")
BUDGETS, WARPS = (2048, 4096, 8192), (2, 4, 8)  # weight bytes per warp, warps
SPLITS = (1, 2, 4, 8, 16, 32)
_ESSENTIAL_S = 45  # what a family's kinds, variants, steps and attention take, held back for those to come


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--models", default=",".join(FAMILIES), help="client/model_shapes names, comma-separated")
    ap.add_argument("--rows", default="1", help="decode rows (batch), comma-separated, e.g. 1,64")
    ap.add_argument("--layers", type=int, default=8, help="layers built per model (even; the step also runs half)")
    ap.add_argument("--context", type=int, default=512, help="cached keys per sequence")
    ap.add_argument("--reps", type=int, default=20, help="graph replays, the best one counts")
    ap.add_argument("--no-sweep", action="store_true", help="skip the GEMV register budget x warps sweep")
    ap.add_argument("--attention-configs", action="store_true",
                    help="also sweep the decode attention's BLOCK_N x warps x stages at the current split count")
    ap.add_argument("--fp8", action="store_true", help="also every kind's weights as FP8 (weight-only decode route)")
    ap.add_argument("--deadline-s", type=float, default=330.0, help="skip optional parts past this many seconds")
    return ap.parse_args(argv)


class Clock:
    def __init__(self, deadline_s: float):
        self.t0, self.deadline = time.perf_counter(), deadline_s

    def left(self) -> float:
        return self.deadline - (time.perf_counter() - self.t0)

    def allows(self, families_after: int) -> bool:
        return self.left() > _ESSENTIAL_S * (families_after + 1)


# --- compiled kernels: registers and spills of what a variant compiled -------------------------

def _jit_functions():
    from tritonformer.kernels import triton_gemv
    from tritonformer.kernels import triton_small_gemm as tsg

    found = []
    for obj in (triton_gemv._gemv_kernel, tsg._small_linear_kernel):
        while not hasattr(obj, "device_caches") and hasattr(obj, "fn"):
            obj = obj.fn  # an autotuner wraps the JITFunction
        if hasattr(obj, "device_caches"):
            found.append(obj)
    return found


def compiled_kernels() -> dict:
    """id -> CompiledKernel of every GEMV and small-GEMM variant compiled so far."""
    out = {}
    for fn in _jit_functions():
        try:
            for cache in list(fn.device_caches.values()):
                table = cache[0] if isinstance(cache, tuple) else cache
                for kernel in list(table.values()):
                    out[id(kernel)] = kernel
        except Exception:  # another Triton's layout: the table just loses its register columns
            pass
    return out


def kernel_facts(kernels: list) -> tuple:
    """(registers, spills, warps, shared bytes) of the heaviest of `kernels`, or Nones."""
    best = (None, None, None, None)
    for k in kernels:
        try:
            if getattr(k, "n_regs", None) is None:
                k._init_handles()
            facts = (k.n_regs, k.n_spills, k.metadata.num_warps, getattr(k.metadata, "shared", 0))
        except Exception:
            continue
        if best[0] is None or facts[0] > best[0]:
            best = facts
    return best


def programs_per_sm(regs, warps, shared, props) -> int | None:
    if regs is None:
        return None
    threads = 32 * warps
    per_warp = -(-regs * 32 // 256) * 256  # registers are allocated per warp in 256s
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (per_warp * warps)
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // threads
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // shared if shared else 32
    return max(0, min(32, by_regs, by_threads, by_smem))


# --- the model's linears, kind by kind ---------------------------------------------------------

class Inputs:
    """Static inputs for `rows` decode rows of `model`: what forward hands each linear."""

    def __init__(self, model, rows: int, context: int):
        import torch

        c, dev, dtype = model.config, model.device, model.dtype
        g = torch.Generator(device=dev).manual_seed(1)

        def rand(*shape):
            return torch.randn(*shape, generator=g, device=dev).to(dtype)

        self.rows, self.context = rows, context
        self.blocks_per_seq = -(-(context + 1) // 16)
        self.cache = model.new_kv_cache(rows * self.blocks_per_seq + 1, 16)
        self.cache.data.normal_(0.0, 1.0, generator=g)
        self.x, self.residual, self.h, self.xf = (rand(rows, c.hidden_size) for _ in range(4))
        self.sum_out = torch.empty_like(self.x)
        self.ctx = rand(rows, c.num_heads * c.head_dim)
        self.act = rand(rows, c.intermediate_size)
        positions = torch.full((rows,), context, device=dev, dtype=torch.long)
        self.slots = torch.arange(rows, device=dev) * self.blocks_per_seq * 16 + context
        self.table = model.rope_cos_sin[positions]
        self.local = model.local_cos_sin[positions] if model.local_cos_sin is not None else None


class Variant:
    """One way to run a kind: `call(li)` runs layer li's linear on `route`'s kernel; `gemv`:
    (paired, half) of the GEMV's column tiles, where the route is the GEMV; `post_norm`: its
    PreNorm has Gemma's sandwich norm (the GEMV's tile depends on it); `fp8`: E4M3 weights."""

    def __init__(self, name, call, route, gemv=None, post_norm=False, fp8=False):
        self.name, self.call, self.route, self.gemv = name, call, route, gemv
        self.post_norm, self.fp8 = post_norm, fp8


def kind_variants(model, inp: Inputs, fp8: bool = False) -> dict:
    """kind -> (weight of layer li, [Variant]): the model's call first, then the isolating ones
    (and with `fp8` the model's call on E4M3 copies of the weights, last)."""
    import torch.nn.functional as F

    from tritonformer import kernels
    from tritonformer.kernels.fp8 import quantize_weight
    from tritonformer.kernels import triton_small_gemm as tsg
    from tritonformer.kernels.reference import PreNorm

    c, layers, eps = model.config, model.layers, model.config.norm_eps
    n = len(layers)
    head_norms = layers[0].q_norm is not None or layers[0].k_norm is not None
    sandwich = layers[0].attn_post_norm is not None
    fp32_norms = layers[0].attn_norm.dtype != model.dtype

    def as_bf16(t):
        return None if t is None else t.to(model.dtype)

    # Norm weights in the activations' dtype, made now (a conversion inside the graph is a kernel).
    low = [dict(attn=as_bf16(l.attn_norm), mlp=as_bf16(l.mlp_norm), attn_post=as_bf16(l.attn_post_norm),
                mlp_post=as_bf16(l.mlp_post_norm)) for l in layers] if fp32_norms else None

    def qkv_pre(li, x_norm=True, bf16=False):
        prev = (li - 1) % n  # layer li's QKV PreNorm closes layer li - 1's MLP (its sandwich norm)
        w = low[li]["attn"] if bf16 else layers[li].attn_norm
        xn = (low[prev]["mlp_post"] if bf16 else layers[prev].mlp_post_norm) if x_norm else None
        return PreNorm(w, None, eps, residual=inp.residual, sum_out=inp.sum_out, x_norm=xn)

    def mlp_pre(li, x_norm=True, bf16=False):
        w = low[li]["mlp"] if bf16 else layers[li].mlp_norm
        xn = (low[li]["attn_post"] if bf16 else layers[li].attn_post_norm) if x_norm else None
        return PreNorm(w, None, eps, residual=inp.residual, sum_out=inp.sum_out, x_norm=xn)

    def norm_kernels(x, pre):
        """The PreNorm as the norm kernels compute it unfused (kernels.rms_norm: the sandwich norm
        first where there is one), the GEMM operand; for the variant that runs them before a GEMV."""
        h = x if pre.x_norm is None else kernels.rms_norm(x, pre.x_norm, eps)[0].to(x.dtype)
        return kernels.rms_norm(h, pre.weight, eps, pre.residual, pre.sum_out)[0]

    def qkv_call(pre_of, unfused=False, weights=None):
        """Layer li's QKV projection with PreNorm pre_of(li), fused as the model runs it, or (unfused)
        after the norm kernels; `weights[li]` instead of the layer's own where given."""
        def call(li):
            layer = layers[li]
            table = inp.local if layer.local else inp.table
            x, pre = (norm_kernels(inp.x, pre_of(li)), None) if unfused else (inp.x, pre_of(li))
            return kernels.prenorm_qkv_to_cache(
                x, pre, layer.qkv_w if weights is None else weights[li], layer.qkv_b, c.num_heads, c.num_kv_heads,
                c.head_dim, table[:, 0], table[:, 1], inp.cache.keys(li), inp.cache.values(li), inp.slots, q_norm=layer.q_norm,
                k_norm=layer.k_norm, norm_eps=eps)
        return call

    def route_qkv(pre, weight=None):
        return tsg.route(inp.x, layers[0].qkv_w if weight is None else weight, "none", pre,
                         qkv_epilogue=not head_norms)

    qkv_n = layers[0].qkv_w.shape[0]
    # With q/k head norms the projection runs plain (qkv_to_cache's kernel after it), else paired per head half.
    qkv_tile = (False, qkv_n) if head_norms else (True, c.head_dim // 2)
    qkv = [Variant("model", qkv_call(qkv_pre), route_qkv(qkv_pre(0)), qkv_tile, sandwich),
           Variant("plain", lambda li: kernels.linear_act(inp.x, layers[li].qkv_w),
                   tsg.route(inp.x, layers[0].qkv_w), (False, qkv_n))]
    if sandwich:
        pre = lambda li: qkv_pre(li, x_norm=False)  # noqa: E731
        qkv.append(Variant("no x_norm", qkv_call(pre), route_qkv(pre(0)), qkv[0].gemv))
    if fp32_norms:
        pre = lambda li: qkv_pre(li, bf16=True)  # noqa: E731
        qkv.append(Variant("bf16 norms", qkv_call(pre), route_qkv(pre(0)), qkv[0].gemv, sandwich))
    qkv.append(Variant("norm kernels + GEMV", qkv_call(qkv_pre, unfused=True), route_qkv(None), qkv_tile))
    qkv.append(Variant("cuBLAS", lambda li: F.linear(inp.x, layers[li].qkv_w), "cuBLAS"))

    o_n = layers[0].o_w.shape[0]
    o = [Variant("model", lambda li: kernels.linear_act(inp.ctx, layers[li].o_w), tsg.route(inp.ctx, layers[0].o_w),
                 (False, o_n)),
         Variant("cuBLAS", lambda li: F.linear(inp.ctx, layers[li].o_w), "cuBLAS")]

    act = model.activation
    gu_n = layers[0].gate_up_w.shape[0]

    def gate_up_call(pre_of, activation=act, unfused=False):
        if unfused:
            return lambda li: kernels.linear_act(norm_kernels(inp.h, pre_of(li)), layers[li].gate_up_w, None,
                                                 activation)
        return lambda li: kernels.linear_act(inp.h, layers[li].gate_up_w, None, activation, prenorm=pre_of(li))

    def route_gu(pre, activation=act, weight=None):
        return tsg.route(inp.h, layers[0].gate_up_w if weight is None else weight, activation, pre)

    gate_up = [Variant("model", gate_up_call(mlp_pre), route_gu(mlp_pre(0)), (True, gu_n // 2), sandwich),
               Variant("plain", lambda li: kernels.linear_act(inp.h, layers[li].gate_up_w),
                       tsg.route(inp.h, layers[0].gate_up_w), (False, gu_n)),
               Variant("no act", gate_up_call(mlp_pre, "none"), route_gu(mlp_pre(0), "none"), (False, gu_n),
                       sandwich)]
    if sandwich:
        pre = lambda li: mlp_pre(li, x_norm=False)  # noqa: E731
        gate_up.append(Variant("no x_norm", gate_up_call(pre), route_gu(pre(0)), (True, gu_n // 2)))
    if fp32_norms:
        pre = lambda li: mlp_pre(li, bf16=True)  # noqa: E731
        gate_up.append(Variant("bf16 norms", gate_up_call(pre), route_gu(pre(0)), (True, gu_n // 2), sandwich))
    gate_up.append(Variant("norm kernels + GEMV", gate_up_call(mlp_pre, unfused=True), route_gu(None),
                           (True, gu_n // 2)))
    gate_up.append(Variant("cuBLAS", lambda li: F.linear(inp.h, layers[li].gate_up_w), "cuBLAS"))

    down_n = layers[0].down_w.shape[0]
    down = [Variant("model", lambda li: kernels.linear_act(inp.act, layers[li].down_w),
                    tsg.route(inp.act, layers[0].down_w), (False, down_n)),
            Variant("cuBLAS", lambda li: F.linear(inp.act, layers[li].down_w), "cuBLAS")]

    head_w = model.output_head
    head = [Variant("model", lambda li: kernels.linear_act(inp.xf, head_w), tsg.route(inp.xf, head_w),
                    (False, head_w.shape[0])),
            Variant("cuBLAS", lambda li: F.linear(inp.xf, head_w), "cuBLAS")]
    if fp8:  # E4M3 copies of every weight, as `quantization: fp8` loads them (per output channel)
        q = {name: [quantize_weight(getattr(layer, name)) for layer in layers]
             for name in ("qkv_w", "o_w", "gate_up_w", "down_w")}
        head8 = quantize_weight(head_w)
        qkv.append(Variant("fp8", qkv_call(qkv_pre, weights=q["qkv_w"]), route_qkv(qkv_pre(0), q["qkv_w"][0]),
                           qkv_tile, sandwich, fp8=True))
        o.append(Variant("fp8", lambda li: kernels.linear_act(inp.ctx, q["o_w"][li]), tsg.route(inp.ctx, q["o_w"][0]),
                         (False, o_n), fp8=True))
        gate_up.append(Variant("fp8", lambda li: kernels.linear_act(inp.h, q["gate_up_w"][li], None, act,
                                                                    prenorm=mlp_pre(li)),
                               route_gu(mlp_pre(0), weight=q["gate_up_w"][0]), (True, gu_n // 2), sandwich, fp8=True))
        down.append(Variant("fp8", lambda li: kernels.linear_act(inp.act, q["down_w"][li]),
                            tsg.route(inp.act, q["down_w"][0]), (False, down_n), fp8=True))
        head.append(Variant("fp8", lambda li: kernels.linear_act(inp.xf, head8), tsg.route(inp.xf, head8),
                            (False, head_w.shape[0]), fp8=True))
    return {
        "qkv": (lambda li: layers[li].qkv_w, qkv),
        "o": (lambda li: layers[li].o_w, o),
        "gate_up": (lambda li: layers[li].gate_up_w, gate_up),
        "down": (lambda li: layers[li].down_w, down),
        "head": (lambda li: head_w, head),
    }


def gemv_tile(weight, rows: int, tile, post_norm: bool = False, element_size: int | None = None) -> tuple | None:
    """(BLOCK_N, warps, programs, weight bytes per program) of the GEMV for this weight (stored
    with `element_size` bytes per value where given) and column tiling, under the GEMV module's
    current knobs."""
    import triton

    from tritonformer.kernels import triton_gemv

    if tile is None:
        return None
    paired, half = tile
    n, k = weight.shape
    kp = triton.next_power_of_2(k)
    warps = triton_gemv.program_warps(k)
    size = element_size or weight.element_size()
    halves = n // (2 * half) if paired else 1
    bn = triton_gemv.block_n(half, kp, triton.next_power_of_2(rows), paired, warps, element_size=size,
                             post_norm=post_norm, weight_k=k, halves=halves)
    programs = halves * triton.cdiv(half, bn)
    return bn, warps, programs, bn * (2 if paired else 1) * k * size


def time_variant(variant: Variant, layer_ids: list[int], repeat: int, reps: int) -> tuple[float, list]:
    """(us per replay of the variant over `layer_ids`, `repeat` times, kernels it compiled)."""
    from time_small_gemm import graph_us

    before = compiled_kernels()
    us = graph_us(lambda: [variant.call(li) for _ in range(repeat) for li in layer_ids], calls=1, reps=reps)
    fresh = [k for key, k in compiled_kernels().items() if key not in before]
    return us, fresh


# --- the report --------------------------------------------------------------------------------

def fmt(v, spec=".0f", none="-"):
    return none if v is None else format(v, spec)


def kinds_table(name, model, inp, args, bw, props, clock, families_after) -> dict:
    """Part 1 and 2 for one family at one row count. Returns kind -> (model us, bytes)."""
    from tritonformer.kernels import triton_gemv

    layer_ids = list(range(len(model.layers)))
    print("| kind | variant | route | BLOCK_N x warps | programs | KB/program | regs | spills | programs/SM | "
          "KB in flight/SM | us | GB/s | of copy |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    results, sweeps = {}, {}
    for kind, (weight_of, variants) in kind_variants(model, inp, args.fp8).items():
        ids, repeat = ([0], 2) if kind == "head" else (layer_ids, 1)
        numel = sum(weight_of(li).numel() for li in ids) * repeat
        for v in variants:
            size = 1 if v.fp8 else weight_of(0).element_size()
            nbytes = numel * size
            us, fresh = time_variant(v, ids, repeat, args.reps)
            tile = gemv_tile(weight_of(0), inp.rows, v.gemv, v.post_norm, size) if v.route == "gemv" else None
            # registers of the GEMV compiled for this variant (none where it was compiled before)
            regs, spills, warps, shared = kernel_facts(fresh) if v.route == "gemv" else (None,) * 4
            per_sm = programs_per_sm(regs, warps or 4, shared, props)
            inflight = per_sm * tile[3] / 1024 if tile and per_sm is not None else None
            gbps = nbytes / us / 1e3
            print(f"| {kind} | {v.name} | {v.route} | {f'{tile[0]} x {tile[1]}' if tile else '-'} | "
                  f"{fmt(tile and tile[2])} | {fmt(tile and tile[3] / 1024, '.1f')} | {fmt(regs)} | {fmt(spills)} | "
                  f"{fmt(per_sm)} | {fmt(inflight)} | {us:.1f} | {gbps:.0f} | {gbps * 1e9 / bw:.2f} |", flush=True)
            if v.name == "model":
                results[kind] = (us, nbytes)
            if v.name in ("model", "fp8") and v.route == "gemv" and not args.no_sweep:
                sweeps[kind if v.name == "model" else f"{kind} fp8"] = (v, ids, repeat, nbytes, weight_of(0), gbps)
    if sweeps and clock.allows(families_after):
        print(f"\nGEMV register budget (weight bytes per warp) x warps ({name}, rows {inp.rows}): GB/s of each kind's "
              f"model call (and FP8 call, whose weights get x{triton_gemv._FP8_BYTES_FACTOR} the bytes)")
        print("| kind | current (budget, warps) BLOCK_N: GB/s | best: GB/s | every (budget x warps: BLOCK_N GB/s) |")
        print("|---|---|---|---|")
        saved = triton_gemv._BYTES_PER_WARP, triton_gemv._WARPS
        try:
            for kind, (v, ids, repeat, nbytes, w, current) in sweeps.items():
                seen, cells, best = {}, [], None
                for budget, warps in itertools.product(BUDGETS, WARPS):
                    if not clock.allows(families_after):
                        cells.append("rest skipped (deadline)")
                        break
                    triton_gemv._BYTES_PER_WARP, triton_gemv._WARPS = budget, warps
                    bn = gemv_tile(w, inp.rows, v.gemv, v.post_norm, 1 if v.fp8 else None)[0]
                    if (bn, warps) not in seen:
                        us, _ = time_variant(v, ids, repeat, args.reps)
                        seen[(bn, warps)] = nbytes / us / 1e3
                    gbps = seen[(bn, warps)]
                    cells.append(f"{budget}x{warps}: {bn} {gbps:.0f}")
                    if best is None or gbps > best[0]:
                        best = (gbps, budget, warps, bn)
                triton_gemv._BYTES_PER_WARP, triton_gemv._WARPS = saved
                bn0 = gemv_tile(w, inp.rows, v.gemv, v.post_norm, 1 if v.fp8 else None)[0]
                best_cell = f"({best[1]}, {best[2]}) {best[3]}: {best[0]:.0f}" if best else "-"
                print(f"| {kind} | ({saved[0]}, {saved[1]}) {bn0}: {current:.0f} | {best_cell} | {'; '.join(cells)} |",
                      flush=True)
        finally:
            triton_gemv._BYTES_PER_WARP, triton_gemv._WARPS = saved
    elif sweeps:
        print(f"\n(GEMV sweep of {name} skipped: {clock.left():.0f} s left)")
    return results


def step_us(model, inp: Inputs, reps: int) -> float:
    """us per replay of the model's decode graph for inp.rows sequences at inp.context keys."""
    from ab_decode_step import replay_ms

    from tritonformer.backend.decoder.batch import BatchEntry
    from tritonformer.backend.decoder.runner import DecoderRunner

    runner = DecoderRunner(model, inp.cache, inp.rows)
    bps = inp.blocks_per_seq
    entries = [BatchEntry([1], inp.context, list(range(b * bps, (b + 1) * bps)), True) for b in range(inp.rows)]
    best = replay_ms(runner, entries, reps) * 1e3
    del runner
    return best


def chain_us(model, inp: Inputs, reps: int) -> float:
    """us of the layers' linears in model order (qkv, o, gate_up, down per layer), no attention."""
    from time_small_gemm import graph_us

    kinds = kind_variants(model, inp)
    calls = [kinds[k][1][0].call for k in ("qkv", "o", "gate_up", "down")]
    return graph_us(lambda: [call(li) for li in range(len(model.layers)) for call in calls], calls=1, reps=reps)


def attention_rows(model, inp: Inputs, args, clock, families_after) -> tuple[dict, int]:
    """us per decode attention launch (and its combine) over key splits; and the graphs' split."""
    import torch

    from time_small_gemm import graph_us
    from tune_decode_attention import cold_input_sets, ranked_cells, sweep_launch_configs
    from tritonformer.backend.decoder.graphs import key_splits
    from tritonformer.kernels import triton_attention as ta
    from tritonformer.kernels.gpu_info import hopper_or_newer, sm_count

    c, layer = model.config, model.layers[0]
    current = key_splits(inp.rows, c.num_kv_heads, sm_count(model.device))
    sets = [(q.to(model.dtype), kc.to(model.dtype), vc.to(model.dtype), tables, cu_q, seqlens, out.to(model.dtype))
            for q, kc, vc, tables, cu_q, seqlens, out in
            cold_input_sets(inp.rows, inp.context, c.num_heads, c.num_kv_heads, c.head_dim)]
    torch.cuda.empty_cache()

    def run(splits):
        turn = itertools.cycle(sets)

        def launch():
            q, kc, vc, tables, cu_q, seqlens, out = next(turn)
            ta.paged_attention(q, kc, vc, tables, cu_q, seqlens, True, scale=c.attn_scale, max_seqlen_q=1, out=out,
                               num_splits=splits, window=layer.window, softcap=c.attn_softcap)
        return launch

    splits_timed = sorted(set(SPLITS) | {current})  # the graphs' own count always among them
    times = {s: graph_us(run(s), calls=2 * len(sets), reps=args.reps) for s in splits_timed}
    block_d = 1 << (c.head_dim - 1).bit_length()
    config = ta._launch_config(block_d, model.dtype, c.num_heads // c.num_kv_heads, True,
                               hopper_or_newer(model.device))
    if current > 1:  # a split decode's blocks, warps and stages are its own
        config = (config[0], *ta._split_decode_config(block_d, model.dtype, True, config[1:],
                                                    c.num_heads // c.num_kv_heads))
    print(f"\ndecode attention alone (no PDL overlap: compare splits in whole steps, ab_decode_step.py), "
          f"rows {inp.rows}, context {inp.context}: heads {c.num_heads}/{c.num_kv_heads} x "
          f"{c.head_dim} (tile {block_d}), softcap {c.attn_softcap}, window {layer.window}; launch config "
          f"(BLOCK_M, BLOCK_N, warps, stages) {config}; the decode graphs split keys {current} ways")
    print("| key splits | " + " | ".join(f"{s}{' (graphs)' if s == current else ''}" for s in splits_timed) + " |")
    print("|---|" + "---:|" * len(splits_timed))
    print("| us per layer (attention + combine) | " + " | ".join(f"{times[s]:.2f}" for s in splits_timed) + " |",
          flush=True)
    if args.attention_configs:
        if clock.allows(families_after):
            candidates = list(itertools.product((16, 32, 64), (2, 4, 8), (1, 2)))  # BLOCK_N, warps, stages
            found = sweep_launch_configs(candidates, lambda cfg: graph_us(run(current), calls=2 * len(sets),
                                                                          reps=args.reps),
                                         lambda cfg: (config[0], *cfg))
            print(f"attention launch configs at {current} splits (BLOCK_N, warps, stages): best us | 1st | 2nd | 3rd: "
                  f"{ranked_cells(found, '.2f')}", flush=True)
        else:
            print(f"(attention config sweep skipped: {clock.left():.0f} s left)")
    return times, current


def family(name: str, rows: int, args, bw: float, clock: Clock, families_after: int) -> dict:
    import torch

    from tritonformer.client.gpu_measure import read_bytes_per_step
    from tritonformer.client.model_shapes import DECODER_SHAPES, random_decoder

    published = DECODER_SHAPES[name]
    depth = published["num_hidden_layers"]
    layers = min(args.layers, depth)
    cfg = {**published, "num_hidden_layers": layers}
    dev, dtype = torch.device("cuda"), torch.bfloat16
    model = random_decoder(cfg, dev, dtype, max_model_len=args.context + 64)
    inp = Inputs(model, rows, args.context)
    props = torch.cuda.get_device_properties(dev)
    c = model.config
    head_bytes = model.output_head.numel() * model.output_head.element_size()
    final_bytes = model.final_norm.numel() * model.final_norm.element_size()
    layer_bytes = (read_bytes_per_step(model) - head_bytes - final_bytes) / layers
    kv_layer = rows * args.context * c.num_kv_heads * c.head_dim * 2 * model.dtype.itemsize
    print(f"\n## {name}: {layers} of {depth} layers, rows {rows}, context {args.context}; weights per layer "
          f"{layer_bytes / 1e6:.1f} MB (floor {layer_bytes / bw * 1e6:.1f} us), KV read per layer "
          f"{kv_layer / 1e6:.1f} MB, head {head_bytes / 1e6:.0f} MB")
    kinds = kinds_table(name, model, inp, args, bw, props, clock, families_after)

    full = step_us(model, inp, args.reps)
    kept = model.layers
    try:
        model.layers = kept[: layers // 2]
        half = step_us(model, inp, args.reps)
    finally:
        model.layers = kept
    chain = chain_us(model, inp, args.reps)
    attention, splits = attention_rows(model, inp, args, clock, families_after)
    per_layer = (full - half) / (layers - layers // 2)
    fixed = full - layers * per_layer
    out = dict(
        name=name, rows=rows, depth=depth, layers=layers, full=full, per_layer=per_layer, fixed=fixed,
        layer_floor=layer_bytes / bw * 1e6, kv_floor=kv_layer / bw * 1e6,
        head_floor=(head_bytes + final_bytes) / bw * 1e6,
        kinds_alone=sum(kinds[k][0] for k in ("qkv", "o", "gate_up", "down")) / layers,
        chain=chain / layers, attention=attention[splits], head_alone=kinds["head"][0] / 2,
        best_split=min(attention, key=attention.get), best_attention=min(attention.values()),
    )
    del model, inp, kept
    gc.collect()
    torch.cuda.empty_cache()
    return out


def summary(results: list[dict], bw: float) -> None:
    print(f"\n# summary: us per layer from the decode step at two depths ((step(L) - step(L/2)) / (L/2)); fixed = "
          f"step(L) - L x per-layer (embedding, final norms, head, soft-cap, argmax); floors at {bw / 1e9:.0f} GB/s; "
          "projected = fixed + published layers x per-layer")
    print("| model | rows | per-layer us | weight floor us | ratio | +KV floor | ratio w/ KV | kinds alone us | "
          "chain, no attn us | step - chain us | attention (graphs' splits) us | best split: us | fixed us | "
          "head alone us | head floor us | projected ms | floor ms | ratio | floor+KV ms | ratio w/ KV |")
    print("|---|---:|" + "---:|" * 18)
    for r in results:
        proj = (r["fixed"] + r["depth"] * r["per_layer"]) / 1e3
        floor = (r["head_floor"] + r["depth"] * r["layer_floor"]) / 1e3
        floor_kv = floor + r["depth"] * r["kv_floor"] / 1e3
        lf, lkv = r["layer_floor"], r["layer_floor"] + r["kv_floor"]
        print(f"| {r['name']} | {r['rows']} | {r['per_layer']:.1f} | {lf:.1f} | {r['per_layer'] / lf:.2f} | "
              f"{lkv:.1f} | {r['per_layer'] / lkv:.2f} | {r['kinds_alone']:.1f} | {r['chain']:.1f} | "
              f"{r['per_layer'] - r['chain']:.1f} | {r['attention']:.1f} | "
              f"{r['best_split']}: {r['best_attention']:.1f} | "
              f"{r['fixed']:.0f} | {r['head_alone']:.0f} | {r['head_floor']:.0f} | {proj:.3f} | {floor:.3f} | "
              f"{proj / floor:.2f} | {floor_kv:.3f} | {proj / floor_kv:.2f} |")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.layers < 2 or args.layers % 2:
        raise SystemExit("--layers must be even and at least 2")
    import torch

    from tritonformer.client.gpu_measure import copy_bandwidth

    clock = Clock(args.deadline_s)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception as e:  # the name from torch below is enough
        smi = f"nvidia-smi: {type(e).__name__}"
    names = [m for m in args.models.split(",") if m]
    rows_list = [int(r) for r in args.rows.split(",")]
    bw = copy_bandwidth()
    gc.collect()
    torch.cuda.empty_cache()
    print(f"# family linears, {smi} ({torch.cuda.get_device_name()}), bf16, torch {torch.__version__}; copy bandwidth "
          f"{bw / 1e9:.0f} GB/s; us per CUDA graph replay, best of {args.reps}; GB/s = weight bytes / time; "
          f"'of copy' = GB/s / copy bandwidth")
    results = []
    jobs = [(name, rows) for rows in rows_list for name in names]
    with torch.inference_mode():
        for i, (name, rows) in enumerate(jobs):
            started = time.perf_counter()
            try:
                results.append(family(name, rows, args, bw, clock, len(jobs) - i - 1))
            except Exception:  # the tables printed so far stand; the next family still runs
                print(f"\n{name}, rows {rows} FAILED:\n{traceback.format_exc(limit=4)}", flush=True)
                gc.collect()
                torch.cuda.empty_cache()
            print(f"\n({name}, rows {rows}: {time.perf_counter() - started:.0f} s; {clock.left():.0f} s before the "
                  "deadline)", flush=True)
    summary(results, bw)
    print(f"\n# done in {time.perf_counter() - clock.t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
