"""Locust load tests for the served `embedder` and `generator` (see docs/load-testing.md).

    locust -f client/locustfile.py --headless -u 8 -r 2 --run-time 2m --tags embed \
        --host http://127.0.0.1:8000 --csv reports/embed --html reports/embed.html

One user class per scenario; pick scenarios with --tags (or by naming user classes):

    tag            user class          what it does
    embed-http     EmbedHttpUser       embedder, HTTP /infer (JSON in, binary embedding out)
    embed-grpc     EmbedGrpcUser       embedder, gRPC ModelInfer (tritonclient.grpc)
    generate-grpc  GenerateGrpcUser    generator, gRPC streaming (tritonclient.grpc)
    generate-http  GenerateHttpUser    generator, HTTP /generate_stream (server-sent events)
    rerank-http    RerankHttpUser      reranker, HTTP /infer: one query x TRITONFORMER_LOAD_DOCUMENTS texts
                                       (needs a reranker checkpoint, README "The reranker and classifier")
    openai-chat    OpenAIChatUser      generator, the OpenAI route /v1/chat/completions (streamed) on
                                       port $TRITONFORMER_OPENAI_PORT (9000) of --host's machine
    embed / generate / http / grpc     the groups of the four embedder and generator users (the
                                       reranker is in none: it ships without a checkpoint; the
                                       OpenAI user is in group `openai`: `tritonformer serve` only)

Every generation reports three entries under the same name: TTFT (time to the first token),
TPOT (time per output token after the first) and stream (the whole request; its "size"
column is the number of output tokens). Failures carry the server's own error message.

Host and ports: --host gives the HTTP base URL (default http://127.0.0.1:$TRITONFORMER_HTTP_PORT,
8000); gRPC goes to the same host on $TRITONFORMER_GRPC_PORT (8001), as the CLI does.
Load shape (environment variables):
    TRITONFORMER_LOAD_MAX_TOKENS        max_tokens per generation (16)
    TRITONFORMER_LOAD_LONG_SHARE        share of long passages among texts and prompts (0.3)
    TRITONFORMER_LOAD_TEXTS_PER_REQUEST embedder texts per request, uniform in 1..N (1)
    TRITONFORMER_LOAD_DOCUMENTS         reranker texts per request (32)
    TRITONFORMER_LOAD_WAIT              think time per user, uniform in 0..W seconds (1.0; 0 = none)
    TRITONFORMER_LOAD_TIMEOUT           seconds before a request counts as failed (120)
Bound a run with --run-time, or with --iterations N (added here: Locust 2.47 itself has none).
"""
from __future__ import annotations

import json
import logging
import os
import queue
import random
import time
import uuid
from urllib.parse import urlsplit

import gevent
import numpy as np
from locust import FastHttpUser, User, between, constant, events, tag, task
from locust.stats import CSV_STATS_INTERVAL_SEC

# Locust has monkey-patched the standard library for gevent by now, but grpcio's C core runs
# its own threads: without this (before any channel exists) a blocking gRPC call, notably a
# stream waiting for its next response, stalls every simulated user in the process.
import grpc.experimental.gevent as grpc_gevent  # noqa: E402  (must follow `import locust`)

grpc_gevent.init_gevent()

import tritonclient.grpc as grpcclient  # noqa: E402
from geventhttpclient import HTTPClient  # noqa: E402


def _env(name: str, default: str) -> str:
    return os.environ.get(name, "") or default


HTTP_PORT = int(_env("TRITONFORMER_HTTP_PORT", "8000"))
GRPC_PORT = int(_env("TRITONFORMER_GRPC_PORT", "8001"))
OPENAI_PORT = int(_env("TRITONFORMER_OPENAI_PORT", "9000"))
MAX_TOKENS = int(_env("TRITONFORMER_LOAD_MAX_TOKENS", "16"))
LONG_SHARE = float(_env("TRITONFORMER_LOAD_LONG_SHARE", "0.3"))
TEXTS_PER_REQUEST = int(_env("TRITONFORMER_LOAD_TEXTS_PER_REQUEST", "1"))
DOCUMENTS = int(_env("TRITONFORMER_LOAD_DOCUMENTS", "32"))
WAIT = float(_env("TRITONFORMER_LOAD_WAIT", "1.0"))
TIMEOUT = float(_env("TRITONFORMER_LOAD_TIMEOUT", "120"))


