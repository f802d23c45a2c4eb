"""GPT-BigCode (StarCoder, StarCoderBase, SantaCoder, WizardCoder, OctoCoder; `model_type`
gpt_bigcode): GPT-2's block as linears (not Conv1D) with one KV head shared by every query head
(`multi_query`, on by default): learnt absolute position embeddings (`wpe`), no rotary,
LayerNorms with a bias before attention and the MLP and at the end, a plain GELU MLP (`c_fc`,
`c_proj`), biases on every linear, a tied head. Its fused QKV (`c_attn`) holds the query heads
and then the KV head, or without `multi_query` each head's q, k and v. Its config uses GPT-2's
names (`n_embd`, `n_head`, `n_layer`, `n_positions`, `n_inner`) and its layers are `h.{i}`.
Unscaled attention (`scale_attn_weights` false) is refused."""
from tritonformer.backend.models.transformer import (GPT2_CONFIG_NAMES, DecoderSpec, TransformerDecoder, WeightNames,
                                                     config_renamed, layers_renamed, plain_activation, spec_from_hf)



def with_canonical_names(cfg: dict) -> dict:
    """A config written with GPT-2's names (`n_embd`, `n_head`, `n_layer`, `n_positions`: GPT-BigCode's,
    GPT-J's) with transformers' canonical ones beside them, and `intermediate_size` from `n_inner`
    (4 x hidden where it is None)."""
    cfg = config_renamed(cfg, GPT2_CONFIG_NAMES)
    cfg["intermediate_size"] = cfg.get("n_inner") or 4 * cfg["hidden_size"]
    return cfg
NAMES = WeightNames(qkv="attn.c_attn", qkv_grouped=True, o="attn.c_proj", up="mlp.c_fc", down="mlp.c_proj",
                    attn_norm="ln_1", mlp_norm="ln_2", embed="wte.weight", final_norm="ln_f.weight")


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """GPT-2-style layers are `h.{i}.` (GPT-BigCode's, GPT-J's): the shared decoder reads them as `layers.{i}.`."""
    return cfg, layers_renamed(state, "h.")


def from_hf(cfg: dict) -> DecoderSpec:
    if not cfg.get("scale_attn_weights", True):
        raise ValueError("GPT-BigCode with scale_attn_weights false is not supported (supported: scale_attn_weights "
                         "true)")
    cfg = with_canonical_names(cfg)
    heads = cfg["num_attention_heads"]
    act = plain_activation({"hidden_act": cfg.get("activation_function", "gelu_pytorch_tanh")}, "GPT-BigCode",
                           ("gelu_pytorch_tanh", "gelu_new", "gelu"))
    cfg["num_key_value_heads"] = 1 if cfg.get("multi_query", True) else heads
    layers = cfg["num_hidden_layers"]
    return spec_from_hf(cfg, tie_default=True, norm_eps=cfg.get("layer_norm_epsilon", 1e-5), layer_norm=True,
                        norm_bias=True, gated_mlp=False, activation=act, mlp_bias=True, qkv_bias=True, o_bias=True,
                        learned_positions=True, rope_layers=(False,) * layers, names=NAMES)


MODEL = TransformerDecoder
