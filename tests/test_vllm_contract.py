"""The generator under the vLLM backend's contract, through a real tritonserver: requests built
exactly as Triton's OpenAI frontend builds them with `--backend vllm` (its
`_create_vllm_generate_request`: text_input, stream, exclude_input_in_output, sampling_parameters
= the OpenAI request's fields with their defaults, return_logprobs, return_num_input_tokens,
return_num_output_tokens), checked on what the frontend reads: text_output, num_input_tokens from
the first response, num_output_tokens summed over a stream, the logprobs JSON; plus n > 1."""
from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import grpc_stream

pytestmark = pytest.mark.server

# Fields the frontend's pydantic schemas fill with defaults (model_dump(exclude_none=True)):
COMPLETION_DEFAULTS = {"frequency_penalty": 0, "ignore_eos": False, "n": 1, "presence_penalty": 0,
                       "temperature": 1, "top_p": 1}
CHAT_DEFAULTS = {"frequency_penalty": 0, "ignore_eos": False, "n": 1, "presence_penalty": 0, "temperature": 0.7,
                 "top_p": 1}
PROMPT = "Write a list of fruits: apple, banana, cherry, apple, banana, cherry, apple, banana,"


def frontend_request(prompt: str, stream: bool, chat: bool, echo: bool | None = None, logprobs: int | None = None,
                     older: bool = False, **fields) -> dict:
    """The inputs the frontend sends for an OpenAI request with `fields` set by the user.
    `older`: a release before the return_* flags and logprobs handling (best_of forwarded,
    a chat request's `"logprobs": false` too)."""
    params = {**(CHAT_DEFAULTS if chat else COMPLETION_DEFAULTS), **fields}
    if older:
        params.update({"logprobs": False} if chat else {"best_of": 1})
    elif logprobs is not None:
        params["logprobs"] = logprobs
    params.setdefault("max_tokens", 16)
    inputs = {
        "text_input": (np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        "stream": (np.array([stream]), "BOOL"),
        "exclude_input_in_output": (np.array([not echo if echo is not None else True]), "BOOL"),
        "sampling_parameters": (np.array([json.dumps(params).encode()], dtype=np.object_), "BYTES"),
    }
    if not older:
        inputs["return_logprobs"] = (np.array([logprobs is not None]), "BOOL")
        inputs["return_num_input_tokens"] = (np.array([True]), "BOOL")
        inputs["return_num_output_tokens"] = (np.array([True]), "BOOL")
    return inputs


def infer(server, inputs: dict, timeout: float = 120.0) -> tuple[list, str | None]:
    """Every response of one request over gRPC streaming, up to the one flagged final."""
    return grpc_stream(server, "generator", inputs, timeout, until_final=True)


def text(results) -> str:
    return "".join(r.as_numpy("text_output")[0].decode() for r in results)


def usage(results) -> tuple[int, int]:
    """What the frontend computes: prompt tokens of the first response, output tokens summed."""
    for r in results:
        assert r.as_numpy("num_input_tokens").dtype == np.uint32 and r.as_numpy("num_output_tokens").dtype == np.uint32
    return int(results[0].as_numpy("num_input_tokens")[0]), sum(int(r.as_numpy("num_output_tokens").sum()) for r in results)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


def test_completion_unary_and_streamed_agree_with_usage(triton_server, tokenizer):
    unary, error = infer(triton_server, frontend_request(PROMPT, False, False, temperature=0, max_tokens=20))
    assert error is None, error
    assert len(unary) == 1  # the frontend takes responses[0]
    prompt_tokens = len(tokenizer(PROMPT)["input_ids"])
    ids = unary[0].as_numpy("output_ids").tolist()
    assert usage(unary) == (prompt_tokens, len(ids)) and len(ids) > 0
    streamed, error = infer(triton_server, frontend_request(PROMPT, True, False, temperature=0, max_tokens=20))
    assert error is None, error
    assert len(streamed) > 3 and text(streamed) == text(unary)
    assert usage(streamed) == usage(unary)  # each streamed response counts its own new tokens
    for r in streamed:
        assert int(r.as_numpy("num_output_tokens")[0]) == len(r.as_numpy("output_ids"))


def test_echo_puts_the_prompt_first(triton_server):
    plain, _ = infer(triton_server, frontend_request(PROMPT, False, False, temperature=0, max_tokens=8))
    echoed, error = infer(triton_server, frontend_request(PROMPT, False, False, echo=True, temperature=0, max_tokens=8))
    assert error is None, error
    assert text(echoed) == PROMPT + text(plain) and usage(echoed) == usage(plain)
    streamed, error = infer(triton_server, frontend_request(PROMPT, True, False, echo=True, temperature=0, max_tokens=8))
    assert error is None and text(streamed) == PROMPT + text(plain)


def test_chat_with_a_negative_seed_streams_what_it_answers(triton_server, tokenizer):
    messages = [{"role": "user", "content": "Name three colors."}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    req = dict(seed=-12345, max_tokens=24)  # temperature: the chat default 0.7
    unary, error = infer(triton_server, frontend_request(prompt, False, True, **req))
    assert error is None, error
    streamed, error = infer(triton_server, frontend_request(prompt, True, True, **req))
    assert error is None, error
    assert text(streamed) == text(unary) and usage(streamed) == usage(unary)
    other, _ = infer(triton_server, frontend_request(prompt, False, True, seed=-12346, max_tokens=24))
    assert text(other) != text(unary)  # really sampling
    older, error = infer(triton_server, frontend_request(prompt, False, True, older=True, **req))
    assert error is None and text(older) == text(unary)  # "logprobs": false, no return_* inputs
    assert older[0].as_numpy("num_input_tokens") is None


def test_stop_and_min_tokens(triton_server):
    base, _ = infer(triton_server, frontend_request(PROMPT, False, False, temperature=0, max_tokens=20))
    words = text(base).split(",")
    assert len(words) > 2
    stop = words[1].strip()
    cut, error = infer(triton_server, frontend_request(PROMPT, False, False, temperature=0, max_tokens=20, stop=[stop]))
    assert error is None, error
    assert text(cut) == text(base)[: text(base).index(stop)]
    assert cut[0].as_numpy("finish_reason")[0] == b"stop"
    forced, error = infer(triton_server, frontend_request("The end.", False, False, temperature=0, max_tokens=12,
                                                         min_tokens=12))
    assert error is None and usage(forced)[1] == 12  # EOS masked until 12 tokens


def test_penalties_change_greedy_repetition(triton_server):
    base, _ = infer(triton_server, frontend_request(PROMPT, False, False, temperature=0, max_tokens=30, ignore_eos=True))
    pen, error = infer(triton_server, frontend_request(PROMPT, False, False, temperature=0, max_tokens=30,
                                                      ignore_eos=True, frequency_penalty=2.0, presence_penalty=2.0))
    assert error is None, error

    def repeats(results):
        ids = results[0].as_numpy("output_ids").tolist()
        return len(ids) - len(set(ids))

    assert repeats(pen) < repeats(base)


def test_logprobs_json_per_streamed_token(triton_server):
    streamed, error = infer(triton_server, frontend_request(PROMPT, True, False, logprobs=2, temperature=0,
                                                           max_tokens=10))
    assert error is None, error
    for r in streamed:
        entries = json.loads(r.as_numpy("logprobs")[0])
        ids = r.as_numpy("output_ids").tolist()
        assert len(entries) == len(ids) == int(r.as_numpy("num_output_tokens")[0])
        for token, entry in zip(ids, entries):
            assert 2 <= len(entry) <= 3
            mine = entry[str(token)]
            assert mine["rank"] == 1 and mine["logprob"] <= 0 and isinstance(mine["decoded_token"], str)
            ranked = sorted(entry.values(), key=lambda e: e["rank"])
            assert [e["rank"] for e in ranked][-1] <= 2 and ranked[0]["logprob"] >= ranked[-1]["logprob"]
    asked_none, _ = infer(triton_server, {**frontend_request(PROMPT, False, False, temperature=0, max_tokens=4),
                                          "return_logprobs": (np.array([True]), "BOOL")})
    assert asked_none[0].as_numpy("logprobs")[0] == b"null"  # as vLLM: no logprobs in the sampling parameters


def test_n_samples_share_the_prompt_and_are_told_apart(triton_server):
    long_prompt = PROMPT * 3  # several KV blocks to share
    greedy, _ = infer(triton_server, frontend_request(long_prompt, False, False, temperature=0, max_tokens=12))
    both, error = infer(triton_server, frontend_request(long_prompt, False, False, temperature=0, max_tokens=12, n=2))
    assert error is None, error
    assert sorted(int(r.as_numpy("index")[0]) for r in both) == [0, 1]
    assert all(text([r]) == text(greedy) for r in both)  # the shared prefill is the same prefill
    sampled, error = infer(triton_server, frontend_request(long_prompt, True, False, seed=3, max_tokens=12, n=3))
    assert error is None, error
    by_index = {i: [r for r in sampled if int(r.as_numpy("index")[0]) == i] for i in range(3)}
    texts = {i: text(rs) for i, rs in by_index.items()}
    assert all(by_index.values()) and len(set(texts.values())) == 3
    assert all(rs[-1].as_numpy("finish_reason") is not None for rs in by_index.values())
    first, _ = infer(triton_server, frontend_request(long_prompt, True, False, seed=3, max_tokens=12))
    assert text(first) == texts[0]  # sample 0 draws what n = 1 draws


@pytest.mark.parametrize("fields,key", [({"best_of": 3}, "best_of"), ({"min_p": 0.2}, "min_p"),
                                        ({"guided_decoding": "{}"}, "guided_decoding"), ({"typo": 1}, "typo")])
def test_unimplemented_values_are_refused_by_name(triton_server, fields, key):
    results, error = infer(triton_server, frontend_request(PROMPT, False, False, **fields))
    assert error is not None and key in error and not results