# ---------------------------------------------------------------- what the simulated users send

# Short texts: search queries and chat questions (a handful of tokens each).
QUERIES = [
    "What is the capital of France?",
    "how do vaccines work",
    "best way to learn Python",
    "Why is the sky blue?",
    "symptoms of dehydration",
    "How far is the Moon from the Earth?",
    "cheap flights to Lisbon in May",
    "What does a transformer model do?",
    "recipe for banana bread without eggs",
    "Who wrote Pride and Prejudice?",
    "difference between TCP and UDP",
    "How many legs does a spider have?",
    "Explain photosynthesis in one sentence.",
    "what time zone is Tokyo in",
]

# Sentences that make up long passages (documents being indexed, texts to summarise).
SENTENCES = [
    "The river had carved the valley over thousands of years, leaving terraces of gravel on either side.",
    "Farmers in the region grow wheat and barley on the higher fields and keep orchards near the water.",
    "In the nineteenth century a railway line was built along the eastern bank to carry coal to the coast.",
    "The line closed in 1962, and its embankment is now a footpath used by walkers and cyclists.",
    "Researchers measured the water quality every month and found that nitrate levels had fallen since 2005.",
    "Most of the improvement came from changes in how fertiliser was applied in spring.",
    "The town hall, rebuilt after a fire in 1887, still houses the council and a small local museum.",
    "Its collection includes tools, photographs and letters written by emigrants who left for Canada.",
    "A transformer encoder reads the whole input at once and builds a representation of every token.",
    "Attention lets each position weigh every other position when it computes its new value.",
    "Batching requests of different lengths together wastes work unless the padding is removed.",
    "Serving systems therefore sort or pack requests so that the hardware spends its time on real tokens.",
    "The committee will publish its final report in the autumn, after a period of public consultation.",
    "Several respondents asked for clearer guidance on how the new rules apply to small businesses.",
    "Volunteers planted four hundred trees along the northern edge of the park last winter.",
    "The project was paid for by a grant from the regional environment fund and by local donations.",
]


def _passage(rng: random.Random) -> str:
    """A paragraph of 4 to 16 sentences: about 80 to 350 tokens, under MiniLM's 512."""
    return " ".join(rng.choice(SENTENCES) for _ in range(rng.randint(4, 16)))


def embed_texts(rng: random.Random) -> list[str]:
    """The texts of one embedder request: mostly short queries, LONG_SHARE long passages."""
    count = rng.randint(1, max(1, TEXTS_PER_REQUEST))
    return [_passage(rng) if rng.random() < LONG_SHARE else rng.choice(QUERIES) for _ in range(count)]


def prompt(rng: random.Random) -> str:
    """A generator prompt: a chat question, or (LONG_SHARE of the time) a passage to summarise."""
    if rng.random() < LONG_SHARE:
        return f"Summarize the following text in one sentence.\n\n{_passage(rng)}"
    return rng.choice(QUERIES)


def sampling_parameters() -> str:
    # Greedy, so output lengths (and TPOT) are comparable between runs; the instruct model wants
    # its chat template, as a chat client would send it.
    return json.dumps({"max_tokens": MAX_TOKENS, "apply_chat_template": True})


# ---------------------------------------------------------------- reporting


class TritonError(Exception):
    """A failed request; Locust's failure table shows this message (the server's own)."""


