"""The tensor-parallel all-reduce: the one-shot kernel (kernels/triton_allreduce.py) and the
choice between it and NCCL (backend/parallel/allreduce.py).

Without a GPU: the reference's fp32 accumulation, the routing and mode rules, and the kernel
in Triton's CPU interpreter, one rank at a time with its peers' halves of the protocol written
by the test (their data in their buffers, their flags already in ours). With 2+ GPUs (4 where
there are 4): our sum against NCCL's and against the reference, eagerly and inside a CUDA graph
replayed with new inputs, over symmetric memory and over CUDA IPC; every multi-process run is
bounded by a timeout and never calls destroy_process_group (it can hang at exit).
"""
from __future__ import annotations

import functools
import os
import time
import traceback

import pytest
import torch

from tritonformer.backend.parallel.allreduce import (MAX_BYTES, MODE_ENV, PUSH_MAX_BYTES, push_bytes, read_mode,
                                                     route)
from tritonformer.kernels.reference import all_reduce_sum

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


# ---- the reference ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, big", [(F16, 2048.0), (BF16, 256.0)])
def test_reference_accumulates_in_fp32_and_rounds_once(dtype, big):
    """One big value and seven ones: in the dtype each +1 is half a unit in the last place and
    rounds away (ties to even), in fp32 the seven add up and survive the final rounding."""
    inputs = [torch.tensor([big, 1.0, -3.5], dtype=dtype)] + [torch.tensor([1.0, 0.25, 0.5], dtype=dtype)] * 7
    running = inputs[0].clone()
    for x in inputs[1:]:
        running += x
    assert running[0].item() == big  # what a sum in the dtype gives
    got = all_reduce_sum(inputs)
    assert got.dtype == dtype
    assert got[0].item() == big + 8.0  # big + 7 lies halfway between two values: the even one
    expected = torch.stack([x.double() for x in inputs]).sum(0).to(dtype)
    assert torch.equal(got, expected)
    out = torch.empty_like(inputs[0])
    assert all_reduce_sum(inputs, out=out) is out and torch.equal(out, got)


def test_reference_is_a_plain_sum_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(5, 33, generator=g).to(BF16) for _ in range(4)]
    torch.testing.assert_close(all_reduce_sum(inputs).float(), sum(x.float() for x in inputs), atol=0.02, rtol=0.01)


# ---- which path serves a call ----------------------------------------------------------------

def test_mode_comes_from_the_environment_and_is_checked():
    assert read_mode({}) == "auto"
    assert read_mode({MODE_ENV: ""}) == "auto"
    assert read_mode({MODE_ENV: "NCCL"}) == "nccl"
    assert read_mode({MODE_ENV: " oneshot "}) == "oneshot"
    assert read_mode({MODE_ENV: "push"}) == "push"
    assert read_mode({MODE_ENV: "fused"}) == "fused"
    with pytest.raises(ValueError, match="TRITONFORMER_ALLREDUCE='fast': expected one of auto, nccl, oneshot, push, fused"):
        read_mode({MODE_ENV: "fast"})


KB = 1024


@pytest.mark.parametrize("mode, nbytes, dtype, contiguous, world, ready, path, said", [
    ("auto", 8 * KB, F16, True, 2, True, "push", None),
    ("auto", 16 * KB, BF16, True, 8, True, "push", None),
    ("auto", push_bytes(2), F16, True, 2, True, "push", None),  # 256 rows of hidden 4096
    ("auto", push_bytes(2) + 2, F16, True, 2, True, "nccl", None),  # by size: nothing to say
    ("auto", push_bytes(4), F16, True, 4, True, "push", None),
    ("auto", push_bytes(4) + 2, F16, True, 4, True, "nccl", None),  # more ranks hand over sooner
    ("auto", 4 * MAX_BYTES, F16, True, 2, True, "nccl", None),
    ("oneshot", 8 * KB, F16, True, 2, True, "oneshot", None),  # forced
    ("oneshot", MAX_BYTES, F16, True, 2, True, "oneshot", None),
    ("oneshot", MAX_BYTES + 2, F16, True, 2, True, "nccl", "bytes"),
    ("nccl", 8 * KB, F16, True, 2, True, "nccl", None),
    ("push", PUSH_MAX_BYTES, BF16, True, 4, True, "push", None),  # forced: past auto's hand-over at 4 ranks
    ("push", PUSH_MAX_BYTES + 2, F16, True, 2, True, "nccl", "push slots hold"),
    ("push", 8 * KB, torch.float32, True, 2, True, "push", None),  # a norm's sums of squares
    ("auto", 8 * KB, torch.float32, True, 2, True, "push", None),
    ("oneshot", 8 * KB, torch.float32, True, 2, True, "oneshot", None),
    ("auto", 8 * KB, torch.float64, True, 2, True, "nccl", "dtype float64"),
    ("auto", 8 * KB, F16, False, 2, True, "nccl", "non-contiguous"),
    ("auto", 8 * KB, F16, True, 16, True, "nccl", "16 ranks"),
    ("oneshot", 8 * KB, F16, True, 16, False, "nccl", "16 ranks"),
    ("auto", 8 * KB, F16, True, 2, False, "nccl", "no peer buffers"),
    ("fused", push_bytes(2), F16, True, 2, True, "push", None),  # routes as auto
    ("fused", push_bytes(2) + 2, F16, True, 2, True, "nccl", None),
    ("oneshot", 8 * KB, BF16, True, 4, False, "nccl", "no peer buffers"),
])
def test_route(mode, nbytes, dtype, contiguous, world, ready, path, said):
    got, why = route(mode, nbytes, dtype, contiguous, world, ready)
    assert got == path
    assert (why is None) == (said is None) and (said is None or said in why), why


