"""Microseconds per tensor-parallel all-reduce: NCCL against our one-shot and push kernels (GPUs, 2+).

One process per GPU. For each message size and dtype it times NCCL launched eagerly, NCCL
captured in a CUDA graph (CALLS all-reduces in one graph, as a decode step holds them), our
one-shot kernel (kernels/triton_allreduce.py, peer buffers set up as TensorParallelGroup does)
and our push kernel (messages of up to its PUSH_SLOT) eagerly and in a graph, and torch's
symmetric-memory `one_shot_all_reduce` with the copy into its buffer (bf16 only in torch 2.11;
a dash where it fails). `ours=ref` says whether our sums were the reference's bits on rank 0
for random inputs. The whole run is bounded (< 3 minutes):

    python3 tools/gpu/time_allreduce.py [--gpus 2] [--sizes 8K,16K,64K,256K,512K,1M,2M]
                                        [--block 2048] [--programs 32] [--no-pdl]
                                        [--push-block 1024] [--push-programs 128]

push_bytes() in backend/parallel/allreduce.py (where `auto` hands over from push to NCCL) comes
from the graph columns: the largest size at which push is still faster. The one-shot kernel
runs up to its 1 MB data region (a dash above); push up to its 2 MB slots.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback

import torch

CALLS = 50  # all-reduces per timed loop / per captured graph
REPLAYS = 10
DEADLINE_S = 170


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20}M" if nbytes >= 1 << 20 and nbytes % (1 << 20) == 0 else f"{nbytes >> 10}K"


def _eager_us(fn, device) -> float:
    import torch.distributed as dist

    fn()
    dist.barrier()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / CALLS


def _graph_us(fn, device) -> float:
    import torch.distributed as dist

    from tritonformer.backend.cuda_graphs import capture_graph

    graph, _ = capture_graph(lambda: [fn() for _ in range(CALLS)])
    dist.barrier()
    torch.cuda.synchronize(device)
    best = float("inf")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / CALLS)
    dist.barrier()
    return best


def _torch_one_shot(n: int, dtype, device):
    """torch's symmetric-memory one-shot all-reduce of `n` elements, with the copy into its
    buffer; None where this torch cannot (e.g. fp16 in 2.11)."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD.group_name
    buf = symm_mem.empty(n, dtype=dtype, device=device)
    symm_mem.rendezvous(buf, group)
    x = torch.zeros(n, dtype=dtype, device=device)

    def run():
        buf.copy_(x)
        return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group)

    run()
    torch.cuda.synchronize(device)
    return run


def _rank(rank: int, world: int, address: str, args, results) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(DEADLINE_S - 5, exit=True)
    try:
        import torch.distributed as dist

        from tritonformer.backend.parallel.group import TensorParallelGroup
        from tritonformer.kernels import triton_allreduce as ar
        from tritonformer.kernels.reference import all_reduce_sum

        device = torch.device(f"cuda:{rank}")
        tp = TensorParallelGroup.join(rank, world, address, device)  # TRITONFORMER_ALLREDUCE=oneshot
        peers = tp.reducer.peers if tp.reducer is not None else None
        if peers is None:
            raise RuntimeError("no peer buffers (see the log above): nothing of ours to time")
        kw = dict(block=args.block, max_programs=args.programs, pdl=False if args.no_pdl else None)
        push_kw = dict(block=args.push_block, max_programs=args.push_programs, pdl=kw["pdl"])
        rows = []
        for nbytes in args.sizes:
            for dtype in (torch.float16, torch.bfloat16):
                n = nbytes // 2
                g = torch.Generator().manual_seed(rank * 7919 + n)
                x = torch.randn(n, generator=g).to(device, dtype)
                parts = [torch.empty_like(x) for _ in range(world)]
                dist.all_gather(parts, x)
                fits = nbytes <= peers.buffers.capacity  # the one-shot kernel's data region
                exact = True
                if fits:
                    ours = ar.one_shot_all_reduce(x.clone(), peers.buffers, **kw)
                    exact = bool(torch.equal(ours, all_reduce_sum(parts)))
                pushable = nbytes <= ar.PUSH_SLOT
                if pushable:
                    pushed = ar.push_all_reduce(x.clone(), peers.buffers, **push_kw)
                    exact = exact and bool(torch.equal(pushed, all_reduce_sum(parts)))
                x.zero_()  # timed on zeros: repeated sums stay finite
                row = {"size": nbytes, "dtype": str(dtype).removeprefix("torch."), "exact": exact,
                       "nccl_eager": _eager_us(lambda: dist.all_reduce(x), device),
                       "nccl_graph": _graph_us(lambda: dist.all_reduce(x), device)}
                if fits:
                    row["ours_eager"] = _eager_us(lambda: ar.one_shot_all_reduce(x, peers.buffers, **kw), device)
                    row["ours_graph"] = _graph_us(lambda: ar.one_shot_all_reduce(x, peers.buffers, **kw), device)
                if pushable:
                    row["push_eager"] = _eager_us(lambda: ar.push_all_reduce(x, peers.buffers, **push_kw), device)
                    row["push_graph"] = _graph_us(lambda: ar.push_all_reduce(x, peers.buffers, **push_kw), device)
                try:
                    run = _torch_one_shot(n, dtype, device)
                    ok = True
                except Exception:  # noqa: BLE001 - this torch has no such op for this dtype
                    ok = False
                # every rank must agree before timing it (a rank timing alone would wait for ever)
                flag = torch.tensor([int(ok)], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MIN)
                if flag.item():
                    row["torch_eager"] = _eager_us(run, device)
                    row["torch_graph"] = _graph_us(run, device)
                rows.append(row)
        if rank == 0:
            results.put(("rows", {"transport": peers.transport, "rows": rows}))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put(("error", f"rank {rank}:\n{traceback.format_exc()}"))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)  # no destroy_process_group: it can hang at exit


