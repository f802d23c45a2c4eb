"""Open-loop Poisson load against a real tritonserver over HTTP: aiohttp + numpy.

The HTTP/1.1 and server-sent-events client is aiohttp's (one ``ClientSession`` and one
keep-alive connection pool per client process; aiohttp ships in the GPU machine's image, which
has neither tritonclient nor pip). It runs in its own process(es), never inside the server.

Why it is built this way (docs/peers.md §4.3 and §4.5):

* **Open loop.** Every arrival time is drawn in advance (Poisson: exponential gaps) and a
  request goes out at its time whatever the server is doing. A closed-loop client (N users each
  waiting for its answer before sending the next) slows down with the server and so hides
  overload.
* **Latency from the *scheduled* arrival**, not from the moment the request was written. If the
  client or the server falls behind, the request's wait before sending is charged too: no
  coordinated omission. The client's own delay (scheduled -> picked up: ``dispatch_lag``; plus
  waiting for a slot under ``max_in_flight``: ``send_lag``) is reported on its own, so a client
  that cannot keep up is visible rather than silently folded in.
* **The client must not be the bottleneck.** One event loop per process multiplexes up to
  ``max_in_flight`` keep-alive connections (``aiohttp.TCPConnector(limit=max_in_flight)``, 64
  of them opened before the clock starts); a separate dispatcher thread sleeps until each
  arrival (``time.sleep`` wakes within ~0.1 ms on Linux; asyncio's own timers round to 1 ms,
  which measured 0.8 ms median dispatch lag against 0.2-0.4 ms this way) and hands due requests
  to the loop; request bodies are JSON-encoded before the clock starts; several processes can
  split one schedule (``processes``). ``capacity`` measures the client's own ceiling against a
  trivial local server, and every result carries the client's CPU use.
* **What the library costs.** aiohttp spends about twice the CPU per request of the
  hand-written asyncio-streams client it replaced (ce4fa1b and earlier), so one process offers
  a lower rate. Measured on a shared 2-core VM (client and trivial server on the same 2 cores,
  other jobs keeping the load average at 5-7; 8-token unary requests, 5 s per rate, the two
  clients alternated at each rate): client CPU 270-360 us a request against 130-175 us; one
  process kept up (achieved/offered >= 0.95 with p99 <= 50 ms) to 1,500-2,500 req/s against
  2,500-3,500 for the old client (which still delivered >= 0.95 of 5,000-6,000, at p99 up to
  1 s). Above its rate a process falls behind, opens connections on the clock and collapses
  (dispatch lag in seconds: in the table and flagged on stderr). For higher rates give
  ``--processes``, about one per 1,500 req/s on such a machine (the served benchmarks run 2-4).

Python API:

* ``poisson_schedule(rate, seconds, seed, n=None)``: arrival offsets in seconds;
* ``run_embed_load(url, rate, seconds, ...)``: POST ``/v2/models/embedder/infer`` with
  pre-tokenized ``input_ids`` (exact lengths, drawn as client/traces.py's distributions) or
  ``text_input``; returns ``{"summary": ..., "records": [...]}``;
* ``run_rerank_load(url, rate, seconds, ...)``: POST ``/v2/models/reranker/infer``, one query
  and ``documents`` (32) texts per request, document token lengths drawn from the same
  distributions (``"truncate": true`` bounds the pairs); ``goodput(summaries, slo_ms)``: the
  best throughput whose p99 meets the SLO without errors;
* ``run_generate_load(url, trace, rate, seed)``: POST ``/v2/models/generator/generate_stream``
  per trace request (prompt ids or text, ``max_tokens``, ``ignore_eos``, greedy), reading the
  server-sent events as they arrive; TTFT, TPOT, output tok/s;
* ``measure_capacity(...)``: the embed load against ``trivial_server`` (no model behind it).

CLI (``python -m tritonformer.client.loadgen``)::

    embed    --url 127.0.0.1:8000 --rates 50,100 --seconds 5 --distribution mixed [--json out.json]
    generate --url 127.0.0.1:8000 --rate 2 --requests 8 --prompt-range 8,32 --output-range 4,8
    rerank   --url 127.0.0.1:8000 --rates 10,20 --documents 32 --distribution mixed --slo-ms 100
    embed --model hf_embedder --batch-dim ...; generate --model hf_generator --unary ...  # the stock set-ups
    capacity --rates 2000,4000,8000 --seconds 2            # the client's own ceiling

``generate`` sends the n-th point of a sweep (0, 1, ...) the seed's Orca trace with its prompts'
token ids shifted by n: every point the same lengths, none another point's prompts, which the
server's prefix cache would otherwise hand over already computed.

Each prints one Markdown table with a row per (rate, seed); ``--csv PREFIX`` writes the raw
per-request rows (§4.5 rule 7).
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import math
import multiprocessing
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

import aiohttp
import numpy as np
from yarl import URL  # aiohttp's URL type: paths parsed once, not per request

from tritonformer.client.traces import DISTRIBUTIONS, TraceRequest, lengths_for, orca_trace, shifted_prompts

__all__ = [
    "Record",
    "poisson_schedule",
    "embed_jobs",
    "generate_jobs",
    "unary_generate_jobs",
    "run_jobs",
    "run_embed_load",
    "rerank_jobs",
    "run_rerank_load",
    "goodput",
    "run_generate_load",
    "summarize_embed",
    "summarize_generate",
    "trivial_server",
    "measure_capacity",
    "main",
]

clock = time.perf_counter  # CLOCK_MONOTONIC on Linux: one clock for every process of the machine

INFER_PATH = "/v2/models/{model}/infer"
GENERATE_PATH = "/v2/models/{model}/generate_stream"


# ----------------------------------------------------------------------------- schedules


def poisson_schedule(rate: float, seconds: float | None = None, seed: int = 0, n: int | None = None) -> np.ndarray:
    """Arrival offsets (seconds from the start) of a Poisson process of ``rate`` per second.

    With ``n``: exactly n arrivals (the duration is random). Otherwise every arrival in
    [0, seconds) (the count is random, Poisson(rate * seconds)). The same (rate, seed) gives the
    same arrivals, so systems compared on one seed see the identical schedule."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng = np.random.default_rng(seed)
    if n is not None:
        return np.cumsum(rng.exponential(1.0 / rate, int(n)))
    if seconds is None:
        raise ValueError("give seconds or n")
    expected = rate * seconds
    block = int(expected + 6 * math.sqrt(expected) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate, block))
    while times[-1] < seconds:  # the 6-sigma block was short: draw more from the same stream
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / rate, block))])
    return times[times < seconds]


