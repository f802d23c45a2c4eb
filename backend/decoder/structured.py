"""Structured outputs: the generated text held to a JSON schema, any JSON object, a regular
expression, one of a list of choices, or an EBNF grammar (vLLM's `structured_outputs` /
`guided_decoding`, OpenAI's `response_format`).

A grammar engine (xgrammar) compiles the constraint against the checkpoint's vocabulary once
(compiled grammars are cached by the compiler); each constrained sequence holds a matcher, the
parser state of its text so far. Before each sample the matcher says which tokens may come next
(a bitmask over the vocabulary: a token that cannot continue a valid text, or ends it early, is
masked to -inf); each sampled token advances it. When the text is complete only the model's end
tokens remain. JSON comes compact (no free whitespace between tokens: a model cannot loop in it). Masks are made on the host per sequence, so a constrained sequence's next sample
waits for its previous token on the host: it sits out the iteration during which that token is on
its way (the scheduler skips it; the others run ahead as always) and takes no rounds of several.

The grammar engine is made ready on a thread of its own when the first constrained request
arrives (`prepare_grammars`: importing xgrammar and reading a 150k-token vocabulary take seconds);
that request waits aside meanwhile, and the engine runs the others. Without xgrammar such
requests are answered with an error that says so, and everything else runs as before.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import numpy as np
import torch

from tritonformer.backend.errors import InvalidRequest

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredSpec:
    kind: str  # one of KINDS
    value: str = ""  # the JSON schema (serialised), the regex or the grammar; the choices as a JSON list

    def describe(self) -> str:
        return self.kind if self.kind == "json_object" else f"{self.kind} {self.value[:80]!r}"


def parse_structured(raw, key: str) -> StructuredSpec | None:
    """vLLM's `structured_outputs` (or older `guided_decoding`) dict: exactly one of `json` (a
    schema, as an object or its JSON text), `json_object` (true: any JSON object), `regex`,
    `choice` (a list of strings) or `grammar` (EBNF, GBNF style); None or {} for none.
    `disable_fallback` and `disable_any_whitespace` are accepted and hold anyway (there is no
    other backend to fall back to; JSON comes compact); `whitespace_pattern` is refused."""
    if raw is None or raw == {}:
        return None
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{key} must be an object with one of {', '.join(KINDS)}")
    given = {k: v for k, v in raw.items() if v not in (None, False)}
    if "whitespace_pattern" in given:
        raise InvalidRequest(f"{key}.whitespace_pattern is not supported (JSON is generated compact, with no "
                             f"whitespace between its tokens)")
    unknown = sorted(set(given) - set(KINDS) - {"disable_fallback", "disable_any_whitespace"})
    if unknown:
        raise InvalidRequest(f"{key}: unsupported key(s) {unknown} (supported: {', '.join(KINDS)})")
    kinds = [k for k in KINDS if k in given]
    if len(kinds) != 1:
        raise InvalidRequest(f"{key} needs exactly one of {', '.join(KINDS)}, got {kinds or 'none'}")
    kind, value = kinds[0], given[kinds[0]]
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise InvalidRequest(f"{key}.json is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise InvalidRequest(f"{key}.json must be a JSON schema (an object)")
        return StructuredSpec("json", json.dumps(value, sort_keys=True))
    if kind == "json_object":
        if value is not True:
            raise InvalidRequest(f"{key}.json_object must be true")
        return StructuredSpec("json_object")
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequest(f"{key}.choice must be a non-empty list of non-empty strings")
        return StructuredSpec("choice", json.dumps(value))
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{key}.{kind} must be a non-empty string")
    return StructuredSpec(kind, value)


class Grammars:
    """The checkpoint's vocabulary as xgrammar sees it and a compiler with its cache: matchers
    for specs. `tokenizer` is a tokenizers.Tokenizer; `vocab_size` the model's (the logits'
    width, which may exceed the tokenizer's); `stop_ids` the tokens that end a complete text."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: tuple[int, ...]):
        try:
            import xgrammar as xgr
            from transformers import PreTrainedTokenizerFast
        except ImportError as e:
            raise InvalidRequest(f"structured outputs need the xgrammar package ({e}); pip install xgrammar") from None
        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tokenizer),
                                                  vocab_size=vocab_size, stop_token_ids=list(stop_ids) or None)
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=2)
        self._lock = threading.Lock()

    def matcher(self, spec: StructuredSpec):
        with self._lock:
            try:
                compiled = self._compile(spec)
            except Exception as e:  # (xgrammar reports a bad schema, regex or grammar as it finds it)
                raise InvalidRequest(f"structured output {spec.describe()} does not compile: {e}") from None
        return self._xgr.GrammarMatcher(compiled)

    def _compile(self, spec: StructuredSpec):
        c = self._compiler
        if spec.kind == "json":  # compact: no runs of free whitespace for a model to loop in
            return c.compile_json_schema(spec.value, any_whitespace=False)
        if spec.kind == "json_object":
            return c.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.kind == "regex":
            return c.compile_regex(spec.value)
        if spec.kind == "choice":
            return c.compile_regex("|".join(_regex_literal(s) for s in json.loads(spec.value)))
        return c.compile_grammar(spec.value)

    def allowed(self, matchers: list) -> torch.Tensor:
        """`[len(matchers), vocab]` bool: the tokens each matcher accepts next."""
        bits = self._xgr.allocate_token_bitmask(len(matchers), self.vocab_size)
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(bits, i)
        return unpack_bitmask(bits, self.vocab_size)


