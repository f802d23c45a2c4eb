"""TritonPythonModel for the `classifier` model (not decoupled): texts in, label probabilities
and the most likely label's name out, from a `*ForSequenceClassification` checkpoint
(sentiment, moderation, intent, ...). A multi-label head (`problem_type:
multi_label_classification`) gives an independent sigmoid per label; otherwise a softmax."""
from __future__ import annotations

from tritonformer.backend.encoder.engine import EmbedRequest
from tritonformer.backend.errors import InvalidRequest
from tritonformer.backend.encoder.heads import label_outputs
from tritonformer.backend.triton import inputs
from tritonformer.backend.triton.encoder_model import EncoderTritonModel
from tritonformer.backend.triton.glue import bool_parameter, input_array, one_item_batches, request_parameters

CHECKPOINT_ENV = "TRITONFORMER_CLASSIFIER_CHECKPOINT"


class TritonPythonModel(EncoderTritonModel):
    KIND = "classifier"
    CHECKPOINT_ENV = CHECKPOINT_ENV

    def not_configured_message(self) -> str:
        return (f"the {self.name} model has no checkpoint: set its config.pbtxt parameter \"checkpoint\" to a "
                f"*ForSequenceClassification folder, or start the bundled server with "
                f"`tritonformer serve --classifier-checkpoint DIR` (environment variable {CHECKPOINT_ENV})")

    def configure(self, p, checkpoint, info) -> None:
        self.outputs = label_outputs(info.labels)

    def parse(self, request, sender, deadline: float | None) -> EmbedRequest:
        if self.batched:
            one_item_batches(request, ("text_input",))
        array = input_array(request, "text_input")
        if array is None:
            raise InvalidRequest("missing input text_input: send one or more texts (BYTES [-1])")
        truncate = bool_parameter(request_parameters(request), "truncate", False)
        texts = inputs.decode_texts(array, "text_input", self.max_texts, self.max_text_bytes)
        encoded = self.tokenizer.encode_batch(texts)
        sequences = [inputs.fit_length(ids, self.max_tokens, truncate, f"text_input[{i}]") for i, ids in enumerate(encoded)]
        return EmbedRequest(sender, sequences, deadline=deadline, outputs=self.outputs)