# ----------------------------------------------------------------------------- jobs and records


class Record:
    """What happened to one request; times are absolute ``clock()`` values."""

    __slots__ = ("index", "scheduled", "launched", "sent", "first", "last_token", "end", "status", "error",
                 "tokens", "events", "finish_reason", "input_tokens")

    def __init__(self, index: int, scheduled: float, input_tokens: int = 0):
        self.index = index
        self.scheduled = scheduled  # when the open-loop schedule says the request arrives
        self.launched = math.nan  # when the event loop picked it up
        self.sent = math.nan  # when its bytes were handed to the socket (after getting a connection)
        self.first = math.nan  # generator: first event carrying output tokens
        self.last_token = math.nan  # generator: last event carrying output tokens
        self.end = math.nan  # the whole response received
        self.status = 0  # HTTP status; 0: no response (connection error), -1: client timeout
        self.error: str | None = None
        self.tokens = 0  # generator: output tokens received
        self.events: list[tuple[float, int]] = []  # generator: (arrival time, tokens) per event with tokens
        self.finish_reason: str | None = None
        self.input_tokens = input_tokens

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state):
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


class Job:
    """One request, encoded before the clock starts: its path, its JSON body and how to read the answer."""

    __slots__ = ("index", "offset", "path", "data", "stream", "input_tokens", "unary_generate")

    def __init__(self, index: int, offset: float, path: str, data: bytes, stream: bool = False, input_tokens: int = 0,
                 unary_generate: bool = False):
        self.index, self.offset, self.path, self.data = index, offset, path, data
        self.stream, self.input_tokens = stream, input_tokens
        # A whole completion in one /infer answer: its output_ids are counted, all arriving at the end.
        self.unary_generate = unary_generate


def _base_url(url: str) -> str:
    """``host:port`` (or ``http://host:port/``) as ``http://host:port``."""
    url = url.rstrip("/")
    return url if "://" in url else f"http://{url}"


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def embed_jobs(url: str, offsets: np.ndarray, *, distribution: str = "mixed", lengths: Sequence[int] | None = None,
               texts: Sequence[str] | None = None, seed: int = 0, vocab_size: int = 30522, cls_id: int = 101,
               sep_id: int = 102, model: str = "embedder", batch_dim: bool = False) -> list[Job]:
    """One embedder request per arrival, encoded up front.

    Default: pre-tokenized ``input_ids`` of exact lengths (special tokens included: [CLS] random
    ids [SEP]) drawn from client/traces.py's distributions; tokenization is excluded, as §4.3
    says. Random ids make every sequence distinct, so the embedder's response cache never hits.
    ``texts`` instead sends ``text_input`` (request i gets texts[i % len(texts)]). ``batch_dim``:
    ``input_ids`` shaped ``[1, n]``, for a model behind Triton's batcher (client/stock_repository).
    (``url`` is unused: the jobs hold paths, run_jobs the server.)"""
    path = INFER_PATH.format(model=model)
    rng = np.random.default_rng((seed, 1))  # independent of the arrival stream of the same seed
    n = len(offsets)
    jobs = []
    if texts is not None:
        shape = [1, 1] if batch_dim else [1]
        for i in range(n):
            body = _dumps({"inputs": [{"name": "text_input", "shape": shape, "datatype": "BYTES",
                                       "data": [texts[i % len(texts)]]}]})
            jobs.append(Job(i, float(offsets[i]), path, body))
        return jobs
    if lengths is None:
        lengths = lengths_for(distribution, n, rng)
    for i in range(n):
        length = int(lengths[i % len(lengths)])
        ids = [cls_id, *rng.integers(1000, vocab_size, max(0, length - 2)).tolist(), sep_id][:length]
        shape = [1, len(ids)] if batch_dim else [len(ids)]
        body = _dumps({"inputs": [{"name": "input_ids", "shape": shape, "datatype": "INT32", "data": ids}]})
        jobs.append(Job(i, float(offsets[i]), path, body, input_tokens=len(ids)))
    return jobs


# Words that are one token in BERT's WordPiece and XLM-R's sentencepiece vocabularies alike, so a
# document of n words is about n tokens for either kind of reranker.
RERANK_WORDS = ("the", "of", "and", "in", "to", "water", "city", "music", "river", "house", "world", "time",
                "system", "school", "market", "energy", "history", "people", "country", "film")
RERANK_QUERY = "what is the history of the river city market"


def rerank_jobs(url: str, offsets: np.ndarray, *, distribution: str = "mixed", documents: int = 32, seed: int = 0,
                model: str = "reranker", batch_dim: bool = False, query: str = RERANK_QUERY) -> list[Job]:
    """One reranker request per arrival: `query` and `documents` texts whose lengths in words
    (about tokens) are drawn from client/traces.py's distributions, minus the pair's special
    tokens and the query; ``"truncate": true`` cuts any pair past the model's maximum. Random
    words make every pair distinct, so the response cache never hits. ``batch_dim``: inputs
    shaped ``[1, ...]`` for the stock model behind Triton's batcher."""
    path = INFER_PATH.format(model=model)
    rng = np.random.default_rng((seed, 2))
    n = len(offsets)
    query_words = len(query.split())
    lengths = lengths_for(distribution, n * documents, rng) - query_words - 4
    words = np.array(RERANK_WORDS)
    jobs = []
    for i in range(n):
        texts = [" ".join(words[rng.integers(0, len(words), max(1, int(k)))])
                 for k in lengths[i * documents : (i + 1) * documents]]
        body = _dumps({"parameters": {"truncate": True}, "inputs": [
            {"name": "query", "shape": [1, 1] if batch_dim else [1], "datatype": "BYTES", "data": [query]},
            {"name": "texts", "shape": [1, documents] if batch_dim else [documents], "datatype": "BYTES",
             "data": texts}]})
        tokens = int(sum(max(1, int(k)) + query_words + 4 for k in lengths[i * documents : (i + 1) * documents]))
        jobs.append(Job(i, float(offsets[i]), path, body, input_tokens=tokens))
    return jobs


