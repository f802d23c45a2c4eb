"""OLMo (`olmo`: AI2's first OLMo, OLMo-1B / 7B and OLMo-1.7-7B as transformers converts them): Llama's
block with LayerNorms (the mean subtracted, eps 1e-5) that have neither a weight nor a bias, before
attention, before the MLP and at the end; biases on the attention's four projections where
`attention_bias`. A checkpoint holds no norm tensors, so the decoder's LayerNorm reads a weight of ones
(and a zero bias: layer_norm without norm_bias). `clip_qkv` (OLMo-1.7-7B's 8.0: q, k and v clamped to
[-clip, clip] after their projections) is refused: the decoder has no clamp there."""
import torch

from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames, spec_from_hf

NAMES = WeightNames()


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors with a weight of ones for every norm, where it has none (all of them)."""
    ones = torch.ones(cfg["hidden_size"])
    norms = [f"layers.{i}.{n}.weight" for i in range(cfg["num_hidden_layers"])
             for n in (NAMES.attn_norm, NAMES.mlp_norm)] + [NAMES.final_norm]
    return cfg, {**{name: ones for name in norms}, **state}


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("clip_qkv") is not None:
        raise ValueError(f"OLMo with clip_qkv {cfg['clip_qkv']} is not supported (supported: clip_qkv unset, as "
                         f"OLMo-1B and OLMo-7B have it)")
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, norm_eps=1e-5, layer_norm=True, qkv_bias=bias, o_bias=bias, names=NAMES)


MODEL = TransformerDecoder