def test_push_route_matches_the_kernels_slots():
    from tritonformer.kernels.triton_allreduce import PUSH_SLOT

    assert PUSH_MAX_BYTES == PUSH_SLOT


def test_fused_norm_starts_where_the_gemv_stops_fusing_it():
    from tritonformer.backend.parallel.allreduce import FUSED_NORM_MIN_ROWS
    from tritonformer.kernels import triton_gemv

    assert FUSED_NORM_MIN_ROWS == triton_gemv.MAX_ROWS + 1


def _prenorm(x, **kw):
    from tritonformer.kernels import PreNorm

    fields = dict(bias=None, residual=torch.zeros_like(x), sum_out=torch.empty_like(x))
    fields.update(kw)
    return PreNorm(torch.ones(x.shape[1]), eps=1e-6, **fields)


@pytest.mark.parametrize("mode, rows, hidden, ready, change, fused", [
    ("fused", 64, 4096, True, {}, True),
    ("fused", 3, 4096, True, {}, True),
    ("fused", 2, 4096, True, {}, False),  # the GEMV's rows: its prologue norms them
    ("fused", 256, 4096, True, {}, True),  # 2 MB: the push kernel's largest message at 2 ranks
    ("fused", 257, 4096, True, {}, False),  # past it: NCCL
    ("fused", 64, 32768, True, {}, False),  # a row longer than one program holds
    ("fused", 64, 4096, False, {}, False),  # no peer buffers
    ("auto", 64, 4096, True, {}, False),  # only when asked for
    ("fused", 64, 4096, True, {"bias": "ln"}, False),  # a LayerNorm prenorm
    ("fused", 64, 4096, True, {"x_bias": "bias"}, False),
    ("fused", 64, 4096, True, {"residual": None}, False),
    ("fused", 64, 4096, True, {"sum_out": "f32"}, False),
])
def test_which_all_reduces_fuse_the_next_norm(mode, rows, hidden, ready, change, fused):
    from tritonformer.backend.parallel.allreduce import AllReduce

    x = torch.zeros(rows, hidden, dtype=F16)
    kw = {}
    for key, value in change.items():
        kw[key] = {"ln": torch.zeros(hidden), "bias": torch.zeros(hidden, dtype=F16), None: None,
                   "f32": torch.empty(rows, hidden)}[value]
    reducer = AllReduce(mode, 2, peers=None)
    reducer.peers = object() if ready else None  # (the decision reads only whether they exist)
    assert reducer.fuses_norm(x, _prenorm(x, **kw)) is fused


def test_without_peer_buffers_the_group_sums_then_leaves_the_norm_to_the_linear():
    from tritonformer.backend.parallel.group import TensorParallelGroup

    tp = TensorParallelGroup(0, 1)  # (no reducer: dist.all_reduce, here a one-rank gloo-free stand-in)
    x = torch.ones(4, 8, dtype=F16)
    pre = _prenorm(x)
    tp.all_reduce = lambda t: t.mul_(2)
    got, still = tp.all_reduce_then(x, pre)
    assert got is x and torch.equal(x, torch.full((4, 8), 2.0, dtype=F16)) and still is pre
    assert tp.all_reduce_then(x, None)[1] is None


def test_route_threshold_and_capacity_are_parameters():
    assert route("auto", 128 * KB, F16, True, 2, True, threshold=96 * KB)[0] == "nccl"
    assert route("auto", 128 * KB, F16, True, 2, True, threshold=128 * KB)[0] == "push"
    assert route("auto", PUSH_MAX_BYTES + 2, F16, True, 2, True, threshold=4 * PUSH_MAX_BYTES)[0] == "nccl"
    assert route("oneshot", 64 * KB, F16, True, 2, True, max_bytes=32 * KB)[0] == "nccl"


