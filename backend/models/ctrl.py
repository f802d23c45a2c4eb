"""CTRL (`ctrl`: Salesforce's CTRL, 1.6B): a pre-LN block (LayerNorms with biases before attention, `layernorm1`, and
the MLP, `layernorm2`, and one at the end, `layernorm`), biases on q, k, v (`Wq`, `Wk`, `Wv`), the output projection
(`dense`) and a plain ReLU MLP (`ffn.0`, `ffn.2`) `dff` wide, no rotary; the token embeddings (`w`) scaled by
sqrt(d_model), then a fixed sinusoidal position table added; the head tied to the embeddings by default, with a bias
of its own (`lm_head.bias`).

Positions: position p adds row p of a table whose row n is [sin(n * f_0) .. sin(n * f_{h-1}), cos(n * f_0) ..
cos(n * f_{h'-1})], f_j = 10000^(-2j / d_model), h = ceil(d_model / 2) sines then h' = floor(d_model / 2) cosines
(the paper's pairs, their sines gathered first, then their cosines; no offset, no padding row). The table is built
in fp32 at load (the checkpoint has none: transformers keeps it as a buffer it does not save) and read as learnt
positions are, max_position_embeddings (`n_positions`) rows of it; rounded to the model's dtype, as transformers
adds it. The layers' LayerNorms take epsilon 1e-6 whatever the config says (transformers builds them so); the final
one takes `layer_norm_epsilon`. Config names: GPT-2's `n_embd`, `n_layer`, `n_head`, `n_positions`."""
import math

import torch

from tritonformer.backend.models.transformer import (GPT2_CONFIG_NAMES, DecoderSpec, TransformerDecoder, WeightNames,
                                                     config_renamed, layers_renamed, spec_from_hf)

_ATTN = "multi_head_attention."
NAMES = WeightNames(q=_ATTN + "Wq", k=_ATTN + "Wk", v=_ATTN + "Wv", o=_ATTN + "dense", up="ffn.0", down="ffn.2",
                    attn_norm="layernorm1", mlp_norm="layernorm2", embed="w.weight", positions="pos_encoding",
                    final_norm="layernorm.weight")
_DEFAULTS = {"vocab_size": 246534, "hidden_size": 1280, "num_hidden_layers": 48, "num_attention_heads": 16,
             "max_position_embeddings": 256}  # (transformers' CTRLConfig's, where config.json leaves one out)


def sinusoidal_positions(rows: int, dim: int) -> torch.Tensor:
    """fp32 `[rows, dim]`: CTRL's sinusoidal table (see the module's docstring)."""
    freqs = 1.0 / torch.pow(10000.0, torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.arange(rows, dtype=torch.float32)[:, None] * freqs[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles[:, : dim // 2])], dim=1)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The layers as `layers.{i}.`, and the position table the decoder reads as `pos_encoding`."""
    cfg = {**_DEFAULTS, **config_renamed(cfg, GPT2_CONFIG_NAMES)}
    table = sinusoidal_positions(cfg["max_position_embeddings"], cfg["hidden_size"])
    return cfg, {**layers_renamed(state, "h."), NAMES.positions: table}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**_DEFAULTS, **config_renamed(cfg, GPT2_CONFIG_NAMES)}
    hidden, heads, layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    return spec_from_hf({**cfg, "intermediate_size": cfg.get("dff", 8192)}, tie_default=True, norm_eps=1e-6,
                        final_norm_eps=cfg.get("layer_norm_epsilon", 1e-6), layer_norm=True, norm_bias=True,
                        gated_mlp=False, activation="relu", mlp_bias=True, qkv_bias=True, o_bias=True, head_bias=True,
                        embed_scale=math.sqrt(hidden), learned_positions=True, num_kv_heads=heads,
                        rope_layers=(False,) * layers, names=NAMES)


MODEL = TransformerDecoder
