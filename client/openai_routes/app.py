"""The FastAPI application: `/v1/models`, `/v1/chat/completions`, `/v1/completions`,
`/v1/embeddings`, `/v1/rerank` (also `/rerank`), `/score` (also `/v1/score`), `/classify` (also
`/v1/classify`), and `/health`.

Requests are checked here before anything reaches Triton: the body (pydantic), the API key,
the model (one Triton serves, else 404), the chat template; generation.py then sizes
`max_tokens` and builds the answer. Every error is OpenAI's error object. A client that hangs up cancels its work: streams stop
as soon as the connection closes (not at the next write), and non-streamed requests are raced
against the disconnect.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import time
from collections.abc import Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tritonformer.client.openai_routes import responses as out
from tritonformer.client.openai_routes.generation import Answer, Generation
from tritonformer.client.openai_routes.schemas import (
    ChatCompletionRequest,
    ClassifyRequest,
    CompletionRequest,
    EmbeddingRequest,
    DetokenizeRequest,
    OpenAIError,
    RerankRequest,
    ScoreRequest,
    TokenizeRequest,
)
from tritonformer.client.openai_routes.served_models import (
    CLASSIFIER,
    EMBEDDER,
    GENERATOR,
    RERANKER,
    ServedModel,
    served_model,
)
from tritonformer.client.openai_routes.responses_api import ResponseShape, ResponsesRequest
from tritonformer.client.openai_routes.tools import ToolUse
from tritonformer.client.openai_routes.triton_calls import TritonCalls

T = TypeVar("T")

# How often an unknown model name may trigger a new look at Triton's repository.
_REFRESH_INTERVAL_S = 1.0

# Prompts up to this many characters are tokenized on the event loop: at most ~0.7 ms, about
# what handing them to a worker thread and back costs at low load. Longer ones go to a thread.
INLINE_TOKENIZE_CHARS = 1024


MAX_TOKENIZE_BYTES = 1_000_000  # /tokenize of an encoder model's text


class ServedModels:
    """The models Triton serves, found at start-up and looked up again (at most once a second)
    when a request names one not seen yet: a model loaded later appears without a restart."""

    def __init__(self, triton: TritonCalls) -> None:
        self.triton = triton
        self.models: dict[str, ServedModel] = {}
        self._refreshed_at = -_REFRESH_INTERVAL_S
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        async with self._lock:
            if time.monotonic() - self._refreshed_at < _REFRESH_INTERVAL_S:
                return
            configs = await self.triton.model_configs()
            found = {}
            for name, config in configs.items():
                known = self.models.get(name)
                # Tokenizer files are read in a worker thread, not on the event loop.
                found[name] = known or await asyncio.to_thread(served_model, name, config, out.now())
            self.models = {name: model for name, model in found.items() if model is not None}
            self._refreshed_at = time.monotonic()

    async def get(self, name: str, kind: str | None) -> ServedModel:
        """The served model `name` of `kind` (None: of any kind), else a 404 naming the served ones."""
        model = self.models.get(name)
        if model is None:
            await self.refresh()
            model = self.models.get(name)
        if model is None or kind not in (None, model.kind):
            served = ", ".join(sorted(m.name for m in self.models.values() if kind in (None, m.kind))) or "none"
            what = f"a {kind} model" if kind else "served"
            raise OpenAIError(404, f"The model {name!r} does not exist or is not {what}; "
                                   f"served{'' if kind is None else ' ' + kind} models: {served}", param="model",
                              code="model_not_found")
        return model


def embedding_inputs(value, vocab_size: int) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token id sequences) of an embeddings request's `input`: one text,
    texts, one sequence of token ids, or sequences of them (OpenAI's four forms). Ids are the
    served checkpoint's own, sent as they are (no special tokens added)."""
    if isinstance(value, str):
        return [value], None
    if value and all(isinstance(t, str) for t in value):
        return list(value), None
    sequences = [value] if value and all(isinstance(t, int) for t in value) else value
    if not sequences or not all(isinstance(s, list) and s and all(isinstance(t, int) for t in s) for s in sequences):
        raise OpenAIError(400, "input must be a string, a non-empty list of strings, a list of token ids or a "
                               "list of such lists (none empty)", param="input")
    if any(not 0 <= t < vocab_size for s in sequences for t in s):
        raise OpenAIError(400, f"token ids must be in [0, {vocab_size})", param="input")
    return None, sequences


