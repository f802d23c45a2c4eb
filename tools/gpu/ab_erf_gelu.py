"""The exact (erf) GELU's two formulas in the Triton kernels, A against B in one machine start.

`kernels/triton_elementwise._erf_gelu` computes h * Phi(h) from a branch-free erfc (one
reciprocal, nine FMAs, one exp2); before, it was 0.5 * h * (1 + erf(h / sqrt 2)) with libdevice's
erf, which branches on |h|. The element-wise kernels that apply an erf GELU call that one
function (the bias + GELU pass, the FP8 FFN's act + quantise pass, the small GEMM's, the GEMV's
and the MoE experts' epilogues), so one setattr before anything compiles picks the formula for
the whole process; the fused many-row GEMM (`kernels/triton_gemm.py`) keeps libdevice's erf in
both arms (`--gemm-too`: it takes the arm's formula too, as it did when that was measured).
Each arm runs in a process of its own, the arms alternating, `--rounds` times:

    python3 tools/gpu/ab_erf_gelu.py [--rounds 2] [--shapes 64x512] [--gemm-too]

Per arm: the act + quantise kernel and the bias + GELU kernel on bert-base's FFN output at (64,
512) (`[32768, 3072]` bf16), and bert-base's forward (random weights) in bf16 and with
`quantization: fp8`, each the median of CUDA-event-timed calls (client/gpu_measure.cuda_ms); then a table
of the arms' best medians and new / old.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

LIBDEVICE = "libdevice-erf"
BRANCH_FREE = "branch-free"


def _set_formula(formula: str, gemm_too: bool) -> None:
    """The element-wise kernels' erf GELU is the arm's (`triton_gemm._erf_gelu` is libdevice's);
    with `gemm_too` the fused many-row GEMM's epilogue takes it as well."""
    from tritonformer.kernels import triton_elementwise, triton_gemm

    fn = triton_gemm._erf_gelu if formula == LIBDEVICE else triton_elementwise._erf_gelu
    triton_elementwise._erf_gelu = fn
    if gemm_too:
        triton_gemm._erf_gelu = fn


def arm(formula: str, shapes: list[tuple[int, int]], gemm_too: bool) -> None:
    """One arm, in this process: prints one `RESULT name=value` line per measurement."""
    _set_formula(formula, gemm_too)
    import torch
    import transformers

    from tritonformer.backend import quantization
    from tritonformer.backend.checkpoints.weights import strip_prefixes_of
    from tritonformer.client.gpu_measure import cuda_ms
    from tritonformer.kernels import dispatch, triton_fp8

    dev = torch.device("cuda")
    h = torch.randn(32768, 3072, device=dev, generator=torch.Generator(device=dev).manual_seed(0))
    h = h.to(torch.bfloat16)
    work = torch.empty_like(h)
    res = {"act + quantise [32768, 3072] us": 1e3 * cuda_ms(lambda: triton_fp8.act_quantize_rows_fp8(h, "gelu")),
           "bias + GELU [32768, 3072] us": 1e3 * cuda_ms(lambda: dispatch.bias_gelu(h, None, "none", out=work))}
    cfg = transformers.BertConfig()
    torch.manual_seed(0)
    state = strip_prefixes_of(transformers.BertModel(cfg).eval().state_dict())
    with torch.inference_mode():
        for seqs, length in shapes:
            ids = torch.randint(1000, 30000, (seqs * length,), device=dev,
                                generator=torch.Generator(device=dev).manual_seed(0))
            cu = torch.arange(0, seqs * length + 1, length, dtype=torch.int32, device=dev)
            for quant, label in (("none", "bf16"), ("fp8", "fp8")):
                model = quantization.load_encoder(cfg.to_dict(), state, dev, torch.bfloat16, quant)
                res[f"bert-base ({seqs}, {length}) {label} ms"] = cuda_ms(
                    lambda m=model: m.forward(ids, cu, max_seqlen=length), iters=10)
                del model
                torch.cuda.empty_cache()
    for name, value in res.items():
        print(f"RESULT {name}={value:.4f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shapes", default="64x512", help="bert-base forwards, SEQSxLENGTH[,...]")
    ap.add_argument("--gemm-too", action="store_true", help="the fused many-row GEMM takes the arm's formula")
    ap.add_argument("--arm", choices=(LIBDEVICE, BRANCH_FREE), help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.arm:
        arm(args.arm, shapes, args.gemm_too)
        return 0
    import torch

    best: dict[str, dict[str, float]] = {LIBDEVICE: {}, BRANCH_FREE: {}}
    for r in range(args.rounds):
        for formula in (LIBDEVICE, BRANCH_FREE):
            cmd = [sys.executable, __file__, "--arm", formula, "--shapes", args.shapes]
            out = subprocess.run(cmd + ["--gemm-too"] * args.gemm_too, capture_output=True, text=True,
                                 check=True).stdout
            for line in out.splitlines():
                if line.startswith("RESULT "):
                    name, value = line[len("RESULT "):].rsplit("=", 1)
                    best[formula][name] = min(best[formula].get(name, float("inf")), float(value))
            print(f"round {r + 1}, {formula}: " + "; ".join(f"{k} {v:.3f}" for k, v in best[formula].items()),
                  flush=True)
    print(f"\n## erf GELU: libdevice erf vs branch-free erfc, {torch.cuda.get_device_name()}, best of "
          f"{args.rounds} processes each")
    print("| measure | libdevice erf | branch-free | new / old |\n|---|---:|---:|---:|")
    for name, old in best[LIBDEVICE].items():
        new = best[BRANCH_FREE][name]
        print(f"| {name} | {old:.3f} | {new:.3f} | {new / old:.3f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
