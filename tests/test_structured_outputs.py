"""Structured outputs (backend/decoder/structured.py): the request format, the sampler held to a
grammar on the real SmolLM2 vocabulary under random logits (whatever the model would say, the
text is valid), and the served generator and OpenAI routes answering valid JSON."""
from __future__ import annotations

import json
import re

import pytest
import torch

from tritonformer.backend.decoder.sampling import Sampler
from tritonformer.backend.decoder.sampling_params import SamplingParams, parse_sampling_parameters
from tritonformer.backend.decoder.structured import StructuredSpec, parse_structured
from tritonformer.backend.errors import InvalidRequest

pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "color"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
                         "color": {"enum": ["red", "green"]}}}


def _valid(text: str) -> bool:
    obj = json.loads(text)
    return (set(obj) == {"name", "age", "color"} and isinstance(obj["name"], str) and len(obj["name"]) <= 8
            and isinstance(obj["age"], int) and obj["color"] in ("red", "green"))


def test_the_request_names_one_constraint():
    parse = lambda obj: parse_sampling_parameters(json.dumps(obj), 64, 100)  # noqa: E731
    assert parse({"structured_outputs": {"json": SCHEMA}}).structured == StructuredSpec(
        "json", json.dumps(SCHEMA, sort_keys=True))
    assert parse({"guided_decoding": {"json": json.dumps(SCHEMA)}}).structured.kind == "json"  # (the older name)
    assert parse({"structured_outputs": {"json_object": True}}).structured == StructuredSpec("json_object")
    assert parse({"structured_outputs": {"choice": ["a", "b"]}}).structured.value == '["a", "b"]'
    assert parse({"structured_outputs": {"regex": "[0-9]+"}}).structured == StructuredSpec("regex", "[0-9]+")
    assert parse({"structured_outputs": None}).structured is None
    assert parse({"structured_outputs": {"regex": "x", "disable_any_whitespace": True, "disable_fallback": True}}
                 ).structured == StructuredSpec("regex", "x")  # (both hold here anyway)
    p = parse({"structured_outputs": {"regex": "x"}})
    assert p.processed and not p.greedy  # never the decode graph's own argmax
    for bad, message in [({"structured_outputs": {"json": SCHEMA, "regex": "x"}}, "exactly one"),
                         ({"structured_outputs": {"yaml": "x"}}, "unsupported key"),
                         ({"structured_outputs": {"json": "{not json"}}, "not valid JSON"),
                         ({"structured_outputs": {"choice": []}}, "non-empty list"),
                         ({"structured_outputs": "x"}, "must be an object"),
                         ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " ?"}}, "whitespace_pattern"),
                         ({"structured_outputs": {"regex": "x"}, "guided_decoding": {"regex": "y"}}, "not both")]:
        with pytest.raises(InvalidRequest, match=message):
            parse(bad)


