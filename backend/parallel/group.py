"""The ranks of one tensor-parallel model and the collectives its forward needs (Megatron-LM's
split): column-parallel QKV and gate/up projections, row-parallel output and down projections
with one all-reduce after each, a vocabulary-parallel embedding (its looked-up rows summed by
one more all-reduce) and output head (its logits gathered).

Between GPUs the all-reduces go to `allreduce.AllReduce`: our push and one-shot kernels over
peer buffers for small messages, NCCL above (and as its fallback), all captured in the decode
CUDA graphs like any kernel; its peer buffers are set up in `join`, on every rank at once, since setting
them up is collective and a capture cannot contain it. Everything else is NCCL. On the CPU,
gloo, so the split is testable without a GPU.
"""
from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from tritonformer.backend.parallel.allreduce import AllReduce
from tritonformer.kernels import reference


# torch >= 2.12 renamed it (the old name warns there)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def free_address() -> str:
    """A TCP rendezvous address on this host that nothing listens on yet."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class TensorParallelGroup:
    """This process's rank among `world` ranks of one model."""

    def __init__(self, rank: int, world: int, reducer: AllReduce | None = None):
        self.rank = rank
        self.world = world
        self.reducer = reducer  # all-reduces on GPUs (allreduce.py); None: dist.all_reduce (gloo on the CPU)

    @classmethod
    def join(cls, rank: int, world: int, address: str, device: torch.device) -> "TensorParallelGroup":
        """Join the group at `address` (every rank calls this; it returns when all have)."""
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (NVLS) in NCCL either
        # A generous timeout: ranks compile kernels at different speeds during warm-up. A dead
        # rank is found by the workers' monitor (workers.py), not by this timeout.
        dist.init_process_group(backend, init_method=address, rank=rank, world_size=world,
                                timeout=datetime.timedelta(minutes=30),
                                device_id=device if device.type == "cuda" else None)
        if device.type != "cuda":
            return cls(rank, world)
        # Collective (every rank is here now); the mode comes from TRITONFORMER_ALLREDUCE, which
        # the workers inherit from rank 0's environment.
        return cls(rank, world, AllReduce.create(rank, world, device))

    def part(self, n: int, what: str) -> slice:
        """This rank's contiguous share of `n` items (heads, rows); they must divide evenly."""
        if n % self.world:
            raise ValueError(f"{what} ({n}) do not divide by tensor_parallel_size {self.world}")
        size = n // self.world
        return slice(self.rank * size, (self.rank + 1) * size)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place (the partial outputs of a row-parallel linear)."""
        if self.reducer is not None:
            return self.reducer(x)
        dist.all_reduce(x)
        return x

    def all_reduce_then(self, x: torch.Tensor, prenorm):
        """Sum `x` over the ranks, in place, then `prenorm` (kernels.PreNorm or None), the norm
        the linear that x feeds applies: returns (x, prenorm) for that linear to apply it, or,
        where the all-reduce kernel applies it in the same launch (AllReduce.fuses_norm), (the
        normalised rows, None), prenorm.sum_out written."""
        if prenorm is not None and self.reducer is not None and self.reducer.fuses_norm(x, prenorm):
            return self.reducer.all_reduce_norm(x, prenorm), None
        return self.all_reduce(x), prenorm

    def rms_norms(self, parts: list[torch.Tensor], weights: list[torch.Tensor], eps: float) -> list[torch.Tensor]:
        """RMSNorms whose width the ranks share (a norm over every head, the heads split): each of `parts`
        is this rank's `[rows, n]` share of one norm's rows and each of `weights` its `[n]` share of the
        weight. Every rank's sums of squares, all norms in one fp32 all-reduce `[rows, len(parts)]`, give
        the whole width's (`world * n`) mean squares; the rows come back normalised in their own dtype,
        computed in fp32 and rounded once, as kernels.rms_norm."""
        squares = self.all_reduce(torch.stack([p.float().pow(2).sum(-1) for p in parts], dim=1))
        return [reference.summed_rms_norm(p, w, eps, squares[:, i : i + 1], p.shape[1] * self.world)
                for i, (p, w) in enumerate(zip(parts, weights))]

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """`[rows, n]` on every rank -> `[rows, world * n]`, rank r's columns at r * n: the
        vocabulary-parallel head's logits, whole on every rank (each samples the same ids)."""
        rows, n = x.shape
        out = x.new_empty(self.world * rows, n)
        _all_gather(out, x.contiguous())
        return out.view(self.world, rows, n).permute(1, 0, 2).reshape(rows, self.world * n)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank, in place (sampled ids: only rank 0 samples)."""
        dist.broadcast(x, src=0)
        return x

    def leave(self) -> None:
        if self.reducer is not None:  # the peer buffers go before the group they were shared over
            self.reducer.close()
            self.reducer = None
        if dist.is_initialized():
            _end_process_group()


def adds_biases(tp: TensorParallelGroup | None) -> bool:
    """Whether this process adds a row-parallel linear's bias: each rank's output is a partial sum that
    the all-reduce adds up, so one rank adds the bias (rank 0; the only process without `tp`)."""
    return tp is None or tp.rank == 0


def _end_process_group() -> None:
    """Tear the process group down without waiting on a peer's work. NCCL lets a communicator
    go only once every CUDA graph that captured one of its collectives is destroyed (the
    runner's close() drops its graphs before it calls leave); destroy_process_group also waits
    for the works it recorded, which graph-captured ones may never report
    (pytorch/pytorch#115388). Aborting the communicators waits for no work, and leaves the
    process free to join a group again."""
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if dist.get_backend() == "nccl" and abort is not None:
        abort()
    else:
        dist.destroy_process_group()
