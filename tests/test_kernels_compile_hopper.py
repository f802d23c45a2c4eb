"""Kernels that the CPU runs only in Triton's interpreter also compile for a Hopper GPU (sm_90).

The interpreter accepts code the compiler refuses (a scalar mask on a block load, a type that
does not broadcast), so a kernel can pass every interpreter test and fail at its first launch on
the GPU. Here the tensor-parallel and embedding kernels are compiled ahead of time for sm_90, no
GPU needed (Triton's own PTX assembler), with their launches' constants; so are the mixture-of-experts
kernels (the routing's group-limited choice included), the split + rotary kernel with and
without PDL, the FP8 per-token quantisation kernels (the FFN activation fused in) and the
LayerNorm writing an E4M3 copy of its output. The compile runs in a child process: in this one
the conftest's TRITON_INTERPRET=1 made every kernel an interpreted function, which cannot be
compiled.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[1]


HOPPER_SHARED_BYTES = 232_448  # the most shared memory one program may take on an H100 / H200 (227 KiB)


def _compile(fn, args: dict, constants: dict, options: dict | None = None):
    """`fn` compiled for `args` (name -> Triton type), its constexprs and launch options, for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**args, **{name: "constexpr" for name in constants}}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants),
                          target=GPUTarget("cuda", 90, 32), options=options or {})


def prefill_kernels_shared() -> list[str]:
    """The recurrent layers' prompt kernels (kernels/triton_recurrent_prefill.py) with their launches' options at
    published head sizes (Qwen3.5's 128 x 128, OLMo hybrid's 96 x 192, Bamba's Mamba-2 64 x 128, Kimi Linear's KDA
    128 x 128, Falcon-Mamba's and Jamba's Mamba-1 state of 16): one line per kernel, its shared memory in bytes (a
    launch fails where it passes the GPU's limit)."""
    from tritonformer.kernels import triton_recurrent_prefill as trp

    f32, i32 = "*fp32", "i32"
    conv = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "state_ptr": f32, "slot_ptr": "*i64",
            "out_ptr": "*bf16", **{n: i32 for n in ("length", "n_channels", "stride_x", "stride_o", "stride_slot",
                                                    "stride_sc")}}
    prepare = {**{f"{n}_ptr": f32 for n in ("k", "v", "g", "beta", "w", "u")}, "length": i32, "padded": i32,
               **{f"stride_{n}": i32 for n in ("kt", "kh", "vt", "vh", "gt", "gh", "bt", "bh")}}
    scan = {**{f"{n}_ptr": f32 for n in ("q", "k", "g", "w", "u", "state")}, "slot_ptr": "*i64", "out_ptr": "*bf16",
            "length": i32, "padded": i32, "n_chunks": i32,
            **{f"stride_{n}": i32 for n in ("qt", "qh", "kt", "kh", "gt", "gh", "slot", "ot", "oh")}}
    ssd = {**{f"{n}_ptr": f32 for n in ("x", "dt", "a", "b", "c", "state")}, "slot_ptr": "*i64", "y_ptr": f32,
           "length": i32, "n_chunks": i32, "group": i32,
           **{f"stride_{n}": i32 for n in ("xt", "xh", "dt", "dh", "bt", "bg", "ct", "cg", "slot", "sh", "yt", "yh")}}
    kda_prepare = {**{f"{n}_ptr": f32 for n in ("q", "k", "v", "g", "beta", "w", "qs", "kc", "u", "o", "end")},
                   "length": i32, "padded": i32,
                   **{f"stride_{n}": i32 for n in ("qt", "qh", "kt", "kh", "vt", "vh", "gt", "gh", "bt", "bh")}}
    kda_scan = {**{f"{n}_ptr": f32 for n in ("w", "qs", "kc", "u", "o", "end", "state")}, "slot_ptr": "*i64",
                "out_ptr": "*bf16", "length": i32, "padded": i32, "n_chunks": i32,
                **{f"stride_{n}": i32 for n in ("slot", "ot", "oh")}}
    selective = {**{f"{n}_ptr": "*bf16" for n in ("x", "dt", "b", "c", "z", "y")}, "slot_ptr": "*i64",
                 **{f"{n}_ptr": f32 for n in ("dt_bias", "a", "d", "state")},
                 **{n: i32 for n in ("length", "n_channels", "stride_x", "stride_dt", "stride_b", "stride_c",
                                     "stride_z", "stride_slot", "stride_y")}}
    scan_options = dict(num_warps=trp.SCAN_WARPS, num_stages=trp.SCAN_STAGES)
    variants = [
        ("conv1d chunk", trp._conv1d_chunk_kernel, conv,
         dict(K=4, KP=4, HAS_BIAS=True, SILU=True, BT=trp.CONV_BLOCK_T, BC=trp.CONV_BLOCK_C), dict(num_warps=4)),
        ("delta prepare 128x128", trp._delta_chunk_prepare_kernel, prepare, dict(K=128, V=128, BK=128, BV=128, C=64),
         dict(num_warps=8)),
        ("delta prepare 96x192", trp._delta_chunk_prepare_kernel, prepare, dict(K=96, V=192, BK=128, BV=256, C=64),
         dict(num_warps=8)),
        ("delta scan 128x128", trp._delta_chunk_scan_kernel, scan,
         dict(K=128, V=128, BK=128, BV=trp.SCAN_BLOCK_V, C=64), scan_options),
        ("delta scan 96x192", trp._delta_chunk_scan_kernel, scan,
         dict(K=96, V=192, BK=128, BV=trp.SCAN_BLOCK_V, C=64), scan_options),
        ("ssd chunk 64x128", trp._ssd_chunk_kernel, ssd,
         dict(P=64, N=128, BP=trp.SSD_BLOCK_P, BN=128, C=trp.SSD_CHUNK), dict(num_warps=8, num_stages=trp.SCAN_STAGES)),
        # Kimi-Linear-48B-A3B's KDA (32 heads of 128 x 128), Falcon-Mamba-7B's and Jamba's Mamba-1 (d_inner 8192, a
        # runtime size; d_state 16)
        ("kda prepare 128x128", trp._kda_chunk_prepare_kernel, kda_prepare,
         dict(K=128, V=128, BK=128, BV=128, KB=trp.KDA_BLOCK_K, C=64), dict(num_warps=trp.KDA_PREPARE_WARPS)),
        ("kda scan 128x128", trp._kda_chunk_scan_kernel, kda_scan,
         dict(K=128, V=128, BK=128, BV=trp.SCAN_BLOCK_V, C=64), scan_options),
        ("selective scan 8192x16", trp._selective_scan_chunk_kernel, selective,
         dict(N=16, BC=trp.SELECTIVE_BLOCK_C, BN=16, TB=16), dict(num_warps=trp.SELECTIVE_WARPS)),
    ]
    return [f"{name}: shared {_compile(fn, args, consts, options).metadata.shared}"
            for name, fn, args, consts, options in variants]