# ---- the kernel, in the interpreter ----------------------------------------------------------

triton = pytest.importorskip("triton")
ON_CPU = not torch.cuda.is_available()
interpreted = pytest.mark.skipif(not ON_CPU or os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="the CPU-interpreter runs (a GPU runs the multi-process tests)")


def _equal_or_truncated(got: torch.Tensor, inputs) -> bool:
    """`got` is the reference, except that the interpreter casts fp32 to bf16 by truncating
    (the GPU rounds to nearest even): there each element may be the truncated sum instead."""
    want = all_reduce_sum(inputs)
    if got.dtype != BF16:
        return torch.equal(got, want)
    acc = torch.zeros(want.shape, dtype=torch.float32)
    for x in inputs:
        acc += x.float()
    truncated = (acc.view(torch.int32) & ~0xFFFF).view(torch.float32).to(BF16)
    return bool(((got == want) | (got == truncated)).all())


class _Simulated:
    """`world` ranks' peer buffers in CPU memory; the kernel runs as rank 0, the test plays
    the others: their data already in their buffers, their flags already in rank 0's."""

    def __init__(self, world: int, capacity: int):
        from tritonformer.kernels import triton_allreduce as ar

        self.ar, self.world = ar, world
        self.cap = ar.region_bytes(capacity)
        self.bufs = [ar.prepare_buffer(torch.empty(ar.buffer_bytes(self.cap), dtype=torch.uint8), self.cap)
                     for _ in range(world)]
        self.peers = ar.PeerBuffers(torch.tensor([b.data_ptr() for b in self.bufs], dtype=torch.int64),
                                    torch.zeros(2, dtype=torch.int32), 0, world, self.cap)

    def flags(self, rank: int) -> torch.Tensor:
        flags = self.bufs[rank][2 * self.cap:self.ar.push_at(self.cap)]
        return flags.view(torch.int32).view(2, self.ar.FLAG_PROGRAMS, self.ar.FLAG_WORLD)

    def slots(self, rank: int, bits=torch.int16) -> torch.Tensor:
        """Rank `rank`'s push slots as bit patterns of `bits`: [parity, slot, element]."""
        ar, size = self.ar, bits.itemsize
        return self.bufs[rank][ar.push_at(self.cap):].view(bits).view(2, ar.FLAG_WORLD, ar.PUSH_SLOT // size)

    def _words(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """x's elements as the push kernel moves them (bit patterns of its width), and their SENTINEL."""
        bits = {2: torch.int16, 4: torch.int32}[x.element_size()]
        return x.reshape(-1).view(bits), self.ar.PUSH_BITS[x.element_size()][1]

    def _pushed_to_us(self, inputs) -> int:
        """The peers' parts of a push call into rank 0's slots (as a peer writes them: the SENTINEL's
        bits, -0.0 at 16 bits, as +0.0). Returns the call count before it."""
        calls = int(self.peers.state[0])
        for r in range(1, self.world):
            bits, sentinel = self._words(inputs[r])
            self.slots(0, bits.dtype)[calls & 1, r, :inputs[0].numel()] = torch.where(bits == sentinel, 0, bits)
        return calls

    def _check_push_traces(self, inputs, calls: int) -> None:
        """What a push call leaves: rank 0's slots read and reset, its part in slot 0 of every
        peer's region of the call's parity (+0.0 for -0.0), no flag, the counter advanced."""
        q, n = calls & 1, inputs[0].numel()
        # every slot read, and reset for the call after next: 16-bit SENTINELs whatever the width
        assert self.slots(0).eq(self.ar.SENTINEL).all()
        mine, sentinel = self._words(inputs[0])
        for r in range(1, self.world):
            s = self.slots(r, mine.dtype)
            assert torch.equal(s[q, 0, :n], torch.where(mine == sentinel, 0, mine))
            assert s[q, 0, n:].eq(sentinel).all() and s[1 - q].eq(sentinel).all() and s[q, 1:].eq(sentinel).all()
            s.fill_(sentinel)  # (rank r's kernel would read and reset it)
        assert not self.flags(0).any()
        assert self.peers.state.tolist() == [calls + 1, 0]

    def push(self, inputs, block, max_programs, in_place=True):
        """Rank 0's push all-reduce of `inputs` (one per rank); checks what it leaves behind."""
        calls = self._pushed_to_us(inputs)
        x = inputs[0].clone()
        out = None if in_place else torch.empty_like(x)
        got = self.ar.push_all_reduce(x, self.peers, out, block=block, max_programs=max_programs)
        assert got is (x if in_place else out)
        assert _equal_or_truncated(got, inputs)
        self._check_push_traces(inputs, calls)
        return got

    def push_norm(self, inputs, residual, weight, x_norm, max_programs):
        """Rank 0's push_all_reduce_norm of `inputs` (one per rank); checks what it leaves
        behind as `push` does. Returns (out, sum_out)."""
        calls = self._pushed_to_us(inputs)
        x = inputs[0].clone()
        out, sum_out = torch.empty_like(x), torch.empty_like(x)
        got = self.ar.push_all_reduce_norm(x, residual, weight, 1e-6, self.peers, out, sum_out, x_norm,
                                           max_programs=max_programs)
        assert got is out and torch.equal(x, inputs[0])  # the input is left as it was
        self._check_push_traces(inputs, calls)
        return out, sum_out

    def data(self, rank: int, parity: int, dtype, n: int) -> torch.Tensor:
        return self.bufs[rank][parity * self.cap:].view(dtype)[:n]

    def call(self, inputs, block, max_programs, in_place=True):
        """Rank 0's all-reduce of `inputs` (one per rank); checks the protocol's traces."""
        calls = int(self.peers.state[0])
        q, n, dtype = calls & 1, inputs[0].numel(), inputs[0].dtype
        programs = self.ar.launch_grid(n, block, max_programs)
        for r in range(1, self.world):
            self.data(r, q, dtype, n).copy_(inputs[r].reshape(-1))
            self.flags(0)[q, :programs, r] = 1  # rank r's programs have arrived
        for r in range(self.world):  # the other region: what a peer may still be reading
            self.data(r, 1 - q, dtype, n).fill_(1000.0)
        x = inputs[0].clone()
        out = None if in_place else torch.empty_like(x)
        got = self.ar.one_shot_all_reduce(x, self.peers, out, block=block, max_programs=max_programs)
        assert got is (x if in_place else out)
        assert _equal_or_truncated(got, inputs)
        assert torch.equal(self.data(0, q, dtype, n), inputs[0].reshape(-1))  # our part, for the peers
        assert self.data(0, 1 - q, dtype, n).eq(1000.0).all()  # the other region untouched
        assert not self.flags(0).any()  # every flag consumed (its own too): back to zero
        for r in range(1, self.world):  # rank 0 told every peer, in slot (q, program, 0)
            f = self.flags(r)
            assert f[q, :programs, 0].eq(1).all() and int(f.sum()) == programs
            f.zero_()  # (rank r's kernel would consume them)
        assert self.peers.state.tolist() == [calls + 1, 0]
        return got


@interpreted
def test_kernel_alone_is_the_identity_and_keeps_count():
    sim = _Simulated(1, 4096)
    for i, (n, dtype) in enumerate([(1000, F16), (64, BF16), (2048, F16)]):
        x = torch.randn(n, generator=torch.Generator().manual_seed(i)).to(dtype)
        sim.call([x], block=256, max_programs=3)


@interpreted
@pytest.mark.parametrize("world", [2, 4])
def test_kernel_sums_the_peers_buffers_over_alternating_regions(world):
    """Consecutive calls of different sizes and grids (one tile per program, several tiles per
    program, a ragged last tile), each in the other data region and flag set."""
    sim = _Simulated(world, 3000 * 2)
    g = torch.Generator().manual_seed(world)
    for i, (shape, dtype, block, max_programs, in_place) in enumerate([
        ((3, 1000), F16, 256, 4, True),  # 12 tiles over 4 programs, the last ragged
        ((1, 512), BF16, 128, 8, False),  # a tile per program
        ((7, 33), F16, 64, 2, True),
        ((2, 1024), BF16, 512, 64, True),
        ((2, 300), F32, 256, 4, False),
    ]):
        inputs = [(torch.randn(shape, generator=g) * 4).to(dtype) for _ in range(world)]
        sim.call(inputs, block, max_programs, in_place)


@interpreted
@pytest.mark.parametrize("world", [2, 4])
def test_push_kernel_sums_what_the_peers_pushed_and_resets_its_slots(world):
    """Consecutive push calls (alternating parity; ragged tiles; -0.0 and zero sums), between
    one-shot calls on the same buffers and counter."""
    sim = _Simulated(world, 3000 * 2)
    g = torch.Generator().manual_seed(10 + world)
    for i, (shape, dtype, block, max_programs, in_place) in enumerate([
        ((1, 1000), F16, 256, 2, True),  # 4 tiles over 2 programs, the last ragged
        ((2, 512), BF16, 128, 8, False),
        ((5, 7), F16, 64, 32, True),
        ((3, 300), F32, 128, 4, True),  # 32-bit words in the same slots, then 16-bit ones again
        ((1, 700), BF16, 256, 4, True),
    ]):
        inputs = [(torch.randn(shape, generator=g) * 4).to(dtype) for _ in range(world)]
        for x in inputs:  # zeros of both signs, and a column of zeros only
            x.view(-1)[:3] = torch.tensor([-0.0, 0.0, -0.0])
            x.view(-1)[5] = -0.0
        if dtype == F32:  # the one fp32 value whose bits are the SENTINEL: pushed as +0.0
            inputs[-1].view(-1)[6:7].view(torch.int32)[0] = sim.ar.SENTINEL32
        sim.push(inputs, block, max_programs, in_place)
        sim.call([(torch.randn(64, generator=g)).to(F16) for _ in range(world)], 64, 1)  # a one-shot between


@interpreted
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("post_norm", [False, True])
def test_push_norm_kernel_is_the_all_reduce_then_the_prenorm(world, post_norm):
    """The fused push all-reduce + residual + RMSNorm against reference.all_reduce_rms_norm: the
    next residual stream exactly (fp16: one rounding of the same fp32 sum), the normalised rows
    within a rounding step; rows spread over fewer programs than rows, a hidden size that is not
    a power of two, -0.0 parts; a plain push call between (same counter and slots)."""
    from tritonformer.kernels.reference import all_reduce_rms_norm

    sim = _Simulated(world, 4096)
    g = torch.Generator().manual_seed(20 + world)
    for rows, hidden, programs in [(5, 96, 2), (3, 64, 8)]:
        inputs = [(torch.randn(rows, hidden, generator=g) * 2).to(F16) for _ in range(world)]
        inputs[0].view(-1)[:2] = -0.0
        residual = (torch.randn(rows, hidden, generator=g) * 4).to(F16)
        weight = (1 + 0.1 * torch.randn(hidden, generator=g)).float()  # (fp32, as Gemma keeps 1 + w)
        x_norm = (1 + 0.1 * torch.randn(hidden, generator=g)).float() if post_norm else None
        out, sum_out = sim.push_norm(inputs, residual, weight, x_norm, programs)
        want, want_sum = all_reduce_rms_norm(inputs, residual, weight, 1e-6, x_norm)
        if post_norm:  # the post-norm's own reduction order may move its rounding by a step
            torch.testing.assert_close(sum_out, want_sum, atol=4e-3, rtol=2e-3)
        else:
            assert torch.equal(sum_out, want_sum)
        torch.testing.assert_close(out, want, atol=2e-3, rtol=2e-3)
        sim.push([(torch.randn(40, generator=g)).to(F16) for _ in range(world)], 64, 1)


@interpreted
def test_push_norm_kernel_refuses_what_it_cannot_hold():
    sim = _Simulated(2, 1024)
    x = torch.zeros(2, 8, dtype=F16)
    w = torch.ones(8)
    with pytest.raises(ValueError, match="shaped and typed"):
        sim.ar.push_all_reduce_norm(x, torch.zeros(2, 8, dtype=BF16), w, 1e-6, sim.peers, x.clone(), x.clone())
    with pytest.raises(ValueError, match="16-bit"):
        y = x.float()
        sim.ar.push_all_reduce_norm(y, y, w, 1e-6, sim.peers, y.clone(), y.clone())
    with pytest.raises(ValueError, match="push slots"):
        big = torch.zeros(2, sim.ar.NORM_MAX_HIDDEN * 2, dtype=F16)
        sim.ar.push_all_reduce_norm(big, big, torch.ones(big.shape[1]), 1e-6, sim.peers, big.clone(), big.clone())


@interpreted
def test_push_kernel_refuses_what_it_cannot_hold():
    sim = _Simulated(2, 1024)
    with pytest.raises(ValueError, match="push slots"):
        sim.ar.push_all_reduce(torch.zeros(sim.ar.PUSH_SLOT, dtype=F16), sim.peers)
    with pytest.raises(ValueError, match="fp16, bf16 or fp32"):
        sim.ar.push_all_reduce(torch.zeros(8, dtype=torch.float64), sim.peers)


@interpreted
def test_kernel_refuses_what_it_cannot_hold():
    sim = _Simulated(2, 1024)
    with pytest.raises(ValueError, match="do not fit"):
        sim.ar.one_shot_all_reduce(torch.zeros(1024, dtype=F16), sim.peers)
    with pytest.raises(ValueError, match="contiguous"):
        sim.ar.one_shot_all_reduce(torch.zeros(8, 8, dtype=F16).t(), sim.peers)


# ---- on GPUs: against NCCL, eagerly and in CUDA graphs -----------------------------------------

SHAPES = [(1, 4096), (1, 8192), (64, 4096), (64, 8192), (3, 1000), (5, 7)]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
RUN_TIMEOUT_S = 300


def _inputs(shape, dtype, rank: int, seed: int, device):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return (torch.randn(shape, generator=g) * (rank + 1)).to(device, dtype)


def _expected(x: torch.Tensor, world: int) -> torch.Tensor:
    """The reference over every rank's `x` (gathered by NCCL)."""
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    return all_reduce_sum(parts)


def _check_summer(summer, rank: int, world: int, device, label: str, path=lambda nbytes: "oneshot",
                  shapes=SHAPES, limit: int = MAX_BYTES) -> list[str]:
    """Eager calls, then a graph of every shape and dtype of at most `limit` bytes replayed with new
    inputs (eager calls in between), each call expected to take `path(its bytes)`. Returns what went
    wrong."""
    from tritonformer.kernels.triton_allreduce import SENTINEL, push_at
    import torch.distributed as dist

    from tritonformer.backend.cuda_graphs import capture_graph

    wrong = []

    def compare(what, got, nccl, want):
        if not torch.equal(got, want):
            wrong.append(f"{label} {what}: ours differs from the reference by "
                         f"{(got.float() - want.float()).abs().max().item():.3g}")
        # NCCL rounds after every addition: a few units in the last place of the largest sums
        tol = {F16: 5e-3, BF16: 4e-2, F32: 1e-5}[nccl.dtype]
        err = ((nccl.float() - want.float()).abs().max() / want.float().abs().max()).item()
        if err > tol:
            wrong.append(f"{label} {what}: NCCL differs from the reference by {err:.3g} of its largest value")

    cases = [(shape, dtype) for dtype in (F16, BF16, F32) for shape in shapes
             if shape[0] * shape[1] * dtype.itemsize <= limit]
    for seed, (shape, dtype) in enumerate(cases):
        x = _inputs(shape, dtype, rank, seed, device)
        if summer.route(x) != path(x.numel() * x.element_size()):
            wrong.append(f"{label} {shape} {dtype}: routed to {summer.route(x)}")
        ours, nccl = x.clone(), x.clone()
        summer(ours)
        dist.all_reduce(nccl)
        compare(f"eager {shape} {dtype}", ours, nccl, _expected(x, world))

    srcs = [_inputs(shape, dtype, rank, 0, device) for shape, dtype in cases]
    ours = [torch.empty_like(s) for s in srcs]
    nccl = [torch.empty_like(s) for s in srcs]

    def step():
        for s, o, n in zip(srcs, ours, nccl):
            o.copy_(s)
            summer(o)
            n.copy_(s)
            dist.all_reduce(n)

    graph, _ = capture_graph(step)
    for replay in range(4):
        for i, (shape, dtype) in enumerate(cases):
            srcs[i].copy_(_inputs(shape, dtype, rank, 100 + 10 * replay + i, device))
        graph.replay()
        for i, (shape, dtype) in enumerate(cases):
            compare(f"graph replay {replay} {shape} {dtype}", ours[i], nccl[i], _expected(srcs[i], world))
        x = _inputs((2, 4096), BF16, rank, 7 + replay, device)  # an eager call between replays
        y = x.clone()
        summer(y)
        if not torch.equal(y, _expected(x, world)):
            wrong.append(f"{label} eager call after replay {replay}")
    torch.cuda.synchronize(device)
    buffers = summer.peers.buffers
    whole = summer.peers.keep[0]
    flags = whole[2 * buffers.capacity:push_at(buffers.capacity)]
    if flags.any():
        wrong.append(f"{label}: {int(flags.count_nonzero())} flags left set")
    slots = whole[push_at(buffers.capacity):].view(torch.int16)
    if not slots.eq(SENTINEL).all():
        wrong.append(f"{label}: {int(slots.ne(SENTINEL).sum())} push-slot elements not reset")
    if int(buffers.state[1]) != 0:
        wrong.append(f"{label}: programs-done counter left at {int(buffers.state[1])}")
    return wrong


def _check_fused_norm(rank: int, world: int, device) -> list[str]:
    """Mode `fused`: the all-reduce with the residual add and the next RMSNorm in one launch,
    against reference.all_reduce_rms_norm over every rank's rows (the residual the same on
    every rank, as a replicated residual stream is), eagerly and in a CUDA graph replayed with
    new inputs, a plain all-reduce on the same buffers between."""
    import torch.distributed as dist

    from tritonformer.backend.cuda_graphs import capture_graph
    from tritonformer.backend.parallel.allreduce import AllReduce
    from tritonformer.kernels import PreNorm
    from tritonformer.kernels.reference import all_reduce_rms_norm

    fused = AllReduce.create(rank, world, device, mode="fused")
    wrong = []
    cases = [((3, 4096), F16, False), ((64, 4096), BF16, False), ((64, 3072), F16, True), ((256, 4096), BF16, False)]

    def make(i, shape, dtype, post):
        x = _inputs(shape, dtype, rank, 50 + i, device)
        res = _inputs(shape, dtype, 0, 60 + i, device)
        w = 1 + 0.1 * _inputs(shape[1:], torch.float32, 0, 70 + i, device)
        xn = 1 + 0.1 * _inputs(shape[1:], torch.float32, 0, 80 + i, device) if post else None
        return x, PreNorm(w, None, 1e-6, residual=res, sum_out=torch.empty_like(res), x_norm=xn)

    def check(what, x, pre, out):
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        want, want_sum = all_reduce_rms_norm(parts, pre.residual, pre.weight, pre.eps, pre.x_norm)
        if pre.x_norm is None and not torch.equal(pre.sum_out, want_sum):
            wrong.append(f"fused {what}: the residual stream differs from the reference by "
                         f"{(pre.sum_out.float() - want_sum.float()).abs().max().item():.3g}")
        tol = 2e-3 if x.dtype == F16 else 1.6e-2
        err = ((out.float() - want.float()).abs().max() / want.float().abs().max()).item()
        if err > tol:
            wrong.append(f"fused {what}: the normalised rows differ from the reference by {err:.3g} of the largest")

    for i, (shape, dtype, post) in enumerate(cases):
        x, pre = make(i, shape, dtype, post)
        if not fused.fuses_norm(x, pre):
            wrong.append(f"fused {shape} {dtype}: not fused")
            continue
        check(f"eager {shape} {dtype}", x, pre, fused.all_reduce_norm(x, pre))

    x, pre = make(9, (64, 4096), F16, False)
    y = _inputs((8, 4096), BF16, rank, 90, device)
    held = {}

    def step():
        held["out"] = fused.all_reduce_norm(x, pre)
        held["y"] = fused(y.clone())

    graph, _ = capture_graph(step)
    for replay in range(3):
        x.copy_(_inputs((64, 4096), F16, rank, 100 + replay, device))
        pre.residual.copy_(_inputs((64, 4096), F16, 0, 110 + replay, device))
        y.copy_(_inputs((8, 4096), BF16, rank, 120 + replay, device))
        graph.replay()
        check(f"graph replay {replay}", x, pre, held["out"])
        if not torch.equal(held["y"], _expected(y, world)):
            wrong.append(f"fused: the plain all-reduce after the fused one, replay {replay}")
    return wrong


def _rank_main(rank: int, world: int, address: str, results) -> None:
    """One rank: join (TRITONFORMER_ALLREDUCE=oneshot, the transport the group picks), check
    that, then check a second set-up over CUDA IPC."""
    try:
        os.environ[MODE_ENV] = "oneshot"
        from tritonformer.backend.parallel.allreduce import AllReduce
        from tritonformer.backend.parallel.group import TensorParallelGroup

        device = torch.device(f"cuda:{rank}")
        tp = TensorParallelGroup.join(rank, world, address, device)
        summer = tp.reducer
        if summer is None or summer.peers is None:
            raise AssertionError("no peer buffers after join")
        wrong = _check_summer(summer, rank, world, device, summer.peers.transport)
        x = _inputs((4, 4096), F16, rank, 3, device)
        y = tp.all_reduce(x.clone())
        if not torch.equal(y, _expected(x, world)):
            wrong.append("TensorParallelGroup.all_reduce")
        ipc = AllReduce.create(rank, world, device, mode="oneshot", transports=("ipc",))
        if ipc.peers is None:
            wrong.append("the CUDA IPC set-up fell back to NCCL")
        else:
            wrong += _check_summer(ipc, rank, world, device, "ipc")
        for transport in ("symm_mem", "ipc"):  # auto: the push kernel, on both transports
            push = AllReduce.create(rank, world, device, mode="auto", transports=(transport,))
            # up to 2 MB (256 rows of 4096 in 16 bits) at 2 ranks; NCCL's sums past the hand-over are not the
            # reference's bits
            wrong += _check_summer(push, rank, world, device, f"push over {transport}", lambda nbytes: "push",
                                   SHAPES + [(256, 4096)], push_bytes(world))
        wrong += _check_fused_norm(rank, world, device)
        results.put((rank, summer.peers.transport, wrong))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, None, [traceback.format_exc()]))
    finally:
        results.close()
        results.join_thread()  # the answer is out of this process before it ends
        os._exit(0)  # no destroy_process_group: it can hang at exit