def test_bitmask_unpacks_bit_j_of_word_w_as_token_32w_plus_j():
    from tritonformer.backend.decoder.structured import unpack_bitmask

    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (3, 10), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    expected = torch.tensor([[(int(bits[r, t // 32]) >> (t % 32)) & 1 for t in range(300)] for r in range(3)]).bool()
    assert torch.equal(unpack_bitmask(bits, 300), expected)


@pytest.fixture(scope="module")
def grammars(smollm2_dir):
    from tritonformer.backend.decoder.structured import Grammars
    from tritonformer.backend.tokenization import TextTokenizer

    tokenizer = TextTokenizer(smollm2_dir)
    return tokenizer, Grammars(tokenizer.backend, 49152, (2,))


def _sample_under(grammars, spec: StructuredSpec, seed: int, eos_boost: float = 0.0, limit: int = 80):
    """Sample under `spec` from random logits (optionally pushing EOS up): (text, ended by EOS)."""
    tokenizer, g = grammars
    sampler = Sampler((2,), grammars=lambda: g)
    params = SamplingParams(temperature=1.0, seed=seed, structured=spec, max_tokens=limit)
    sampler.register(1, params, [])
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(limit):
        logits = torch.randn(1, 49152, generator=gen) * 3
        logits[0, 2] += eos_boost
        token = sampler.sample(logits, [params], [1])[0]
        if token == 2:
            return tokenizer.decode(out), True
        sampler.accept(1, token)
        out.append(token)
    return tokenizer.decode(out), False


@pytest.mark.parametrize("seed", range(4))
def test_random_logits_under_a_schema_give_valid_json(grammars, seed):
    text, ended = _sample_under(grammars, parse_structured({"json": SCHEMA}, "s"), seed, eos_boost=50.0)
    assert ended and _valid(text), text  # EOS only once the object is complete, however likely


@pytest.mark.parametrize("seed", range(3))
def test_random_logits_under_a_choice_a_regex_and_a_grammar(grammars, seed):
    text, ended = _sample_under(grammars, parse_structured({"choice": ["yes", "no", "a.b (c)"]}, "s"), seed)
    assert ended and text in ("yes", "no", "a.b (c)")
    text, ended = _sample_under(grammars, parse_structured({"regex": r"[0-9]{3}-[a-z]{2}"}, "s"), seed)
    assert ended and re.fullmatch(r"[0-9]{3}-[a-z]{2}", text), text
    grammar = 'root ::= "(" digits ("," digits)? ")"\ndigits ::= [0-9] | [0-9] [0-9]'
    text, ended = _sample_under(grammars, parse_structured({"grammar": grammar}, "s"), seed)
    assert ended and re.fullmatch(r"\(\d{1,2}(,\d{1,2})?\)", text), text


def test_unconstrained_random_logits_would_not_have_been_json(grammars):
    """The check above can fail: the same draws without the grammar are not valid JSON."""
    tokenizer, _ = grammars
    gen = torch.Generator().manual_seed(0)
    text = tokenizer.decode([int(torch.randn(49152, generator=gen).argmax()) for _ in range(20)])
    with pytest.raises(ValueError):
        json.loads(text)


def test_a_schema_that_does_not_compile_is_a_request_error(grammars):
    _, g = grammars
    sampler = Sampler((2,), grammars=lambda: g)
    params = SamplingParams(structured=StructuredSpec("regex", "(unclosed"))
    with pytest.raises(InvalidRequest, match="does not compile"):
        sampler.register(3, params, [])


def test_the_engine_runs_constrained_and_free_sequences_together(smollm2_dir):
    """A constrained sequence beside free ones (rounds of several decode iterations allowed): its
    text is valid, and theirs are what they are without it."""
    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
    from tritonformer.backend.decoder.build import EngineOptions, build_engine
    from tritonformer.backend.models.decoder import load_decoder
    from tritonformer.backend.tokenization import TextTokenizer

    model = load_decoder(load_config(smollm2_dir), load_state_dict(smollm2_dir), torch.device("cpu"), torch.float32)
    tokenizer = TextTokenizer(smollm2_dir)

    class Sink:
        def __init__(self):
            self.ids, self.errors = {}, []

        def send(self, handle, outputs, error, final):
            if error is not None:
                self.errors.append(error)
            self.ids.setdefault(handle, []).extend(outputs.get("output_ids", []) if outputs else [])

        def is_cancelled(self, handle):
            return False

    def run(constrained: bool) -> dict:
        sink = Sink()
        engine = build_engine(model, tokenizer, sink, EngineOptions(cuda_graphs=False, kv_cache_tokens="9000",
                                                                    max_decode_steps=4))
        free = SamplingParams(max_tokens=12, ignore_eos=True)
        seqs = [engine.new_sequence(i, tokenizer.encode(p), free, False)
                for i, p in enumerate(["The capital of France is", "def add(a, b):"])]
        if constrained:
            seqs.append(engine.new_sequence("json", tokenizer.encode("A person:"),
                                            SamplingParams(max_tokens=60, structured=parse_structured({"json": SCHEMA}, "s")),
                                            False))
        engine.admit(seqs)
        while engine.has_work():
            engine.step()
        assert not sink.errors
        return sink.ids

    alone, together = run(False), run(True)
    assert together[0] == alone[0] and together[1] == alone[1]
    assert _valid(tokenizer.decode([int(t) for t in together["json"] if int(t) != 2]))


# --- served --------------------------------------------------------------------------------

@pytest.mark.server
def test_served_generator_answers_the_schema(triton_server):
    from helpers import http_post

    params = {"max_tokens": 60, "structured_outputs": {"json": SCHEMA}}
    for prompt in ("A person:", "Describe a cat as JSON."):
        status, body = http_post(triton_server, "/v2/models/generator/generate",
                                 {"text_input": prompt, "stream": False, "sampling_parameters": json.dumps(params)})
        assert status == 200, body
        assert body["finish_reason"] == "stop" and _valid(body["text_output"]), body
    status, body = http_post(triton_server, "/v2/models/generator/generate", {
        "text_input": "x", "stream": False,
        "sampling_parameters": json.dumps({"structured_outputs": {"regex": "(unclosed"}})})
    assert status == 400 and "does not compile" in json.dumps(body), body


@pytest.mark.server
def test_openai_response_format_json_schema(openai_routes):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=openai_routes.url, api_key="none", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model="generator", messages=[{"role": "user", "content": "Give me a person as JSON."}], max_tokens=60,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
    assert reply.choices[0].finish_reason == "stop" and _valid(reply.choices[0].message.content)
    reply = client.chat.completions.create(
        model="generator", messages=[{"role": "user", "content": "yes or no?"}], max_tokens=8,
        extra_body={"guided_choice": ["yes", "no"]})
    assert reply.choices[0].message.content in ("yes", "no")
