"""A generation request's sampling parameters, parsed and validated from its JSON.

The keys are vLLM's `SamplingParams` names, so the JSON that Triton's OpenAI frontend builds with
`--backend vllm` (every OpenAI field with its default: `n`, `best_of`, `frequency_penalty`,
`presence_penalty`, `ignore_eos`, `temperature`, `top_p`, `max_tokens`; `min_tokens`, `seed`,
`stop`, `logit_bias`, `logprobs`, `structured_outputs` / `guided_decoding` when set) parses as it is. A key we know but do not implement
is accepted at its neutral value and refused, with its name, at any other: a request never
silently gets less than it asked for.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property

from tritonformer.backend.decoder.structured import StructuredSpec, parse_structured
from tritonformer.backend.errors import InvalidRequest

MAX_N = 16  # samples per request (n): each is a sequence of its own in the running batch
MAX_LOGPROBS = 20  # top tokens per position (OpenAI's chat API allows 20)
MAX_LOGIT_BIAS = 1024  # entries in logit_bias


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy, the default: same prompt, same answer
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None  # any integer (negative too); folded to 64 bits
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    apply_chat_template: bool = False
    n: int = 1  # samples of the prompt, prefilled once (responses carry their `index`)
    frequency_penalty: float = 0.0  # OpenAI: minus penalty * (times the token was generated)
    presence_penalty: float = 0.0  # OpenAI: minus penalty once the token was generated
    repetition_penalty: float = 1.0  # Hugging Face: prompt and generated tokens' logits / or * by it
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens were generated
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    logprobs: int | None = None  # top tokens' log-probabilities per output token (None = off)
    structured: StructuredSpec | None = None  # the text held to a JSON schema, regex, ... (structured.py)

    @property
    def penalized(self) -> bool:
        """Whether the sampler needs this sequence's token counts (the costly per-row state)."""
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def processed(self) -> bool:
        """Whether the logits change before the pick (penalties, bias, min_tokens masking, a
        structured output's grammar)."""
        return self.penalized or bool(self.logit_bias) or self.min_tokens > 0 or self.structured is not None

    @property
    def argmax(self) -> bool:
        """The pick is the largest (processed) logit: no randomness."""
        return self.temperature == 0.0 or self.top_k == 1

    @cached_property  # read for every row of every launch; fields are set only while parsing
    def greedy(self) -> bool:
        """The argmax of the model's raw logits is the whole answer: the fast path (a decode
        graph's own argmax), with nothing to process and no log-probabilities to report."""
        return self.argmax and not self.processed and self.logprobs is None


# Keys vLLM (and the OpenAI frontend) may send that we accept only at their neutral value:
# key -> (neutral values, what to say when another is sent).
_NEUTRAL_ONLY = {
    "best_of": ((None, 1), "best_of > n (ranking extra samples) is not implemented; send best_of equal to n or leave it out"),
    "min_p": ((None, 0, 0.0), "min_p is not implemented; send 0 or leave it out"),
    "use_beam_search": ((None, False), "beam search is not implemented"),
    "length_penalty": ((None, 1, 1.0), "length_penalty (beam search) is not implemented"),
    "early_stopping": ((None, False), "early_stopping (beam search) is not implemented"),
    "include_stop_str_in_output": ((None, False), "include_stop_str_in_output is not implemented: stop strings are cut"),
    "skip_special_tokens": ((None, True), "skip_special_tokens=false is not implemented"),
    "spaces_between_special_tokens": ((None, True), "spaces_between_special_tokens=false is not implemented"),
    "prompt_logprobs": ((None,), "prompt_logprobs is not implemented"),
    "detokenize": ((None, True), "detokenize=false is not implemented"),
    "truncate_prompt_tokens": ((None,), "truncate_prompt_tokens is not implemented"),
    "bad_words": ((None, []), "bad_words is not implemented"),
    "allowed_token_ids": ((None,), "allowed_token_ids is not implemented"),
    "lora_name": ((None,), "LoRA adapters are not supported by this model"),
    "top_logprobs": ((None,), "top_logprobs: send the number of top tokens as logprobs"),
}

_FIELDS = set(SamplingParams.__dataclass_fields__) - {"structured"}
STRUCTURED_KEYS = ("structured_outputs", "guided_decoding")  # vLLM's names, newer and older
KNOWN_KEYS = frozenset(_FIELDS | set(_NEUTRAL_ONLY) | set(STRUCTURED_KEYS))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def _is_neutral(value, neutral: tuple) -> bool:
    """`value` equals one of `neutral`, a number equal to a number (1 == 1.0), never a bool to a
    number (true is not 1)."""
    for n in neutral:
        if n is None:
            continue
        if isinstance(value, bool) or isinstance(n, bool):
            if value is n:
                return True
        elif value == n and (type(value) is type(n) or (_is_number(value) and _is_number(n))):
            return True
    return False


def _float_in(obj: dict, key: str, lo: float, hi: float, what: str) -> float:
    v = obj[key]
    if not _is_number(v) or not lo <= v <= hi:
        raise InvalidRequest(f"{key} must be a number in {what}, got {v!r}")
    return float(v)


