"""Jais 2 (Arabic-English): Llama's attention with LayerNorms that have a bias (before attention,
before the MLP, at the end), a plain MLP with the squared ReLU (`up_proj`, relu(h)^2,
`down_proj`) and biases on every linear but the head (`attention_bias`, `mlp_bias`: both on by
default)."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, plain_activation, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    act = plain_activation(cfg, "Jais 2", ("relu2",))
    cfg = {"attention_bias": True, "mlp_bias": True, **cfg}  # (Hugging Face's defaults)
    bias = bool(cfg["attention_bias"])
    return spec_from_hf(cfg, norm_eps=cfg.get("layer_norm_eps", 1e-5), layer_norm=True, norm_bias=True,
                        gated_mlp=False, activation=act, qkv_bias=bias, o_bias=bias)


MODEL = TransformerDecoder