def _trace_item(item) -> tuple[list[int] | None, str | None, int]:
    """(prompt ids, prompt text, max_tokens) of a TraceRequest or a dict."""
    if isinstance(item, TraceRequest) or hasattr(item, "prompt_ids"):
        return list(item.prompt_ids), None, int(item.max_new_tokens)
    ids = item.get("prompt_ids", item.get("input_ids"))
    text = item.get("text", item.get("prompt"))
    return (list(ids) if ids is not None else None), text, int(item.get("max_tokens", item.get("max_new_tokens")))


def generate_jobs(url: str, offsets: np.ndarray, trace: Sequence, model: str = "generator") -> list[Job]:
    """One /generate_stream request per trace entry: greedy, EOS ignored, so every system
    generates exactly max_tokens (§4.4)."""
    path = GENERATE_PATH.format(model=model)
    jobs = []
    for i, item in enumerate(trace):
        ids, text, max_tokens = _trace_item(item)
        params = json.dumps({"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0})
        body = {"input_ids": ids} if ids is not None else {"text_input": text}
        body["sampling_parameters"] = params
        jobs.append(Job(i, float(offsets[i]), path, _dumps(body), True, len(ids) if ids is not None else 0))
    return jobs


def unary_generate_jobs(url: str, offsets: np.ndarray, trace: Sequence, model: str = "hf_generator") -> list[Job]:
    """One ``/infer`` request per trace entry for a non-streaming generator behind Triton's
    batcher (client/stock_repository/hf_generator): ``input_ids [1, n]``, ``max_tokens [1, 1]``.
    Its tokens all arrive with the answer, so its time to first token is its whole latency."""
    path = INFER_PATH.format(model=model)
    jobs = []
    for i, item in enumerate(trace):
        ids, text, max_tokens = _trace_item(item)
        if ids is None:
            raise ValueError("the unary generator takes prompt ids, not text")
        body = {"inputs": [{"name": "input_ids", "shape": [1, len(ids)], "datatype": "INT32", "data": ids},
                           {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [max_tokens]}]}
        jobs.append(Job(i, float(offsets[i]), path, _dumps(body), False, len(ids), unary_generate=True))
    return jobs


def _count_unary_tokens(body: bytes, rec: "Record") -> None:
    """A whole completion's output ids, all received at the end."""
    outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
    rec.tokens = len(outputs["output_ids"]["data"])
    rec.first = rec.last_token = rec.end
    rec.events.append((rec.end, rec.tokens))
    rec.finish_reason = "length"  # the stock generator ignores EOS: every answer runs to max_tokens


# ----------------------------------------------------------------------------- the HTTP client (aiohttp)

# Sent as they are: no User-Agent, and no Accept-Encoding (Triton compresses an answer when asked,
# which would put gzip on both sides of the measurement). The session's own headers are merged
# into each request for free; per-request headers cost ~8 us, so only the streams carry one.
_SESSION_HEADERS = {"Content-Type": "application/json"}
_STREAM_HEADERS = {"Accept": "text/event-stream"}
_SKIP_HEADERS = ("User-Agent", "Accept-Encoding")
WARM_PATH = "/v2/health/live"  # prewarm: a request Triton answers without touching a model


class _Driver:
    """Runs one shard of jobs on this thread's event loop through one aiohttp session; a
    dispatcher thread releases each job at its scheduled time."""

    def __init__(self, base: str, jobs: Sequence[Job], max_in_flight: int, timeout: float, prewarm: int):
        self.base = base
        self.jobs = jobs
        self.records = [Record(j.index, math.nan, j.input_tokens) for j in jobs]
        self.max_in_flight = max_in_flight
        self.timeout = timeout
        self.prewarm = min(prewarm, max_in_flight, max(1, len(jobs)))
        self.session: aiohttp.ClientSession | None = None
        self.slots: asyncio.Semaphore | None = None
        self.urls = {path: URL(base + path) for path in {j.path for j in jobs}}  # parsed once
        self.closing = False
        self.pending: set[asyncio.Task] = set()
        self.remaining = len(jobs)
        self.done: asyncio.Event | None = None
        self.stop = threading.Event()

    async def setup(self) -> None:
        self.done = asyncio.Event()
        # The in-flight cap: above it, arrivals wait here (and are charged for it). The pool has as
        # many keep-alive connections, so a request past the cap never waits inside aiohttp too.
        self.slots = asyncio.Semaphore(self.max_in_flight)
        # No total timeout: the run's own deadline (timeout after the last arrival) cancels what is
        # left. No cookies, no decompression: nothing a benchmark request needs.
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_in_flight, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=None), headers=_SESSION_HEADERS, skip_auto_headers=_SKIP_HEADERS,
            auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())
        # Connections opened before the clock starts, so the first arrivals do not pay for TCP set-up
        # (run_jobs opens 64: a burst past the warm pool opens connections on the clock, ~1 ms each
        # with the server's side on a loaded 2-core VM, which 16 warm ones hit at 1,500 req/s).
        # A refused connection fails the run here, loudly; a server that accepts but never answers
        # keeps no warm connection and is found out by the run itself.
        warm = [asyncio.ensure_future(self._warm()) for _ in range(self.prewarm)]
        done, slow = await asyncio.wait(warm, timeout=min(self.timeout, 5.0))
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        for task in done:
            task.result()

    async def _warm(self) -> None:
        try:
            async with self.session.get(URL(self.base + WARM_PATH)) as resp:
                await resp.read()
        except aiohttp.ClientConnectorError as e:
            raise OSError(e.errno, f"cannot connect to {self.base}: {e.strerror}") from None  # picklable

    def _launch(self, batch: list[int]) -> None:
        if self.closing:  # handed over just as the run timed out
            for k in batch:
                self.records[k].status, self.records[k].error = -1, "not sent: the run timed out"
            return
        for k in batch:
            task = asyncio.ensure_future(self._one(k))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    def _dispatch(self, loop: asyncio.AbstractEventLoop, start: float) -> None:
        """Dispatcher thread: sleep until the next arrival, then hand every due job to the loop.
        The loop never waits for an answer before the next arrival: that is the open loop."""
        n, k = len(self.jobs), 0
        while k < n and not self.stop.is_set():
            now = clock()
            due = start + self.jobs[k].offset
            if due > now:
                time.sleep(min(due - now, 0.05))
                continue
            j = k
            while j < n and start + self.jobs[j].offset <= now:
                self.records[j].scheduled = start + self.jobs[j].offset
                j += 1
            loop.call_soon_threadsafe(self._launch, list(range(k, j)))
            k = j

    async def _one(self, k: int) -> None:
        job, rec = self.jobs[k], self.records[k]
        rec.launched = clock()
        acquired = False
        try:
            await self.slots.acquire()
            acquired = True
            # Sent: given its slot; a keep-alive connection is then taken at once (or one opened).
            # (aiohttp's on_request_headers_sent trace would stamp the write itself, at ~25-50 us
            # more per request: a fifth of the client's CPU.)
            rec.sent = clock()
            async with self.session.post(self.urls[job.path], data=job.data,
                                         headers=_STREAM_HEADERS if job.stream else None) as resp:
                rec.status = resp.status
                if job.stream and resp.status == 200:
                    await self._read_events(resp.content, rec)
                else:
                    body = await resp.read()
                    rec.end = clock()
                    if resp.status != 200:
                        rec.error = body[:300].decode(errors="replace")
                    elif job.unary_generate:
                        _count_unary_tokens(body, rec)
        except asyncio.CancelledError:
            rec.status, rec.error = -1, f"no complete answer within {self.timeout:g} s of the last arrival"
            raise
        except Exception as e:  # connection refused/reset, malformed answer: a failed request
            rec.end = clock() if math.isnan(rec.end) else rec.end
            rec.error = f"{type(e).__name__}: {e}"
            if rec.status == 200:
                rec.status = 0
        finally:
            if acquired:
                self.slots.release()
            self.remaining -= 1
            if self.remaining == 0:
                self.done.set()

    @staticmethod
    async def _read_events(content: aiohttp.StreamReader, rec: Record) -> None:
        """Server-sent events, timestamped as each piece of the body arrives: TTFT and inter-token
        times are what a streaming user sees."""
        buf = b""
        async for chunk in content.iter_any():
            now = clock()
            buf += chunk
            while (nl := buf.find(b"\n")) >= 0:
                line, buf = buf[:nl].strip(), buf[nl + 1:]
                if not line.startswith(b"data:"):
                    continue  # blank separator lines, comments
                event = json.loads(line[5:])
                if "error" in event:  # a later error arrives as an event; the status stays 200
                    rec.error = str(event["error"])
                ids = event.get("output_ids")
                count = 0 if ids is None else 1 if isinstance(ids, int) else len(ids)  # one id comes as a scalar
                if count:
                    if rec.tokens == 0:
                        rec.first = now
                    rec.last_token = now
                    rec.tokens += count
                    rec.events.append((now, count))
                if event.get("finish_reason") is not None:
                    rec.finish_reason = str(event["finish_reason"])
                    rec.end = now
        if math.isnan(rec.end):
            rec.end = clock()
            if rec.error is None:
                rec.error = "the event stream ended without a finish_reason"

    async def run(self, start: float) -> None:
        loop = asyncio.get_running_loop()
        dispatcher = threading.Thread(target=self._dispatch, args=(loop, start), daemon=True, name="loadgen-dispatch")
        dispatcher.start()
        last = start + (self.jobs[-1].offset if self.jobs else 0.0)
        # A request still unanswered `timeout` seconds after the last arrival is a failure.
        while not self.done.is_set() and self.jobs:
            left = last + self.timeout - clock()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self.done.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass
        self.stop.set()
        dispatcher.join()
        self.closing = True
        for task in list(self.pending):
            task.cancel()
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)
        for k, rec in enumerate(self.records):  # never dispatched (only when the run was cut short)
            if math.isnan(rec.scheduled):
                rec.scheduled = start + self.jobs[k].offset
                rec.status, rec.error = -1, "not sent: the run timed out"

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


