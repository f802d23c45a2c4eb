"""Arcee (AFM-4.5B): Llama's block with a plain MLP whose activation is the squared ReLU
(`up_proj`, relu(h)^2, `down_proj`, no gate); biases on the attention's four projections where
`attention_bias` is set and on the MLP's where `mlp_bias` is."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, plain_activation, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    act = plain_activation(cfg, "Arcee", ("relu2",))
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, gated_mlp=False, activation=act, qkv_bias=bias, o_bias=bias)


MODEL = TransformerDecoder