def parse_sampling_parameters(raw: str | None, max_tokens_limit: int, vocab_size: int) -> SamplingParams:
    """Parse the `sampling_parameters` JSON object; every bad value is an InvalidRequest. A key
    set to null means its default, as vLLM reads it."""
    params = SamplingParams()
    if raw is None or raw.strip() == "":
        return params
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"sampling_parameters is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise InvalidRequest("sampling_parameters must be a JSON object")
    unknown = sorted(set(obj) - KNOWN_KEYS)
    if unknown:
        raise InvalidRequest(f"unknown key(s) in sampling_parameters: {unknown}; known keys: {sorted(KNOWN_KEYS)}")
    obj = {k: v for k, v in obj.items() if v is not None}

    for key, (neutral, message) in _NEUTRAL_ONLY.items():
        if key not in obj or _is_neutral(obj[key], neutral):
            continue
        if key == "best_of" and _is_int(obj[key]) and obj[key] == obj.get("n", 1):
            continue  # best_of == n: nothing to rank
        raise InvalidRequest(f"{key}={obj[key]!r}: {message}")

    if "max_tokens" in obj:
        v = obj["max_tokens"]
        if not _is_int(v) or not 1 <= v <= max_tokens_limit:
            raise InvalidRequest(f"max_tokens must be an integer in [1, {max_tokens_limit}], got {v!r}")
        params.max_tokens = v
    if "temperature" in obj:
        params.temperature = _float_in(obj, "temperature", 0.0, 100.0, "[0, 100]")
    if "top_k" in obj:
        v = obj["top_k"]
        if not _is_int(v) or v < -1:
            raise InvalidRequest(f"top_k must be an integer >= 0 (0 or -1 = off), got {v!r}")
        params.top_k = max(v, 0)
    if "top_p" in obj:
        v = obj["top_p"]
        if not _is_number(v) or not 0.0 < v <= 1.0:
            raise InvalidRequest(f"top_p must be a number in (0, 1], got {v!r}")
        params.top_p = float(v)
    if "seed" in obj:
        v = obj["seed"]
        if v is not None and (not _is_int(v) or not -(2**63) <= v < 2**64):
            raise InvalidRequest(f"seed must be an integer in [-2**63, 2**64), got {v!r}")
        params.seed = v
    if "stop" in obj:
        v = obj["stop"]
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v) or len(v) > 16:
            raise InvalidRequest("stop must be a non-empty string or a list of at most 16 non-empty strings")
        params.stop = v
    if "stop_token_ids" in obj:
        v = obj["stop_token_ids"]
        if not isinstance(v, list) or not all(_is_int(t) and 0 <= t < vocab_size for t in v):
            raise InvalidRequest(f"stop_token_ids must be a list of token ids in [0, {vocab_size})")
        params.stop_token_ids = v
    for key in ("ignore_eos", "apply_chat_template"):
        if key in obj:
            if not isinstance(obj[key], bool):
                raise InvalidRequest(f"{key} must be true or false, got {obj[key]!r}")
            setattr(params, key, obj[key])
    if "n" in obj:
        v = obj["n"]
        if not _is_int(v) or not 1 <= v <= MAX_N:
            raise InvalidRequest(f"n must be an integer in [1, {MAX_N}], got {v!r}")
        params.n = v
    # OpenAI's ranges (vLLM's too for the two penalties; it takes any repetition_penalty > 0).
    if "frequency_penalty" in obj:
        params.frequency_penalty = _float_in(obj, "frequency_penalty", -2.0, 2.0, "[-2, 2]")
    if "presence_penalty" in obj:
        params.presence_penalty = _float_in(obj, "presence_penalty", -2.0, 2.0, "[-2, 2]")
    if "repetition_penalty" in obj:
        v = obj["repetition_penalty"]
        if not _is_number(v) or not 0.0 < v <= 100.0:
            raise InvalidRequest(f"repetition_penalty must be a number in (0, 100] (1 = off), got {v!r}")
        params.repetition_penalty = float(v)
    if "min_tokens" in obj:
        v = obj["min_tokens"]
        if not _is_int(v) or not 0 <= v <= params.max_tokens:
            raise InvalidRequest(f"min_tokens must be an integer in [0, max_tokens={params.max_tokens}], got {v!r}")
        params.min_tokens = v
    if "logit_bias" in obj:
        params.logit_bias = _logit_bias(obj["logit_bias"], vocab_size)
    if "logprobs" in obj:
        v = obj["logprobs"]
        if v is False:  # what older OpenAI frontends forward for a chat request's default
            v = None
        elif v is True:
            v = 1
        if v is not None and (not _is_int(v) or not 0 <= v <= MAX_LOGPROBS):
            raise InvalidRequest(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (top tokens per position), got {v!r}")
        params.logprobs = v
    given = [k for k in STRUCTURED_KEYS if k in obj]
    if len(given) > 1:
        raise InvalidRequest(f"send one of {' / '.join(STRUCTURED_KEYS)}, not both")
    if given:
        params.structured = parse_structured(obj[given[0]], given[0])
    return params


def _logit_bias(v, vocab_size: int) -> dict[int, float]:
    """OpenAI's form: {"token id as a string": bias in [-100, 100]}."""
    if not isinstance(v, dict) or len(v) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"logit_bias must be an object of at most {MAX_LOGIT_BIAS} token ids -> bias")
    out = {}
    for key, bias in v.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequest(f"logit_bias keys must be token ids, got {key!r}") from None
        if not 0 <= token < vocab_size:
            raise InvalidRequest(f"logit_bias token id {token} is outside the vocabulary [0, {vocab_size})")
        if not _is_number(bias) or not -100.0 <= bias <= 100.0:
            raise InvalidRequest(f"logit_bias values must be numbers in [-100, 100], got {bias!r} for {key}")
        out[token] = float(bias)
    return out
