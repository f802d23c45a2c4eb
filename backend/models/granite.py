"""Granite (IBM's dense Granite 3.x): Llama's block with four scalars of its training recipe
(muP): token embeddings times `embedding_multiplier`, queries scaled by `attention_multiplier`
in place of head_dim^-1/2, the output of every attention block and MLP times
`residual_multiplier` before its residual add, and the logits divided by `logits_scaling`. The
last two are folded into weights at load (the output and down projections, the final norm)."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict, **options) -> DecoderSpec:
    """`options`: more DecoderSpec fields (granitemoe.py's experts)."""
    if cfg.get("attention_bias"):
        raise ValueError("Granite with attention_bias is not supported")
    return spec_from_hf(cfg, **options,
                        embed_scale=float(cfg.get("embedding_multiplier", 1.0)),
                        attn_scale=float(cfg.get("attention_multiplier", 1.0)),
                        residual_scale=float(cfg.get("residual_multiplier", 1.0)),
                        logit_scale=1.0 / float(cfg.get("logits_scaling", 1.0)))


MODEL = TransformerDecoder
