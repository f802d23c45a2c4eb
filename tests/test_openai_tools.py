"""Tool calling on the OpenAI chat route (client/openai_routes/tools.py): reading calls in the
formats chat templates teach, the constraint a forced call adds, the tools reaching the template,
and the served route answering a valid call from the real SmolLM2 with the OpenAI SDK."""
from __future__ import annotations

import json

import pytest

from tritonformer.client.openai_routes.schemas import ChatCompletionRequest, OpenAIError
from tritonformer.client.openai_routes.tools import HERMES, LLAMA3_JSON, ToolUse, detect_format, parse_calls

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
HERMES_TEMPLATE = "{% if tools %}<tools>{{ tools | tojson }}</tools> answer in <tool_call></tool_call>{% endif %}"


def test_hermes_blocks_and_llama_json_are_read_as_calls():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n' \
           '</tool_call>\n<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}</tool_call>'
    content, calls = parse_calls(text, HERMES)
    assert content == "Let me check." and calls == [
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}},
        {"name": "get_time", "arguments": {"zone": "UTC"}}]
    assert parse_calls("no calls here", HERMES) == ("no calls here", [])
    broken = "<tool_call>{not json}</tool_call>"
    assert parse_calls(broken, HERMES) == (broken, [])  # a call that does not parse stays text
    assert parse_calls(' {"name": "get_time", "parameters": {"zone": "CET"}}', LLAMA3_JSON) == (
        None, [{"name": "get_time", "arguments": {"zone": "CET"}}])
    assert parse_calls("The answer is 4.", LLAMA3_JSON) == ("The answer is 4.", [])
    assert detect_format(HERMES_TEMPLATE) == HERMES
    assert detect_format('{% if tools %}Respond with {"name": function name, "parameters": ...}{% endif %}') == LLAMA3_JSON
    assert detect_format("{{ messages }}") is None and detect_format(None) is None


def test_tool_choice_decides_how_the_reply_is_read():
    auto = ToolUse([WEATHER], None, HERMES_TEMPLATE, "m")
    assert auto.fmt == HERMES and auto.structured is None
    message, calls = auto.message('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}'
                                  '</tool_call>')
    assert calls and message["content"] is None and message["tool_calls"][0]["type"] == "function"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo", "unit": "C"}
    assert auto.message("It is sunny.") == ({"role": "assistant", "content": "It is sunny."}, False)
    named = ToolUse([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, None, "m")
    assert named.fmt == "forced" and named.structured["json"]["properties"]["name"] == {"const": "get_time"}
    required = ToolUse([WEATHER, TIME], "required", None, "m")
    assert [o["properties"]["name"]["const"] for o in required.structured["json"]["anyOf"]] == ["get_weather",
                                                                                                 "get_time"]
    assert not ToolUse([WEATHER], "none", None, "m").active and not ToolUse(None, None, None, "m").active
    for tools, choice, template, words in [
            ([WEATHER], "auto", "{{ messages }}", "tool-call format"),
            ([WEATHER], {"type": "function", "function": {"name": "nope"}}, None, "nope"),
            (None, "required", None, "needs tools"), ([WEATHER], "sometimes", None, "sometimes"),
            ([{"type": "function"}], "required", None, "tools")]:
        with pytest.raises(OpenAIError, match=words):
            ToolUse(tools, choice, template, "m")


def test_tools_and_tool_messages_reach_the_template():
    from tritonformer.backend.tokenization import _render_chat_template

    req = ChatCompletionRequest(model="m", tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 C"}])
    req.refuse_unsupported()
    template = ("{{ tools[0].function.name }}|{% for m in messages %}{{ m.role }}:{{ m.content }}"
                "{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}"
                "{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %};{% endfor %}")
    assert _render_chat_template(template, messages=req.conversation(), tools=req.tools) == \
        "get_weather|user:Weather in Oslo?;assistant:Oslo;tool:4 C(call_1);"


@pytest.fixture(scope="module")
def client(openai_routes):
    openai = pytest.importorskip("openai")
    pytest.importorskip("xgrammar")
    with openai.OpenAI(base_url=openai_routes.url, api_key="none", max_retries=0, timeout=120) as c:
        yield c


@pytest.mark.server
def test_served_forced_calls_are_valid_calls(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(model="generator", messages=ask, tools=[WEATHER, TIME], max_tokens=60,
                                           temperature=0, tool_choice={"type": "function",
                                                                       "function": {"name": "get_weather"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and set(args) == {"city", "unit"} and args["unit"] in ("C", "F")

    stream = client.chat.completions.create(model="generator", messages=ask, tools=[WEATHER, TIME], max_tokens=60,
                                            tool_choice="required", stream=True)
    chunks = list(stream)
    calls = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices]
    assert len(calls) == 1 and calls[0].function.name in ("get_weather", "get_time")
    json.loads(calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.server
def test_served_auto_on_a_template_without_a_tool_format_is_a_400(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="tool-call format"):
        client.chat.completions.create(model="generator", messages=[{"role": "user", "content": "hi"}],
                                       tools=[WEATHER], max_tokens=8)