async def encode(model: ServedModel, text: str, add_special_tokens: bool = True) -> list[int]:
    """`text`'s token ids: short texts at once, long ones in a worker thread (off the event loop)."""
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return model.tokenizer.encode(text, add_special_tokens)
    return await asyncio.to_thread(model.tokenizer.encode, text, add_special_tokens)


def check_prompt_bytes(model: ServedModel, text: str, param: str) -> None:
    """The generator's `max_prompt_bytes`, checked before tokenizing: the routes send token ids,
    which the generator does not measure in bytes."""
    size = len(text.encode("utf-8"))
    if size > model.max_prompt_bytes:
        raise OpenAIError(400, f"the prompt is {size} bytes; this model takes at most {model.max_prompt_bytes}",
                          param=param)


# ------------------------------------------------------------------ disconnects


class HangUp:
    """Within its `with` block, cancels the calling task as soon as the client hangs up.

    A watcher task reads the connection's messages; the work itself stays in the calling task
    (a task of its own would cost event-loop passes to start and to wake from on every request).
    `happened` tells that cancellation from any other."""

    def __init__(self, receive) -> None:
        self._receive = receive
        self._caller = asyncio.current_task()
        self._active = False
        self.happened = False

    def __enter__(self) -> HangUp:
        self._active = True
        self._watcher = asyncio.ensure_future(self._watch())
        self._watcher.add_done_callback(self._done)
        return self

    def __exit__(self, *exc) -> None:
        self._active = False
        self._watcher.cancel()

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass

    def _done(self, watcher: asyncio.Future) -> None:
        if watcher.cancelled():
            return
        watcher.exception()  # a broken connection counts as a hang-up
        if self._active:  # (the caller is suspended inside the block: it is cancelled there)
            self.happened = True
            self._caller.cancel()


