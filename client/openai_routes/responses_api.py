"""OpenAI's Responses API (`POST /v1/responses`) over the chat route's machinery.

A request (`input`: a string or a list of messages; `instructions`; `max_output_tokens`,
`temperature`, `top_p`; `text.format` for JSON output) becomes a chat completion request, and its
answer the Response object: one `message` output item with one `output_text` part. Streamed, it
is the Responses event sequence (`response.created` ... `response.output_text.delta` ...
`response.completed`). Nothing is stored: `previous_response_id` and `store: true` lookups, tools
and reasoning items are refused by name.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

from pydantic import BaseModel, ConfigDict, Field

from tritonformer.client.openai_routes import responses as out
from tritonformer.client.openai_routes.schemas import ChatCompletionRequest, OpenAIError, _Request


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    text: dict | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    store: bool | None = None  # accepted: nothing is stored either way
    metadata: dict | None = None
    user: str | None = None

    refuse_unsupported = _Request.refuse_unsupported

    def chat(self) -> ChatCompletionRequest:
        """The chat completion request that answers this one."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            for item in self.input:
                if item.get("type", "message") != "message" or "role" not in item:
                    raise OpenAIError(400, f"input items of type {item.get('type')!r} are not supported (messages "
                                           f"only)", param="input")
                messages.append({"role": item["role"], "content": _text(item.get("content"))})
        fields = {"model": self.model, "messages": messages, "stream": self.stream}
        for key, value in (("max_tokens", self.max_output_tokens), ("temperature", self.temperature),
                           ("top_p", self.top_p)):
            if value is not None:
                fields[key] = value
        fmt = (self.text or {}).get("format")
        if fmt and fmt.get("type") == "json_object":
            fields["response_format"] = {"type": "json_object"}
        elif fmt and fmt.get("type") == "json_schema":  # (the Responses API puts name and schema at this level)
            fields["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.get("name"), "schema": fmt.get("schema"), "strict": fmt.get("strict")}}
        elif fmt and fmt.get("type") != "text":
            raise OpenAIError(400, f"text.format type {fmt.get('type')!r} is not supported", param="text")
        return ChatCompletionRequest(**fields)


def _text(content) -> str | list[dict]:
    """A message's content as the chat route takes it: the Responses API's `input_text` /
    `output_text` parts are text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise OpenAIError(400, f"content of type {part.get('type')!r} is not supported (text only)", param="input")
        parts.append({"type": "text", "text": part.get("text", "")})
    return parts


class ResponseShape:
    """The Response object of a request, built from its chat answer's text and usage."""

    def __init__(self, req: ResponsesRequest):
        self.req = req
        self.id, self.created = out.new_id("resp"), out.now()
        self.message_id = out.new_id("msg")

    def message(self, text: str, status: str) -> dict:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}] if text or status else []}

    def response(self, status: str, text: str | None, usage: dict | None, incomplete: str | None = None) -> dict:
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.req.model, "output": [] if text is None else [self.message(text, "completed")],
            "instructions": self.req.instructions, "max_output_tokens": self.req.max_output_tokens,
            "temperature": self.req.temperature, "top_p": self.req.top_p, "text": self.req.text or {
                "format": {"type": "text"}}, "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None, "metadata": self.req.metadata or {},
            "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "store": False,
            "usage": None if usage is None else {
                "input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0}},
        }

    def whole(self, chat: dict) -> dict:
        """The Response of a non-streamed chat answer (one choice)."""
        choice = chat["choices"][0]
        incomplete = "max_output_tokens" if choice["finish_reason"] == "length" else None
        return self.response("incomplete" if incomplete else "completed", choice["message"]["content"] or "",
                             chat["usage"], incomplete)

    async def events(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The Responses event stream of a streamed chat answer (its SSE chunks, usage included)."""
        n = 0

        def event(kind: str, **body) -> bytes:
            nonlocal n
            n += 1
            data = json.dumps({"type": kind, "sequence_number": n - 1, **body}, separators=(",", ":"))
            return f"event: {kind}\ndata: {data}\n\n".encode()

        yield event("response.created", response=self.response("in_progress", None, None))
        yield event("response.in_progress", response=self.response("in_progress", None, None))
        yield event("response.output_item.added", output_index=0,
                    item={**self.message("", "in_progress"), "content": []})
        part = {"type": "output_text", "text": "", "annotations": []}
        yield event("response.content_part.added", item_id=self.message_id, output_index=0, content_index=0, part=part)
        text, usage, finish = "", None, None
        async for chunk in chunks:
            body = chunk.removeprefix(b"data: ").strip()
            if body == b"[DONE]":
                break
            data = json.loads(body)
            if "error" in data:
                yield event("error", message=data["error"]["message"], code=data["error"].get("code"), param=None)
                return
            usage = data.get("usage") or usage
            for choice in data.get("choices", ()):
                delta = choice["delta"].get("content") or ""
                finish = choice.get("finish_reason") or finish
                if delta:
                    text += delta
                    yield event("response.output_text.delta", item_id=self.message_id, output_index=0,
                                content_index=0, delta=delta, logprobs=[])
        yield event("response.output_text.done", item_id=self.message_id, output_index=0, content_index=0, text=text,
                    logprobs=[])
        yield event("response.content_part.done", item_id=self.message_id, output_index=0, content_index=0,
                    part={**part, "text": text})
        yield event("response.output_item.done", output_index=0, item=self.message(text, "completed"))
        incomplete = "max_output_tokens" if finish == "length" else None
        kind = "response.incomplete" if incomplete else "response.completed"
        yield event(kind, response=self.response("incomplete" if incomplete else "completed", text, usage, incomplete))
