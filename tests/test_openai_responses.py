"""OpenAI's Responses API (`/v1/responses`, client/openai_routes/responses_api.py) through the
served routes with the real OpenAI SDK: the same text as the chat route, streamed and not, usage,
instructions, JSON output, and what is refused."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.server

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(openai_routes):
    with openai.OpenAI(base_url=openai_routes.url, api_key="none", max_retries=0, timeout=120) as c:
        yield c


def test_a_response_is_the_chat_answer(client):
    chat = client.chat.completions.create(model="generator", temperature=0, max_tokens=12, messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}])
    reply = client.responses.create(model="generator", temperature=0, max_output_tokens=12,
                                    instructions="Answer briefly.", input=QUESTION)
    assert reply.output_text == chat.choices[0].message.content
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == chat.usage.completion_tokens
    assert reply.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    listed = client.responses.create(model="generator", temperature=0, max_output_tokens=12, input=[
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    assert listed.output_text == reply.output_text

    events = list(client.responses.create(model="generator", temperature=0, max_output_tokens=12, stream=True,
                                          instructions="Answer briefly.", input=QUESTION))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in (
        "response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == reply.output_text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_response_in_json(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    reply = client.responses.create(model="generator", input=QUESTION, max_output_tokens=40, temperature=0,
                                    text={"format": {"type": "json_schema", "name": "answer", "schema": schema}})
    assert reply.status == "completed" and set(json.loads(reply.output_text)) == {"city"}


def test_what_is_not_implemented_is_refused_by_name(client):
    for extra, word in (({"previous_response_id": "resp_1"}, "previous_response_id"),
                        ({"tools": [{"type": "web_search"}]}, "tools")):
        with pytest.raises(openai.BadRequestError, match=word):
            client.responses.create(model="generator", input=QUESTION, **extra)
