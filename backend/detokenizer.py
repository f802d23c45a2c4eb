"""Incremental detokenization with stop strings.

Generated tokens arrive one at a time; the text a client sees must never contain half a UTF-8
character (a multi-byte character can span tokens) nor the start of a stop string that may
still complete. So each step decodes a short window of recent tokens, holds back an incomplete
character (decoded as U+FFFD) and, when stop strings are set, the last few characters that
could still begin one.
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
        self.text = ""
        self._emitted = 0

    def add(self, token_id: int) -> bool:
        """Append one token; returns True when a stop string appeared (text is cut before it)."""
        self._ids.append(token_id)
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        new_text = self._tok.decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_INCOMPLETE):
            search_from = max(0, len(self.text) - self._hold)
            self.text += new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self._ids)
            return self._cut_at_stop(search_from)
        return False

    def _cut_at_stop(self, search_from: int) -> bool:
        hits = [i for i in (self.text.find(s, search_from) for s in self._stop) if i >= 0]
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        return True

    def take_delta(self, final: bool) -> str:
        """Text not yet handed out. Until the end, keep back what could begin a stop string."""
        limit = len(self.text) if final or not self._stop else max(self._emitted, len(self.text) - self._hold)
        delta = self.text[self._emitted : limit]
        self._emitted = limit
        return delta
