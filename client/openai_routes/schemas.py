"""OpenAI request bodies (pydantic) and OpenAI error objects.

Fields follow OpenAI's API reference; the sampling extras vLLM's OpenAI server also accepts
(`top_k`, `min_tokens`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`) pass through to the
generator, and so do structured outputs: OpenAI's `response_format` (JSON mode, a JSON schema)
and vLLM's `structured_outputs` / `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar`; chat requests take `tools` and `tool_choice` (tools.py). Any other field a
client sets (images, ...) is refused with a 400 naming it, never silently ignored.
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

# Sampling extras (vLLM's names) forwarded as they are to the generator's sampling_parameters.
SAMPLING_EXTRAS = ("top_k", "min_tokens", "repetition_penalty", "ignore_eos", "stop_token_ids")


class OpenAIError(Exception):
    """An error answered as OpenAI's error object with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Request(BaseModel):
    # Unknown fields are kept (not dropped) so that refuse_unsupported() can name them.
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # an end-user id for abuse monitoring: accepted, unused

    # vLLM's extras
    top_k: int | None = None
    min_tokens: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    # structured outputs: OpenAI's, and vLLM's newer and older names
    response_format: ResponseFormat | None = None
    structured_outputs: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # a constraint the route adds (a forced tool call: tools.py), as {what asked it: constraint}
    _also_structured: dict = PrivateAttr(default_factory=dict)

    def structured(self) -> dict | None:
        """The generator's `structured_outputs` for what the request asks, or None; more than
        one way of asking is a 400."""
        asked = dict(self._also_structured)
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            asked["response_format"] = {"json_object": True}
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise OpenAIError(400, "response_format json_schema needs json_schema.schema", param="response_format")
            asked["response_format"] = {"json": fmt.json_schema.schema_}
        if self.structured_outputs:
            asked["structured_outputs"] = self.structured_outputs
        for key, kind in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                          ("guided_grammar", "grammar")):
            if getattr(self, key) is not None:
                asked[key] = {kind: getattr(self, key)}
        if len(asked) > 1:
            raise OpenAIError(400, f"ask for one structured output, not {sorted(asked)}", param=sorted(asked)[1])
        return next(iter(asked.values()), None)

    def refuse_unsupported(self) -> None:
        """400 for any field set that these routes do not implement (kept by extra="allow")."""
        for key, value in (self.model_extra or {}).items():
            if value is not None:
                raise OpenAIError(400, f"unsupported parameter: {key!r} is not implemented by this server",
                                  param=key, code="unsupported_parameter")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: to which call

    def for_template(self) -> dict:
        """The message as chat templates take it (Hugging Face's convention: `developer` is the
        newer `system`; a call's arguments as an object)."""
        out = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _json_or_text(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            out["name"] = self.name
        return out

    def text(self) -> str:
        """The message's text: a string, or its text parts joined (other parts are refused)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise OpenAIError(400, f"message content of type {part.type!r} is not supported (text only)",
                                  param="messages")
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None  # accepted: a reply may hold several calls either way

    def output_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def conversation(self) -> list[dict]:
        """The messages as the chat template wants them (ChatMessage.for_template)."""
        return [m.for_template() for m in self.messages]


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1)

    def output_budget(self) -> int | None:
        return self.max_tokens


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    refuse_unsupported = _Request.refuse_unsupported


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize body: a `prompt` (special tokens added unless add_special_tokens is false)
    or chat `messages` (rendered for the reply; none added unless asked)."""

    model_config = ConfigDict(extra="allow")
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None  # default true: rendered for the reply
    return_token_strs: bool = False

    refuse_unsupported = _Request.refuse_unsupported


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    tokens: list[int]

    refuse_unsupported = _Request.refuse_unsupported


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")  # structured documents (Cohere's rank_fields) are not supported
    text: str


class RerankRequest(BaseModel):
    """The rerank API of Cohere and Jina as vLLM and Hugging Face's text-embeddings-inference
    serve it: a query, its candidate documents (strings or `{"text": ...}`), `top_n` and
    `return_documents`; TEI's `truncate` (cut each document to fit the model) and `raw_scores`
    (the logit, not its sigmoid) pass through to the reranker model."""

    model_config = ConfigDict(extra="allow")

    model: str
    query: str
    documents: list[str | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = True
    truncate: bool = False
    raw_scores: bool = False

    refuse_unsupported = _Request.refuse_unsupported

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class ScoreRequest(BaseModel):
    """vLLM's score API for cross-encoders: `text_1` one text scored against each of `text_2`, or
    two lists of one length scored pair by pair; `truncate` and `raw_scores` as for rerank."""

    model_config = ConfigDict(extra="allow")

    model: str
    text_1: str | list[str]
    text_2: str | list[str]
    truncate: bool = False
    raw_scores: bool = False

    refuse_unsupported = _Request.refuse_unsupported

    def pairs(self) -> list[tuple[str, str]]:
        """The (query, text) pairs in answer order; a ValueError names what does not pair up."""
        first = [self.text_1] if isinstance(self.text_1, str) else list(self.text_1)
        second = [self.text_2] if isinstance(self.text_2, str) else list(self.text_2)
        if not first or not second:
            raise ValueError("text_1 and text_2 must not be empty")
        if len(first) == 1:
            return [(first[0], t) for t in second]
        if len(first) != len(second):
            raise ValueError(f"text_1 has {len(first)} texts and text_2 {len(second)}: send one text_1, or as many "
                             f"as text_2")
        return list(zip(first, second))


class ClassifyRequest(BaseModel):
    """vLLM's classification API: one text or a list; `truncate` (cut each text to fit the
    model) passes through to the classifier model."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[str]
    truncate: bool = False

    refuse_unsupported = _Request.refuse_unsupported

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


def _json_or_text(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
