"""A chat or completions request, from its prompts' token ids to the OpenAI answer.

Each prompt is one Triton request (its `n` samples included: the generator prefills the prompt
once and numbers the samples with its `index` output); a completions request with several
prompts runs them at once and numbers its choices prompt by prompt. The answer is a JSON body,
or server-sent events whose status line waits for the first piece, so that a request the
generator refuses is a 400 rather than a 200 stream carrying an error.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from tritonformer.client.openai_routes import responses as out
from tritonformer.client.openai_routes.schemas import (
    SAMPLING_EXTRAS,
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
)
from tritonformer.client.openai_routes.served_models import ServedModel
from tritonformer.client.openai_routes.triton_calls import Piece, TritonCalls

T = TypeVar("T")

# OpenAI's default temperature (the generator's own default is greedy).
DEFAULT_TEMPERATURE = 1.0


def output_budget(model: ServedModel, prompt_tokens: int, asked: int | None) -> int:
    """`max_tokens` for a prompt: what the context leaves (capped by max_tokens_limit) by default;
    an asked budget that the context or the limit cannot hold is a 400 with the numbers."""
    room = model.context_length - prompt_tokens
    if room < 1:
        raise OpenAIError(400, f"This model's maximum context length is {model.context_length} tokens; "
                               f"the prompt is {prompt_tokens} tokens, which leaves no room for output.",
                          param="messages", code="context_length_exceeded")
    if asked is None:
        return min(room, model.max_tokens_limit)
    if asked > model.max_tokens_limit:
        raise OpenAIError(400, f"max_tokens is {asked}; this model allows at most {model.max_tokens_limit}.",
                          param="max_tokens")
    if asked > room:
        raise OpenAIError(400, f"This model's maximum context length is {model.context_length} tokens. "
                               f"However, you requested {prompt_tokens + asked} tokens ({prompt_tokens} in the "
                               f"prompt, {asked} for the completion).", param="max_tokens",
                          code="context_length_exceeded")
    return asked


def sampling_parameters(req: ChatCompletionRequest | CompletionRequest, max_tokens: int,
                        logprobs: int | None) -> dict:
    """The generator's sampling_parameters: only the keys the request sets (neutral ones left to
    the generator's defaults), so a generator without an option is asked for it only by a user
    who wants it, and then says so."""
    params: dict = {"max_tokens": max_tokens,
                    "temperature": DEFAULT_TEMPERATURE if req.temperature is None else req.temperature}
    if req.n != 1:
        params["n"] = req.n
    if req.stop:
        params["stop"] = [req.stop] if isinstance(req.stop, str) else req.stop
    if logprobs is not None:
        params["logprobs"] = logprobs
    for key in ("top_p", "seed", "frequency_penalty", "presence_penalty", "logit_bias", *SAMPLING_EXTRAS):
        value = getattr(req, key)
        if value is not None:
            params[key] = value
    structured = req.structured()
    if structured is not None:
        params["structured_outputs"] = structured
    return params


class Generation:
    """One prompt's Triton request: its token ids, its sampling parameters, the text an `echo`
    puts first, the index of its first choice, and its usage as the pieces report it."""

    def __init__(self, model: ServedModel, req, prompt_ids: list[int], first_index: int, logprobs: int | None,
                 echo: str = "") -> None:
        self.prompt_ids, self.first_index, self.echo = prompt_ids, first_index, echo
        self.sampling = sampling_parameters(req, output_budget(model, len(prompt_ids), req.output_budget()),
                                            logprobs)
        self.counter = out.TokenCounter(len(prompt_ids))


async def merged(streams: list[AsyncIterator[T]]) -> AsyncIterator[T]:
    """The items of several async iterators as they come; closing this closes them all."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
        except BaseException as e:  # noqa: BLE001 - re-raised in the reader below
            await queue.put(e)
        finally:
            await queue.put(done)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Answer:
    """The OpenAI answer to one chat (`shape` ChatShape) or completions (CompletionShape) request.

    `guard(work)` runs an awaitable until the HTTP client hangs up (then cancels it): the
    routes pass their disconnect watcher. `tools` (a chat request's tools.ToolUse): each reply is
    read for tool calls, and a streamed one is sent whole at its end."""

    def __init__(self, triton: TritonCalls, model: ServedModel, generations: list[Generation], shape,
                 top_logprobs: int | None, guard: Callable[[Awaitable[T]], Awaitable[T]], tools=None) -> None:
        self.model, self.generations, self.shape, self.guard = model, generations, shape, guard
        self.tools = tools
        self.logprobs = top_logprobs is not None
        self.top_n = top_logprobs or 0
        self.id, self.created = out.new_id(shape.id_prefix), out.now()

        async def one(generation: Generation) -> AsyncIterator[tuple[Generation, Piece]]:
            async for piece in triton.generate(model, generation.prompt_ids, generation.sampling, self.logprobs):
                generation.counter.add(piece)
                yield generation, piece

        self.pieces = merged([one(g) for g in generations])

    def _tokens(self, piece: Piece) -> list[out.TokenLogprob] | None:
        return out.token_logprobs(piece, self.model.tokenizer, self.top_n) if self.logprobs else None

    def _usage(self) -> dict:
        return out.usage(sum(g.counter.prompt_tokens for g in self.generations),
                         sum(g.counter.completion_tokens for g in self.generations))

    async def _collect(self) -> dict[int, tuple[out.Choice, Generation]]:
        choices: dict[int, tuple[out.Choice, Generation]] = {}
        async for generation, piece in self.pieces:
            index = generation.first_index + piece.index
            if index not in choices:
                choices[index] = (out.Choice(text=generation.echo), generation)
            choices[index][0].add(piece, self._tokens(piece) or [])
        return choices

    def _choices(self, choices: dict[int, tuple[out.Choice, Generation]]) -> list[dict]:
        answered = []
        for i, (c, g) in sorted(choices.items()):
            choice = self.shape.whole_choice(i, c, self.logprobs, g.echo)
            if self.tools is not None:
                choice["message"], calls = self.tools.message(c.text)
                if calls:
                    choice["finish_reason"] = "tool_calls"
            answered.append(choice)
        return answered

    async def whole(self) -> dict:
        """The non-streamed answer: every choice's pieces joined."""
        choices = await self.guard(self._collect())
        return {"id": self.id, "object": self.shape.whole_object, "created": self.created,
                "model": self.model.name, "choices": self._choices(choices), "usage": self._usage()}

    async def events(self, include_usage: bool) -> AsyncIterator[bytes]:
        """The streamed answer; await it up to its first piece (see the module docstring). With
        tools, each choice whole in one chunk once it is complete."""
        if self.tools is not None:
            return self._whole_as_events(await self.guard(self._collect()), include_usage)
        first = await self.guard(anext(self.pieces, None))
        return self._events(first, include_usage)

    async def _whole_as_events(self, choices, include_usage: bool) -> AsyncIterator[bytes]:
        try:
            for choice in self._choices(choices):
                message, finish = choice.pop("message"), choice.pop("finish_reason")
                delta = {k: v for k, v in message.items() if v is not None}
                for n, call in enumerate(delta.get("tool_calls", ())):
                    call["index"] = n
                yield self._chunk([{**choice, "delta": delta, "finish_reason": None}], include_usage)
                yield self._chunk([{"index": choice["index"], "delta": {}, "logprobs": None,
                                    "finish_reason": finish}], include_usage)
            if include_usage:
                yield self._usage_chunk()
        finally:
            await self.pieces.aclose()
        yield out.sse("[DONE]")

    def _usage_chunk(self) -> bytes:
        """The last chunk of a stream with `include_usage`: no choices, the usage."""
        return out.sse({"id": self.id, "object": self.shape.chunk_object, "created": self.created,
                        "model": self.model.name, "choices": [], "usage": self._usage()})

    def _chunk(self, choices: list[dict], include_usage: bool) -> bytes:
        body = {"id": self.id, "object": self.shape.chunk_object, "created": self.created,
                "model": self.model.name, "choices": choices}
        if include_usage:
            body["usage"] = None
        return out.sse(body)

    async def _events(self, item, include_usage: bool) -> AsyncIterator[bytes]:
        offsets: dict[int, int] = {}  # per choice: characters sent so far (completions' text_offset)
        try:
            while item is not None:
                generation, piece = item
                index = generation.first_index + piece.index
                if index not in offsets:
                    offsets[index] = len(generation.echo)
                    opening = self.shape.opening(index, generation.echo)
                    if opening is not None:
                        yield self._chunk([opening], include_usage)
                finish = out.FINISH_REASONS.get(piece.finish_reason, piece.finish_reason) \
                    if piece.finish_reason else None
                if piece.text or piece.token_ids or finish:  # not the empty FINAL-only response
                    choice = self.shape.chunk_choice(index, piece.text, self._tokens(piece), finish, offsets[index])
                    yield self._chunk([choice], include_usage)
                    offsets[index] += len(piece.text)
                item = await anext(self.pieces, None)
            if include_usage:
                yield self._usage_chunk()
        except OpenAIError as e:  # after the status line: OpenAI's clients read an error event
            yield out.sse(e.body())
        finally:
            await self.pieces.aclose()
        yield out.sse("[DONE]")