class PreparedGrammars:
    """Grammars built on a background thread, started by the first constrained request (`start`):
    importing xgrammar and reading a 150k-token vocabulary take seconds, which must neither stall
    the engine's thread nor be paid by a server that never constrains anything. Calling it
    starts, waits and returns them (or raises what building them raised: an InvalidRequest
    without xgrammar)."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: tuple[int, ...]):
        self._args = (tokenizer, vocab_size, stop_ids)
        self._done = threading.Event()
        self._started = False
        self._lock = threading.Lock()
        self._grammars: Grammars | None = None
        self._error: Exception | None = None

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                threading.Thread(target=self._build, daemon=True, name="tritonformer-grammars").start()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether they are built (or failed to be), waiting up to `timeout` seconds."""
        return self._done.wait(timeout)

    def _build(self) -> None:
        try:
            self._grammars = Grammars(*self._args)
        except Exception as e:  # noqa: BLE001 - raised again to each request that needs them
            self._error = e
        finally:
            self._done.set()

    def __call__(self) -> Grammars:
        self.start()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._grammars


class _Unavailable(PreparedGrammars):
    """A stand-in tokenizer's (no vocabulary): every constrained request is refused."""

    def __init__(self):
        super().__init__(None, 0, ())
        self._error = InvalidRequest("structured outputs need the checkpoint's tokenizer.json")
        self._started = True
        self._done.set()


_prepared: dict[tuple, PreparedGrammars] = {}
_prepared_lock = threading.Lock()


def prepare_grammars(tokenizer, vocab_size: int, stop_ids: tuple[int, ...]) -> PreparedGrammars:
    """The (not yet started) Grammars of a TextTokenizer's vocabulary: one per checkpoint,
    vocabulary size and end tokens in a process, so engines rebuilt on one checkpoint share them."""
    if getattr(tokenizer, "backend", None) is None:
        return _Unavailable()
    key = (str(getattr(tokenizer, "checkpoint", id(tokenizer))), vocab_size, tuple(stop_ids))
    with _prepared_lock:
        if key not in _prepared:
            _prepared[key] = PreparedGrammars(tokenizer.backend, vocab_size, tuple(stop_ids))
        return _prepared[key]


def unpack_bitmask(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's int32 bitmask `[rows, ceil(vocab / 32)]` (bit j of word w: token 32 w + j) as
    bool `[rows, vocab]` (numpy's unpackbits over the little-endian bytes: ~10 us a row of 49k
    tokens on the host, where shifting in torch took ~90)."""
    rows = bits.shape[0]
    flat = np.unpackbits(bits.numpy().view(np.uint8).reshape(rows, -1), axis=1, bitorder="little")
    return torch.from_numpy(np.ascontiguousarray(flat[:, :vocab]).view(np.bool_))


def _regex_literal(text: str) -> str:
    """`text` matched literally in xgrammar's regex syntax."""
    return "".join("\\" + ch if ch in ".^$*+?()[]{}|\\" else ch for ch in text)