def _run_shard(base, jobs, max_in_flight, timeout, prewarm, ready: Callable[[], float]) -> tuple[list[Record], float]:
    """Set up (session, warm connections), report ready and get the common start, run. Returns
    (records, cpu s)."""
    # (A shorter GIL switch interval, tried so that the dispatcher gets the GIL back sooner, made
    # the send lag's tail 40x worse at 5k req/s from GIL thrashing: the default stays.)
    loop = asyncio.new_event_loop()
    driver = _Driver(base, jobs, max_in_flight, timeout, prewarm)
    try:
        loop.run_until_complete(driver.setup())
        start = ready()
        cpu0 = time.process_time()
        loop.run_until_complete(driver.run(start))
        return driver.records, time.process_time() - cpu0
    finally:
        loop.run_until_complete(driver.close())
        loop.close()


def _child(conn, base, jobs, max_in_flight, timeout, prewarm) -> None:
    def ready() -> float:
        conn.send("ready")
        return conn.recv()

    try:
        records, cpu = _run_shard(base, jobs, max_in_flight, timeout, prewarm, ready)
        conn.send((records, cpu))
    except BaseException as e:  # report rather than leave the parent waiting
        conn.send(e)
        raise


def run_jobs(url: str, jobs: list[Job], *, max_in_flight: int = 1024, processes: int = 1, timeout: float = 120.0,
             prewarm: int = 64) -> tuple[list[Record], float, float]:
    """Send every job at start + job.offset. Returns (records in job order, start, client CPU
    seconds). ``processes`` > 1 deals the jobs round-robin to that many forked processes, each
    with its own loop, session, connections and ``max_in_flight // processes`` cap; they share
    one start time on the machine-wide monotonic clock."""
    base = _base_url(url)
    if processes <= 1:
        box = {}

        def ready() -> float:
            box["start"] = clock() + 0.02
            return box["start"]

        records, cpu = _run_shard(base, jobs, max_in_flight, timeout, prewarm, ready)
        return records, box["start"], cpu
    ctx = multiprocessing.get_context("fork")  # the jobs are inherited, not pickled
    per = max(1, max_in_flight // processes)
    shards = [jobs[p::processes] for p in range(processes)]
    pipes, procs = [], []
    try:
        for shard in shards:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_child, args=(child, base, shard, per, timeout, prewarm), daemon=True)
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        for pipe in pipes:
            msg = pipe.recv()
            if isinstance(msg, BaseException):
                raise msg
        start = clock() + 0.05
        for pipe in pipes:
            pipe.send(start)
        records: list[Record | None] = [None] * len(jobs)
        cpu = 0.0
        for p, pipe in enumerate(pipes):
            msg = pipe.recv()
            if isinstance(msg, BaseException):
                raise msg
            shard_records, shard_cpu = msg
            cpu += shard_cpu
            for k, rec in enumerate(shard_records):
                records[p + k * processes] = rec
        return records, start, cpu
    except BaseException:
        for proc in procs:  # the others may be waiting for a start that will not come
            proc.kill()
        raise
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


