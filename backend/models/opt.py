"""OPT (`opt`: Meta's OPT-125M to OPT-66B, and fine-tunes): learnt absolute positions (`embed_positions`,
whose first 2 rows are unused: OPT looks up position + 2), no rotary; LayerNorms with a bias
before attention (`self_attn_layer_norm`) and the MLP (the layer's `final_layer_norm`) and at the
end; a plain ReLU MLP (`fc1`, `fc2`); biases on every linear where `enable_bias`; a tied head.
Its tensors are under `decoder.`. OPT-350M's norms after the blocks (`do_layer_norm_before` false)
and its projections around the layers (`word_embed_proj_dim` unlike the hidden size) are
refused, as are LayerNorms without weights and a missing final norm."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, plain_activation,
                                                     spec_from_hf)

NAMES = WeightNames(o="self_attn.out_proj", up="fc1", down="fc2", attn_norm="self_attn_layer_norm",
                    mlp_norm="final_layer_norm", final_norm="final_layer_norm.weight",
                    positions="embed_positions.weight")
_REFUSED = (("do_layer_norm_before", False), ("layer_norm_elementwise_affine", False),
            ("_remove_final_layer_norm", True))


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """OPT's tensors are `decoder.*` (under `model.`): the shared decoder reads them without it."""
    return cfg, {name.removeprefix("decoder."): t for name, t in state.items()}


def from_hf(cfg: dict) -> DecoderSpec:
    for key, value in _REFUSED:
        if cfg.get(key, not value) == value:
            raise ValueError(f"OPT with {key} {str(value).lower()} is not supported (supported: {key} "
                             f"{str(not value).lower()})")
    hidden = cfg["hidden_size"]
    if cfg.get("word_embed_proj_dim", hidden) != hidden:
        raise ValueError(f"OPT with word_embed_proj_dim {cfg['word_embed_proj_dim']} unlike hidden_size {hidden} is "
                         f"not supported (supported: word_embed_proj_dim equal to hidden_size)")
    act = plain_activation({"hidden_act": cfg.get("activation_function", "relu")}, "OPT", ("relu", "gelu"))
    bias = bool(cfg.get("enable_bias", True))
    return spec_from_hf({**cfg, "intermediate_size": cfg["ffn_dim"]}, tie_default=True, norm_eps=1e-5,
                        layer_norm=True, norm_bias=True, gated_mlp=False, activation=act, mlp_bias=bias,
                        qkv_bias=bias, o_bias=bias, learned_positions=True, position_offset=2,
                        rope_layers=(False,) * cfg["num_hidden_layers"], names=NAMES)


MODEL = TransformerDecoder