class EventStream(StreamingResponse):
    """Server-sent events that stop as soon as the client hangs up.

    Starlette's own StreamingResponse (ASGI spec >= 2.4) notices a closed connection only when
    its next write fails; a stream still waiting for tokens would go on generating. Here a
    hang-up cancels the body at once (HangUp), and the cancellation reaches
    TritonCalls.generate, which cancels the Triton stream."""

    media_type = "text/event-stream"

    async def __call__(self, scope, receive, send) -> None:
        with HangUp(receive) as hang_up:
            try:
                await self.stream_response(send)
            except OSError:
                pass  # the client went away mid-write
            except asyncio.CancelledError:
                if not hang_up.happened:
                    raise
                asyncio.current_task().uncancel()  # the client left: the stream is over

    async def stream_response(self, send) -> None:
        """Starlette's, but the first event is made before the status line is sent, so that the
        two leave back to back (one read for the client)."""
        events = aiter(self.body_iterator)
        first = await anext(events, None)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if first is not None:
            await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, cancelled if the client hangs up first (non-streamed answers, and a
    stream's wait for its first piece); the answer to a client that left is a 499 that nobody
    reads (not an exception in the server's log)."""
    with HangUp(request.receive) as hang_up:
        try:
            return await work
        except asyncio.CancelledError:
            if not hang_up.happened:
                raise
            asyncio.current_task().uncancel()
    raise OpenAIError(499, "the client closed the connection")


def create_app(grpc_url: str, api_key: str | None = None) -> FastAPI:
    """The OpenAI routes in front of the tritonserver whose gRPC endpoint is `grpc_url`.
    With `api_key`, every /v1 request must carry `Authorization: Bearer <api_key>`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # The asyncio gRPC channel belongs to the server's event loop: made here, not earlier.
        app.state.triton = TritonCalls(grpc_url)
        app.state.models = ServedModels(app.state.triton)
        await app.state.models.refresh()
        try:
            yield
        finally:
            await app.state.triton.close()

    async def check_api_key(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise OpenAIError(401, "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'.",
                              type="authentication_error", code="invalid_api_key")

    app = FastAPI(title="tritonformer OpenAI routes", lifespan=lifespan, docs_url=None, redoc_url=None)
    authorized = [Depends(check_api_key)] if api_key is not None else []  # (no dependency to solve per request)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        first = problems[0] if problems else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg')}"
                            for e in problems[:5])
        return JSONResponse(OpenAIError(400, message or "invalid request body", param=where or None).body(),
                            status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return JSONResponse(OpenAIError(error.status_code, str(error.detail), type=kind).body(),
                            status_code=error.status_code)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    def model_card(model: ServedModel) -> dict:
        return {"id": model.name, "object": "model", "created": model.created, "owned_by": "tritonformer"}

    @app.get("/v1/models", dependencies=authorized)
    async def list_models(request: Request) -> dict:
        await request.app.state.models.refresh()
        return {"object": "list", "data": [model_card(m) for m in request.app.state.models.models.values()]}

    @app.get("/v1/models/{name}", dependencies=authorized)
    async def get_model(name: str, request: Request) -> dict:
        models: ServedModels = request.app.state.models
        if name not in models.models:
            await models.refresh()
        if name not in models.models:
            raise OpenAIError(404, f"The model {name!r} does not exist", param="model", code="model_not_found")
        return model_card(models.models[name])

    # ---- generation

    async def answer(request: Request, req, model: ServedModel, generations: list[Generation], shape,
                     top_logprobs: int | None):
        result = Answer(request.app.state.triton, model, generations, shape, top_logprobs,
                        lambda work: until_disconnect(request, work))
        if not req.stream:
            return await result.whole()
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventStream(await result.events(include_usage))

    async def chat_answer(req: ChatCompletionRequest, request: Request) -> Answer:
        """The Answer to a chat request (what /v1/chat/completions and /v1/responses send)."""
        req.refuse_unsupported()
        model = await request.app.state.models.get(req.model, GENERATOR)
        tools = ToolUse(req.tools, req.tool_choice, model.tokenizer.chat_template, req.model)
        if tools.structured is not None:  # a forced call: the reply is constrained to one
            req._also_structured = {"tool_choice": tools.structured}
        try:
            text = model.tokenizer.render_chat(req.conversation(), tools=req.tools)
        except Exception as e:
            raise OpenAIError(400, f"cannot apply the model's chat template: {e}", param="messages") from None
        check_prompt_bytes(model, text, "messages")
        # The template wrote its own special tokens (a BOS, say): add none (as HF tokenizes chats).
        prompt_ids = await encode(model, text, False)
        top = (req.top_logprobs or 0) if req.logprobs else None
        return Answer(request.app.state.triton, model, [Generation(model, req, prompt_ids, 0, top)], out.ChatShape,
                      top, lambda work: until_disconnect(request, work), tools if tools.active else None)

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        result = await chat_answer(req, request)
        if not req.stream:
            return await result.whole()
        return EventStream(await result.events(bool(req.stream_options and req.stream_options.include_usage)))

    @app.post("/v1/responses", dependencies=authorized)
    async def responses(req: ResponsesRequest, request: Request):
        req.refuse_unsupported()
        shape = ResponseShape(req)
        result = await chat_answer(req.chat(), request)
        if not req.stream:
            return shape.whole(await result.whole())
        return EventStream(shape.events(await result.events(include_usage=True)))

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(req: CompletionRequest, request: Request):
        req.refuse_unsupported()
        if req.best_of is not None and req.best_of != req.n:
            raise OpenAIError(400, "best_of other than n is not implemented", param="best_of")
        if req.echo and req.logprobs is not None:
            raise OpenAIError(400, "echo with logprobs (the prompt's logprobs) is not implemented", param="echo")
        model = await request.app.state.models.get(req.model, GENERATOR)
        prompts = req.prompt
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts or any(len(p) == 0 for p in prompts):
            raise OpenAIError(400, "prompt must not be empty", param="prompt")
        tokenizer = model.tokenizer
        generations = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                check_prompt_bytes(model, prompt, "prompt")
                ids, echo = await encode(model, prompt), prompt
            else:
                if not all(0 <= t < tokenizer.vocab_size for t in prompt):
                    raise OpenAIError(400, f"prompt token ids must be in [0, {tokenizer.vocab_size})", param="prompt")
                ids = list(prompt)
                echo = tokenizer.decode(ids, skip_special_tokens=False) if req.echo else ""
            generations.append(Generation(model, req, ids, i * req.n, req.logprobs, echo if req.echo else ""))
        return await answer(request, req, model, generations, out.CompletionShape, req.logprobs)

    @app.post("/v1/embeddings", dependencies=authorized)
    async def embeddings(req: EmbeddingRequest, request: Request):
        req.refuse_unsupported()
        model = await request.app.state.models.get(req.model, EMBEDDER)
        texts, sequences = embedding_inputs(req.input, model.tokenizer.vocab_size)
        triton = request.app.state.triton
        work = triton.embed(model, texts) if texts is not None else triton.embed_ids(model, sequences)
        vectors = await until_disconnect(request, work)
        if req.dimensions is not None and req.dimensions != vectors.shape[1]:
            raise OpenAIError(400, f"dimensions must be this model's {vectors.shape[1]} (no shortening)",
                              param="dimensions")
        if texts is not None:
            sequences = await asyncio.to_thread(model.tokenizer.encode_batch, texts)
        prompt_tokens = sum(len(ids) for ids in sequences)
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.tobytes()).decode() if req.encoding_format == "base64"
                 else v.tolist()} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": model.name,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}

    async def rerank(req: RerankRequest, request: Request):
        """Scores of the documents for the query from a reranker model, best first (ties in
        document order), cut to `top_n`; usage counts the (query, document) pairs' tokens
        before any truncation."""
        req.refuse_unsupported()
        model = await request.app.state.models.get(req.model, RERANKER)
        texts = req.texts()
        scores = await until_disconnect(request, request.app.state.triton.rerank(model, req.query, texts, req.truncate,
                                                                                req.raw_scores))
        order = sorted(range(len(texts)), key=lambda i: -float(scores[i]))[: req.top_n]
        tokens = sum(await asyncio.to_thread(model.tokenizer.pair_lengths, req.query, texts)) if model.tokenizer else 0
        results = [{"index": i, "relevance_score": float(scores[i]),
                    **({"document": {"text": texts[i]}} if req.return_documents else {})} for i in order]
        return {"id": out.new_id("rerank"), "model": model.name, "results": results,
                "usage": {"total_tokens": tokens}}

    for path in ("/v1/rerank", "/rerank"):  # vLLM and text-embeddings-inference answer on both
        app.add_api_route(path, rerank, methods=["POST"], dependencies=authorized)

    async def score(req: ScoreRequest, request: Request):
        """vLLM's /score from a reranker model: each (text_1, text_2) pair's score in request
        order; the pairs of one text_1 go to the model as one rerank call."""
        req.refuse_unsupported()
        try:
            pairs = req.pairs()
        except ValueError as e:
            raise OpenAIError(400, str(e), param="text_2") from None
        model = await request.app.state.models.get(req.model, RERANKER)
        by_query: dict[str, list[int]] = {}
        for i, (query, _) in enumerate(pairs):
            by_query.setdefault(query, []).append(i)
        calls = [request.app.state.triton.rerank(model, query, [pairs[i][1] for i in rows], req.truncate,
                                                 req.raw_scores) for query, rows in by_query.items()]
        answers = await until_disconnect(request, asyncio.gather(*calls))
        scores = [0.0] * len(pairs)
        for rows, values in zip(by_query.values(), answers):
            for i, value in zip(rows, values):
                scores[i] = float(value)
        tokens = 0
        if model.tokenizer:
            for query, rows in by_query.items():
                tokens += sum(await asyncio.to_thread(model.tokenizer.pair_lengths, query, [pairs[i][1] for i in rows]))
        return {"id": out.new_id("score"), "object": "list", "created": out.now(), "model": model.name,
                "data": [{"index": i, "object": "score", "score": v} for i, v in enumerate(scores)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    for path in ("/score", "/v1/score"):  # vLLM's path, and under /v1 beside the others
        app.add_api_route(path, score, methods=["POST"], dependencies=authorized)

    async def classify(req: ClassifyRequest, request: Request):
        """Each text's label probabilities and most likely label from a classifier model, as
        vLLM's /classify answers."""
        req.refuse_unsupported()
        model = await request.app.state.models.get(req.model, CLASSIFIER)
        texts = req.texts()
        if not texts:
            raise OpenAIError(400, "input must be a string or a non-empty list of strings", param="input")
        probabilities, labels = await until_disconnect(request, request.app.state.triton.classify(model, texts,
                                                                                                  req.truncate))
        tokens = (sum(map(len, await asyncio.to_thread(model.tokenizer.encode_batch, texts)))
                  if model.tokenizer else 0)
        data = [{"index": i, "label": label, "probs": [float(p) for p in row], "num_classes": len(row)}
                for i, (label, row) in enumerate(zip(labels, probabilities))]
        return {"id": out.new_id("classify"), "object": "list", "created": out.now(), "model": model.name,
                "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    for path in ("/classify", "/v1/classify"):  # vLLM's path, and under /v1 beside the others
        app.add_api_route(path, classify, methods=["POST"], dependencies=authorized)

    async def tokenize(req: TokenizeRequest, request: Request):
        """vLLM's /tokenize: a prompt's token ids (or a chat's, rendered with the model's chat
        template), as the served model's tokenizer makes them."""
        req.refuse_unsupported()
        model = await request.app.state.models.get(req.model, None)
        if model.tokenizer is None:
            raise OpenAIError(400, f"model {req.model!r} has no tokenizer here", param="model")
        if (req.prompt is None) == (req.messages is None):
            raise OpenAIError(400, "send one of prompt or messages", param="prompt")
        if req.messages is not None:
            try:
                text = model.tokenizer.render_chat([m.for_template() for m in req.messages],
                                                   add_generation_prompt=req.add_generation_prompt is not False)
            except Exception as e:
                raise OpenAIError(400, f"cannot apply the model's chat template: {e}", param="messages") from None
            special = bool(req.add_special_tokens)  # (a rendered chat has its own: none added by default)
        else:
            text, special = req.prompt, req.add_special_tokens is not False
        if model.kind == GENERATOR:  # its prompt limit; an encoder's texts: a fixed one
            check_prompt_bytes(model, text, "prompt")
        elif len(text.encode()) > MAX_TOKENIZE_BYTES:
            raise OpenAIError(400, f"the prompt is over {MAX_TOKENIZE_BYTES} bytes", param="prompt")
        ids = await asyncio.to_thread(model.tokenizer.encode, text, special)
        body = {"count": len(ids), "max_model_len": model.context_length or None, "tokens": ids}
        if req.return_token_strs:
            body["token_strs"] = [model.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
        return body

    async def detokenize(req: DetokenizeRequest, request: Request):
        """vLLM's /detokenize: the text of token ids (special tokens kept)."""
        req.refuse_unsupported()
        model = await request.app.state.models.get(req.model, None)
        if model.tokenizer is None:
            raise OpenAIError(400, f"model {req.model!r} has no tokenizer here", param="model")
        if not all(0 <= t < model.tokenizer.vocab_size for t in req.tokens):
            raise OpenAIError(400, f"tokens must be ids in [0, {model.tokenizer.vocab_size})", param="tokens")
        return {"prompt": model.tokenizer.decode(req.tokens, skip_special_tokens=False)}

    for path in ("/tokenize", "/v1/tokenize"):
        app.add_api_route(path, tokenize, methods=["POST"], dependencies=authorized)
    for path in ("/detokenize", "/v1/detokenize"):
        app.add_api_route(path, detokenize, methods=["POST"], dependencies=authorized)

    return app
