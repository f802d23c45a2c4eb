"""What one iteration's batch of streamed outputs costs on each side of the engine process, on
this machine's CPU (no GPU, no tritonserver: Triton's per-response objects are stand-ins, and
the sends themselves, an IPC round trip each in the real stub, are not counted).

engine side: BatchingSink.send per response (outputs packed as plain lists) and the flush that
pickles the batch onto a real pipe; stub side: unpickling it, EngineClient._deliver (unpacking
into arrays, handing each to the sink) and TritonSink's loop up to handle.send (coalescing,
first pieces first, building each response's tensors). Prints one table, microseconds per
batch and per response.

    python tools/engine_process_batch_cost.py [--streams 64,256] [--tokens 1,8] [--repeat 200]
"""
from __future__ import annotations

import argparse
import pickle
import queue
import sys
import threading
import time
import types
from multiprocessing import Pipe

import numpy as np


def fake_pb_utils() -> types.ModuleType:
    """The few names of triton_python_backend_utils that TritonSink uses (objects only)."""
    pb = types.ModuleType("triton_python_backend_utils")

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, np.ascontiguousarray(array)

    class InferenceResponse:
        def __init__(self, output_tensors=None, error=None):
            self.output_tensors, self.error = output_tensors, error

    class TritonError:
        INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL = 1, 2, 3, 4

        def __init__(self, message, code=4):
            self.message, self.code = message, code

    pb.Tensor, pb.InferenceResponse, pb.TritonError = Tensor, InferenceResponse, TritonError
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    pb.Logger = types.SimpleNamespace(log_error=print, log_warn=print, log_info=print)
    return pb


class Handle:
    """A response sender that only counts (the real send is an IPC round trip, not timed)."""

    sent = 0

    def send(self, response, flags=0):
        Handle.sent += 1


def outputs(tokens: int, final: bool) -> dict:
    out = {"text_output": np.array([(" tok" * tokens).encode()], dtype=np.object_),
           "output_ids": np.arange(tokens, dtype=np.int32)}
    if final:
        out["finish_reason"] = np.array([b"length"], dtype=np.object_)
    return out


def measure(streams: int, tokens: int, repeat: int) -> dict:
    sys.modules.setdefault("triton_python_backend_utils", fake_pb_utils())
    from tritonformer.backend.engine_process.batching_sink import BatchingSink
    from tritonformer.backend.engine_process.client import EngineClient
    from tritonformer.backend.triton.glue import _STOP, TritonSink

    ours, theirs = Pipe()
    drained = []

    def drain():
        try:
            while True:
                drained.append(theirs.recv_bytes())
        except (EOFError, OSError):
            pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    sink = BatchingSink()
    sink.connect(0, ours)
    for rid in range(streams):
        sink.opened((0, rid))
    pieces = [outputs(tokens, final=(i % 16 == 15)) for i in range(streams)]  # a final now and then
    engine_s = []
    for _ in range(repeat):
        t = time.perf_counter()
        for rid, out in enumerate(pieces):
            sink.send((0, rid), out, None, False)
        sink.flush()
        engine_s.append(time.perf_counter() - t)
    time.sleep(0.2)
    message = next(b for b in reversed(drained) if pickle.loads(b)[0] == "out")  # as the stub receives it

    triton = TritonSink.__new__(TritonSink)  # its loop body, run here, without its thread
    triton.batch_axis = False

    client = EngineClient.__new__(EngineClient)
    client._lock, client._cancel_sent = threading.Lock(), set()
    handles = [Handle() for _ in range(streams)]
    stub_s = []
    for _ in range(repeat):
        pending = queue.SimpleQueue()
        triton._queues = [pending]  # one sender thread's queue
        client.sink, client._pending = triton, dict(enumerate(handles))
        t = time.perf_counter()
        _, (responses, arrays, _) = pickle.loads(message)
        client._deliver([(rid, out, err, False) for rid, out, err, _ in responses], arrays)  # (keep every stream open)
        pending.put(_STOP)
        triton._run(pending)
        stub_s.append(time.perf_counter() - t)
    ours.close()
    return {"streams": streams, "tokens": tokens, "bytes": len(message),
            "engine_us": 1e6 * float(np.median(engine_s)), "stub_us": 1e6 * float(np.median(stub_s))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="64,256")
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    print("| streams | tokens/response | batch bytes | engine us/batch | us/response | stub us/batch | us/response |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for streams in map(int, args.streams.split(",")):
        for tokens in map(int, args.tokens.split(",")):
            r = measure(streams, tokens, args.repeat)
            print(f"| {streams} | {tokens} | {r['bytes']:,} | {r['engine_us']:,.0f} | {r['engine_us'] / streams:.1f} | "
                  f"{r['stub_us']:,.0f} | {r['stub_us'] / streams:.1f} |")


if __name__ == "__main__":
    main()
