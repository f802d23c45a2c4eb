"""XGLM (`xglm`: Meta's XGLM-564M to 7.5B, fairseq's multilingual decoders): OPT's pre-LN block (opt.py: LayerNorms
with a bias before attention (`self_attn_layer_norm`) and the MLP (`final_layer_norm`) and at the end
(`layer_norm`); biases on q, k, v, `out_proj`, `fc1`, `fc2`; a plain MLP, GELU by default) with fairseq's
sinusoidal positions in place of learnt ones and the token embeddings scaled by sqrt(d_model)
(`scale_embedding`, the default); the head tied to the embeddings by default.

Positions: position p adds row p + 2 of a fixed table (fairseq's offset of 2, past its padding index), whose row n
is [sin(n * f_0) .. sin(n * f_{h-1}), cos(n * f_0) .. cos(n * f_{h-1})] with h = d_model // 2 and
f_i = exp(-i * ln(10000) / (h - 1)) (tensor2tensor's spacing, not the paper's 10000^(-2i/d)); a zero column after
them where d_model is odd, and row `pad_token_id` zeroed. The table is built in fp32 at load (the checkpoint has
none: transformers keeps it as a buffer it does not save) and read as learnt positions are (DecoderSpec's
learned_positions with position_offset 2), max_position_embeddings rows of it (transformers grows its table past
them; here max_position_embeddings caps a sequence). transformers adds the fp32 table to the embeddings in the
model's dtype (so in bf16 its residual stream is fp32 from there); here the table is rounded to the model's dtype.
Its LayerNorms take torch's default epsilon, 1e-5. Config names: `d_model`, `attention_heads`, `num_layers`,
`ffn_dim`, `activation_function`. Refused: cross-attention (`add_cross_attention`), activations other than
gelu / gelu_new / relu."""
import math
from dataclasses import replace

import torch

from tritonformer.backend.models import opt
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, config_renamed,
                                                     plain_activation, spec_from_hf)

NAMES = replace(opt.NAMES, final_norm="layer_norm.weight")
_NAMES = (("d_model", "hidden_size"), ("attention_heads", "num_attention_heads"), ("num_layers", "num_hidden_layers"))
OFFSET = 2  # (fairseq's: positions count from past the padding index)


def sinusoidal_positions(rows: int, dim: int, padding_idx: int | None) -> torch.Tensor:
    """fp32 `[rows, dim]`: fairseq's sinusoidal table (see the module's docstring), row `padding_idx` zeroed."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float32) * -step)
    angles = torch.arange(rows, dtype=torch.float32)[:, None] * freqs[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    if padding_idx is not None and 0 <= padding_idx < rows:
        table[padding_idx] = 0
    return table


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors and the position table the decoder reads as `embed_positions.weight`."""
    cfg = config_renamed(cfg, _NAMES)
    rows = OFFSET + cfg.get("max_position_embeddings", 2048)
    table = sinusoidal_positions(rows, cfg.get("hidden_size", 1024), cfg.get("pad_token_id", 1))
    return cfg, {**state, NAMES.positions: table}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = config_renamed(cfg, _NAMES)
    if cfg.get("add_cross_attention"):
        raise ValueError("XGLM with add_cross_attention true is not supported (supported: add_cross_attention false)")
    act = plain_activation({"hidden_act": cfg.get("activation_function", "gelu")}, "XGLM", ("gelu", "gelu_new", "relu"))
    cfg = {"vocab_size": 256008, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
           "max_position_embeddings": 2048, **cfg, "intermediate_size": cfg.get("ffn_dim", 4096)}
    scale = math.sqrt(cfg["hidden_size"]) if cfg.get("scale_embedding", True) else None
    return spec_from_hf(cfg, tie_default=True, norm_eps=1e-5, layer_norm=True, norm_bias=True, gated_mlp=False,
                        activation=act, mlp_bias=True, qkv_bias=True, o_bias=True, embed_scale=scale,
                        learned_positions=True, position_offset=OFFSET, num_kv_heads=cfg["num_attention_heads"],
                        rope_layers=(False,) * cfg["num_hidden_layers"], names=NAMES)


MODEL = TransformerDecoder
