"""Baseline `hf_generator`: request-level batching, the plain way to serve a decoder on Triton.

Triton's dynamic batcher hands `execute` up to 32 requests; they run as one left-padded
Hugging Face `generate` (greedy, EOS ignored) for the batch's largest `max_tokens`, so every
request waits for the longest one and new requests wait for the whole batch (what Orca's
iteration-level scheduling removes). Each answer is its own `max_tokens` tokens.
"""
import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoModelForCausalLM

from tritonformer.client.hf_reference import generate_greedy, left_pad
from tritonformer.client.stock_models import load_checkpoint_model


class TritonPythonModel:
    def initialize(self, args):
        self.model, self.device = load_checkpoint_model(args, AutoModelForCausalLM)

    def execute(self, requests):
        prompts = [pb_utils.get_input_tensor_by_name(r, "input_ids").as_numpy().reshape(-1).tolist() for r in requests]
        budgets = [int(pb_utils.get_input_tensor_by_name(r, "max_tokens").as_numpy().reshape(-1)[0]) for r in requests]
        ids, mask = left_pad(prompts, self.device)
        out = generate_greedy(self.model, ids, mask, max(budgets))[:, ids.shape[1] :].cpu().numpy().astype(np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("output_ids", out[i : i + 1, :n])])
                for i, n in enumerate(budgets)]