# ----------------------------------------------------------------------------- statistics


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def _common(records: list[Record], start: float, warmup: float, cpu: float) -> tuple[list[Record], dict]:
    measured = [r for r in records if r.scheduled - start >= warmup]
    # dispatch lag: scheduled -> picked up by the event loop, the client's own delay alone;
    # send lag adds waiting for a slot under max_in_flight (the connection pool is as large).
    dispatch = np.array([r.launched - r.scheduled for r in measured if not math.isnan(r.launched)]) * 1e3
    lag = np.array([r.sent - r.scheduled for r in measured if not math.isnan(r.sent)]) * 1e3
    ends = [r.end for r in records if not math.isnan(r.end)]
    wall = (max(ends) - start) if ends else math.nan
    span = (measured[-1].scheduled - measured[0].scheduled) if len(measured) > 1 else math.nan
    return measured, {
        "requests": len(measured),
        "arrival_rate": (len(measured) - 1) / span if span and span > 0 else math.nan,  # the realised λ
        "ok": sum(r.ok for r in measured),
        "overloaded_503": sum(r.status == 503 for r in measured),
        "timeouts": sum(r.status == -1 for r in measured),
        "errors": sum(not r.ok and r.status not in (503, -1) for r in measured),
        "first_error": next((f"{r.status}: {r.error}" for r in measured if not r.ok), None),
        "dispatch_lag_p50_ms": _pct(dispatch, 50),
        "dispatch_lag_p99_ms": _pct(dispatch, 99),
        "send_lag_p50_ms": _pct(lag, 50),
        "send_lag_p99_ms": _pct(lag, 99),
        "send_lag_max_ms": float(lag.max()) if len(lag) else math.nan,
        # Client CPU over the run as a share of one core (per process when sharded, it is the sum):
        # near 1.0 per process means the client, not the server, may be setting the pace.
        "client_cpu_cores": cpu / wall if wall and wall > 0 else math.nan,
    }


def summarize_embed(records: list[Record], start: float, rate: float, warmup: float = 0.0, cpu: float = 0.0) -> dict:
    """Throughput and latency (from the scheduled arrival, successful requests only; failures are
    counted beside them) of the requests scheduled after the warm-up."""
    measured, out = _common(records, start, warmup, cpu)
    ok = [r for r in measured if r.ok]
    lat = np.array([r.end - r.scheduled for r in ok]) * 1e3
    window = (max(r.end for r in ok) - min(r.scheduled for r in measured)) if ok else math.nan
    out = {"offered_rate": rate, **out,
           "throughput_rps": len(ok) / window if ok and window > 0 else 0.0,
           "tokens_per_s": sum(r.input_tokens for r in ok) / window if ok and window > 0 else 0.0,
           "latency_mean_ms": float(lat.mean()) if len(lat) else math.nan,
           "latency_p50_ms": _pct(lat, 50), "latency_p90_ms": _pct(lat, 90), "latency_p99_ms": _pct(lat, 99),
           "latency_p999_ms": _pct(lat, 99.9), "latency_max_ms": float(lat.max()) if len(lat) else math.nan}
    return out


def summarize_generate(records: list[Record], start: float, rate: float, warmup: float = 0.0, cpu: float = 0.0) -> dict:
    """§4.4's metrics from the client's side: TTFT = first event with output tokens minus the
    scheduled arrival; TPOT = (last token - first token) / (n - 1) per request (the last
    token's event, which is the end unless the final event carries no tokens); latency per
    output token = (end - scheduled) / n per request."""
    measured, out = _common(records, start, warmup, cpu)
    ok = [r for r in measured if r.ok]
    ttft = np.array([r.first - r.scheduled for r in ok if r.tokens]) * 1e3
    # Between tokens, so only where they came in two events or more (a unary answer has none).
    tpot = np.array([(r.last_token - r.first) / (r.tokens - 1) for r in ok if len(r.events) > 1]) * 1e3
    per_token = np.array([(r.end - r.scheduled) / r.tokens for r in ok if r.tokens]) * 1e3
    e2e = np.array([r.end - r.scheduled for r in ok]) * 1e3
    tokens = sum(r.tokens for r in ok)
    window = (max(r.end for r in ok) - min(r.scheduled for r in measured)) if ok else math.nan
    return {"offered_rate": rate, **out,
            "output_tokens": tokens,
            "output_tok_per_s": tokens / window if ok and window > 0 else 0.0,
            "requests_per_s": len(ok) / window if ok and window > 0 else 0.0,
            "ttft_p50_ms": _pct(ttft, 50), "ttft_p99_ms": _pct(ttft, 99),
            "tpot_p50_ms": _pct(tpot, 50), "tpot_p99_ms": _pct(tpot, 99),
            "latency_per_token_p50_ms": _pct(per_token, 50),
            "e2e_p50_ms": _pct(e2e, 50), "e2e_p99_ms": _pct(e2e, 99)}


# ----------------------------------------------------------------------------- the two loads


def run_embed_load(url: str, rate: float, seconds: float, *, distribution: str = "mixed",
                   lengths: Sequence[int] | None = None, texts: Sequence[str] | None = None, seed: int = 0,
                   vocab_size: int = 30522, max_in_flight: int = 1024, processes: int = 1, warmup: float = 0.0,
                   timeout: float = 120.0, model: str = "embedder", batch_dim: bool = False) -> dict:
    """Open-loop Poisson embedder load for ``warmup + seconds``; statistics over the arrivals after
    the warm-up. Returns {"summary": {...}, "records": [Record, ...], "start": clock value}."""
    offsets = poisson_schedule(rate, warmup + seconds, seed)
    jobs = embed_jobs(url, offsets, distribution=distribution, lengths=lengths, texts=texts, seed=seed,
                      vocab_size=vocab_size, model=model, batch_dim=batch_dim)
    records, start, cpu = run_jobs(url, jobs, max_in_flight=max_in_flight, processes=processes, timeout=timeout)
    summary = summarize_embed(records, start, rate, warmup, cpu)
    summary.update(seed=seed, seconds=seconds, distribution="texts" if texts is not None else distribution)
    return {"summary": summary, "records": records, "start": start}


