"""Starcoder2 (StarCoder2-3B, 7B, 15B): Llama's attention (grouped KV heads, rotary) with GPT-2's
other parts: LayerNorms with a bias before attention, before the MLP and at the end; a plain
MLP (`c_fc`, GELU, `c_proj`); biases on every linear (`use_bias`, on by default) but the tied
head; a sliding window on every layer where `sliding_window` is set (4,096 tokens in the
published configs)."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, layer_windows,
                                                     spec_from_hf)

# Hugging Face's activation names -> the plain MLP's (transformer.PLAIN_ACTIVATIONS)
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}


def from_hf(cfg: dict) -> DecoderSpec:
    act = cfg.get("hidden_act", "gelu_pytorch_tanh")
    if act not in _ACTIVATIONS:
        raise ValueError(f"unsupported Starcoder2 hidden_act {act!r} (supported: {sorted(_ACTIVATIONS)})")
    bias = bool(cfg.get("use_bias", True))
    return spec_from_hf(cfg, tie_default=True, norm_eps=cfg.get("norm_epsilon", 1e-5), layer_norm=True, norm_bias=True,
                        gated_mlp=False, activation=_ACTIVATIONS[act], mlp_bias=bias, qkv_bias=bias, o_bias=bias,
                        layer_windows=layer_windows(cfg, cfg.get("sliding_window")),
                        names=WeightNames(up="mlp.c_fc", down="mlp.c_proj"))


MODEL = TransformerDecoder