class StreamClock:
    """Times one streamed generation and reports it as TTFT, TPOT and stream entries.

    TTFT: request sent -> first response carrying tokens. TPOT: (last token - first token) /
    (tokens - 1), the per-token decode time as genai-perf and vLLM define it (a response may
    carry several tokens). stream: request sent -> last response; size = output tokens.
    """

    def __init__(self, environment, name: str) -> None:
        self.environment, self.name = environment, name
        self.start_time = time.time()
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0

    def tokens_arrived(self, count: int, at: float) -> None:
        if count <= 0:
            return
        if self.first is None:
            self.first = at
            self._fire("TTFT", at - self.start)  # reported at once: valid even if the rest fails
        self.last = at
        self.tokens += count

    def finished(self, at: float) -> None:
        if self.tokens > 1:
            self._fire("TPOT", (self.last - self.first) / (self.tokens - 1))
        self._fire("stream", at - self.start, length=self.tokens)

    def failed(self, error: Exception) -> None:
        self._fire("stream", time.perf_counter() - self.start, length=self.tokens, exception=error)

    def _fire(self, kind: str, seconds: float, length: int = 0, exception: Exception | None = None) -> None:
        self.environment.events.request.fire(
            request_type=kind,
            name=self.name,
            response_time=seconds * 1000.0,
            response_length=length,
            exception=exception,
            context={},
            start_time=self.start_time,
        )


def _address(host: str | None, port: int) -> str:
    """host:port: the host of --host, another port of the same machine."""
    hostname = urlsplit(host if host and "//" in host else f"http://{host or '127.0.0.1'}").hostname or "127.0.0.1"
    return f"[{hostname}]:{port}" if ":" in hostname else f"{hostname}:{port}"


def _grpc_address(host: str | None) -> str:
    """gRPC host:port: the host of --host, the port of TRITONFORMER_GRPC_PORT."""
    return _address(host, GRPC_PORT)


def _as_error(e: Exception) -> TritonError:
    if isinstance(e, TritonError):
        return e
    if isinstance(e, grpcclient.InferenceServerException):
        return TritonError(str(e))  # its repr() leaves out the status and often the message
    return TritonError(repr(e))


def _http_error(status: int, body: bytes) -> TritonError:
    """The server's message from an error body: JSON {"error": ...} or an SSE `data:` line."""
    text = body.decode("utf-8", "replace").strip()
    try:
        message = json.loads(text.removeprefix("data:").strip())["error"]
    except (ValueError, KeyError, TypeError):
        message = text[:500] or "(empty body)"
    return TritonError(f"HTTP {status}: {message}")


def _sse_data(resp, ended_early: str):
    """The `data:` payloads of a server-sent event stream with their arrival times, read line by
    line as they come (a connection closed before the caller stops reading: TritonError)."""
    while True:
        line = resp.readline(b"\n")
        at = time.perf_counter()
        if not line:
            raise TritonError(ended_early)
        if line.startswith(b"data:"):  # not the blank line between events
            yield line[len(b"data:"):].strip(), at


# ---------------------------------------------------------------- users


class TritonUser(User):
    """Common settings; --host (or the default below) is the server's HTTP base URL."""

    abstract = True
    host = f"http://127.0.0.1:{HTTP_PORT}"
    wait_time = between(0, WAIT) if WAIT > 0 else constant(0)

    def on_start(self) -> None:
        self.rng = random.Random()


class EmbedHttpUser(FastHttpUser, TritonUser):
    """The embedder over HTTP, with JSON input and the binary output tritonclient asks for
    (384 floats per text as JSON text would make the server's encoding the bottleneck)."""

    abstract = False
    network_timeout = connection_timeout = TIMEOUT

    @tag("embed", "embed-http", "http")
    @task
    def embed_http(self) -> None:
        texts = embed_texts(self.rng)
        body = {
            "parameters": {"truncate": True},
            "inputs": [{"name": "text_input", "shape": [len(texts)], "datatype": "BYTES", "data": texts}],
            "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}],
        }
        with self.client.post("/v2/models/embedder/infer", json=body, name="embedder http", catch_response=True) as resp:
            if not resp.status_code:
                return  # no response at all: Locust reports the connection error itself
            if resp.status_code != 200:
                resp.failure(_http_error(resp.status_code, resp.content or b""))
                return
            # The JSON header precedes the binary tensor; check the shape we asked for came back.
            header_length = int(resp.headers.get("Inference-Header-Content-Length", "0"))
            try:
                shape = json.loads(resp.content[:header_length])["outputs"][0]["shape"]
            except (ValueError, KeyError, IndexError):
                shape = None
            if not shape or shape[0] != len(texts):
                resp.failure(TritonError(f"expected {len(texts)} embeddings, got shape {shape}"))


