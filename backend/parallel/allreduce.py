"""The tensor-parallel sum all-reduce on GPUs: our kernels for small messages, NCCL above.

A decode step all-reduces a few rows of hidden states twice per layer; NCCL spends ~10-34 us
on each even inside a CUDA graph, our push kernel over peer buffers (kernels/triton_allreduce.py)
a third of that. Which one runs is decided per call by `route` from the message and the mode,
read once from `TRITONFORMER_ALLREDUCE`:

* `auto` (default): our push kernel (no flags: the data is its own signal) up to
  `push_bytes(world)`, NCCL above;
* `push`: the push kernel wherever it can run (up to PUSH_MAX_BYTES), NCCL above;
* `oneshot`: our one-shot kernel (a barrier of flags, then every peer's part read) wherever it
  can run (up to MAX_BYTES), for tests and benchmarks: push beat it at every size;
* `nccl`: NCCL only (no peer buffers are set up);
* `fused`: `auto`, and where a row-parallel linear's output feeds a linear whose RMSNorm
  prenorm runs as a kernel of its own (decode batches past the GEMV's FUSED_NORM_MIN_ROWS - 1
  rows, within the push kernel's size), one launch sums the rows, adds the residual and
  normalises them (kernels/triton_allreduce.push_all_reduce_norm; `fuses_norm`). Off by
  default until measured against `auto` (`tritonformer bench tensor-parallel --allreduce auto,fused`).

Measured on two H100s (tools/gpu/time_allreduce.py, 50 in a CUDA graph, fp16, 2026-11-27): push
/ one-shot / NCCL 3.1 / 6.2 / 9.6 us at 8 KB, 3.4 / 6.3 / 9.4 at 64 KB, 5.0 / 13.7 / 14.3 at
512 KB (batch 64 of hidden 4096), 12.2 / - / 33.9 at 2 MB (batch 256).

NCCL also serves what ours does not: dtypes other than fp16/bf16/fp32, non-contiguous tensors,
larger messages (a prefill's), more than 8 ranks, GPUs without peer access, and any failure to set
up the peer buffers (logged once, with why). Every rank takes the same decision for the same
call, so the ranks stay in step.

The peer buffers come from torch's symmetric memory (`symm_mem.empty` + `rendezvous`) or, where
that is missing or fails, from CUDA IPC handles exchanged over the process group. Setup is
collective: every rank calls `AllReduce.create` together (TensorParallelGroup.join does, right
after the process group exists), and the ranks agree on the outcome before any kernel runs.
NVLink multicast stays off: TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is set before symmetric memory is
touched, and nothing here uses multimem or NVLS.
"""
from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from tritonformer.kernels.triton_allreduce import PeerBuffers

log = logging.getLogger("tritonformer")

MODE_ENV = "TRITONFORMER_ALLREDUCE"
MODES = ("auto", "nccl", "oneshot", "push", "fused")
# `fused`: decode rows from which the norm is fused into the all-reduce; fewer rows run the GEMV,
# whose prologue fuses it already (kernels/triton_gemv.MAX_ROWS + 1; a test holds them equal).
FUSED_NORM_MIN_ROWS = 3
MAX_BYTES = 1 << 20  # the one-shot kernel's data region (64 rows x 8192 hidden, fp16)
PUSH_MAX_BYTES = 2 << 20  # the push kernel's slots (kernels/triton_allreduce.PUSH_SLOT; a test holds them equal)


def push_bytes(world: int) -> int:
    """`auto`: the push kernel up to this, NCCL above. A rank writes its message into each of
    its world - 1 peers, so the hand-over keeps every rank's outgoing bytes at what two ranks
    send at PUSH_MAX_BYTES, where push still ran in 12.2 us against NCCL's 33.9 (two H100s).
    More than two ranks have not been timed with push yet (tools/gpu/time_allreduce.py)."""
    return PUSH_MAX_BYTES // max(world - 1, 1)


