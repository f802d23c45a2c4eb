"""StableLM (StableLM-2-1.6B, StableLM-3B-4E1T, their Zephyr chat models): Llama's gated MLP and
grouped heads with LayerNorms that have a bias (before attention, before the MLP, at the end), a
partial rotary (a quarter of each head by default) and biases on Q, K and V where
`use_qkv_bias` is set. StableLM-2-12B's per-head q / k LayerNorms (`qk_layernorm`) and its
parallel residual (`use_parallel_residual`) are refused."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    for option in ("qk_layernorm", "use_parallel_residual"):
        if cfg.get(option):
            raise ValueError(f"StableLM with {option} is not supported (supported: {option} false)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported StableLM hidden_act {cfg['hidden_act']!r} (supported: silu)")
    cfg = {"partial_rotary_factor": 0.25, **cfg}  # (Hugging Face's default where the config has none)
    return spec_from_hf(cfg, norm_eps=cfg.get("layer_norm_eps", 1e-5), layer_norm=True, norm_bias=True,
                        qkv_bias=bool(cfg.get("use_qkv_bias", False)))


MODEL = TransformerDecoder