def _run_ranks(target, world: int, timeout: float = RUN_TIMEOUT_S) -> dict:
    """Run `target(rank, world, address, results)` in `world` spawned processes; returns
    {rank: (transport, what went wrong)} as they put it in `results`."""
    import multiprocessing

    from tritonformer.backend.parallel.group import free_address

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    address = free_address()
    procs = [ctx.Process(target=target, args=(r, world, address, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got, deadline = {}, time.monotonic() + timeout
    try:
        while len(got) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout} s; ranks that answered: {sorted(got)}")
            try:
                rank, transport, wrong = results.get(timeout=min(remaining, 5.0))
            except Exception:  # noqa: BLE001 - queue.Empty: look again (and at the processes)
                if not any(p.is_alive() for p in procs):
                    raise AssertionError(f"ranks exited without answering; answered: {sorted(got)}") from None
                continue
            got[rank] = (transport, wrong)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return got


def _problems(got: dict) -> str:
    return "\n".join(f"rank {r}: {w}" for r, (_, wrong) in sorted(got.items()) for w in wrong)


def _reported_rank(body, rank: int, world: int, address: str, results) -> None:
    """A spawned rank running `body(rank, world)` -> (transport, what went wrong) over a gloo group, its
    answer (or its traceback) put in `results`, the process ended without waiting on the group."""
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
        results.put((rank, *body(rank, world)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, None, [traceback.format_exc()]))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)


def _cpu_sum(rank: int, world: int):
    """A CPU rank: no peer buffers can exist, so even `oneshot` sums through the group (gloo)."""
    from tritonformer.backend.parallel.allreduce import AllReduce

    summer = AllReduce.create(rank, world, torch.device("cpu"), mode="oneshot")
    wrong = [] if summer.peers is None else ["peer buffers on a CPU"]
    x = torch.full((3, 5), float(rank + 1), dtype=BF16)
    if summer.route(x) != "nccl":
        wrong.append(f"routed to {summer.route(x)}")
    if summer(x) is not x or not torch.equal(x, torch.full((3, 5), world * (world + 1) / 2, dtype=BF16)):
        wrong.append(f"sum {x}")
    return None, wrong


def _transport_choice(rank: int, world: int):
    """A CPU rank choosing its peer buffers' transport with both transports faked: a group whose ranks never
    opened symmetric memory takes it; once any rank's process has (rank 0's here, as a pytest process making a
    second group), every rank takes CUDA IPC instead, and none waits in a rendezvous its peers skip."""
    from tritonformer.backend.parallel import allreduce

    allreduce._obstacle = lambda *args: None
    allreduce._OPEN = {t: (lambda *args, t=t: t) for t in allreduce.TRANSPORTS}
    first = allreduce._set_up_peers(rank, world, torch.device("cpu"), allreduce.TRANSPORTS, 1 << 10)
    wrong = [] if first == "symm_mem" and allreduce._symm_mem_opened else [f"first group: {first}"]
    allreduce._symm_mem_opened = rank == 0  # rank 0's process opened it before, rank 1 is fresh
    second = allreduce._set_up_peers(rank, world, torch.device("cpu"), allreduce.TRANSPORTS, 1 << 10)
    wrong += [] if second == "ipc" else [f"second group: {second}"]
    return second, wrong


_cpu_rank = functools.partial(_reported_rank, _cpu_sum)  # (module-level parts: spawned processes unpickle them)
_transport_rank = functools.partial(_reported_rank, _transport_choice)


def test_a_group_any_of_whose_ranks_opened_symmetric_memory_before_takes_ipc_on_every_rank():
    got = _run_ranks(_transport_rank, 2, timeout=120)
    assert not _problems(got), _problems(got)


def test_without_peer_buffers_every_rank_sums_through_the_process_group():
    got = _run_ranks(_cpu_rank, 2, timeout=120)
    assert not _problems(got), _problems(got)


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("world", [2, 4])
def test_one_shot_matches_nccl_and_the_reference_on_gpus(world):
    if GPUS < world:
        pytest.skip(f"needs {world} GPUs")
    got = _run_ranks(_rank_main, world)
    assert not _problems(got), _problems(got)
    assert {t for t, _ in got.values()} == {"symm_mem"}, got  # torch 2.11 has symmetric memory
