"""A one-shot sum all-reduce over peer buffers (tensor parallelism's small messages).

Every rank owns one symmetric buffer that every peer GPU can read and write through a plain
device pointer (CUDA IPC or torch's symmetric memory; backend/parallel/allreduce.py sets them
up). `PeerBuffers.ptrs` holds the `world` buffers' addresses, rank order, as int64 on the
device. Each buffer is laid out as

    [ data, parity 0: CAPACITY bytes | data, parity 1: CAPACITY bytes | flags: int32 |
      pushed, parity 0: FLAG_WORLD slots of PUSH_SLOT bytes | pushed, parity 1: the same ]

Two kernels use them: `one_shot_all_reduce` (below: copy in, a barrier of flags, read every
peer's part) and `push_all_reduce` (at the end of this file: write into every peer's slot,
no flags at all), which `auto` uses for every decode-sized message.

and the flags are `[2 parities][FLAG_PROGRAMS][FLAG_WORLD]`: slot (q, b, s) of rank r's buffer
is where rank s's program b says "arrived" to rank r in a call of parity q.

One launch does the whole all-reduce, with the same grid on every rank. Program b:

1. reads `calls`, this rank's count of all-reduces done (parity q = calls & 1);
2. copies its tiles of the input (tiles b, b + G, b + 2G, ... of BLOCK elements; G programs)
   into its own buffer's parity-q data region;
3. barrier, one thread per rank: adds 1 to slot (q, b, rank) of every rank's flags (a
   system-scope release `red`, which awaits no reply), then spins on its own slots (q, b, s)
   with system-scope acquire compare-and-swaps 1 -> 0 until each has read 1 once (so each
   flag is consumed, and the flags are zero again when the call ends);
4. loads the same tiles from every rank's parity-q region, sums them in rank order in fp32
   and writes the result, in the input dtype, to the output (which may be the input);
5. the last program to finish (a gpu-scope counter) advances `calls`.

Why this is correct (each step is per program b; the grid size may differ between calls, but
is the same on every rank within one call, and calls come in the same order on every rank):

* Data visible before it is read. Rank s's program b stores its tiles, then `debug_barrier`
  (bar.sync: the block's stores are ordered before what any of its threads does next), then a
  thread's release `red` publishes the flag; cumulativity of the release carries the other
  threads' stores with it. Rank r's program b acquires that flag in one thread, then bar.sync
  orders every thread's later loads after the acquire. So each tile is read after its
  writer's stores are visible. Peer loads also skip L1 (`.cg`), which is not coherent across
  GPUs.
* No overwrite while a peer still reads (instead of a second barrier: two data regions).
  Kernels on one stream run one after the other (with PDL, nothing is touched before
  `griddepcontrol.wait`, which returns once the previous kernel has completed). If rank r runs
  call k, its call k-1 completed, so each of its programs passed call k-1's barrier, which
  needs every peer's flag of call k-1: every peer has started call k-1, so every peer's call
  k-2 has completed. Call k writes region k & 1; the only peer reads still possible are call
  k-1's, in the other region. (Call k-2 used region k & 1 and is over everywhere.)
* Flags never pile up. Rank r writes slot (q, b, r) of rank p in call k; the previous write to
  that slot was in call k-2 at the latest (same parity), and by the argument above rank p's
  call k-2 has completed, so it consumed that flag. A flag is therefore 0 when 1 is added,
  and each compare-and-swap that consumes one sees exactly one 1 per call; spinning on an
  already consumed slot reads 0 and changes nothing (its next 1 comes in call k+2 at the
  earliest, after this call has ended).
* `calls` advances once per call on every rank. Every program reads it first and then adds
  to the done counter with acquire-release; the program that brings the counter to G (the
  grid size) resets it and stores calls + 1, so no program of this call can read the new
  value, and the next kernel reads it after this one completed.

Any dtype the output can hold works (fp16 and bf16 in practice); every rank gets the same
bits (same order of fp32 sums). The reference is `reference.all_reduce_sum`, which takes the
ranks' inputs instead of the peer buffers.

The number of programs (G <= MAX_PROGRAMS) and the tile (BLOCK) are tunable: few programs
keep the barrier cheap (G x world flag writes over NVLink), more programs and longer tiles
move large messages faster. A rank that never arrives (a dead worker) leaves the others
spinning, as an NCCL kernel would; the workers' monitor reports it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonformer.kernels import triton_pdl

FLAG_WORLD = 8  # ranks the flag layout has room for (the largest world this kernel serves)
FLAG_PROGRAMS = 64  # programs per call the flag layout has room for
FLAG_BYTES = 2 * FLAG_PROGRAMS * FLAG_WORLD * 4
ALIGN = 256  # a data region's size is a multiple of this (keeps every tile 16-byte aligned)

# Launch shape: BLOCK elements per tile, at most MAX_PROGRAMS programs (one per tile until
# then), NUM_WARPS warps each. Tuned with tools/gpu/time_allreduce.py.
BLOCK = 2048
MAX_PROGRAMS = 32
NUM_WARPS = 4

# The push kernel: each rank's slot in every buffer holds up to PUSH_SLOT bytes; a slot not yet
# written holds SENTINEL in every 16-bit element (the bits of -0.0 in fp16 and in bf16, which
# no pushed value has: -0.0 is pushed as +0.0, which changes no sum of the reference's). fp32
# messages move as 32-bit words whose SENTINEL32 is two 16-bit SENTINELs, so an unwritten slot
# reads the same to either width; the one fp32 value with those bits (-4.6e-41, subnormal) is
# pushed as +0.0 (fp32 pushes carry norms' sums of squares, where no such value arises).
PUSH_SLOT = 2 << 20  # 256 decode rows of hidden 4096 in fp16 (backend/parallel/allreduce.py routes by measure)
PUSH_REGIONS_BYTES = 2 * FLAG_WORLD * PUSH_SLOT  # both parities' slots, in every buffer
SENTINEL = -32768  # 0x8000 as int16
SENTINEL32 = -2147450880  # 0x80008000 as int32
PUSH_BITS = {2: (tl.int16, SENTINEL), 4: (tl.int32, SENTINEL32)}  # element bytes -> (word, its SENTINEL)
# Push launch shape: PUSH_BLOCK elements per tile, at most PUSH_MAX_PROGRAMS programs (the
# default and the most: all resident at once on any GPU this serves, and a waiting program
# spins). On two H100s 128 programs moved 512 KB in 5.0 us where 32 took 9.5 (equal up to
# 128 KB): tools/gpu/time_allreduce.py --push-programs.
PUSH_BLOCK = 1024
PUSH_MAX_PROGRAMS = 128


def buffer_bytes(capacity: int) -> int:
    """Bytes of one rank's symmetric buffer for messages of up to `capacity` bytes (one-shot)
    and up to PUSH_SLOT bytes (push)."""
    return push_at(capacity) + PUSH_REGIONS_BYTES


def push_at(capacity: int) -> int:
    """Where the push slots start in a buffer (bytes): after both data regions and the flags."""
    return 2 * region_bytes(capacity) + FLAG_BYTES


def prepare_buffer(buf: torch.Tensor, capacity: int) -> torch.Tensor:
    """A new buffer (uint8, buffer_bytes(capacity)) as the kernels expect it before their first
    call: data and flags zero, every push slot full of the SENTINEL."""
    buf.zero_()
    buf[push_at(capacity):].view(torch.int16).fill_(SENTINEL)
    return buf


def region_bytes(capacity: int) -> int:
    """One parity's data region: `capacity` rounded up to ALIGN."""
    return -(-capacity // ALIGN) * ALIGN


@dataclass(frozen=True)
class PeerBuffers:
    """The symmetric buffers of one group, as this rank sees them."""

    ptrs: torch.Tensor  # int64 [world] on this rank's device: each rank's buffer address
    state: torch.Tensor  # int32 [2] on this rank's device, zeroed: [calls done, programs done]
    rank: int
    world: int
    capacity: int  # bytes one parity's data region holds (a multiple of ALIGN)


@triton.jit
def _one_shot_all_reduce_kernel(x_ptr, out_ptr, n, ptrs_ptr, state_ptr, rank,
                                CAPACITY: tl.constexpr, WORLD: tl.constexpr, WORLD_P2: tl.constexpr,
                                BLOCK: tl.constexpr, FLAG_PROGRAMS: tl.constexpr, FLAG_WORLD: tl.constexpr,
                                PDL: tl.constexpr):
    triton_pdl.wait_for_predecessor(PDL)  # from here on the previous kernel has completed
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles = tl.cdiv(n, BLOCK)
    dtype = x_ptr.dtype.element_ty
    calls = tl.load(state_ptr)
    parity = calls & 1
    region = parity.to(tl.int64) * CAPACITY
    mine = tl.multiple_of((tl.load(ptrs_ptr + rank) + region).to(tl.pointer_type(dtype)), 16)
    for t in range(pid, tiles, programs):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(mine + offs, tl.load(x_ptr + offs, mask=m), mask=m)
    tl.debug_barrier()  # every thread's stores before the flags go out

    # The barrier: one lane (thread) per rank, so the flags go out and come in in parallel.
    lanes = tl.arange(0, WORLD_P2)
    real = lanes < WORLD
    slot = (parity * FLAG_PROGRAMS + pid) * FLAG_WORLD
    flags_at = 2 * CAPACITY
    bases = tl.load(ptrs_ptr + lanes, mask=real, other=0)
    theirs = (bases + flags_at).to(tl.pointer_type(tl.int32)) + slot + rank
    tl.atomic_add(theirs, 1, mask=real, sem="release", scope="sys")  # 0 -> 1 (a `red`: no reply awaited)
    own = (tl.load(ptrs_ptr + rank) + flags_at).to(tl.pointer_type(tl.int32)) + slot + lanes
    ones, zeros = tl.full([WORLD_P2], 1, tl.int32), tl.zeros([WORLD_P2], tl.int32)
    arrived = (lanes >= WORLD).to(tl.int32)
    while tl.min(arrived, axis=0) == 0:
        seen = tl.atomic_cas(own, ones, zeros, sem="acquire", scope="sys")
        arrived = arrived | (seen == 1).to(tl.int32)
    tl.debug_barrier()  # every thread's loads after the acquires

    for t in range(pid, tiles, programs):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(WORLD):
            src = tl.multiple_of((tl.load(ptrs_ptr + p) + region).to(tl.pointer_type(dtype)), 16)
            acc += tl.load(src + offs, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=m)

    _count_call(state_ptr, calls)


def launch_grid(n: int, block: int = BLOCK, max_programs: int = MAX_PROGRAMS) -> int:
    """Programs for `n` elements: one per tile, at most `max_programs`."""
    return min(triton.cdiv(n, block), max_programs)


def one_shot_all_reduce(x: torch.Tensor, peers: PeerBuffers, out: torch.Tensor | None = None, *,
                        block: int | None = None, max_programs: int | None = None,
                        num_warps: int | None = None, pdl: bool | None = None) -> torch.Tensor:
    """Sum `x` over the ranks of `peers` into `out` (default: in place); returns it. Every rank
    calls this with the same shape and dtype, in the same order relative to its other calls on
    these buffers, from one stream. Nothing is allocated and the host never waits, so a CUDA
    graph can capture it."""
    return _launch(_one_shot_all_reduce_kernel, "one_shot_all_reduce", x, out, peers,
                   peers.capacity, "peer buffers", block or BLOCK, max_programs or MAX_PROGRAMS, FLAG_PROGRAMS,
                   num_warps, pdl, CAPACITY=peers.capacity, WORLD_P2=triton.next_power_of_2(peers.world),
                   FLAG_PROGRAMS=FLAG_PROGRAMS, FLAG_WORLD=FLAG_WORLD)


def _launch(kernel, name: str, x: torch.Tensor, out: torch.Tensor | None, peers: PeerBuffers, room: int,
            room_name: str, block: int, max_programs: int, most_programs: int, num_warps: int | None,
            pdl: bool | None, **meta) -> torch.Tensor:
    """The checks and the launch both kernels share: `x` summed into `out` (default: in place),
    `room` bytes at most, `max_programs` (<= `most_programs`) programs of `block` elements."""
    out = x if out is None else out
    n = x.numel()
    if not (x.is_contiguous() and out.is_contiguous() and out.shape == x.shape):
        raise ValueError(f"{name} needs contiguous x and out of one shape")
    if n * x.element_size() > room:
        raise ValueError(f"{n * x.element_size()} bytes do not fit the {room}-byte {room_name}")
    if peers.world > FLAG_WORLD or max_programs > most_programs:
        raise ValueError(f"at most {FLAG_WORLD} ranks and {most_programs} programs")
    if n == 0:
        return out
    pdl = triton_pdl.enabled(x.device) if pdl is None else pdl
    kernel[(launch_grid(n, block, max_programs),)](
        x, out, n, peers.ptrs, peers.state, peers.rank, WORLD=peers.world, BLOCK=block, PDL=pdl,
        num_warps=num_warps or NUM_WARPS, **meta, **triton_pdl.launch_options(pdl),
    )
    return out


# ---- push: decode-sized messages, no flags -------------------------------------------------------
#
# One launch, the same grid on every rank; parity q = calls & 1 as above. Program b, for each of
# its tiles (b, b + G, ...):
#
# 1. writes the tile of its input (as 16-bit patterns, -0.0 made +0.0) into slot `rank` of
#    parity q of every peer's buffer: plain stores over NVLink, no fence, no flag;
# 2. then, for each rank p in order: its own tile for p = rank, else the tile from slot p of
#    its own buffer, loaded again (volatile: from L2, never a stale L1 line) until no element is
#    the SENTINEL; it adds them in fp32, stores the sum, and writes the SENTINEL back over the
#    slot's tile, ready for the call after next.
#
# The data is its own flag (Lamport's one-shot, as in TensorRT-LLM): a reader waits for nothing
# but the data itself, one NVLink crossing after its writer stored it. Why this is correct:
#
# * An element once not the SENTINEL is final: each 16-bit element of a slot is written once
#   per call (an aligned 2-byte store is never seen half done), from the SENTINEL to its value.
# * Nothing is overwritten early. Rank r's slot p of parity q is written by peer p in call k
#   and next in call k + 2. Peer p ends call k + 1 only with rank r's data of call k + 1, which
#   rank r writes after its call k completed (stream order), so after it read that slot in
#   call k and reset it: the reset lands before the slot is written again.
# * Every rank sums the same values in the same order: the same bits on every rank, the
#   reference's (all_reduce_sum starts from +0.0, so the sign of a zero part never shows).
# * No program waits for one that cannot run: a program writes all its tiles before it waits,
#   and the grid (<= PUSH_MAX_PROGRAMS) is resident at once.
#
# (Calls are counted over both kernels: one-shot and push calls may alternate on the same
# buffers, and each argument above holds with k counting either; NCCL calls count for nothing.)

@triton.jit
def _push_region(ptrs_ptr, state_ptr, PUSH_AT: tl.constexpr, SLOT: tl.constexpr, SLOTS: tl.constexpr):
    """(calls done, the byte offset of this call's parity of push slots in every buffer)."""
    calls = tl.load(state_ptr)
    return calls, PUSH_AT + (calls & 1).to(tl.int64) * (SLOTS * SLOT)


@triton.jit
def _push_out(bits_in, offs, m, ptrs_ptr, region, rank, SLOT: tl.constexpr, WORLD: tl.constexpr,
              SENTINEL: tl.constexpr):
    """Step 1 for one tile: its elements (bit patterns, the SENTINEL's as +0.0) into slot `rank` of
    every peer's buffer."""
    v = tl.load(bits_in + offs, mask=m)
    v = tl.where(v == SENTINEL, tl.zeros_like(v), v)
    for p in tl.static_range(WORLD):
        if p != rank:
            theirs = (tl.load(ptrs_ptr + p) + region + rank * SLOT).to(bits_in.dtype)
            tl.store(tl.multiple_of(theirs, 16) + offs, v, mask=m)


@triton.jit
def _push_sum(bits_in, offs, m, mine, rank, dtype, SLOT: tl.constexpr, WORLD: tl.constexpr,
              SENTINEL: tl.constexpr, BLOCK: tl.constexpr):
    """Step 2 for one tile: every rank's part in rank order, summed in fp32 (the peers' read
    from this rank's slots once no element is the SENTINEL, and reset to it)."""
    own = tl.load(bits_in + offs, mask=m, other=0)
    own = tl.where(own == SENTINEL, tl.zeros_like(own), own)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(WORLD):
        if p == rank:
            acc += own.to(dtype, bitcast=True).to(tl.float32)
        else:
            slot = tl.multiple_of(mine + p * (SLOT // (own.dtype.primitive_bitwidth // 8)), 16) + offs
            v = tl.load(slot, mask=m, other=0, volatile=True)
            while tl.max(((v == SENTINEL) & m).to(tl.int32), axis=0) > 0:
                v = tl.load(slot, mask=m, other=0, volatile=True)
            tl.store(slot, tl.full([BLOCK], SENTINEL, own.dtype), mask=m)
            acc += v.to(dtype, bitcast=True).to(tl.float32)
    return acc


@triton.jit
def _count_call(state_ptr, calls):
    """Step 3: the last program to finish advances the call counter."""
    done = tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:
        tl.store(state_ptr + 1, 0)
        tl.store(state_ptr, calls + 1)


@triton.jit
def _push_all_reduce_kernel(x_ptr, out_ptr, n, ptrs_ptr, state_ptr, rank,
                            PUSH_AT: tl.constexpr, SLOT: tl.constexpr, SLOTS: tl.constexpr,
                            WORLD: tl.constexpr, BLOCK: tl.constexpr, SENTINEL: tl.constexpr,
                            BITS: tl.constexpr, PDL: tl.constexpr):
    triton_pdl.wait_for_predecessor(PDL)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles = tl.cdiv(n, BLOCK)
    calls, region = _push_region(ptrs_ptr, state_ptr, PUSH_AT, SLOT, SLOTS)
    bits_in = x_ptr.to(tl.pointer_type(BITS))
    for t in range(pid, tiles, programs):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        _push_out(bits_in, offs, offs < n, ptrs_ptr, region, rank, SLOT, WORLD, SENTINEL)

    mine = (tl.load(ptrs_ptr + rank) + region).to(tl.pointer_type(BITS))
    dtype = out_ptr.dtype.element_ty
    for t in range(pid, tiles, programs):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        acc = _push_sum(bits_in, offs, m, mine, rank, dtype, SLOT, WORLD, SENTINEL, BLOCK)
        tl.store(out_ptr + offs, acc.to(dtype), mask=m)
    _count_call(state_ptr, calls)


def push_all_reduce(x: torch.Tensor, peers: PeerBuffers, out: torch.Tensor | None = None, *,
                    block: int | None = None, max_programs: int | None = None,
                    num_warps: int | None = None, pdl: bool | None = None) -> torch.Tensor:
    """one_shot_all_reduce's contract (same buffers, same call counter, same bits) for messages
    of up to PUSH_SLOT bytes of fp16, bf16 or fp32, by pushing: see the notes above the kernel."""
    if x.element_size() not in PUSH_BITS or not x.is_floating_point() or (out is not None and out.dtype != x.dtype):
        raise ValueError(f"push_all_reduce sums fp16, bf16 or fp32 into their own dtype, not {x.dtype}")
    bits, sentinel = PUSH_BITS[x.element_size()]
    return _launch(_push_all_reduce_kernel, "push_all_reduce", x, out, peers, PUSH_SLOT, "push slots",
                   block or PUSH_BLOCK, max_programs or PUSH_MAX_PROGRAMS, PUSH_MAX_PROGRAMS, num_warps, pdl,
                   PUSH_AT=push_at(peers.capacity), SLOT=PUSH_SLOT, SLOTS=FLAG_WORLD, SENTINEL=sentinel, BITS=bits)


# ---- push, then the residual add and the next RMSNorm (decode rows past the GEMV's) ------------
#
# A row-parallel linear's partial rows are summed and, in the same launch, become the next
# linear's PreNorm'd input: the protocol above with one row per tile (a program owns whole rows,
# so it can take a row's statistics), then per row: the sum rounded to the dtype (what the plain
# all-reduce stores), optionally RMS-normalised with `x_norm` and rounded (Gemma's sandwich
# norm), plus the residual in fp32; that written as the next residual stream (`sum_out`), and
# RMS-normalised with `weight` into `out`. reference.all_reduce_rms_norm is the contract.

@triton.jit
def _push_all_reduce_norm_kernel(x_ptr, res_ptr, w_ptr, xn_ptr, out_ptr, sum_ptr, rows, ptrs_ptr, state_ptr, rank,
                                 eps, HIDDEN: tl.constexpr, PUSH_AT: tl.constexpr, SLOT: tl.constexpr,
                                 SLOTS: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                                 SENTINEL: tl.constexpr, POST_NORM: tl.constexpr, PDL: tl.constexpr):
    triton_pdl.wait_for_predecessor(PDL)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    calls, region = _push_region(ptrs_ptr, state_ptr, PUSH_AT, SLOT, SLOTS)
    bits_in = x_ptr.to(tl.pointer_type(tl.int16))
    cols = tl.arange(0, BLOCK)
    m = cols < HIDDEN
    for r in range(pid, rows, programs):
        _push_out(bits_in, r * HIDDEN + cols, m, ptrs_ptr, region, rank, SLOT, WORLD, SENTINEL)

    mine = (tl.load(ptrs_ptr + rank) + region).to(tl.pointer_type(tl.int16))
    dtype = out_ptr.dtype.element_ty
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    xn = w
    if POST_NORM:
        xn = tl.load(xn_ptr + cols, mask=m, other=0.0).to(tl.float32)
    for r in range(pid, rows, programs):
        offs = r * HIDDEN + cols
        h = _push_sum(bits_in, offs, m, mine, rank, dtype, SLOT, WORLD, SENTINEL, BLOCK).to(dtype).to(tl.float32)
        if POST_NORM:
            h = (h * tl.math.rsqrt(tl.sum(h * h, axis=0) / HIDDEN + eps) * xn).to(dtype).to(tl.float32)
        h += tl.load(res_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(sum_ptr + offs, h.to(dtype), mask=m)
        y = h * tl.math.rsqrt(tl.sum(h * h, axis=0) / HIDDEN + eps) * w
        tl.store(out_ptr + offs, y.to(dtype), mask=m)
    _count_call(state_ptr, calls)


NORM_MAX_HIDDEN = 16384  # the longest row one program holds (registers: BLOCK fp32 per row)


def push_all_reduce_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                         peers: PeerBuffers, out: torch.Tensor, sum_out: torch.Tensor,
                         x_norm: torch.Tensor | None = None, *, max_programs: int | None = None,
                         pdl: bool | None = None) -> torch.Tensor:
    """Rows `[M, H]` of x summed over the ranks (push_all_reduce's protocol, buffers and counter;
    x is left as it is), then RMSNorm(sum (+ post-norm) + residual) into `out` and the sum with
    the residual into `sum_out`: reference.all_reduce_rms_norm. Returns out."""
    rows, hidden = x.shape
    for t in (residual, out, sum_out):
        if t.shape != x.shape or t.dtype != x.dtype or not t.is_contiguous():
            raise ValueError("push_all_reduce_norm needs residual, out and sum_out shaped and typed as x, contiguous")
    if x.element_size() != 2 or not x.is_floating_point() or not x.is_contiguous():
        raise ValueError(f"push_all_reduce_norm sums contiguous 16-bit floats, not {x.dtype}")
    if x.numel() * 2 > PUSH_SLOT or hidden > NORM_MAX_HIDDEN:
        raise ValueError(f"{rows} x {hidden} do not fit the push slots ({PUSH_SLOT} bytes) or one program's row")
    if peers.world > FLAG_WORLD:
        raise ValueError(f"at most {FLAG_WORLD} ranks")
    if rows == 0:
        return out
    pdl = triton_pdl.enabled(x.device) if pdl is None else pdl
    block = triton.next_power_of_2(hidden)
    _push_all_reduce_norm_kernel[(min(rows, max_programs or PUSH_MAX_PROGRAMS),)](
        x, residual, weight, x_norm if x_norm is not None else weight, out, sum_out, rows, peers.ptrs, peers.state,
        peers.rank, float(eps), HIDDEN=hidden, PUSH_AT=push_at(peers.capacity), SLOT=PUSH_SLOT, SLOTS=FLAG_WORLD,
        WORLD=peers.world, BLOCK=block, SENTINEL=SENTINEL, POST_NORM=x_norm is not None, PDL=pdl,
        num_warps=4 if block <= 4096 else 8, **triton_pdl.launch_options(pdl),
    )
    return out
