"""Calling the server the way users do (raw HTTP JSON, gRPC streaming), its metrics, and the
engine processes its stubs started."""
from __future__ import annotations

import contextlib


def http_post(server, path: str, body: dict, timeout: float = 120.0) -> tuple[int, dict | str]:
    """POST JSON to the server's HTTP endpoint; (status, parsed JSON or raw text)."""
    return post_json(f"http://{server.http_url}{path}", body, timeout=timeout)


def post_json(url: str, body: dict, headers: dict | None = None, timeout: float = 120.0) -> tuple[int, dict | str]:
    """POST JSON to `url` (the server's HTTP endpoint, the OpenAI routes); (status, parsed JSON
    or raw text), an HTTP error's status and body too."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read().decode()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def grpc_stream(server, model: str, inputs: dict, timeout: float = 120.0,
                until_final: bool = False) -> tuple[list, str | None]:
    """Send one request over gRPC streaming with raw numpy inputs {name: (array, triton_dtype)}.
    Returns (results until the one carrying finish_reason, error message or None). With
    `until_final`, as Triton's OpenAI frontend reads a stream: every result with outputs up to
    the response flagged final (an empty final response asked for)."""
    import queue

    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    tensors = []
    for name, (array, dtype) in inputs.items():
        t = grpcclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        tensors.append(t)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = []
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(model, tensors, enable_empty_final_response=until_final)
        while True:
            result, error = responses.get(timeout=timeout)
            if error is not None:
                return results, str(error)
            if until_final:
                if result.as_numpy("text_output") is not None:
                    results.append(result)
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return results, None
                continue
            results.append(result)
            if result.as_numpy("finish_reason") is not None:
                return results, None
    finally:
        client.stop_stream()
        client.close()


def scrape_metrics(server, model: str, prefix: str = "tritonformer_") -> dict[str, float]:
    """Metrics named `prefix*` for `model` from the server's metrics port: ours by default,
    Triton's own with e.g. "nv_inference_" (histograms as _count/_sum; buckets left out)."""
    import re
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        m = re.match(rf'^({prefix}\w+)\{{([^}}]*model="{model}"[^}}]*)\}} ([0-9.e+-]+)$', line)
        if m and 'le="' not in m.group(2):
            values[m.group(1)] = float(m.group(3))
    return values


def wait_for_metrics(server, model: str, predicate, prefix: str = "tritonformer_", timeout: float = 10.0,
                     interval: float = 0.1) -> tuple[bool, dict[str, float]]:
    """Scrape until predicate(values) holds or `timeout` seconds pass: (whether it held, the
    last values). Metrics trail the answers: ours go through the metrics thread's queue, and
    Triton counts a request as a success after its response has gone out."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        values = scrape_metrics(server, model, prefix)
        if predicate(values):
            return True, values
        if time.monotonic() > deadline:
            return False, values
        time.sleep(interval)


def exit_code(process, timeout: float) -> int | None:
    """A multiprocessing child's exit code, waiting up to `timeout` s for it. Not process.join:
    an EngineClient's receiver polls is_alive(), and when its waitpid reaps the child first, a
    join in another thread returns with exitcode still None."""
    import time

    deadline = time.monotonic() + timeout
    while process.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process.exitcode


def engine_processes(server, model: str) -> list[int]:
    """Pids of the processes spawned by `model`'s Python-backend stubs (its engine process) under
    `server` (another server on the host may serve a model of the same name)."""
    from tritonformer.backend.spawn import process_table, spawned_by, stub_pids

    table = process_table()

    def under_server(pid: int) -> bool:
        while pid > 1 and pid in table:
            if pid == server.process.pid:
                return True
            pid = table[pid][0]
        return False

    return spawned_by({pid for pid in stub_pids(model, table) if under_server(pid)}, table)


@contextlib.contextmanager
def serving(repository, models: list[str], timeout: float = 600):
    """A real tritonserver on free ports serving `repository`, ready for `models`; stopped after."""
    from tritonformer.client.server import TritonServer, free_ports

    http_port, grpc_port, metrics_port = free_ports(3)
    with TritonServer(repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port) as server:
        server.wait_ready(models, timeout=timeout)
        yield server
