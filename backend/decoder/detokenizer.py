"""Incremental detokenization with stop strings.

Generated tokens arrive one at a time; the text a client sees must never contain half a UTF-8
character (a multi-byte character can span tokens) nor the start of a stop string that may
still complete. So each step decodes a short window of recent tokens, holds back an incomplete
character (decoded as U+FFFD) and, when stop strings are set, the last few characters that
could still begin one.

Decoding is lazy: without stop strings nothing needs the text until a response leaves, so
tokens are only collected and decoded (several at once) when text is asked for. Per-token
decoding would cost two tokenizer calls per sequence per iteration on the engine's thread.
"""
from __future__ import annotations

from tritonformer.backend.tokenization import TextTokenizer

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: TextTokenizer, stop: list[str]):
        self._tok = tokenizer
        self._ids: list[int] = []
        # Decoding ids[_prefix:_read] gave text already in self.text; ids[_prefix:] is decoded
        # each step, so that tokenizers whose decoders look at neighbours (leading spaces) agree.
        self._prefix = 0
        self._read = 0
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._text = ""
        self._emitted = 0
        self._decoded = 0  # ids[:_decoded] have been looked at

    @property
    def text(self) -> str:
        self._catch_up()
        return self._text

    def add(self, token_id: int) -> bool:
        """Append one token; returns True when a stop string appeared (text is cut before it).
        Without stop strings the token is only recorded (decoded when text is needed)."""
        self._ids.append(token_id)
        return self._catch_up() if self._stop else False

    def _catch_up(self) -> bool:
        if self._decoded == len(self._ids):
            return False
        self._decoded = len(self._ids)
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        new_text = self._tok.decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_INCOMPLETE):
            search_from = max(0, len(self._text) - self._hold)
            self._text += new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self._ids)
            return self._cut_at_stop(search_from)
        return False

    def _cut_at_stop(self, search_from: int) -> bool:
        hits = [i for i in (self._text.find(s, search_from) for s in self._stop) if i >= 0]
        if not hits:
            return False
        self._text = self._text[: min(hits)]
        return True

    def take_delta(self, final: bool) -> str:
        """Text not yet handed out. Until the end, keep back what could begin a stop string."""
        text = self.text
        limit = len(text) if final or not self._stop else max(self._emitted, len(text) - self._hold)
        delta = text[self._emitted : limit]
        self._emitted = limit
        return delta
