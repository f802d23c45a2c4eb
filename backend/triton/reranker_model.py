"""TritonPythonModel for the `reranker` model (not decoupled): one query and its candidate texts
in, one relevance score per text out, from a cross-encoder checkpoint (a one-logit
`*ForSequenceClassification` head, e.g. ms-marco-MiniLM-L-6-v2 or bge-reranker-v2-m3).

Every (query, text) pair is one sequence in the engine's length-aware queue: a request's pairs
may run in different batches beside other requests' pairs, and the one response leaves when
the last score is back (engine.SplitRequest).
"""
from __future__ import annotations

from dataclasses import replace

from tritonformer.backend.encoder.build import reranker_score_tokens
from tritonformer.backend.encoder.engine import SplitRequest
from tritonformer.backend.encoder.heads import relevance_outputs
from tritonformer.backend.errors import InvalidRequest
from tritonformer.backend.pair_tokenization import PairTokenizer
from tritonformer.backend.triton import inputs
from tritonformer.backend.triton.encoder_model import ENCODER_PARAMETERS, EncoderTritonModel
from tritonformer.backend.triton.glue import bool_parameter, input_array, one_item_batches, request_parameters

CHECKPOINT_ENV = "TRITONFORMER_RERANKER_CHECKPOINT"


class TritonPythonModel(EncoderTritonModel):
    KIND = "reranker"
    # score_tokens: a causal LM's next-token logits as the score ("no,yes": Qwen3-Reranker's).
    PARAMETERS = {**ENCODER_PARAMETERS, "max_texts_per_request": "256", "score_tokens": ""}
    CHECKPOINT_ENV = CHECKPOINT_ENV

    def not_configured_message(self) -> str:
        return (f"the {self.name} model has no checkpoint: set its config.pbtxt parameter \"checkpoint\" to a "
                f"cross-encoder folder (*ForSequenceClassification with one label), or start the bundled server "
                f"with `tritonformer serve --reranker-checkpoint DIR` (environment variable {CHECKPOINT_ENV})")

    def spec(self, p, checkpoint, device, dtype):
        """The encoder's settings; the checkpoint named by the environment (`tritonformer serve
        --reranker-checkpoint`) takes its score_tokens from there too."""
        spec = super().spec(p, checkpoint, device, dtype)
        return replace(spec, score_tokens=reranker_score_tokens(spec.score_tokens, p.str("checkpoint")))

    def configure(self, p, checkpoint, info) -> None:
        self.pairs = PairTokenizer(checkpoint, self.max_tokens)
        # Segment ids matter only where the model has more than one token type (BERT); XLM-R's
        # tokenizer gives none to the model, as Hugging Face's does not.
        self.token_types = info.token_types

    def parse(self, request, sender, deadline: float | None) -> SplitRequest:
        if self.batched:
            one_item_batches(request, ("query", "texts"))
        query_array, texts_array = input_array(request, "query"), input_array(request, "texts")
        if query_array is None:
            raise InvalidRequest("missing input query: send one query string (BYTES [1]) with the texts")
        if texts_array is None:
            raise InvalidRequest("missing input texts: send the texts to score against the query (BYTES [-1])")
        params = request_parameters(request)
        truncate = bool_parameter(params, "truncate", False)
        raw = bool_parameter(params, "raw_scores", False)
        query = inputs.single_text(query_array, "query", self.max_text_bytes)
        texts = inputs.decode_texts(texts_array, "texts", self.max_texts, self.max_text_bytes)
        ids, types = self.pairs.encode_pairs(query, texts, truncate)
        return SplitRequest(sender, ids, relevance_outputs(raw), types if self.token_types else None, deadline=deadline)