MAX_WORLD = 8
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # fp32: norms' sums of squares (Mamba2Mixer)
TRANSPORTS = ("symm_mem", "ipc")
# Whether this process has opened symmetric-memory buffers for a process group. torch registers a group's
# symmetric-memory rendezvous by the group's name, and a group made again after the first one left gets the
# same name: a process's second rendezvous then waits on the first group's store while a fresh rank waits
# on the new one (seen on two H200s: the second of two two-GPU checks in one pytest process never met).
# A group any of whose ranks has opened them before skips them for CUDA IPC handles.
_symm_mem_opened = False


def read_mode(environ=os.environ) -> str:
    """TRITONFORMER_ALLREDUCE, checked ('auto' when unset or empty)."""
    mode = (environ.get(MODE_ENV) or "auto").strip().lower()
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={environ.get(MODE_ENV)!r}: expected one of {', '.join(MODES)}")
    return mode


def route(mode: str, nbytes: int, dtype: torch.dtype, contiguous: bool, world: int, ready: bool,
          threshold: int | None = None, max_bytes: int = MAX_BYTES) -> tuple[str, str | None]:
    """('push', 'oneshot' or 'nccl', why NCCL serves a call ours would otherwise take, or None).
    `ready`: the peer buffers are set up on every rank."""
    if mode == "nccl":
        return "nccl", None
    if world > MAX_WORLD:
        return "nccl", f"{world} ranks (our kernels serve up to {MAX_WORLD})"
    if not ready:
        return "nccl", "no peer buffers"
    if dtype not in DTYPES:
        return "nccl", f"dtype {str(dtype).removeprefix('torch.')} (our kernels serve fp16, bf16 and fp32)"
    if not contiguous:
        return "nccl", "a non-contiguous tensor"
    if mode in ("auto", "fused"):
        limit = min(push_bytes(world) if threshold is None else threshold, PUSH_MAX_BYTES)
        return ("push" if nbytes <= limit else "nccl"), None
    if mode == "push":
        if nbytes <= PUSH_MAX_BYTES:
            return "push", None
        return "nccl", f"{nbytes} bytes (push slots hold {PUSH_MAX_BYTES})"
    if nbytes > max_bytes:
        return "nccl", f"{nbytes} bytes (peer buffers hold {max_bytes})"
    return "oneshot", None


class AllReduce:
    """`all_reduce(x)`: sum `x` over the ranks in place, by our kernel or NCCL (`route`)."""

    def __init__(self, mode: str, world: int, peers=None, threshold: int | None = None,
                 max_bytes: int = MAX_BYTES):
        self.mode, self.world, self.peers = mode, world, peers
        self.threshold, self.max_bytes = threshold, max_bytes
        self._told: set[str] = set()
        self._kernels = {}
        if peers is not None:  # (imports Triton: only once peer buffers exist, on a GPU)
            from tritonformer.kernels.triton_allreduce import one_shot_all_reduce, push_all_reduce, push_all_reduce_norm

            self._kernels = {"oneshot": one_shot_all_reduce, "push": push_all_reduce, "push_norm": push_all_reduce_norm}

    @classmethod
    def create(cls, rank: int, world: int, device: torch.device, mode: str | None = None,
               transports: tuple[str, ...] = TRANSPORTS, max_bytes: int = MAX_BYTES,
               threshold: int | None = None) -> "AllReduce":
        """Set up on every rank at once (collective, after init_process_group). `mode`: default
        from the environment. `transports`: tried in order until every rank has one."""
        mode = read_mode() if mode is None else mode
        peers = None
        if mode != "nccl":
            peers = _set_up_peers(rank, world, device, transports, max_bytes)
        return cls(mode, world, peers, threshold, max_bytes)

    def route(self, x: torch.Tensor) -> str:
        path, why = route(self.mode, x.numel() * x.element_size(), x.dtype, x.is_contiguous(), self.world,
                          self.peers is not None, self.threshold, self.max_bytes)
        if why is not None and why not in self._told:
            self._told.add(why)
            log.info("all-reduce by NCCL for %s", why)
        return path

    def fuses_norm(self, x: torch.Tensor, prenorm) -> bool:
        """Whether `all_reduce_norm` serves x and `prenorm` (mode `fused`): rows of x that the
        push kernel takes, at least FUSED_NORM_MIN_ROWS of them, of at most NORM_MAX_HIDDEN
        columns, and an RMSNorm prenorm over a residual (no LayerNorm, no bias on x, not a
        post-norm block's sum without a norm, no sum_scale)."""
        from tritonformer.kernels.triton_allreduce import NORM_MAX_HIDDEN

        p = prenorm
        return (self.mode == "fused" and self.peers is not None and x.dim() == 2
                and FUSED_NORM_MIN_ROWS <= x.shape[0] and x.shape[1] <= NORM_MAX_HIDDEN
                and p.weight is not None and p.bias is None and p.x_bias is None and p.residual is not None
                and p.sum_out is not None and p.sum_scale is None
                and p.residual.dtype == p.sum_out.dtype == x.dtype and p.residual.is_contiguous()
                and p.sum_out.is_contiguous() and self.route(x) == "push")

    def all_reduce_norm(self, x: torch.Tensor, prenorm) -> torch.Tensor:
        """x summed over the ranks and `prenorm` applied to it in one launch (see fuses_norm):
        the normalised rows (a new tensor; x is left as this rank's part), prenorm.sum_out
        written. reference.all_reduce_rms_norm is the contract."""
        p = prenorm
        return self._kernels["push_norm"](x, p.residual, p.weight, p.eps, self.peers.buffers, torch.empty_like(x),
                                          p.sum_out, p.x_norm)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        path = self.route(x)
        if path != "nccl":
            return self._kernels[path](x, self.peers.buffers)
        dist.all_reduce(x)
        return x

    def close(self) -> None:
        """Let go of the peer buffers (before the process group goes)."""
        self.peers = None