def run_rerank_load(url: str, rate: float, seconds: float, *, distribution: str = "mixed", documents: int = 32,
                    seed: int = 0, max_in_flight: int = 1024, processes: int = 1, warmup: float = 0.0,
                    timeout: float = 120.0, model: str = "reranker", batch_dim: bool = False) -> dict:
    """Open-loop Poisson reranker load (rerank_jobs); returns like run_embed_load, with
    ``pairs_per_s`` (documents scored a second) in the summary."""
    offsets = poisson_schedule(rate, warmup + seconds, seed)
    jobs = rerank_jobs(url, offsets, distribution=distribution, documents=documents, seed=seed, model=model,
                       batch_dim=batch_dim)
    records, start, cpu = run_jobs(url, jobs, max_in_flight=max_in_flight, processes=processes, timeout=timeout)
    summary = summarize_embed(records, start, rate, warmup, cpu)
    summary.update(seed=seed, seconds=seconds, distribution=distribution, documents=documents,
                   pairs_per_s=summary["throughput_rps"] * documents)
    return {"summary": summary, "records": records, "start": start}


def goodput(summaries: Sequence[dict], slo_ms: float) -> dict | None:
    """The summary with the highest throughput among those whose p99 latency is within
    ``slo_ms`` and that answered every request (no 503s, errors or timeouts); None if none did."""
    good = [s for s in summaries if s["requests"] and s["ok"] == s["requests"] and s["latency_p99_ms"] <= slo_ms]
    return max(good, key=lambda s: s["throughput_rps"]) if good else None


def run_generate_load(url: str, trace: Sequence, rate: float, seed: int = 0, *, max_in_flight: int = 1024,
                      processes: int = 1, warmup: float = 0.0, timeout: float = 600.0, model: str = "generator",
                      unary: bool = False) -> dict:
    """Each trace request (TraceRequest or {"prompt_ids"|"text", "max_tokens"}) at its Poisson
    arrival (exactly len(trace) arrivals) over /generate_stream, or with ``unary`` one /infer
    each (unary_generate_jobs). Returns like run_embed_load."""
    offsets = poisson_schedule(rate, seed=seed, n=len(trace))
    make = unary_generate_jobs if unary else generate_jobs
    jobs = make(url, offsets, trace, model=model)
    records, start, cpu = run_jobs(url, jobs, max_in_flight=max_in_flight, processes=processes, timeout=timeout)
    summary = summarize_generate(records, start, rate, warmup, cpu)
    summary.update(seed=seed, expected_tokens=sum(_trace_item(t)[2] for t in trace))
    return {"summary": summary, "records": records, "start": start}


# ----------------------------------------------------------------------------- capacity


class _TrivialProtocol(asyncio.Protocol):
    """Answers each request at once: a fixed embedder-sized JSON body, or for /generate_stream
    ``max_tokens`` one-token events (chunked), like the real server's shapes but with no work.
    It stands in for the server while the client is measured, so it is a bare asyncio protocol
    (tens of microseconds a request) rather than a framework's server."""

    def __init__(self, embed_body: bytes):
        self.embed_body = embed_body
        self.buf = b""

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].lower()
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line[15:])
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            if head.split(b" ", 2)[1].endswith(b"generate_stream"):
                self._stream(body)
            else:
                self.transport.write(self.embed_body)

    def _stream(self, body: bytes) -> None:
        try:
            n = int(json.loads(json.loads(body)["sampling_parameters"])["max_tokens"])
        except Exception:
            n = 8
        out = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"]
        for i in range(n):
            fin = ', "finish_reason": "length"' if i == n - 1 else ""
            event = f'data: {{"model_name": "generator", "text_output": " x", "output_ids": {1000 + i}{fin}}}\n\n'.encode()
            out.append(b"%x\r\n%s\r\n" % (len(event), event))
        out.append(b"0\r\n\r\n")
        self.transport.write(b"".join(out))


def _serve_trivial(sock: socket.socket, hidden: int) -> None:
    floats = ",".join(f"{0.01 * ((i * 37) % 100 - 50):.6f}" for i in range(hidden))
    payload = (f'{{"model_name":"embedder","model_version":"1","outputs":[{{"name":"embedding","datatype":"FP32",'
               f'"shape":[1,{hidden}],"data":[{floats}]}}]}}').encode()
    response = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(lambda: _TrivialProtocol(response), sock=sock))
    try:
        loop.run_forever()
    finally:
        server.close()


class trivial_server:
    """A context manager: a do-nothing HTTP server in ``processes`` forked processes (sharing one
    listening socket) on 127.0.0.1; ``.url`` is host:port. It answers with the real payload sizes
    (``hidden`` floats per embedding) so the client's read and parse costs are the real ones."""

    def __init__(self, processes: int = 1, hidden: int = 384):
        self.processes, self.hidden = processes, hidden
        self.procs: list = []

    def __enter__(self) -> trivial_server:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(4096)
        sock.setblocking(False)
        self.url = f"127.0.0.1:{sock.getsockname()[1]}"
        ctx = multiprocessing.get_context("fork")
        for _ in range(self.processes):
            proc = ctx.Process(target=_serve_trivial, args=(sock, self.hidden), daemon=True)
            proc.start()
            self.procs.append(proc)
        sock.close()  # the children hold it
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join(timeout=5)


def measure_capacity(rates: Sequence[float], seconds: float = 2.0, processes: int = 1, server_processes: int = 1,
                     distribution: str = "mixed", max_in_flight: int = 1024) -> list[dict]:
    """The embed load against trivial_server at each rate. The client keeps up while throughput
    ≈ offered and send lag stays sub-millisecond; where it stops, that is its own ceiling (or
    the trivial server's: compare client_cpu_cores with the processes given)."""
    rows = []
    with trivial_server(server_processes) as server:
        for rate in rates:
            rows.append(run_embed_load(server.url, rate, seconds, distribution=distribution, processes=processes,
                                       max_in_flight=max_in_flight, timeout=30)["summary"])
    return rows


