"""GPT-Neo (`gpt_neo`: EleutherAI's GPT-Neo 125M, 1.3B, 2.7B): GPT-2's block as linears (learnt absolute
position embeddings `wpe`, no rotary; LayerNorms with a bias before attention and the MLP and at the end; a
plain GELU MLP `c_fc`, `c_proj` with biases; a tied head) with unscaled attention scores (no 1/sqrt(head_dim):
a query scale of 1), no biases on Q, K, V but one on the output projection, and local layers attending to the
last `window_size` tokens (256) by `attention_types` (global and local in turn by default; transformers
writes them out per layer as `attention_layers`). Its config names the layers and heads `num_layers` and
`num_heads`; its layers are `h.{i}` and its attention `attn.attention`."""
from tritonformer.backend.models import gpt_bigcode
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, config_renamed,
                                                     plain_activation, spec_from_hf)

NAMES = WeightNames(q="attn.attention.q_proj", k="attn.attention.k_proj", v="attn.attention.v_proj",
                    o="attn.attention.out_proj", up="mlp.c_fc", down="mlp.c_proj", attn_norm="ln_1",
                    mlp_norm="ln_2", embed="wte.weight", final_norm="ln_f.weight")
KINDS = ("global", "local")

adapt = gpt_bigcode.adapt  # (its layers are `h.{i}.` too)


def attention_layers(cfg: dict) -> list[str]:
    """Each layer's attention kind: the config's `attention_layers`, else `attention_types` written out
    (each [kinds, n] item: the kinds in turn, n times), else global and local in turn."""
    layers = cfg.get("attention_layers")
    if not layers:
        types = cfg.get("attention_types") or [[list(KINDS), cfg["num_hidden_layers"] // 2]]
        layers = [kind for kinds, times in types for _ in range(times) for kind in kinds]
    if len(layers) != cfg["num_hidden_layers"] or not set(layers) <= set(KINDS):
        raise ValueError(f"GPT-Neo attention_layers {layers} are not supported (supported: attention_layers naming "
                         f"'global' or 'local' for each of {cfg['num_hidden_layers']} layers)")
    return layers


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = config_renamed(cfg, (("num_layers", "num_hidden_layers"), ("num_heads", "num_attention_heads")))
    cfg["intermediate_size"] = cfg.get("intermediate_size") or 4 * cfg["hidden_size"]
    act = plain_activation({"hidden_act": cfg.get("activation_function", "gelu_new")}, "GPT-Neo",
                           ("gelu_new", "gelu_pytorch_tanh", "gelu"))
    window = cfg.get("window_size", 256)
    windows = tuple(window if kind == "local" else None for kind in attention_layers(cfg))
    return spec_from_hf(cfg, tie_default=True, norm_eps=cfg.get("layer_norm_epsilon", 1e-5), layer_norm=True,
                        norm_bias=True, gated_mlp=False, activation=act, mlp_bias=True, o_bias=True, attn_scale=1.0,
                        learned_positions=True, rope_layers=(False,) * cfg["num_hidden_layers"],
                        layer_windows=windows if any(windows) else (), names=NAMES)


MODEL = TransformerDecoder
