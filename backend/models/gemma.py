"""Gemma (the first generation: Gemma-2B/7B, CodeGemma): Gemma 2's (1 + w) norms, GeGLU and scaled
embeddings, without its norms after attention and the MLP, soft-capping or sliding windows."""
from tritonformer.backend.models.gemma2 import gemma_options
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {"head_dim": 256, **cfg}
    options = {**gemma_options(cfg), "sandwich_norms": False, "names": WeightNames()}
    return spec_from_hf(cfg, tie_default=True, **options)


MODEL = TransformerDecoder
