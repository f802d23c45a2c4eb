"""Baseline `hf_reranker`: the plain way to serve a cross-encoder reranker on Triton today.

Triton's dynamic batcher hands `execute` up to 64 requests at once; every (query, text) pair of
them is tokenized by the Hugging Face tokenizer (truncating the text to the model's maximum),
padded to the longest pair, and scored by AutoModelForSequenceClassification (SDPA attention,
fp16 on a GPU) in one forward; each request gets the sigmoid of its pairs' logits.
"""
import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tritonformer.client.stock_models import load_checkpoint_model


class TritonPythonModel:
    def initialize(self, args):
        self.model, self.device = load_checkpoint_model(args, AutoModelForSequenceClassification)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model.name_or_path)
        # RoBERTa-family position tables start at padding_idx + 1: two rows fewer for tokens
        # (BERT's, DistilBERT's and ELECTRA's at 0).
        config = self.model.config
        offset = 0 if config.model_type in ("bert", "distilbert", "electra") else config.pad_token_id + 1
        positions = config.max_position_embeddings - offset
        self.max_length = min(self.tokenizer.model_max_length, positions)

    def execute(self, requests):
        queries, texts, counts = [], [], []
        for r in requests:
            query = pb_utils.get_input_tensor_by_name(r, "query").as_numpy().reshape(-1)[0].decode()
            docs = [t.decode() for t in pb_utils.get_input_tensor_by_name(r, "texts").as_numpy().reshape(-1)]
            queries += [query] * len(docs)
            texts += docs
            counts.append(len(docs))
        enc = self.tokenizer(queries, texts, padding=True, truncation="only_second", max_length=self.max_length,
                             return_tensors="pt").to(self.device)
        if getattr(self.model.config, "type_vocab_size", 2) == 1:
            enc.pop("token_type_ids", None)  # one token type (XLM-R): its own tokenizers send none
        with torch.inference_mode():
            scores = torch.sigmoid(self.model(**enc).logits[:, 0].float()).cpu().numpy()
        responses, offset = [], 0
        for n in counts:
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("scores", scores[None, offset : offset + n])]))
            offset += n
        return responses
