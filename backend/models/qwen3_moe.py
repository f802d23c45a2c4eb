"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's block (q/k norms, its own head_dim) with
Qwen2-MoE's expert layers without the shared expert (128 experts, the top 8 per token)."""
from dataclasses import replace

from tritonformer.backend.models import qwen3
from tritonformer.backend.models.qwen2_moe import qwen_moe
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder


def from_hf(cfg: dict) -> DecoderSpec:
    return replace(qwen3.from_hf(cfg), moe=qwen_moe(cfg, shared=False))


MODEL = TransformerDecoder
