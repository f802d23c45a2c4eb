"""OLMo 2 and OLMo 3 (`olmo2`, `olmo3`: AI2's fully open OLMo-2 1B-32B, OLMo-3 7B / 32B): Llama's
attention and MLP with the norms moved after them (each block's output RMS-normalised, then added
to the residual stream; nothing normalises a block's input), and q / k RMS-normalised over all of
a token's query / key heads at once (weights of `heads x head_dim`) before the rotary. OLMo 3 adds
sliding-window layers (three of every four by default, `layer_types`), the rope scaling (YaRN)
only on the full-attention layers: `rope_parameters` per layer type, or a published config's
`rope_scaling` for the full layers and plain `rope_theta` for the local ones."""
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, layer_windows,
                                                     sliding_pattern, spec_from_hf)

NAMES = WeightNames(attn_post_norm="post_attention_layernorm", mlp_post_norm="post_feedforward_layernorm")


def olmo3_options(cfg: dict) -> dict:
    """OLMo 3's rotary tables (the full layers', the local layers') and its windows."""
    params, theta = cfg.get("rope_parameters") or {}, cfg.get("rope_theta", 500000.0)
    if "full_attention" in params or "sliding_attention" in params:  # transformers >= 5: per layer type
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    else:  # as published: rope_scaling (if any) for the full layers
        full, local = cfg.get("rope_scaling") or {}, {}
    positions = cfg.get("max_position_embeddings", 65536)
    rope = Rope.from_hf(full, full.get("rope_theta", theta), positions)
    local_rope = Rope.from_hf(local, local.get("rope_theta", theta), positions)
    windows = layer_windows(cfg, cfg.get("sliding_window", 4096), sliding_pattern(cfg, 4))
    return dict(rope=rope, local_rope=None if local_rope == rope else local_rope, layer_windows=windows)


def from_hf(cfg: dict, **extra) -> DecoderSpec:
    """`extra`: more DecoderSpec fields (flex_olmo.py's experts)."""
    if cfg.get("attention_bias"):
        raise ValueError("OLMo 2 / 3 with attention_bias is not supported (supported: attention_bias false)")
    options = {}
    if cfg.get("model_type") == "olmo3":
        options = olmo3_options(cfg)
        cfg = {**cfg, "rope_parameters": None, "rope_scaling": None}
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), sandwich_norms=True, pre_norms=False,
                        qk_norm=True, qk_norm_full=True, names=NAMES, **options, **extra)


MODEL = TransformerDecoder
