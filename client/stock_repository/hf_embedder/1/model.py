"""Baseline `hf_embedder`: the plain way to serve a BERT encoder on Triton today.

Triton's dynamic batcher hands `execute` up to 64 requests at once; they are padded to the
longest, run through Hugging Face's BertModel (SDPA attention, fp16 on a GPU) with an attention
mask, and mean-pooled over their own tokens.
"""
import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModel

from tritonformer.client.stock_models import load_checkpoint_model


class TritonPythonModel:
    def initialize(self, args):
        self.model, self.device = load_checkpoint_model(args, AutoModel)

    def execute(self, requests):
        seqs = [pb_utils.get_input_tensor_by_name(r, "input_ids").as_numpy().reshape(-1) for r in requests]
        ids = np.zeros((len(seqs), max(len(s) for s in seqs)), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, : len(s)], mask[i, : len(s)] = s, 1
        with torch.inference_mode():
            ids_t, mask_t = torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device)
            hidden = self.model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
            weights = mask_t.unsqueeze(-1).to(hidden.dtype)
            pooled = ((hidden * weights).sum(1) / weights.sum(1)).float().cpu().numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("embedding", pooled[i : i + 1])])
                for i in range(len(requests))]
