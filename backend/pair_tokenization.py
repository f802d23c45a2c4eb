"""(query, text) pairs -> token ids and segment ids, as a cross-encoder reads them.

The pair encoding is the checkpoint's own (tokenizer.json's post-processor): BERT writes
`[CLS] query [SEP] text [SEP]` with segment 1 on the text part, XLM-R `<s> query </s></s> text
</s>`. Over-long pairs are an error unless the request asks for truncation, which cuts the
text (the second part) only, as Hugging Face's `truncation="only_second"` does: a reranker's
query is short and must be read whole.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from tritonformer.backend.errors import InvalidRequest


class PairTokenizer:
    def __init__(self, checkpoint: Path, max_tokens: int):
        path = Path(checkpoint) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint folder {checkpoint} has no tokenizer.json")
        self.max_tokens = max_tokens
        # Two tokenizers, because truncation is a setting of the tokenizer object, not of a call.
        self._whole = Tokenizer.from_file(str(path))
        self._whole.no_truncation()
        self._whole.no_padding()
        self._truncating = Tokenizer.from_file(str(path))
        self._truncating.enable_truncation(max_tokens, strategy="only_second")
        self._truncating.no_padding()

    def encode_pairs(self, query: str, texts: list[str], truncate: bool) -> tuple[list[list[int]], list[list[int]]]:
        """(ids, segment ids) of every (query, text) pair, one batch call. Raises InvalidRequest
        for a pair longer than the model's maximum without `truncate`, and for a query that
        leaves no room for any text even with it."""
        pairs = [(query, text) for text in texts]
        if truncate:
            try:
                encoded = self._truncating.encode_batch(pairs)
            except Exception:  # the tokenizer's "second sequence not long enough to be truncated"
                query_tokens = len(self._whole.encode(query).ids)
                raise InvalidRequest(
                    f"the query alone is {query_tokens} tokens (with special tokens), too long to pair with any "
                    f"text within the model's maximum of {self.max_tokens}; shorten the query"
                ) from None
        else:
            encoded = self._whole.encode_batch(pairs)
            for i, e in enumerate(encoded):
                if len(e.ids) > self.max_tokens:
                    raise InvalidRequest(
                        f"the pair (query, texts[{i}]) is {len(e.ids)} tokens, longer than the model's maximum of "
                        f'{self.max_tokens}; shorten it or send the request parameter "truncate": true '
                        "(which cuts the text, never the query)"
                    )
        return [e.ids for e in encoded], [e.type_ids for e in encoded]
