"""What a kernel boundary costs inside a CUDA graph, and what programmatic dependent launch
(PDL) saves of it (GPU, Hopper).

The decode steps and small encoder batches that miss their targets are 115-190 launches each.
This replays a chain of 100 trivial Triton kernels (add 1 to a vector: 1 or 132 programs) in
one CUDA graph, then the same chain interleaved with a cuBLAS GEMV (1 x 768 @ 768 x 2304, GPT-2's
QKV at batch 1), three ways: plain launches; `launch_pdl=True` with `gdc_wait()` at the top of
the kernel (its launch overlaps the previous kernel's tail); and also `gdc_launch_dependents()`
right after the wait (the next kernel may launch as soon as this one starts). Every variant's
result is checked (each kernel must see the previous one's writes):

    python3 tools/time_launch_chain.py
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from time_small_gemm import graph_us

CALLS = 100
VARIANTS = (("plain", False, False), ("PDL + wait", True, False), ("PDL + wait + early trigger", True, True))


@triton.jit
def _bump(x_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr):
    if PDL:
        tl_cuda.gdc_wait()  # the previous kernel's writes are visible from here on
    if TRIGGER:
        tl_cuda.gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x + 1.0, mask=offs < n)


def main() -> int:
    print(f"# kernel chains in one CUDA graph ({CALLS} Triton kernels), {torch.cuda.get_device_name()}, best of 30 replays")
    print("| chain | programs | plain us | PDL + wait us | PDL + wait + early trigger us |")
    print("|---|---:|---:|---:|---:|")
    a = torch.randn(1, 768, device="cuda", dtype=torch.float16)
    w = torch.randn(2304, 768, device="cuda", dtype=torch.float16)
    o = torch.empty(1, 2304, device="cuda", dtype=torch.float16)
    for programs in (1, 132):
        n = programs * 1024
        x = torch.zeros(n, device="cuda")

        def bump(pdl, trigger):
            _bump[(programs,)](x, n, BLOCK=1024, PDL=pdl, TRIGGER=trigger, launch_pdl=pdl)

        def with_gemv(pdl, trigger):
            torch.mm(a, w.t(), out=o)
            bump(pdl, trigger)
            bump(pdl, trigger)

        for name, link, per_link in (("Triton kernel", bump, 1), ("GEMV + 2 Triton kernels", with_gemv, 2)):
            cells = []
            for _, pdl, trigger in VARIANTS:
                calls = CALLS // per_link
                cells.append(f"{graph_us(lambda: link(pdl, trigger), calls=calls, reps=30):.2f}")
                x.zero_()
                for _ in range(calls):
                    link(pdl, trigger)
                assert bool((x == CALLS).all()), f"{name}: a kernel ran before its predecessor's writes landed"
            print(f"| {name} | {programs} | {' | '.join(cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
