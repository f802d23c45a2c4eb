"""The OpenAI routes' request arithmetic, without a server: the default `max_tokens`, the 400s
with the numbers, and which sampling keys reach the generator (only those a request sets)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from tritonformer.client.openai_routes.generation import output_budget, sampling_parameters  # noqa: E402
from tritonformer.client.openai_routes.schemas import (  # noqa: E402
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
)
from tritonformer.client.openai_routes.served_models import GENERATOR, ServedModel, context_length  # noqa: E402

MODEL = ServedModel("generator", GENERATOR, Path("."), None, frozenset(), frozenset(), context_length=8192,
                    max_tokens_limit=4096)


@pytest.mark.parametrize("prompt, expected", [(10, 4096), (4096, 4096), (5000, 3192), (8191, 1)])
def test_default_max_tokens_is_the_room_left_capped_by_the_limit(prompt, expected):
    assert output_budget(MODEL, prompt, None) == expected


@pytest.mark.parametrize("prompt, asked, words", [
    (8192, None, ["8192", "no room"]),
    (9000, 5, ["8192", "9000"]),
    (10, 4097, ["4097", "4096"]),
    (8000, 1000, ["8192", "9000", "8000", "1000"]),
])
def test_budgets_that_do_not_fit_are_400s_with_the_numbers(prompt, asked, words):
    with pytest.raises(OpenAIError) as caught:
        output_budget(MODEL, prompt, asked)
    assert caught.value.status == 400 and all(w in caught.value.message for w in words), caught.value.message


def test_an_asked_budget_that_fits_is_kept():
    assert output_budget(MODEL, 8000, 192) == 192


def test_context_length_reads_the_checkpoint_and_max_model_len():
    assert context_length({"max_position_embeddings": 8192}, "auto") == 8192
    assert context_length({"max_position_embeddings": 8192}, "2048") == 2048
    assert context_length({"n_positions": 1024}, "") == 1024  # GPT-2's name
    # (DeepSeek-V3.2 / GLM-5: served up to index_topk tokens a sequence)
    assert context_length({"max_position_embeddings": 163840, "index_topk": 2048}, "auto") == 2048


def test_only_the_keys_a_request_sets_reach_the_generator():
    chat = ChatCompletionRequest(model="generator", messages=[{"role": "user", "content": "hi"}])
    assert sampling_parameters(chat, 7, None) == {"max_tokens": 7, "temperature": 1.0}  # OpenAI's default

    full = CompletionRequest(model="generator", prompt="hi", temperature=0, n=3, stop="\n", seed=-5, top_p=0.9,
                             frequency_penalty=0.5, presence_penalty=0.0, logit_bias={"42": -100}, top_k=5,
                             min_tokens=2, repetition_penalty=1.1, ignore_eos=True, stop_token_ids=[7])
    assert sampling_parameters(full, 16, 2) == {
        "max_tokens": 16, "temperature": 0, "n": 3, "stop": ["\n"], "logprobs": 2, "top_p": 0.9, "seed": -5,
        "frequency_penalty": 0.5, "presence_penalty": 0.0, "logit_bias": {"42": -100}, "top_k": 5, "min_tokens": 2,
        "repetition_penalty": 1.1, "ignore_eos": True, "stop_token_ids": [7]}


def test_structured_outputs_reach_the_generator_as_its_structured_outputs():
    hi = [{"role": "user", "content": "hi"}]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = [({"response_format": {"type": "json_object"}}, {"json_object": True}),
             ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
              {"json": schema}),
             ({"response_format": {"type": "text"}}, None),
             ({"guided_regex": "[a-z]+"}, {"regex": "[a-z]+"}), ({"guided_choice": ["a", "b"]}, {"choice": ["a", "b"]}),
             ({"structured_outputs": {"grammar": "root ::= \"x\""}}, {"grammar": "root ::= \"x\""})]
    for fields, expected in cases:
        req = ChatCompletionRequest(model="generator", messages=hi, **fields)
        req.refuse_unsupported()
        assert sampling_parameters(req, 7, None).get("structured_outputs") == expected, fields
    both = ChatCompletionRequest(model="generator", messages=hi, guided_regex="a", response_format={"type": "json_object"})
    with pytest.raises(OpenAIError, match="one structured output"):
        sampling_parameters(both, 7, None)
    no_schema = ChatCompletionRequest(model="generator", messages=hi, response_format={"type": "json_schema"})
    with pytest.raises(OpenAIError, match="json_schema.schema"):
        sampling_parameters(no_schema, 7, None)


def test_unimplemented_fields_are_refused_by_name():
    req = ChatCompletionRequest(model="generator", messages=[{"role": "user", "content": "hi"}],
                                modalities=["audio"])
    with pytest.raises(OpenAIError, match="modalities"):
        req.refuse_unsupported()
    ChatCompletionRequest(model="generator", messages=[{"role": "user", "content": "hi"}],
                          modalities=None).refuse_unsupported()  # null: not set
