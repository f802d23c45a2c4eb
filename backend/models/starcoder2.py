"""Starcoder2 (StarCoder2-3B, 7B, 15B): Llama's attention (grouped KV heads, rotary) with GPT-2's
other parts: LayerNorms with a bias before attention, before the MLP and at the end; a plain
MLP (`c_fc`, GELU, `c_proj`); biases on every linear (`use_bias`, on by default) but the tied
head; a sliding window on every layer where `sliding_window` is set (4,096 tokens in the
published configs)."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, layer_windows,
                                                     plain_activation, spec_from_hf)


def from_hf(cfg: dict) -> DecoderSpec:
    act = plain_activation(cfg, "Starcoder2", ("gelu_pytorch_tanh", "gelu_new", "gelu"))
    bias = bool(cfg.get("use_bias", True))
    return spec_from_hf(cfg, tie_default=True, norm_eps=cfg.get("norm_epsilon", 1e-5), layer_norm=True, norm_bias=True,
                        gated_mlp=False, activation=act, mlp_bias=bias, qkv_bias=bias, o_bias=bias,
                        layer_windows=layer_windows(cfg, cfg.get("sliding_window")),
                        names=WeightNames(up="mlp.c_fc", down="mlp.c_proj"))


MODEL = TransformerDecoder