class RerankHttpUser(FastHttpUser, TritonUser):
    """The reranker over HTTP: one search query and DOCUMENTS candidate texts (LONG_SHARE long
    passages), scores back as JSON; a reranker in a retrieval stack sees exactly this."""

    abstract = False
    network_timeout = connection_timeout = TIMEOUT

    @tag("rerank-http")
    @task
    def rerank_http(self) -> None:
        texts = [_passage(self.rng) if self.rng.random() < LONG_SHARE else self.rng.choice(QUERIES)
                 for _ in range(DOCUMENTS)]
        body = {
            "parameters": {"truncate": True},
            "inputs": [{"name": "query", "shape": [1], "datatype": "BYTES", "data": [self.rng.choice(QUERIES)]},
                       {"name": "texts", "shape": [len(texts)], "datatype": "BYTES", "data": texts}],
        }
        with self.client.post("/v2/models/reranker/infer", json=body, name="reranker http", catch_response=True) as resp:
            if not resp.status_code:
                return  # no response at all: Locust reports the connection error itself
            if resp.status_code != 200:
                resp.failure(_http_error(resp.status_code, resp.content or b""))
                return
            try:
                scores = json.loads(resp.content)["outputs"][0]["data"]
            except (ValueError, KeyError, IndexError):
                scores = None
            if scores is None or len(scores) != len(texts):
                resp.failure(TritonError(f"expected {len(texts)} scores, got {scores!r:.200}"))


class EmbedGrpcUser(TritonUser):
    """The embedder over gRPC ModelInfer, one tritonclient per user (one HTTP/2 connection)."""

    def on_start(self) -> None:
        super().on_start()
        self.client = grpcclient.InferenceServerClient(_grpc_address(self.host))

    def on_stop(self) -> None:
        # Closed explicitly: a client left to the interpreter's exit hung Locust at shutdown.
        self.client.close()

    @tag("embed", "embed-grpc", "grpc")
    @task
    def embed_grpc(self) -> None:
        texts = embed_texts(self.rng)
        data = grpcclient.InferInput("text_input", [len(texts)], "BYTES")
        data.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
        with self.environment.events.request.measure("grpc", "embedder grpc") as meta:
            try:
                result = self.client.infer("embedder", [data], parameters={"truncate": True}, client_timeout=TIMEOUT)
            except grpcclient.InferenceServerException as e:
                raise TritonError(str(e)) from None  # str() carries gRPC status + message
            embedding = result.as_numpy("embedding")
            if embedding is None or embedding.shape[0] != len(texts):
                raise TritonError(f"expected {len(texts)} embeddings, got {getattr(embedding, 'shape', None)}")
            meta["response_length"] = embedding.nbytes


class GenerateGrpcUser(TritonUser):
    """The generator over gRPC streaming: one stream per user, one request in flight on it."""

    def on_start(self) -> None:
        super().on_start()
        self.client = grpcclient.InferenceServerClient(_grpc_address(self.host))
        self._start_stream()

    def _start_stream(self) -> None:
        self.responses: queue.Queue = queue.Queue()
        # Timestamp in the callback: the task greenlet may read the queue a little later.
        self.client.start_stream(
            callback=lambda result, error: self.responses.put((time.perf_counter(), result, error))
        )

    def _restart_stream(self) -> None:
        # After a transport error or a timeout the stream is dead or holds a stray request:
        # cancel whatever is in flight and open a fresh one (a new queue drops stale responses).
        try:
            self.client.stop_stream(cancel_requests=True)
        except Exception:
            pass  # a stream that broke may complain on the way out; it is replaced either way
        self._start_stream()

    def _stream_error(self) -> Exception | None:
        while not self.responses.empty():
            _, _, error = self.responses.get_nowait()
            if error is not None:
                return error
        return None

    def on_stop(self) -> None:
        # Cancels a generation cut short by the end of the run (the server frees it within one
        # iteration) instead of letting it run on after Locust has gone.
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    @tag("generate", "generate-grpc", "grpc")
    @task
    def generate_grpc(self) -> None:
        request_id = uuid.uuid4().hex
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([prompt(self.rng).encode()], dtype=np.object_))
        params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        params.set_data_from_numpy(np.array([sampling_parameters().encode()], dtype=np.object_))
        clock = StreamClock(self.environment, "generator grpc-stream")
        try:
            try:
                self.client.async_stream_infer("generator", [text, params], request_id=request_id)
            except grpcclient.InferenceServerException as e:
                # A stream that broke while idle (it could not connect, the server went away)
                # refuses new requests and tells why only through the callback.
                raise self._stream_error() or e from None
            deadline = clock.start + TIMEOUT
            while True:
                try:
                    at, result, error = self.responses.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    raise TritonError(f"no final response within {TIMEOUT:g} s") from None
                if error is not None:
                    if error.status() is None:  # the model's own error answer: the stream is fine
                        clock.failed(TritonError(str(error)))
                        return
                    raise error  # a gRPC status: the stream itself broke
                if result.get_response().id != request_id:
                    continue  # a late response of an earlier, abandoned request
                ids = result.as_numpy("output_ids")
                clock.tokens_arrived(0 if ids is None else ids.size, at)
                if result.as_numpy("finish_reason") is not None:  # only on the last response
                    clock.finished(at)
                    return
        except Exception as e:  # not GreenletExit: a user stopped mid-request reports nothing
            self._restart_stream()
            clock.failed(_as_error(e))


