"""Programmatic dependent launch (PDL; Hopper and later), shared by the decode path's kernels.

A kernel launched with PDL may start while the kernel before it on the stream still runs; it
must call `wait_for_predecessor` before it reads anything that kernel (or any before it)
writes, or writes anything they read. Calling it also lets the next kernel launch early, so a
chain of such kernels overlaps each one's launch, and whatever it loads before waiting (the
weights of a linear: triton_gemv.py), with the tail of the one before. A kernel that never
waits is not launched this way. Measured on the H100: docs/benchmarks/defaults.md, "Defaults".
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritonformer.kernels.gpu_info import hopper_or_newer

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# PDL is only ever on for a GPU that has it; a benchmark comparing with and without sets this.
USE_PDL = True

if not _INTERPRETED:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
else:  # the interpreter runs one program at a time, with no grid dependencies: PDL is never on
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def wait_for_predecessor(PDL: tl.constexpr):
    """Block until the previous kernel's writes are visible; then let the next kernel launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL."""
    return USE_PDL and not _INTERPRETED and hopper_or_newer(device)


def launch_options(pdl: bool) -> dict:
    """The launch keyword a PDL kernel needs (none otherwise: the interpreter takes no such option)."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte lines holding `ptrs` (a hint: it takes no registers and nothing
    waits for it). What a kernel will read from HBM once it has waited for its predecessor:
    by then it is in L2."""
    tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)
