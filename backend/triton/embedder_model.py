"""TritonPythonModel for the `embedder` model: sentence embeddings, pooled as the checkpoint's
sentence-transformers files say. The shared encoder-model body is in encoder_model.py."""
from __future__ import annotations

from pathlib import Path

from tritonformer.backend.checkpoints import minilm_dir
from tritonformer.backend.encoder.engine import EmbedRequest
from tritonformer.backend.triton import inputs
from tritonformer.backend.triton.encoder_model import ENCODER_PARAMETERS, EncoderTritonModel
from tritonformer.backend.triton.glue import bool_parameter, input_array, one_item_batches, request_parameters

PARAMETERS = {
    **ENCODER_PARAMETERS,
    "checkpoint": "",  # an encoder folder; empty = the bundled all-MiniLM-L6-v2
    "pooling": "auto",  # auto (from the checkpoint) | mean | cls
    "normalize": "auto",  # auto (from the checkpoint) | true | false
}


class TritonPythonModel(EncoderTritonModel):
    KIND = "embedder"
    PARAMETERS = PARAMETERS

    def default_checkpoint(self) -> Path:
        return minilm_dir()

    def parse(self, request, sender, deadline: float | None) -> EmbedRequest:
        return EmbedRequest(sender, self._sequences(request), deadline=deadline)

    def _sequences(self, request) -> list[list[int]]:
        if self.batched:
            one_item_batches(request, ("text_input", "input_ids"))
        arrays = {name: input_array(request, name) for name in ("text_input", "input_ids")}
        truncate = bool_parameter(request_parameters(request), "truncate", False)
        if inputs.exactly_one(arrays, ("text_input", "input_ids")) == "input_ids":
            ids = inputs.token_ids(arrays["input_ids"], "input_ids", self.vocab_size)
            return [inputs.fit_length(ids, self.max_tokens, truncate, "input_ids")]
        texts = inputs.decode_texts(arrays["text_input"], "text_input", self.max_texts, self.max_text_bytes)
        encoded = self.tokenizer.encode_batch(texts)
        return [inputs.fit_length(ids, self.max_tokens, truncate, f"text_input[{i}]") for i, ids in enumerate(encoded)]
