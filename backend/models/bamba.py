"""Bamba (`bamba`: IBM's Bamba-9B): Llama's pre-norm block where the layers not in
`attn_layer_indices` run Mamba-2 (mamba2.py, the same mixer as Granite 4.0-H's) in place of attention.
The attending layers rotate half of each head (transformers fixes partial_rotary_factor at 0.5 for
Bamba), with biases on the four projections where `attention_bias`; every layer has a SwiGLU MLP
(`feed_forward`, biases where `mlp_bias`) after the norm `pre_ff_layernorm`; the final norm is
`final_layernorm`."""
from tritonformer.backend.models.mamba2 import Mamba2Decoder, Mamba2Spec, hybrid_spec, layer_mixers
from tritonformer.backend.models.transformer import DecoderSpec, WeightNames, spec_from_hf

NAMES = WeightNames(gate="feed_forward.gate_proj", up="feed_forward.up_proj", down="feed_forward.down_proj",
                    mlp_norm="pre_ff_layernorm", final_norm="final_layernorm.weight")


def from_hf(cfg: dict) -> DecoderSpec:
    layers = cfg["num_hidden_layers"]
    attending = set(cfg.get("attn_layer_indices") or ())  # (indices past the layers name none, as in transformers)
    mixers = layer_mixers(["attention" if i in attending else "mamba" for i in range(layers)], "Bamba")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported Bamba hidden_act {cfg['hidden_act']!r} (supported: silu)")
    # (transformers writes partial_rotary_factor 0.5 into the rope parameters whatever the config says)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    bias = bool(cfg.get("attention_bias", False))
    spec = spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), qkv_bias=bias, o_bias=bias,
                        rotary_dim=int(head_dim * 0.5), mixers=mixers if any(mixers) else (), names=NAMES)
    return hybrid_spec(spec, Mamba2Spec.from_hf({"rms_norm_eps": 1e-5, **cfg}, "Bamba")) if any(mixers) else spec


MODEL = Mamba2Decoder
