"""Sweep the packed (prefill) attention's launch configuration on BERT's shapes (GPU).

The kernel profile puts attention at 195 us per layer of bert-base at 64 x 512 tokens (264
TFLOP/s, 14% of the forward) and 4.4 ms of the 256-request workload. This times
`kernels.varlen_attention` as the encoder calls it (q, k, v strided views of one packed QKV
GEMM output, non-causal) under every (BLOCK_M, BLOCK_N, num_warps, num_stages) of a small grid
and prints the current configuration next to the best ones:

    python3 tools/gpu/tune_prefill_attention.py [--workloads 64x512,u5-500,8x128]

With --decoders (client/model_shapes.py names), instead: one causal prompt of --tokens tokens at
each decoder's attention shape (heads, KV heads, head dim, scale, soft-cap, window of its first
layer), through the paged cache as a decoder's prefill runs it, bf16:

    python3 tools/gpu/tune_prefill_attention.py --decoders gemma-2-9b,phi-3-mini,llama-3.1-8b --tokens 2000
"""
from __future__ import annotations

import argparse
import itertools

import numpy as np
import torch
import triton.testing

from tune_decode_attention import ranked_cells, sweep_launch_configs
from tritonformer.kernels import reference
from tritonformer.kernels import triton_attention as ta
from tritonformer.kernels.gpu_info import hopper_or_newer

HEADS, HEAD_DIM = 12, 64  # bert-base


def lengths_of(workload: str) -> list[int]:
    """"BxL": B sequences of L tokens; "u5-500": the 256-request U[5,500] seed-0 workload."""
    if workload == "u5-500":
        return [int(n) for n in np.random.default_rng(0).integers(5, 501, 256)]
    batch, length = map(int, workload.split("x"))
    return [length] * batch


def packed_qkv(lengths: list[int]):
    """q, k, v as the encoder passes them: strided views of one `[T, 3, H, D]` tensor."""
    dev = torch.device("cuda")
    qkv = torch.randn(sum(lengths), 3, HEADS, HEAD_DIM, device=dev, dtype=torch.float16)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), device=dev, dtype=torch.int32)
    return qkv[:, 0], qkv[:, 1], qkv[:, 2], cu


CANDIDATES = list(itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)))  # BLOCK_M, BLOCK_N, warps, stages
DECODER_CANDIDATES = list(itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3)))


def decoder_prefill(names: list[str], tokens: int) -> None:
    """The sweep on each decoder's prefill attention (paged keys, causal, one prompt)."""
    from tritonformer.client.model_shapes import DECODER_SHAPES, random_decoder

    dev, dtype, page = torch.device("cuda"), torch.bfloat16, 16
    print(f"# decoder prefill attention, one prompt of {tokens} tokens, {torch.cuda.get_device_name()}, bf16, "
          "paged keys, causal, median ms")
    print("| model | layer (window, soft-cap) | current (BLOCK_M, BLOCK_N, warps, stages) ms | TFLOP/s | best TFLOP/s | "
          "best ms | best | 2nd | 3rd |")
    print("|---|---|---|---:|---:|---:|---|---|---|")
    for name in names:
        model = random_decoder({**DECODER_SHAPES[name], "num_hidden_layers": 2}, dev, dtype, max_model_len=tokens + 64)
        c = model.config
        g = torch.Generator(device=dev).manual_seed(0)
        blocks = -(-tokens // page)
        q = torch.randn(tokens, c.num_heads, c.head_dim, device=dev, generator=g).to(dtype)
        kc = torch.randn(blocks, page, c.num_kv_heads, c.head_dim, device=dev, generator=g).to(dtype)
        vc = torch.randn(blocks, page, c.num_kv_heads, c.head_dim, device=dev, generator=g).to(dtype)
        tables = torch.arange(blocks, device=dev, dtype=torch.int32)[None, :]
        cu_q = torch.tensor([0, tokens], device=dev, dtype=torch.int32)
        seqlens = torch.tensor([tokens], device=dev, dtype=torch.int32)
        out = torch.empty_like(q)
        flops = 2.0 * tokens * tokens * c.num_heads * c.head_dim  # causal: half of 4 N^2 H D
        window = model.layers[0].window

        def run():
            return ta.paged_attention(q, kc, vc, tables, cu_q, seqlens, True, scale=c.attn_scale,
                                      max_seqlen_q=tokens, out=out, window=window, softcap=c.attn_softcap)

        expected = run().float().clone()

        def timed() -> float:
            err = (run().float() - expected).abs().max().item()
            if not err < 2e-2:
                raise AssertionError(f"max error {err:.2e} against the current configuration")
            return triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median")

        block_d = 1 << (c.head_dim - 1).bit_length()
        base_cfg = ta._launch_config(block_d, dtype, tokens * (c.num_heads // c.num_kv_heads), True,
                                     hopper_or_newer(dev))
        base = timed()
        results = sweep_launch_configs(DECODER_CANDIDATES, lambda cfg: timed(), lambda cfg: cfg)
        best = f"{flops / results[0][0] / 1e9:.0f}" if results else "-"
        print(f"| {name} | 0 ({window}, {c.attn_softcap}) | {base_cfg} {base:.4f} | {flops / base / 1e9:.0f} "
              f"| {best} | {ranked_cells(results, '.4f')} |", flush=True)
        del model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="64x512,u5-500,8x128")
    parser.add_argument("--decoders", default="", help="decoder shapes to sweep instead (model_shapes names)")
    parser.add_argument("--tokens", type=int, default=2000, help="--decoders: the prompt's tokens")
    args = parser.parse_args()
    if args.decoders:
        decoder_prefill([n for n in args.decoders.split(",") if n], args.tokens)
        return 0
    current = ta._launch_config
    print(f"# packed attention, bert-base heads, {torch.cuda.get_device_name()}, fp16, non-causal, median ms")
    print("| workload | current (BLOCK_M, BLOCK_N, warps, stages) ms | TFLOP/s | best TFLOP/s | best ms | best | 2nd | 3rd |")
    print("|---|---|---:|---:|---:|---|---|---|")
    for workload in args.workloads.split(","):
        lengths = lengths_of(workload)
        q, k, v, cu = packed_qkv(lengths)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        longest = max(lengths)
        flops = 4.0 * sum(n * n for n in lengths) * HEADS * HEAD_DIM
        expected = reference.varlen_attention(q.float(), k.float(), v.float(), cu, cu, causal=False)

        def run():
            return ta.varlen_attention(q, k, v, cu, cu, causal=False, max_seqlen_q=longest, out=out)

        def timed() -> float:
            err = (run().float() - expected).abs().max().item()
            if not err < 2e-2:
                raise AssertionError(f"max error {err:.2e}")
            return triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")

        base_cfg = current(HEAD_DIM, q.dtype, longest, True, hopper_or_newer(q.device))
        base = timed()
        results = sweep_launch_configs(CANDIDATES, lambda c: timed(), lambda c: c)
        best_tflops = f"{flops / results[0][0] / 1e9:.0f}" if results else "-"
        print(f"| {workload} | {base_cfg} {base:.4f} | {flops / base / 1e9:.0f} | {best_tflops} | "
              f"{ranked_cells(results, '.4f')} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