class GenerateHttpUser(TritonUser):
    """The generator over HTTP /generate_stream, reading the server-sent events as they come.

    geventhttpclient directly rather than FastHttpUser's client: its streaming read waits for a
    full 1 KiB block, which would hold back the first events and distort TTFT; readline() does not.
    """

    def on_start(self) -> None:
        super().on_start()
        self.http = HTTPClient.from_url(self.host, connection_timeout=TIMEOUT, network_timeout=TIMEOUT)

    def on_stop(self) -> None:
        self.http.close()

    @tag("generate", "generate-http", "http")
    @task
    def generate_http(self) -> None:
        body = json.dumps({"text_input": prompt(self.rng), "sampling_parameters": sampling_parameters()})
        clock = StreamClock(self.environment, "generator http-sse")
        try:
            resp = self.http.post(
                "/v2/models/generator/generate_stream",
                body=body,
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            )
            if resp.status_code != 200:  # an error before the first response, e.g. bad parameters
                raise _http_error(resp.status_code, resp.read())
            for data, at in _sse_data(resp, "the event stream ended without a finish_reason"):
                event = json.loads(data)
                if "error" in event:  # a later error arrives as an event; the status stays 200
                    raise TritonError(f"HTTP 200: {event['error']}")
                ids = event.get("output_ids", [])
                clock.tokens_arrived(1 if isinstance(ids, int) else len(ids), at)  # one id comes as a scalar
                if event.get("finish_reason") is not None:
                    clock.finished(at)
                    resp.read()  # the end of the chunked body, so the connection can be reused
                    return
        except Exception as e:
            if isinstance(e, TimeoutError):  # network_timeout: per read, so between two events
                e = TritonError(f"nothing received for {TIMEOUT:g} s")
            # The connection may hold half a response: drop it rather than reuse it.
            self.http.close()
            self.http = HTTPClient.from_url(self.host, connection_timeout=TIMEOUT, network_timeout=TIMEOUT)
            clock.failed(_as_error(e))