# ----------------------------------------------------------------------------- CLI


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    return int(lo), int(hi or lo)


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


EMBED_COLUMNS = [("offered req/s", "offered_rate", 0), ("seed", "seed", 0), ("requests", "requests", 0),
                 ("arrivals/s", "arrival_rate", 0), ("ok", "ok", 0), ("503", "overloaded_503", 0),
                 ("errors", "errors", 0), ("timeouts", "timeouts", 0), ("throughput req/s", "throughput_rps", 0),
                 ("tokens/s", "tokens_per_s", 0), ("p50 ms", "latency_p50_ms", 2), ("p90 ms", "latency_p90_ms", 2),
                 ("p99 ms", "latency_p99_ms", 2), ("dispatch lag p99 ms", "dispatch_lag_p99_ms", 2),
                 ("client CPU cores", "client_cpu_cores", 2)]
RERANK_COLUMNS = [c for c in EMBED_COLUMNS if c[1] != "tokens_per_s"]
RERANK_COLUMNS.insert(RERANK_COLUMNS.index(("throughput req/s", "throughput_rps", 0)) + 1, ("pairs/s", "pairs_per_s", 0))
GENERATE_COLUMNS = [("offered req/s", "offered_rate", 2), ("seed", "seed", 0), ("requests", "requests", 0),
                    ("ok", "ok", 0), ("503", "overloaded_503", 0), ("errors", "errors", 0),
                    ("output tokens", "output_tokens", 0), ("output tok/s", "output_tok_per_s", 1),
                    ("TTFT p50 ms", "ttft_p50_ms", 1), ("TTFT p99 ms", "ttft_p99_ms", 1),
                    ("TPOT p50 ms", "tpot_p50_ms", 2), ("TPOT p99 ms", "tpot_p99_ms", 2),
                    ("latency/token p50 ms", "latency_per_token_p50_ms", 2),
                    ("dispatch lag p99 ms", "dispatch_lag_p99_ms", 2)]


CLIENT_LAG_WARN_MS = 2.0


def _table_head(columns) -> str:
    names = [c[0] for c in columns]
    return "| " + " | ".join(names) + " |\n|" + "|".join("---:" for _ in names) + "|"


def _table_row(columns, summary: dict) -> str:
    return "| " + " | ".join(_fmt(summary.get(key), d) for _, key, d in columns) + " |"


def _write_csv(path: str, result: dict) -> None:
    start = result["start"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "scheduled_s", "sent_s", "first_token_s", "end_s", "status", "input_tokens",
                    "output_tokens", "latency_ms", "ttft_ms", "finish_reason", "error"])
        for r in result["records"]:
            w.writerow([r.index, f"{r.scheduled - start:.6f}", f"{r.sent - start:.6f}", f"{r.first - start:.6f}",
                        f"{r.end - start:.6f}", r.status, r.input_tokens, r.tokens, f"{(r.end - r.scheduled) * 1e3:.3f}",
                        f"{(r.first - r.scheduled) * 1e3:.3f}", r.finish_reason or "", r.error or ""])


def _json_safe(summary: dict) -> dict:
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in summary.items()}


def _report(kind: str, columns, results: list[dict], args, header: str) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kind": kind, "url": getattr(args, "url", None), "header": header,
                       "results": [_json_safe(r["summary"]) for r in results]}, f, indent=1)
    if args.csv:
        for r in results:
            s = r["summary"]
            _write_csv(f"{args.csv}-{kind}-{s['offered_rate']:g}-seed{s['seed']}.csv", r)


def _sweep(kind: str, columns, header: str, points, run_point, args) -> int:
    print(header)
    print()
    print(_table_head(columns), flush=True)
    results = []
    failed = False
    for rate, seed in points:
        result = run_point(rate, seed)
        results.append(result)
        s = result["summary"]
        print(_table_row(columns, s), flush=True)
        if s["dispatch_lag_p99_ms"] > CLIENT_LAG_WARN_MS:
            # Either the client is CPU-bound (client CPU near 1 core per process: add --processes)
            # or the machine is oversubscribed (e.g. a CPU server on the same cores).
            print(f"<!-- rate {rate:g} seed {seed}: requests left the client late (dispatch lag p99 "
                  f"{s['dispatch_lag_p99_ms']:.1f} ms, client CPU {s['client_cpu_cores']:.2f} cores over "
                  f"{args.processes} process(es)); latencies include that delay. Near 1 core per process: add "
                  f"--processes; otherwise the machine's cores are busy elsewhere -->", file=sys.stderr)
        if s["first_error"]:
            failed = failed or s["ok"] == 0
            print(f"<!-- rate {rate:g} seed {seed}: first failure {s['first_error'][:300]} -->", file=sys.stderr)
    _report(kind, columns, results, args, header)
    return 1 if failed else 0