def compile_all() -> list[str]:
    """Compile each kernel; returns one line per kernel variant: its name and whether its PTX
    waits for its predecessor (PDL) first."""
    import triton.language as tl

    from tritonformer.kernels import triton_allreduce as ar
    from tritonformer.kernels import triton_attention as ta
    from tritonformer.kernels import fp8
    from tritonformer.kernels import triton_elementwise as te
    from tritonformer.kernels import triton_fp8 as tf8
    from tritonformer.kernels import triton_kda as tk
    from tritonformer.kernels import triton_lightning as tlg
    from tritonformer.kernels import triton_moe as moe
    from tritonformer.kernels import triton_norms as tn
    from tritonformer.kernels import triton_recurrent as tr
    from tritonformer.kernels import triton_rglru as trg

    push = dict(PUSH_AT=ar.push_at(ar.region_bytes(1 << 20)), SLOT=ar.PUSH_SLOT, SLOTS=ar.FLAG_WORLD, WORLD=2,
                SENTINEL=ar.SENTINEL, PDL=True)
    ptrs = {"ptrs_ptr": "*i64", "state_ptr": "*i32", "rank": "i32"}
    plain = {"x_ptr": "*fp16", "out_ptr": "*fp16", "n": "i32", **ptrs}
    fused = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*fp32", "xn_ptr": "*fp32", "out_ptr": "*bf16",
             "sum_ptr": "*bf16", "rows": "i32", **ptrs, "eps": "fp32"}
    lookup = {"ids_ptr": "*i64", "table_ptr": "*bf16", "out_ptr": "*bf16", "n_ids": "i32", "n_rows": "i32",
              "n_cols": "i32", "start": "i32", "scale": "fp32"}
    grouped = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "pairs_ptr": "*i32", "experts_ptr": "*i32",
               "scale_ptr": "*fp32", "bias_ptr": "*bf16", "num_pairs": "i32", "N": "i32", "K": "i32",
               "stride_xm": "i32", "stride_we": "i32", "stride_wn": "i32", "stride_om": "i32", "stride_be": "i32"}
    gemm = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, PRECISION="tf32", PDL=True)
    route = {"logits_ptr": "*bf16", "weights_ptr": "*fp32", "pairs_ptr": "*i32", "experts_ptr": "*i32",
             "scratch_ptr": "*i32", "bias_ptr": "*fp32", "scale": "fp32", "eps": "fp32", "T": "i32", "E": "i32",
             "stride_l": "i32", "max_rows": "i32", "n_blocks": "i32"}
    chunk = {"logits_ptr": "*bf16", "weights_ptr": "*fp32", "ids_ptr": "*i32", "counts_ptr": "*i32",
             "pairs_ptr": "*i32", "bias_ptr": "*fp32", "scale": "fp32", "eps": "fp32", "T": "i32", "E": "i32",
             "stride_l": "i32", "max_rows": "i32"}
    # (the routing's constexprs where the choice is plain: not group-limited, not sparsemixer's)
    ungrouped = dict(GROUPS=1, KEPT=1, GROUP_TOP2=False, SPARSEMIXER=False)
    attention = {**{name: "*bf16" for name in ("Q", "K", "V", "Out")}, "cu_seqlens_q": "*i32", "cu_seqlens_k": "*i32",
                 **{f"stride_{t}": "i32" for t in ("qt", "qh", "kt", "kh", "vt", "vh", "ot", "oh")}, "qk_scale": "fp32",
                 "PartialOut": "*fp32", "PartialLse": "*fp32", "split_stride": "i32", "BlockTables": "*i32",
                 "stride_bt": "i32", "window": "i32", "softcap_log2e": "fp32", "lookahead": "i32", "Sinks": "*fp32",
                 "Slopes": "*fp32"}
    # Llama 4's chunked attention (CHUNKED: the window's machinery with the chunk's lower edge), paged
    chunked = dict(GROUP=5, CAUSAL=True, PRECISION="tf32", BLOCK_D=128, PAGE=16, PDL=True, HAS_WINDOW=True,
                   SOFTCAP=False, HEAD_DIM=128, D_PADDED=False, HAS_SINKS=False, CHUNKED=True, ALIBI=False)
    # ALiBi (BLOOM-7B1's 32 heads of 128, one query head per KV head), paged, no window
    alibi = dict(GROUP=1, CAUSAL=True, PRECISION="tf32", BLOCK_D=128, PAGE=16, PDL=True, HAS_WINDOW=False,
                 SOFTCAP=False, HEAD_DIM=128, D_PADDED=False, HAS_SINKS=False, CHUNKED=False, ALIBI=True)
    split_rotary = {**{f"{name}_ptr": "*bf16" for name in ("src", "bias", "q", "k", "v", "cos", "sin", "qn", "kn")},
                    "sq_ptr": "*fp32", "slot_ptr": "*i64", "src_stride_t": "i32", "src_stride_h": "i32",
                    "cos_stride_t": "i32", "sin_stride_t": "i32", "n_q_heads": "i32", "n_kv_heads": "i32",
                    "head_dim": "i32", "half": "i32", "norm_eps": "fp32", "norm_ranks": "i32"}
    quantize = {"q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "K": "i32"}
    fp8_consts = dict(MIN_AMAX=fp8.MIN_AMAX, FP8_MAX=fp8.E4M3_MAX)
    variants = [
        ("push", ar._push_all_reduce_kernel, plain, {**push, "BLOCK": 1024, "BITS": tl.int16}),
        ("push fp32", ar._push_all_reduce_kernel, {**plain, "x_ptr": "*fp32", "out_ptr": "*fp32"},
         {**push, "BLOCK": 1024, "BITS": tl.int32, "SENTINEL": ar.SENTINEL32}),
        ("one-shot", ar._one_shot_all_reduce_kernel, plain, dict(
            CAPACITY=ar.region_bytes(1 << 20), WORLD=2, WORLD_P2=2, BLOCK=2048, FLAG_PROGRAMS=ar.FLAG_PROGRAMS,
            FLAG_WORLD=ar.FLAG_WORLD, PDL=True)),
        ("push-norm", ar._push_all_reduce_norm_kernel, fused, {**push, "HIDDEN": 3072, "BLOCK": 4096, "POST_NORM": False}),
        ("push-norm post-norm", ar._push_all_reduce_norm_kernel, fused,
         {**push, "HIDDEN": 4096, "BLOCK": 4096, "POST_NORM": True}),
        ("embedding-part", tn._embedding_part_kernel, lookup, dict(BLOCK=4096, PDL=True, SCALE=False)),
        ("embedding-part scaled", tn._embedding_part_kernel, lookup, dict(BLOCK=4096, PDL=True, SCALE=True)),
        ("moe gate-up", moe._moe_gemm, grouped, dict(X_PER_PAIR=8, ACT=3, GATED=True, SCALED=False, HAS_BIAS=False,
                                                     **gemm)),
        ("moe down", moe._moe_gemm, {**grouped, "out_ptr": "*fp32"},
         dict(X_PER_PAIR=1, ACT=0, GATED=False, SCALED=True, HAS_BIAS=False,
              **{**gemm, "BLOCK_M": 64, "BLOCK_N": 128})),
        ("moe gate-up gpt-oss", moe._moe_gemm, grouped, dict(X_PER_PAIR=4, ACT=6, GATED=True, SCALED=False,
                                                             HAS_BIAS=True, **gemm)),
        ("moe down gpt-oss", moe._moe_gemm, {**grouped, "out_ptr": "*fp32"},
         dict(X_PER_PAIR=1, ACT=0, GATED=False, SCALED=True, HAS_BIAS=True, **gemm)),
        # Nemotron-H's ungated experts: the up projection's tile alone, squared ReLU (a decode step's config)
        ("moe up relu2", moe._moe_gemm, grouped, dict(X_PER_PAIR=6, ACT=7, GATED=False, SCALED=False, HAS_BIAS=False,
                                                      **{**gemm, "BLOCK_K": 256})),
        ("moe route-align", moe._route_align_kernel, route, dict(
            TOP_K=8, NORMALIZE=True, ROUND=2, SIGMOID=False, HAS_BIAS=False, BLOCK_M=16, T_P2=16, K_P2=8, E_P2=128,
            PDL=True, **ungrouped)),
        ("moe route-align softmax bias", moe._route_align_kernel, {**route, "logits_ptr": "*fp32"}, dict(
            TOP_K=6, NORMALIZE=True, ROUND=2, SIGMOID=False, HAS_BIAS=True, BLOCK_M=16, T_P2=1, K_P2=8, E_P2=64,
            PDL=True, **ungrouped)),
        ("moe route-align sigmoid", moe._route_align_kernel, route, dict(
            TOP_K=8, NORMALIZE=True, ROUND=0, SIGMOID=True, HAS_BIAS=True, BLOCK_M=16, T_P2=16, K_P2=8, E_P2=128,
            PDL=True, **ungrouped)),
        ("moe route-align DeepSeek-V3 groups", moe._route_align_kernel, {**route, "logits_ptr": "*fp32"}, dict(
            TOP_K=8, NORMALIZE=True, ROUND=0, SIGMOID=True, HAS_BIAS=True, BLOCK_M=16, T_P2=16, K_P2=8, E_P2=256,
            PDL=True, GROUPS=8, KEPT=4, GROUP_TOP2=True, SPARSEMIXER=False)),
        ("moe route-chunk DeepSeek-V2 groups", moe._route_chunk_kernel, chunk, dict(
            TOP_K=6, NORMALIZE=False, ROUND=0, SIGMOID=False, HAS_BIAS=False, CHUNK=16, K_P2=8, E_P2=256,
            FILL=256, PDL=True, GROUPS=8, KEPT=3, GROUP_TOP2=False, SPARSEMIXER=False)),
        # Phi-3.5-MoE's sparsemixer router (2 of 16, the weights rounded to bf16), a decode batch's
        ("moe route-align sparsemixer", moe._route_align_kernel, route, dict(
            TOP_K=2, NORMALIZE=False, ROUND=2, SIGMOID=False, HAS_BIAS=False, BLOCK_M=16, T_P2=16, K_P2=2, E_P2=16,
            PDL=True, GROUPS=1, KEPT=1, GROUP_TOP2=False, SPARSEMIXER=True)),
        ("moe prefill gate-up", moe._moe_gemm, grouped, dict(X_PER_PAIR=8, ACT=3, GATED=True, SCALED=False,
                                                             HAS_BIAS=False,
                                                             **{**gemm, "BLOCK_M": 128, "BLOCK_N": 128,
                                                                "PDL": False})),
        ("moe route-chunk", moe._route_chunk_kernel, chunk,
         dict(TOP_K=8, NORMALIZE=True, ROUND=2, SIGMOID=False, HAS_BIAS=False, CHUNK=16, K_P2=8, E_P2=128,
              FILL=256, PDL=True, **ungrouped)),
        ("moe align-offsets", moe._align_offsets_kernel,
         {"counts_ptr": "*i32", "offsets_ptr": "*i32", "experts_ptr": "*i32", "chunks": "i32", "E": "i32",
          "n_blocks": "i32"}, dict(BLOCK_M=64, E_P2=128, ROWS=16, PDL=True)),
        ("moe scatter-chunk", moe._scatter_chunk_kernel,
         {"ids_ptr": "*i32", "offsets_ptr": "*i32", "pairs_ptr": "*i32", "T": "i32"},
         dict(TOP_K=8, CHUNK=16, K_P2=8, E_P2=128, PDL=True)),
        ("moe sum-pairs", moe._sum_pairs_kernel, {"rows_ptr": "*fp32", "out_ptr": "*bf16", "N": "i32"},
         dict(TOP_K=8, BLOCK=1024, PDL=True)),
        ("attention chunked prefill", ta._varlen_attention_kernel, attention,
         dict(BLOCK_M=64, BLOCK_N=64, NUM_SPLITS=1, **chunked)),
        ("attention chunked split decode", ta._varlen_attention_kernel, attention,
         dict(BLOCK_M=16, BLOCK_N=64, NUM_SPLITS=8, **chunked)),
        ("attention alibi prefill", ta._varlen_attention_kernel, attention,
         dict(BLOCK_M=64, BLOCK_N=64, NUM_SPLITS=1, **alibi)),
        ("attention alibi split decode", ta._varlen_attention_kernel, attention,
         dict(BLOCK_M=16, BLOCK_N=32, NUM_SPLITS=16, **alibi)),
        ("split-rotary q/k norms", te._split_rotary_kernel, split_rotary,
         dict(HAS_BIAS=False, ROTARY=True, BLOCK_H=8, BLOCK_D=64, TO_SLOTS=True, Q_NORM=True, K_NORM=True,
              FULL_NORM=False, SUMMED=False, FULL_BLOCK=1024, PDL=True, V_NORM=False, V_FROM_K=False)),
        # Gemma 4's full layers: v normalised without a weight and read from k's projection (head_dim 512)
        ("split-rotary v norms from keys", te._split_rotary_kernel, split_rotary,
         dict(HAS_BIAS=False, ROTARY=True, BLOCK_H=4, BLOCK_D=256, TO_SLOTS=True, Q_NORM=True, K_NORM=True,
              FULL_NORM=False, SUMMED=False, FULL_BLOCK=1024, PDL=True, V_NORM=True, V_FROM_K=True)),
        # OLMo 2's whole-width q / k norms split over ranks: every rank's sums of squares read (norm_squares)
        ("split-rotary q/k norms over ranks", te._split_rotary_kernel, split_rotary,
         dict(HAS_BIAS=False, ROTARY=True, BLOCK_H=8, BLOCK_D=64, TO_SLOTS=True, Q_NORM=True, K_NORM=True,
              FULL_NORM=True, SUMMED=True, FULL_BLOCK=1024, PDL=True, V_NORM=False, V_FROM_K=False)),
        ("qk squares", te._qk_squares_kernel,
         {"qkv_ptr": "*bf16", "out_ptr": "*fp32", "stride_t": "i32", "q_width": "i32", "k_width": "i32"},
         dict(BLOCK=1024)),
        ("xielu", te._xielu_kernel, {"x_ptr": "*bf16", "p_ptr": "*fp32", "out_ptr": "*bf16", "n": "i32"},
         dict(BLOCK=4096)),
        # Kimi Linear's KDA decode step and its output norm at Kimi-Linear-48B-A3B's heads (32 of 128)
        ("kda decode", tk._kda_decode_kernel,
         {**{f"{name}_ptr": "*bf16" for name in ("mixed", "f", "b", "out")}, "neg_a_ptr": "*fp32",
          "dt_bias_ptr": "*fp32", "state_ptr": "*fp32", "slots_ptr": "*i64",
          **{f"stride_{t}": "i32" for t in ("m", "f", "b", "slot", "out")}, "lower_bound": "fp32"},
         dict(HEADS=32, K=128, V=128, BK=128, BV=32, BOUNDED=False, ROUND_DECAY=False)),
        # Ling 3.0's (bailing_hybrid): the bounded forget gate, rounded to bf16, at Ling-3.0-Flash's heads (32 of 128)
        ("kda decode bounded", tk._kda_decode_kernel,
         {**{f"{name}_ptr": "*bf16" for name in ("mixed", "f", "b", "out")}, "neg_a_ptr": "*fp32",
          "dt_bias_ptr": "*fp32", "state_ptr": "*fp32", "slots_ptr": "*i64",
          **{f"stride_{t}": "i32" for t in ("m", "f", "b", "slot", "out")}, "lower_bound": "fp32"},
         dict(HEADS=32, K=128, V=128, BK=128, BV=32, BOUNDED=True, ROUND_DECAY=True)),
        # MiniMax's lightning-attention decode step at MiniMax-Text-01's heads (64 of 128)
        ("lightning decode", tlg._lightning_decode_kernel,
         {"qkv_ptr": "*bf16", "decay_ptr": "*fp32", "state_ptr": "*fp32", "slots_ptr": "*i64", "out_ptr": "*bf16",
          **{f"stride_{t}": "i32" for t in ("m", "slot", "out")}},
         dict(D=128, BD=128, BV=32)),
        # RecurrentGemma's RG-LRU decode step at RecurrentGemma-2B's and -9B's heads (blocks of 256 channels)
        ("rglru decode", trg._rglru_decode_kernel,
         {**{f"{name}_ptr": "*bf16" for name in ("x", "y", "wi", "bi", "wa", "ba", "rate", "out")},
          "state_ptr": "*fp32", "slots_ptr": "*i64", "pos_ptr": "*i64",
          **{f"stride_{t}": "i32" for t in ("x", "y", "slot", "out")}},
         dict(B=256, BJ=trg.BLOCK_J, BK=trg.BLOCK_K)),
        ("kda gated norm", tr._gated_rms_norm_kernel,
         {**{f"{name}_ptr": "*bf16" for name in ("o", "z", "w", "out")}, "n_heads": "i32", "stride_z": "i32",
          "eps": "fp32"}, dict(V=128, BV=128, SIGMOID=True)),
        # FP8 per-token quantisation, and the FFN's activation fused into it: bert-base's 3,072-wide
        # up projection output (one pass, erf GELU), the two-pass loop of rows longer than
        # _ONE_PASS_K (tanh GELU, fp16), ReLU
        ("fp8 quantize rows", tf8._quantize_rows_kernel, {"x_ptr": "*bf16", **quantize, "stride_xm": "i32"},
         dict(**fp8_consts, BLOCK_K=1024, ONE_PASS=True)),
        ("fp8 act-quantize gelu", tf8._act_quantize_rows_kernel, {"h_ptr": "*bf16", **quantize, "stride_hm": "i32"},
         dict(**fp8_consts, BLOCK_K=4096, ONE_PASS=True, ACT=te.ACT_CODE["gelu"])),
        ("fp8 act-quantize gelu_tanh two-pass", tf8._act_quantize_rows_kernel,
         {"h_ptr": "*fp16", **quantize, "stride_hm": "i32"},
         dict(**fp8_consts, BLOCK_K=tf8._CHUNK_K, ONE_PASS=False, ACT=te.ACT_CODE["gelu_tanh"])),
        ("fp8 act-quantize relu", tf8._act_quantize_rows_kernel, {"h_ptr": "*bf16", **quantize, "stride_hm": "i32"},
         dict(**fp8_consts, BLOCK_K=4096, ONE_PASS=True, ACT=te.ACT_CODE["relu"])),
        # BERT's residual add + LayerNorm writing the E4M3 copy of its output as well (bert-base's 768)
        ("layer-norm fp8 copy", tn._add_bias_residual_layer_norm_kernel,
         {**{f"{n}_ptr": "*bf16" for n in ("x", "bias", "res", "w", "b", "out", "sum")}, "x_rows_ptr": "*i64",
          "res_rows_ptr": "*i64", "q_ptr": "*fp8e4nv", "q_scale_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32",
          "eps": "fp32"},
         dict(HAS_BIAS=True, HAS_RESIDUAL=True, WRITE_SUM=False, GATHER=False, ROWS=2, BLOCK=1024, ONE_TILE=True,
              PDL=True, QUANT=True, **fp8_consts)),
    ]
    return [f"{name}: {'waits' if 'griddepcontrol.wait' in _compile(fn, args, consts).asm['ptx'] else 'no wait'}"
            for name, fn, args, consts in variants]


def test_interpreted_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    for name in ("push", "push fp32", "one-shot", "push-norm", "push-norm post-norm", "embedding-part", "embedding-part scaled",
                 "moe gate-up", "moe down", "moe gate-up gpt-oss", "moe down gpt-oss", "moe up relu2",
                 "moe route-align", "moe route-align sigmoid", "moe route-align softmax bias",
                 "moe route-align DeepSeek-V3 groups", "moe route-chunk DeepSeek-V2 groups", "moe sum-pairs",
                 "moe route-align sparsemixer",
                 "moe route-chunk", "moe align-offsets", "moe scatter-chunk", "split-rotary q/k norms",
                 "split-rotary q/k norms over ranks",
                 "attention chunked prefill", "attention chunked split decode",
                 "attention alibi prefill", "attention alibi split decode"):
        assert f"{name}: waits" in lines, done.stdout  # compiled, and launched with PDL it waits first
    assert "moe prefill gate-up: no wait" in lines, done.stdout  # compiled (a prefill's GEMM: no PDL)
    assert "xielu: no wait" in lines, done.stdout  # compiled (Apertus's activation, its scalars loaded: no PDL)
    assert "kda decode: no wait" in lines and "kda gated norm: no wait" in lines, done.stdout  # (Kimi Linear's)
    assert "kda decode bounded: no wait" in lines, done.stdout  # (Ling 3.0's bounded, rounded decay)
    assert "lightning decode: no wait" in lines, done.stdout  # (MiniMax's)
    assert "rglru decode: no wait" in lines, done.stdout  # (RecurrentGemma's)
    assert "qk squares: no wait" in lines, done.stdout  # (OLMo 2's split norms: no PDL)
    for name in ("fp8 quantize rows", "fp8 act-quantize gelu", "fp8 act-quantize gelu_tanh two-pass",
                 "fp8 act-quantize relu"):
        assert f"{name}: no wait" in lines, done.stdout  # (the FP8 linears' activation quantisation: no PDL)
    assert "layer-norm fp8 copy: waits" in lines, done.stdout
    shared = {line.split(": shared ")[0]: int(line.split(": shared ")[1]) for line in lines if ": shared " in line}
    assert len(shared) == 9 and max(shared.values()) <= HOPPER_SHARED_BYTES, done.stdout


if __name__ == "__main__":
    print("\n".join(compile_all() + prefill_kernels_shared()))
