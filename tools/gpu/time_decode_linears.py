"""A decode step's linears, layer after layer, as the models run them: the separate kernels
(norm kernels, the small GEMM, cuBLAS) vs the prefetching GEMV, without and with programmatic
dependent launch (GPU).

Each model's whole layer stack (distinct random weights per layer, so nothing is served from
L2 that a real step would read from HBM) runs what `forward` runs around attention: the norm +
QKV + cache write, the attention output projection, the norm + MLP up-projection + activation
and the down-projection; attention itself is left out (its output is stood in for by q). Timed
as one CUDA graph replay, as the decode graphs replay it. Past the GEMV's two rows, "GEMV +
PDL" is what PDL changes there: every linear in the small GEMM, which pulls its weight tile
into L2 before it waits, and the norm kernels launched early too:

    python3 tools/gpu/time_decode_linears.py [--rows 1,2,16,64] [--sweep]

--sweep also times the GEMV's other register budgets and warp counts.
"""
from __future__ import annotations

import argparse

import torch
import triton

from tritonformer.kernels import triton_gemv, triton_pdl
from tritonformer.kernels import triton_small_gemm as tsg
from tritonformer.kernels.reference import PreNorm
from time_small_gemm import graph_us

# model -> (layers, hidden, intermediate, heads, kv_heads, head_dim, norm, activation, biases)
MODELS = {
    "gpt2": (12, 768, 3072, 12, 12, 64, "layer", "gelu_tanh", True),
    "llama-1B": (16, 2048, 8192, 32, 8, 64, "rms", "silu_mul", False),
}
MODES = {  # name -> (GEMV rows, PDL)
    "separate kernels": (0, False),
    "GEMV": (2, False),
    "GEMV + PDL": (2, True),
}


def build(model: str, rows: int, dev, dtype):
    """The stack's weights and a `run()` of its linears for `rows` decode rows."""
    n_layers, hid, inter, heads, kv_heads, d, norm, act, biases = MODELS[model]
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, std=1.0, mean=0.0):
        return (torch.randn(*shape, generator=g, device=dev) * std + mean).to(dtype)

    qkv_n = (heads + 2 * kv_heads) * d
    up_n = 2 * inter if act == "silu_mul" else inter
    layers = [{
        "ln1": (rand(hid, std=0.1, mean=1.0), rand(hid, std=0.1) if norm == "layer" else None),
        "ln2": (rand(hid, std=0.1, mean=1.0), rand(hid, std=0.1) if norm == "layer" else None),
        "qkv_w": rand(qkv_n, hid, std=hid ** -0.5), "qkv_b": rand(qkv_n, std=0.1) if biases else None,
        "o_w": rand(hid, heads * d, std=hid ** -0.5), "o_b": rand(hid, std=0.1) if biases else None,
        "up_w": rand(up_n, hid, std=hid ** -0.5), "up_b": rand(up_n, std=0.1) if biases else None,
        "down_w": rand(hid, inter, std=inter ** -0.5), "down_b": rand(hid, std=0.1) if biases else None,
    } for _ in range(n_layers)]
    blocks = triton.cdiv(5 * rows, 16)  # room for every row's slot
    k_cache, v_cache = rand(blocks, 16, kv_heads, d), rand(blocks, 16, kv_heads, d)
    slots = torch.arange(rows, device=dev) * 5
    table = rand(rows, 2, d // 2, std=0.5)
    cos, sin = (table[:, 0], table[:, 1]) if norm == "rms" else (None, None)
    x0, h0 = rand(rows, hid), rand(rows, hid)
    weight_bytes = sum(t.numel() * t.element_size() for layer in layers for t in layer.values() if torch.is_tensor(t))

    def run():
        x, pre, h = x0, PreNorm(*layers[0]["ln1"], 1e-5, None, h0, torch.empty_like(h0)), h0
        for li, layer in enumerate(layers):
            q = tsg.prenorm_qkv_to_cache(x, pre, layer["qkv_w"], layer["qkv_b"], heads, kv_heads, d, cos, sin,
                                         k_cache, v_cache, slots)
            h = pre.sum_out
            o = tsg.linear_act(q.reshape(rows, -1), layer["o_w"])
            mlp = PreNorm(*layer["ln2"], 1e-5, layer["o_b"], h, torch.empty_like(h))
            x = tsg.linear_act(tsg.linear_act(o, layer["up_w"], layer["up_b"], act, prenorm=mlp), layer["down_w"])
            h = mlp.sum_out
            nxt = layers[(li + 1) % len(layers)]["ln1"]
            pre = PreNorm(*nxt, 1e-5, layer["down_b"], h, torch.empty_like(h))
        return x

    return run, weight_bytes


def timed(run, gemv_rows: int, pdl: bool) -> tuple[float, torch.Tensor]:
    saved = triton_gemv.MAX_ROWS, triton_pdl.USE_PDL
    try:
        triton_gemv.MAX_ROWS, triton_pdl.USE_PDL = gemv_rows, pdl
        us = graph_us(run, calls=1, reps=50)
        return us, run()
    finally:
        triton_gemv.MAX_ROWS, triton_pdl.USE_PDL = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,16,64")
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    dev, dtype = torch.device("cuda"), torch.float16
    print(f"# a decode step's linears (no attention), {torch.cuda.get_device_name()}, fp16, "
          "us per step (one CUDA graph replay, best of 50)")
    print("| model | rows | weight-read floor us | " + " | ".join(f"{m} us" for m in MODES) + " | speed-up |")
    print("|---|---:|---:|" + "---:|" * (len(MODES) + 1))
    for model in MODELS:
        for rows in map(int, args.rows.split(",")):
            run, weight_bytes = build(model, rows, dev, dtype)
            times, outs = [], []
            for gemv_rows, pdl in MODES.values():
                us, out = timed(run, gemv_rows, pdl)
                times.append(us)
                outs.append(out.float())
            for out in outs[1:]:  # the same step whichever kernels ran it
                torch.testing.assert_close(out, outs[0], atol=5e-2, rtol=5e-2)
            floor = weight_bytes / 3.35e12 * 1e6
            cells = " | ".join(f"{t:.1f}" for t in times)
            print(f"| {model} | {rows} | {floor:.1f} | {cells} | {times[0] / times[-1]:.2f}x |", flush=True)
            if args.sweep:
                sweep(run)
    return 0


def sweep(run) -> None:
    saved = triton_gemv._BYTES_PER_WARP, triton_gemv._WARPS
    try:
        for per_warp in (2048, 4096, 8192):
            for warps in (2, 4, 8):
                triton_gemv._BYTES_PER_WARP, triton_gemv._WARPS = per_warp, warps
                us, _ = timed(run, 2, True)
                print(f"|   budget {per_warp} bytes per warp, {warps} warps | | | | | {us:.1f} | |", flush=True)
    finally:
        triton_gemv._BYTES_PER_WARP, triton_gemv._WARPS = saved


if __name__ == "__main__":
    raise SystemExit(main())