def main(argv: list[str] | None = None, prog: str = "python -m tritonformer.client.loadgen") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, default_url=True):
        if default_url:
            p.add_argument("--url", default=f"127.0.0.1:{os.environ.get('TRITONFORMER_HTTP_PORT', '8000')}",
                           help="host:port of the server's HTTP endpoint")
        p.add_argument("--seeds", default="0", help="comma-separated; one row per (rate, seed)")
        p.add_argument("--processes", type=int, default=1, help="client processes sharing the schedule")
        p.add_argument("--max-in-flight", type=int, default=1024, help="open connections at most (all processes)")
        p.add_argument("--warmup", type=float, default=0.0, help="seconds of arrivals sent but not measured")
        p.add_argument("--json", help="write the summaries here")
        p.add_argument("--csv", help="write raw per-request rows to PREFIX-KIND-RATE-seedS.csv")

    e = sub.add_parser("embed", help="embedder: Poisson arrivals of pre-tokenized sequences")
    common(e)
    e.add_argument("--rates", default="50,100", help="offered req/s, comma-separated")
    e.add_argument("--seconds", type=float, default=5.0, help="measured seconds of arrivals per point")
    e.add_argument("--distribution", default="mixed", choices=DISTRIBUTIONS,
                   help="token lengths (special tokens included), as bench serve-encoder")
    e.add_argument("--vocab-size", type=int, default=30522, help="random ids are drawn from [1000, this)")
    e.add_argument("--model", default="embedder")
    e.add_argument("--batch-dim", action="store_true",
                   help="input_ids shaped [1, n]: a model behind Triton's batcher (client/stock_repository)")
    e.add_argument("--timeout", type=float, default=120.0, help="seconds after the last arrival before giving up")

    g = sub.add_parser("generate", help="generator: Poisson arrivals over /generate_stream")
    common(g)
    g.add_argument("--rate", "--rates", dest="rates", default="2", help="offered req/s, comma-separated")
    g.add_argument("--requests", type=int, default=64, help="requests per point")
    g.add_argument("--prompt-range", default="32,512", help="prompt tokens, uniform inclusive lo,hi")
    g.add_argument("--output-range", default="1,128", help="max_tokens, uniform inclusive lo,hi (EOS ignored)")
    g.add_argument("--vocab-size", type=int, default=49152, help="prompt ids from [0, this) (SmolLM2: 49152)")
    g.add_argument("--model", default="generator")
    g.add_argument("--unary", action="store_true",
                   help="one /infer per request, whole answers (client/stock_repository/hf_generator)")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds after the last arrival before giving up")

    r = sub.add_parser("rerank", help="reranker: Poisson arrivals of one query x N documents")
    common(r)
    r.add_argument("--rates", default="10,20", help="offered req/s, comma-separated")
    r.add_argument("--seconds", type=float, default=5.0, help="measured seconds of arrivals per point")
    r.add_argument("--documents", type=int, default=32, help="texts per request")
    r.add_argument("--distribution", default="mixed", choices=DISTRIBUTIONS,
                   help="pair lengths in tokens (about), as bench serve-encoder")
    r.add_argument("--slo-ms", type=float, default=100.0, help="goodput: the best throughput with p99 within this")
    r.add_argument("--model", default="reranker")
    r.add_argument("--batch-dim", action="store_true",
                   help="inputs shaped [1, ...]: a model behind Triton's batcher (client/stock_repository)")
    r.add_argument("--timeout", type=float, default=120.0, help="seconds after the last arrival before giving up")

    c = sub.add_parser("capacity", help="the client's own ceiling against a trivial local HTTP server")
    common(c, default_url=False)
    c.add_argument("--rates", default="1000,2000,4000,8000")
    c.add_argument("--seconds", type=float, default=2.0)
    c.add_argument("--distribution", default="mixed", choices=DISTRIBUTIONS)
    c.add_argument("--server-processes", type=int, default=1)

    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    points = [(rate, seed) for rate in _floats(args.rates) for seed in seeds]
    clientside = f"{args.processes} client process(es), at most {args.max_in_flight} in flight"

    if args.command == "embed":
        header = (f"embedder at {args.url}: open-loop Poisson, {args.seconds:g} s measured after {args.warmup:g} s "
                  f"warm-up, {args.distribution} lengths (pre-tokenized input_ids), latency from the scheduled "
                  f"arrival (successful requests; failures counted beside), {clientside}")
        return _sweep("embed", EMBED_COLUMNS, header, points, lambda rate, seed: run_embed_load(
            args.url, rate, args.seconds, distribution=args.distribution, seed=seed, vocab_size=args.vocab_size,
            max_in_flight=args.max_in_flight, processes=args.processes, warmup=args.warmup, timeout=args.timeout,
            model=args.model, batch_dim=args.batch_dim), args)
    if args.command == "generate":
        prompt_range, output_range = _range(args.prompt_range), _range(args.output_range)
        header = (f"generator at {args.url}: open-loop Poisson, {args.requests} requests per point, prompt "
                  f"U{list(prompt_range)} output U{list(output_range)} tokens (input_ids, greedy, EOS ignored), "
                  f"times from the scheduled arrival, {clientside}")

        points_run = itertools.count()

        def point(rate, seed):
            # The n-th point on one server shifts its prompts' token ids by n: the same lengths
            # and arrivals, but none of the earlier points' prompts, which the server's prefix
            # cache would hand over already computed.
            trace = shifted_prompts(orca_trace(args.requests, seed, prompt_range, output_range, args.vocab_size),
                                    next(points_run), args.vocab_size)
            return run_generate_load(args.url, trace, rate, seed, max_in_flight=args.max_in_flight,
                                     processes=args.processes, warmup=args.warmup, timeout=args.timeout,
                                     model=args.model, unary=args.unary)

        return _sweep("generate", GENERATE_COLUMNS, header, points, point, args)
    if args.command == "rerank":
        header = (f"{args.model} at {args.url}: open-loop Poisson, 1 query x {args.documents} documents per request, "
                  f"{args.distribution} pair lengths, {args.seconds:g} s measured after {args.warmup:g} s warm-up, "
                  f"latency from the scheduled arrival, {clientside}")
        summaries = []

        def rerank_point(rate, seed):
            result = run_rerank_load(args.url, rate, args.seconds, distribution=args.distribution,
                                     documents=args.documents, seed=seed, max_in_flight=args.max_in_flight,
                                     processes=args.processes, warmup=args.warmup, timeout=args.timeout,
                                     model=args.model, batch_dim=args.batch_dim)
            summaries.append(result["summary"])
            return result

        code = _sweep("rerank", RERANK_COLUMNS, header, points, rerank_point, args)
        best = goodput(summaries, args.slo_ms)
        print(f"\ngoodput at p99 <= {args.slo_ms:g} ms: " + (
            f"{best['throughput_rps']:.1f} req/s ({best['pairs_per_s']:.0f} pairs/s, offered {best['offered_rate']:g}, "
            f"p99 {best['latency_p99_ms']:.1f} ms)" if best else "none of the rates met it"), flush=True)
        return code
    with trivial_server(args.server_processes) as server:
        header = (f"client capacity: embed load against a trivial local HTTP server ({args.server_processes} "
                  f"process(es)), {args.seconds:g} s per rate, {os.cpu_count()} CPUs, {clientside}")
        return _sweep("capacity", EMBED_COLUMNS, header, points, lambda rate, seed: run_embed_load(
            server.url, rate, args.seconds, distribution=args.distribution, seed=seed, processes=args.processes,
            max_in_flight=args.max_in_flight, warmup=args.warmup, timeout=30), args)


if __name__ == "__main__":
    sys.exit(main())