def _gpu_names() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.split("\n")
        names = [s.strip() for s in out if s.strip()]
        return ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names)) or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no nvidia-smi)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="ranks (default: every GPU)")
    parser.add_argument("--sizes", default="8K,16K,64K,256K,512K,1M", help="message bytes, comma-separated")
    parser.add_argument("--block", type=int, default=0, help="elements per tile (default: the kernel's)")
    parser.add_argument("--programs", type=int, default=0, help="most programs per call (default: the kernel's)")
    parser.add_argument("--no-pdl", action="store_true", help="launch ours without programmatic dependent launch")
    parser.add_argument("--push-block", type=int, default=0, help="push kernel: elements per tile (default: its own)")
    parser.add_argument("--push-programs", type=int, default=0, help="push kernel: most programs (default: its own)")
    args = parser.parse_args()
    args.sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    world = args.gpus or torch.cuda.device_count()
    if world < 2:
        print(f"needs 2 or more GPUs (found {torch.cuda.device_count()})")
        return 1
    import multiprocessing

    import triton

    from tritonformer.backend.parallel.allreduce import MAX_BYTES, MODE_ENV
    from tritonformer.backend.parallel.group import free_address
    from tritonformer.kernels import triton_allreduce as ar

    if max(args.sizes) > max(MAX_BYTES, ar.PUSH_SLOT):
        print(f"sizes above {max(MAX_BYTES, ar.PUSH_SLOT)} bytes fit neither kernel's buffers")
        return 1
    os.environ[MODE_ENV] = "oneshot"  # peer buffers for every size; the ranks inherit it
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    print(f"GPUs: {_gpu_names()}; torch {torch.__version__}, triton {triton.__version__}, {world} ranks")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    address = free_address()
    procs = [ctx.Process(target=_rank, args=(r, world, address, args, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline, answer = time.monotonic() + DEADLINE_S, None
    try:
        while answer is None and time.monotonic() < deadline:
            try:
                answer = results.get(timeout=2.0)
            except Exception:  # noqa: BLE001 - queue.Empty
                if not any(p.is_alive() for p in procs):
                    break
    finally:
        for p in procs:
            p.join(3)
            if p.is_alive():
                p.kill()
    if answer is None:
        print(f"no result within {DEADLINE_S} s (or the ranks died): see their output above")
        return 1
    kind, payload = answer
    if kind == "error":
        print(payload)
        return 1
    pdl = "off" if args.no_pdl else "where the GPU has it"
    print(f"ours: peer buffers over {payload['transport']}, block {args.block or ar.BLOCK}, "
          f"at most {args.programs or ar.MAX_PROGRAMS} programs (push: block {args.push_block or ar.PUSH_BLOCK}, "
          f"at most {args.push_programs or ar.PUSH_MAX_PROGRAMS}), PDL {pdl}")
    print(f"us per all-reduce; eager: {CALLS} launched back to back; graph: {CALLS} in one CUDA graph, "
          f"best of {REPLAYS} replays; torch-1shot: symm_mem one_shot_all_reduce with the copy into its buffer")
    cols = ["size", "dtype", "nccl-eager", "nccl-graph", "ours-eager", "ours-graph", "push-eager", "push-graph",
            "torch-1shot-eager", "torch-1shot-graph", "nccl/best graph", "ours=ref"]
    print("  ".join(f"{c:>17}" if i > 1 else f"{c:>5}" for i, c in enumerate(cols)))

    def us(v):
        return f"{v:17.1f}" if v is not None else f"{'-':>17}"

    for r in payload["rows"]:
        best = min(v for v in (r.get("ours_graph"), r.get("push_graph")) if v is not None)
        print("  ".join([f"{_label(r['size']):>5}", f"{r['dtype']:>5}", us(r["nccl_eager"]), us(r["nccl_graph"]),
                         us(r.get("ours_eager")), us(r.get("ours_graph")), us(r.get("push_eager")),
                         us(r.get("push_graph")), us(r.get("torch_eager")), us(r.get("torch_graph")),
                         f"{r['nccl_graph'] / best:16.2f}x", f"{'yes' if r['exact'] else 'NO':>17}"]))
    return 0 if all(r["exact"] for r in payload["rows"]) else 2


if __name__ == "__main__":
    sys.exit(main())
