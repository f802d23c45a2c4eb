"""Gemma 2: RMSNorm as (1 + w), GeGLU with tanh GELU, embeddings scaled by sqrt(hidden), norms
before and after attention and the MLP, queries scaled by query_pre_attn_scalar^-1/2, attention
scores and logits soft-capped with tanh, and sliding-window layers alternating with global ones."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, layer_windows,
                                                     spec_from_hf)

GEMMA_NAMES = WeightNames(mlp_norm="pre_feedforward_layernorm", attn_post_norm="post_attention_layernorm",
                          mlp_post_norm="post_feedforward_layernorm")


def gemma_options(cfg: dict) -> dict:
    """What Gemma 2 and Gemma 3 share."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported Gemma hidden_activation {act!r} (supported: gelu_pytorch_tanh)")
    if cfg.get("attention_bias"):
        raise ValueError("Gemma with attention_bias is not supported")
    return dict(norm_offset=1.0, activation="gelu_tanh", sandwich_norms=True, names=GEMMA_NAMES,
                embed_scale=cfg["hidden_size"] ** 0.5,
                attn_scale=cfg.get("query_pre_attn_scalar", 256) ** -0.5)


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {"head_dim": 256, **cfg}
    alternate = [bool((i + 1) % 2) for i in range(cfg["num_hidden_layers"])]  # even layers slide
    return spec_from_hf(
        cfg, tie_default=True, **gemma_options(cfg),
        attn_softcap=cfg.get("attn_logit_softcapping", 50.0),
        final_softcap=cfg.get("final_logit_softcapping", 30.0),
        layer_windows=layer_windows(cfg, cfg.get("sliding_window", 4096), alternate),
    )


MODEL = TransformerDecoder
