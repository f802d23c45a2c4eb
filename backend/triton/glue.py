"""Everything that touches Triton's Python-backend API (`triton_python_backend_utils`).

The engines know nothing of Triton: they answer through a `ResponseSink`. `TritonSink` is the
real one. Every `send()` is an IPC round trip to the server (~0.1-0.5 ms), so responses leave
from sender threads of their own and the engine thread goes back to the GPU at once.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonformer.backend.device import DTYPE_CHOICES, pick_device, pick_dtype
from tritonformer.backend.engine_loop import EngineFailed, Overloaded, RequestCancelled, RequestTimedOut, ShuttingDown
from tritonformer.backend.triton.params import ModelParameters
from tritonformer.backend.responses import coalesce, first_pieces_first
from tritonformer.backend.errors import InvalidRequest, ModelNotConfigured
from tritonformer.backend.checkpoints.weights import load_state_dict

_STOP = object()


def error_code(error: Exception) -> int:
    if isinstance(error, InvalidRequest):
        return pb_utils.TritonError.INVALID_ARG
    if isinstance(error, (Overloaded, ShuttingDown, RequestTimedOut, ModelNotConfigured, EngineFailed)):
        return pb_utils.TritonError.UNAVAILABLE  # HTTP 503 / gRPC UNAVAILABLE: retry later
    if isinstance(error, RequestCancelled):
        return pb_utils.TritonError.CANCELLED
    return pb_utils.TritonError.INTERNAL


def make_response(outputs: dict[str, np.ndarray] | None, error: Exception | None, batch_axis: bool = False):
    """`batch_axis`: the model runs behind Triton's batcher (max_batch_size > 0), so every output
    carries the request's batch dimension, 1, in front."""
    if error is not None:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), error_code(error)))
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(k, v[None] if batch_axis else v) for k, v in outputs.items()]
    )


def uses_triton_batching(args: dict) -> bool:
    """Whether config.pbtxt puts the model behind Triton's batcher (max_batch_size > 0): then
    each execute() may carry many requests, and every tensor has a leading batch dimension."""
    return int(json.loads(args["model_config"]).get("max_batch_size", 0)) > 0


def one_item_batches(request, names: tuple[str, ...]) -> None:
    """Behind Triton's batcher a request holds one item: inputs shaped [1, ...]."""
    for name in names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None and (not tensor.shape() or tensor.shape()[0] != 1):
            raise InvalidRequest(
                f"{name} has shape {list(tensor.shape())}: with Triton batching a request holds one item, "
                f"shaped [1, ...] (send several items as several requests, or several texts in one text_input)"
            )


class TritonSink:
    """A ResponseSink whose handles are `InferenceResponseSender`s. Each `send()` to Triton is a
    synchronous IPC round trip that releases the GIL while it waits, and tritonserver takes a
    stub's responses on a pool of threads: `threads` sender threads keep that many round trips in
    flight. A request's responses always leave from the same thread (chosen by its handle), so
    a stream keeps its order; when a thread falls behind the engine, a stream's pending pieces
    are coalesced into one response. `batch_axis`: see make_response."""

    def __init__(self, name: str, batch_axis: bool = False, threads: int = 1):
        if threads < 1:
            raise ValueError(f"a sink needs at least one sender thread, got {threads}")
        self.batch_axis = batch_axis
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(threads)]
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"{name}-sender-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def send(self, handle, outputs, error, final) -> None:
        # id() is an address, aligned and often evenly spaced: the tuple's hash mixes its bits.
        self._queues[hash((id(handle),)) % len(self._queues)].put((handle, outputs, error, final))

    def is_cancelled(self, handle) -> bool:
        """An IPC round trip. Never call it once the handle's final response may have been
        handed to send(): Triton frees the request's response factory with the final, and the
        poll then reads freed memory in tritonserver (it dies with SIGSEGV)."""
        return handle.is_cancelled()

    def close(self, timeout: float = 10.0) -> None:
        for q in self._queues:
            q.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, pending: queue.SimpleQueue) -> None:
        started: set[int] = set()  # requests with a response sent (see first_pieces_first)
        while True:
            items = [pending.get()]
            while not pending.empty():  # whatever piled up while we were sending
                items.append(pending.get_nowait())
            stop = _STOP in items
            batch = first_pieces_first(coalesce([i for i in items if i is not _STOP]), started)
            for handle, outputs, error, final in batch:
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
                try:
                    handle.send(make_response(outputs, error, self.batch_axis), flags=flags)
                except Exception as e:  # e.g. the client went away; nothing else to do for it
                    logging.getLogger("tritonformer").warning("could not send a response: %s", e)
            if stop:
                return


def reject(sender, error: Exception) -> None:
    """Answer a request that never reaches the queue, directly from execute()."""
    sender.send(make_response(None, error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def input_array(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def request_parameters(request) -> dict:
    try:
        return json.loads(request.parameters() or "{}")
    except json.JSONDecodeError:
        return {}


def bool_parameter(params: dict, key: str, default: bool) -> bool:
    value = params.get(key, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise InvalidRequest(f"request parameter {key} must be true or false, got {value!r}")
    return value


class TritonLogHandler(logging.Handler):
    """Route our `logging` records into the server log."""

    def emit(self, record: logging.LogRecord) -> None:
        msg = self.format(record)
        if record.levelno >= logging.ERROR:
            pb_utils.Logger.log_error(msg)
        elif record.levelno >= logging.WARNING:
            pb_utils.Logger.log_warn(msg)
        else:
            pb_utils.Logger.log_info(msg)


def setup_logging() -> None:
    logger = logging.getLogger("tritonformer")
    if not any(isinstance(h, TritonLogHandler) for h in logger.handlers):
        logger.addHandler(TritonLogHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False


def load_settings(args: dict, known: dict[str, str], default_checkpoint, checkpoint_names=()):
    """The start of every model's initialize(): logging, config parameters, and where and in
    which precision to run. Returns (parameters, checkpoint folder, device, dtype).
    The parameter `checkpoint` is a folder, empty for default_checkpoint(), or one of
    `checkpoint_names` for default_checkpoint(name)."""
    setup_logging()
    params = ModelParameters.from_args(args, known)
    value = params.str("checkpoint")
    if value in checkpoint_names:
        checkpoint = default_checkpoint(value)
    else:
        checkpoint = Path(value) if value else default_checkpoint()
    device = pick_device(params.choice("device", ("auto", "cpu", "cuda")), int(args.get("model_instance_device_id", 0)))
    dtype = pick_dtype(params.choice("dtype", DTYPE_CHOICES), device)
    return params, checkpoint, device, dtype


def checkpoint_weights(params: ModelParameters, checkpoint: Path) -> dict:
    """The checkpoint's tensors, pickle weights only with the explicit opt-in."""
    allow = params.choice("allow_pickle_checkpoint", ("true", "false")) == "true"
    return load_state_dict(checkpoint, allow_pickle=allow)