class OpenAIChatUser(TritonUser):
    """The generator through the bundled server's OpenAI routes: a streamed /v1/chat/completions
    (the prompt as one user message, greedy, `stream_options.include_usage`), read event by event
    as GenerateHttpUser reads /generate_stream. The routes listen on the host of --host at
    $TRITONFORMER_OPENAI_PORT (9000); $TRITONFORMER_API_KEY, if set, is sent as the bearer key.
    Tokens per event are not in the chunks: TTFT is the first content chunk, and the stream's
    size is the completion_tokens of the final usage chunk."""

    def on_start(self) -> None:
        super().on_start()
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if _env("TRITONFORMER_API_KEY", ""):
            self.headers["Authorization"] = f"Bearer {os.environ['TRITONFORMER_API_KEY']}"
        self._connect()

    def _connect(self) -> None:
        self.http = HTTPClient.from_url(f"http://{_address(self.host, OPENAI_PORT)}", connection_timeout=TIMEOUT,
                                        network_timeout=TIMEOUT)

    def on_stop(self) -> None:
        self.http.close()

    @tag("openai", "openai-chat")
    @task
    def chat_openai(self) -> None:
        body = json.dumps({
            "model": "generator", "messages": [{"role": "user", "content": prompt(self.rng)}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        })
        clock = StreamClock(self.environment, "generator openai-chat")
        try:
            resp = self.http.post("/v1/chat/completions", body=body, headers=self.headers)
            if resp.status_code != 200:  # OpenAI's error object: {"error": {"message": ...}}
                raise _http_error(resp.status_code, resp.read())
            for data, at in _sse_data(resp, "the event stream ended without [DONE]"):
                if data == b"[DONE]":
                    clock.finished(at)
                    resp.read()  # the end of the chunked body, so the connection can be reused
                    return
                event = json.loads(data)
                if "error" in event:
                    raise TritonError(f"HTTP 200: {event['error']}")
                for choice in event.get("choices", ()):
                    if choice.get("delta", {}).get("content"):
                        clock.tokens_arrived(1, at)
                if event.get("usage"):
                    clock.tokens = event["usage"]["completion_tokens"]  # exact, where chunks held several
        except Exception as e:
            if isinstance(e, TimeoutError):
                e = TritonError(f"nothing received for {TIMEOUT:g} s")
            self.http.close()
            self._connect()
            clock.failed(_as_error(e))


# ---------------------------------------------------------------- run control


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    parser.add_argument(
        "--iterations",
        type=int,
        default=0,
        help="tritonformer: stop the run after this many requests in all (0: no limit; use with --run-time as a bound)",
    )


@events.init.add_listener
def _drop_users_without_tasks(environment, **_kwargs) -> None:
    """Locust's --tags filter tasks, not users: a user whose only task was filtered out would
    still be spawned and fail with "No tasks defined". Keep only the users that have a task left."""
    options = environment.parsed_options
    tags = set(options.tags) if options is not None and options.tags else None
    exclude = set(options.exclude_tags) if options is not None and options.exclude_tags else None
    if tags is None and exclude is None:
        return

    def selected(func) -> bool:
        func_tags = getattr(func, "locust_tag_set", set())
        return (tags is None or bool(func_tags & tags)) and not (exclude and func_tags & exclude)

    kept = [u for u in environment.user_classes if any(selected(t) for t in u.tasks)]
    if not kept:
        known = sorted({t for u in environment.user_classes for f in u.tasks for t in getattr(f, "locust_tag_set", ())})
        raise SystemExit(
            f"no scenario left by --tags {options.tags} --exclude-tags {options.exclude_tags}; tags: {', '.join(known)}"
        )
    environment.user_classes[:] = kept
    logging.getLogger(__name__).info("scenarios: %s", ", ".join(u.__name__ for u in kept))


_runner = None  # set at init when --iterations is given
_completed = 0


@events.init.add_listener
def _remember_runner(environment, runner=None, **_kwargs) -> None:
    global _runner
    _runner = runner if getattr(environment.parsed_options, "iterations", 0) else None


@events.request.add_listener
def _count_iterations(request_type, **_kwargs) -> None:
    """--iterations: count whole requests (TTFT and TPOT are parts of one) and quit at the limit.
    Requests that finish while the users are being stopped may add one or two more."""
    global _completed
    if _runner is None or request_type in ("TTFT", "TPOT"):
        return
    _completed += 1
    if _completed == _runner.environment.parsed_options.iterations:
        # Not from this greenlet directly: quit() kills every user, the caller among them.
        gevent.spawn(_runner.quit)


@events.quitting.add_listener
def _let_csv_catch_up(environment, **_kwargs) -> None:
    """Locust rewrites its --csv files once a second and not again at exit, so they would miss
    the last second of a run (all of a short --iterations one): wait for one more pass. The
    printed summary and the --html report are written from the final numbers anyway."""
    if environment.parsed_options is not None and environment.parsed_options.csv_prefix:
        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.25)
