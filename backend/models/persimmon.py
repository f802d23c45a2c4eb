"""Persimmon (`persimmon`: Adept's Persimmon-8B): a pre-norm block on LayerNorms with biases (before
attention, before the MLP, at the end), as many KV heads as query heads from one `query_key_value`
projection storing each head's q, k, v rows one after the other (qkv_grouped), each head's q and k
LayerNorm'd over its dims with a weight and a bias of their own (`q_layernorm` / `k_layernorm`,
qk_norm_bias) before a rotary over the first half of each head (`partial_rotary_factor` 0.5,
rotate-half), a plain squared-ReLU MLP (`dense_h_to_4h`, relu(h)^2, `dense_4h_to_h`), biases on
every linear but the output head. Without `qk_layernorm` the heads are not normalised."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, plain_activation,
                                                     spec_from_hf)

NAMES = WeightNames(qkv="self_attn.query_key_value", qkv_grouped=True, o="self_attn.dense", up="mlp.dense_h_to_4h",
                    down="mlp.dense_4h_to_h", q_norm="self_attn.q_layernorm", k_norm="self_attn.k_layernorm",
                    final_norm="final_layernorm.weight")


def from_hf(cfg: dict) -> DecoderSpec:
    act = plain_activation(cfg, "Persimmon", ("relu2",))
    # (Hugging Face's defaults where the config has none; the heads are hidden / heads wide, whatever head_dim says)
    cfg = {"partial_rotary_factor": 0.5, **cfg, "num_key_value_heads": None,
           "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"]}
    qk_norm = bool(cfg.get("qk_layernorm", True))
    return spec_from_hf(cfg, norm_eps=cfg.get("layer_norm_eps", 1e-5), layer_norm=True, norm_bias=True,
                        gated_mlp=False, activation=act, mlp_bias=True, qkv_bias=True, o_bias=True, qk_norm=qk_norm,
                        qk_norm_bias=qk_norm, names=NAMES)


MODEL = TransformerDecoder