@dataclass(frozen=True)
class PeerSetup:
    """The kernel's view of the peer buffers, and what keeps their mappings alive."""

    buffers: PeerBuffers
    transport: str  # "symm_mem" or "ipc"
    keep: tuple = ()


def _all_ranks(ok: bool, device: torch.device) -> bool:
    """Whether `ok` holds on every rank (a collective: also a barrier)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _obstacle(rank: int, world: int, device: torch.device) -> str | None:
    """Why this rank cannot use peer buffers (None: it can). Collective (gathers devices)."""
    if device.type != "cuda":
        return "not on a GPU"
    if world > MAX_WORLD:
        return f"{world} ranks (the one-shot kernel serves up to {MAX_WORLD})"
    devices: list = [None] * world
    dist.all_gather_object(devices, device.index if device.index is not None else torch.cuda.current_device())
    mine = devices[rank]
    if len(set(devices)) < world:
        return f"ranks share a GPU (devices {devices})"
    for other in devices:
        if other != mine and not torch.cuda.can_device_access_peer(mine, other):
            return f"no peer access from GPU {mine} to GPU {other}"
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"no Triton ({e})"
    return None


def _set_up_peers(rank: int, world: int, device: torch.device, transports, max_bytes: int):
    """The peer buffers on every rank, or None on every rank (logged once, with why)."""
    global _symm_mem_opened
    try:
        why = _obstacle(rank, world, device)
    except Exception as e:  # noqa: BLE001 - any failure here means NCCL only
        why = f"{type(e).__name__}: {e}"
    if not _all_ranks(why is None, device):
        log.warning("one-shot all-reduce off, NCCL for every all-reduce: %s", why or "a peer cannot use it")
        return None
    reasons = []
    if "symm_mem" in transports and not _all_ranks(not _symm_mem_opened, device):
        transports = tuple(t for t in transports if t != "symm_mem")
        reasons.append("symm_mem: opened before in a rank's process (its rendezvous is registered by group name)")
    for transport in transports:
        peers, why = None, None
        try:
            peers = _OPEN[transport](rank, world, device, max_bytes)
        except Exception as e:  # noqa: BLE001 - try the next transport, then NCCL
            why = f"{transport}: {type(e).__name__}: {e}"
        if _all_ranks(peers is not None, device):  # also: every rank's flags are zero before any kernel
            log.info("one-shot all-reduce over %s peer buffers, %d ranks, up to %d bytes", transport, world, max_bytes)
            if transport == "symm_mem":
                _symm_mem_opened = True
            return peers
        reasons.append(why or f"{transport}: failed on a peer")
    log.warning("one-shot all-reduce off, NCCL for every all-reduce: %s", "; ".join(reasons))
    return None


def _buffers(ptrs: list[int], rank: int, world: int, device: torch.device, capacity: int) -> PeerBuffers:
    from tritonformer.kernels.triton_allreduce import PeerBuffers

    return PeerBuffers(torch.tensor(ptrs, dtype=torch.int64, device=device),
                       torch.zeros(2, dtype=torch.int32, device=device), rank, world, capacity)


def _open_symm_mem(rank: int, world: int, device: torch.device, max_bytes: int) -> PeerSetup:
    """One symmetric-memory buffer per rank; each peer's address from the rendezvous handle."""
    from tritonformer.kernels.triton_allreduce import buffer_bytes, prepare_buffer, region_bytes

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    import torch.distributed._symmetric_memory as symm_mem

    capacity = region_bytes(max_bytes)
    buf = symm_mem.empty(buffer_bytes(capacity), dtype=torch.uint8, device=device)
    group = dist.group.WORLD
    try:
        handle = symm_mem.rendezvous(buf, group.group_name)
    except Exception:  # torch builds that want the group registered first
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is None:
            raise
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable(group.group_name)
        handle = symm_mem.rendezvous(buf, group.group_name)
    if _attr(handle, "world_size") != world or _attr(handle, "rank") != rank:
        raise RuntimeError(f"rendezvous gave rank {_attr(handle, 'rank')} of {_attr(handle, 'world_size')}")
    bases = [int(p) for p in _attr(handle, "buffer_ptrs")]
    # The handle names each rank's allocation; our tensor may start inside it (a memory pool).
    offsets: list = [None] * world
    dist.all_gather_object(offsets, buf.data_ptr() - bases[rank])
    if any(o is None or o < 0 for o in offsets):
        raise RuntimeError(f"buffer offsets {offsets}")
    prepare_buffer(buf, capacity)
    torch.cuda.synchronize(device)
    ptrs = [b + o for b, o in zip(bases, offsets)]
    return PeerSetup(_buffers(ptrs, rank, world, device, capacity), "symm_mem", (buf, handle))


