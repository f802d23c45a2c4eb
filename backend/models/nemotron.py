"""Nemotron (Nemotron-Mini-4B, Minitron-4B / 8B, Nemotron-4): LayerNorms with a bias whose weight
is applied as (1 + w) ("LayerNorm1P", kept in fp32 as Gemma's (1 + w)), a plain MLP with the
squared ReLU (`up_proj`, relu(h)^2, `down_proj`), a rotary over half of each head by default;
biases on the attention's four projections where `attention_bias` is set and on the MLP's where
`mlp_bias` is."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, plain_activation, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    act = plain_activation(cfg, "Nemotron", ("relu2",))
    cfg = {"partial_rotary_factor": 0.5, **cfg}  # (Hugging Face's default where the config has none)
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, norm_eps=cfg.get("norm_eps", 1e-5), layer_norm=True, norm_bias=True, norm_offset=1.0,
                        gated_mlp=False, activation=act, qkv_bias=bias, o_bias=bias)


MODEL = TransformerDecoder
