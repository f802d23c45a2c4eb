"""Cohere Command R and Aya (`cohere`), Command R7B and Command A (`cohere2`): attention and the MLP
side by side on one norm's output, both added to the residual stream (a parallel block); the norm
a LayerNorm without a bias (the mean subtracted, then scaled); a rotary pairing neighbouring dims
(2i, 2i + 1); a tied embedding; and the logits times `logit_scale`, folded into the final norm.
`cohere2` adds sliding-window layers (three of every four, `layer_types` or
`sliding_window_pattern`) and rotates q and k in those only: its global layers are NoPE.
Command R+'s per-head LayerNorms on q and k (`use_qk_norm`) are refused."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, layer_windows, sliding_pattern,
                                                     spec_from_hf)


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("use_qk_norm"):
        raise ValueError("Cohere with q/k LayerNorms (use_qk_norm, Command R+) is not supported (supported: use_qk_norm false)")
    if cfg.get("attention_bias"):
        raise ValueError("Cohere with attention_bias is not supported (supported: attention_bias false)")
    options = {}
    if cfg.get("model_type") == "cohere2":
        windows = layer_windows(cfg, cfg.get("sliding_window", 4096), sliding_pattern(cfg, 4))
        options = dict(layer_windows=windows, rope_layers=tuple(w is not None for w in windows))
    return spec_from_hf(cfg, tie_default=True, norm_eps=cfg.get("layer_norm_eps", 1e-5), parallel_block=True,
                        layer_norm=True, rotary_interleaved=True, logit_scale=float(cfg.get("logit_scale", 0.0625)),
                        **options)


MODEL = TransformerDecoder
