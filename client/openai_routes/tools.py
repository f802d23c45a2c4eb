"""Tool calling on /v1/chat/completions: OpenAI's `tools` and `tool_choice`.

The tools go to the checkpoint's chat template (its `tools` variable, as Hugging Face's
apply_chat_template passes them), and what the model writes is read back as calls:

- `tool_choice` "auto" (the default when tools are given): the model decides; its text is parsed
  in the format its chat template teaches (`detect_format`): Hermes-style
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen2.5, Qwen3, Hermes,
  SmolLM3 and most open models), or Llama 3.1's bare JSON `{"name": ..., "parameters": {...}}`.
  A template that teaches neither cannot take "auto": a 400 says so.
- "required" or a named function: the reply is constrained (structured outputs) to a JSON object
  `{"name": <one of the tools>, "arguments": <its parameters' schema>}`, whatever the template,
  so the answer is a valid call by construction.
- "none": the tools are shown to the template, the reply is text.

A streamed answer with tools comes whole, in one content / tool_calls chunk at the end: a call's
text is not known to be one until it is complete.
"""
from __future__ import annotations

import json
import re
import uuid

from tritonformer.client.openai_routes.schemas import OpenAIError

HERMES, LLAMA3_JSON = "hermes", "llama3_json"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def detect_format(chat_template: str | None) -> str | None:
    """The tool-call format a chat template teaches, or None."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return HERMES
    if '"parameters"' in chat_template and "tools" in chat_template:
        return LLAMA3_JSON
    return None


def forced_schema(tools: list[dict], name: str | None) -> dict:
    """The JSON schema of one call of the named tool, or of any of them (tool_choice "required")."""
    options = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not options:
        raise OpenAIError(400, f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": f["name"]},
                             "arguments": f.get("parameters") or {"type": "object"}}} for f in options]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def _call(obj) -> dict | None:
    """{"name", "arguments"} of a parsed call object (Llama's "parameters" as arguments), or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # (some models write the arguments as a JSON string)
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return {"name": obj["name"], "arguments": arguments}


def parse_calls(text: str, fmt: str) -> tuple[str | None, list[dict]]:
    """(the reply's content, its calls) of a reply in `fmt`; a reply whose calls do not parse is
    all content. `fmt` "forced": the whole reply is one call object."""
    if fmt == HERMES:
        calls = []
        for block in _HERMES_CALL.findall(text):
            try:
                call = _call(json.loads(block))
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, []
            calls.append(call)
        content = _HERMES_CALL.sub("", text).strip() if calls else text
        return (content or None) if calls else text, calls
    try:
        obj = json.loads(text.strip())
    except json.JSONDecodeError:
        return text, []
    call = _call(obj)
    return (None, [call]) if call is not None else (text, [])


def tool_call_objects(calls: list[dict]) -> list[dict]:
    """OpenAI's `tool_calls` for parsed calls (arguments as a JSON string, a fresh id each)."""
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
            for c in calls]


class ToolUse:
    """One request's tools: what the template gets, the constraint a forced choice adds, and how
    to read the reply (`fmt` None: the reply is text)."""

    def __init__(self, tools: list[dict] | None, tool_choice, chat_template: str | None, model: str):
        self.tools = tools or []
        choice = tool_choice if tool_choice is not None else ("auto" if self.tools else "none")
        self.structured = None
        self.fmt = None
        if isinstance(choice, dict):
            if choice.get("type") != "function" or not isinstance((choice.get("function") or {}).get("name"), str):
                raise OpenAIError(400, 'tool_choice must be "none", "auto", "required" or {"type": "function", '
                                       '"function": {"name": ...}}', param="tool_choice")
            name = choice["function"]["name"]
        elif choice in ("none", "auto", "required"):
            name = None
        else:
            raise OpenAIError(400, f"unknown tool_choice {choice!r}", param="tool_choice")
        if choice != "none" and not self.tools:
            raise OpenAIError(400, "tool_choice needs tools", param="tool_choice")
        for t in self.tools:
            if t.get("type") != "function" or not isinstance((t.get("function") or {}).get("name"), str):
                raise OpenAIError(400, 'each of tools must be {"type": "function", "function": {"name": ..., '
                                       '"parameters": {...}}}', param="tools")
        if choice == "required" or isinstance(choice, dict):
            self.structured, self.fmt = {"json": forced_schema(self.tools, name)}, "forced"
        elif choice == "auto":
            self.fmt = detect_format(chat_template)
            if self.fmt is None:
                raise OpenAIError(400, f"model {model!r}'s chat template does not teach a tool-call format this "
                                       f"server reads (Hermes <tool_call> blocks, Llama 3.1 JSON); send tool_choice "
                                       f'"required" or a named function to constrain the reply to a call',
                                  param="tool_choice")

    @property
    def active(self) -> bool:
        return self.fmt is not None

    def message(self, text: str) -> tuple[dict, bool]:
        """The assistant message for a finished reply, and whether it calls tools."""
        content, calls = parse_calls(text, self.fmt)
        if not calls:
            return {"role": "assistant", "content": text}, False
        return {"role": "assistant", "content": content, "tool_calls": tool_call_objects(calls)}, True
