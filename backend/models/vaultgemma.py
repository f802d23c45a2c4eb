"""VaultGemma (VaultGemma-1B, trained with differential privacy): Gemma 2's block without its norms
after attention and the MLP (each sub-block's output is added to the residual stream as it is)."""
from dataclasses import replace

from tritonformer.backend.models import gemma2
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder


def from_hf(cfg: dict) -> DecoderSpec:
    spec = gemma2.from_hf(cfg)
    return replace(spec, sandwich_norms=False, names=replace(spec.names, attn_post_norm=None, mlp_post_norm=None))


MODEL = TransformerDecoder