def _open_ipc(rank: int, world: int, device: torch.device, max_bytes: int) -> PeerSetup:
    """A plain CUDA buffer per rank, shared by CUDA IPC handles gathered over the group; each
    peer's handle is opened on this rank's own GPU, which maps it with peer access."""
    from tritonformer.kernels.triton_allreduce import buffer_bytes, prepare_buffer, region_bytes

    capacity = region_bytes(max_bytes)
    buf = prepare_buffer(torch.empty(buffer_bytes(capacity), dtype=torch.uint8, device=device), capacity)
    storage = buf.untyped_storage()
    shared = storage._share_cuda_()  # (device, handle, size, offset, ref counter..., event...)
    offset = buf.data_ptr() - storage.data_ptr()
    everyone: list = [None] * world
    dist.all_gather_object(everyone, (tuple(shared), offset))
    index = device.index if device.index is not None else torch.cuda.current_device()
    ptrs, keep = [], [buf, storage]
    for r, (theirs, their_offset) in enumerate(everyone):
        if r == rank:
            ptrs.append(buf.data_ptr())
            continue
        with torch.cuda.device(index):
            opened = torch.UntypedStorage._new_shared_cuda(index, *theirs[1:])
        keep.append(opened)
        ptrs.append(opened.data_ptr() + their_offset)
    torch.cuda.synchronize(device)
    return PeerSetup(_buffers(ptrs, rank, world, device, capacity), "ipc", tuple(keep))


_OPEN = {"symm_mem": _open_symm_mem, "ipc": _open_ipc}


def _attr(handle, name: str):
    """A rendezvous handle's attribute, whether torch exposes it as a property or a method."""
    value = getattr(handle, name)
    return value() if callable(value) else value
