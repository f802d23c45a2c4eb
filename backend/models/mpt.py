"""MPT (`mpt`: MosaicML's MPT-7B, MPT-30B and their fine-tunes): ALiBi in place of any position
embedding, LayerNorms without a bias (`norm_1`, `norm_2`, `norm_f`) before attention and the MLP
(Llama's sequential block), no bias on any linear, one fused QKV projection `attn.Wqkv` ([q; k; v],
every head's query rows, then key rows, then value rows), its outputs clamped to +-`clip_qkv` where
the attention config sets it (as DBRX's), a plain exact-GELU MLP 4 x hidden wide (`ffn.up_proj`,
`ffn.down_proj`), a head tied to the embeddings (`wte`). Layers are `blocks.{i}`; the config says
`d_model`, `n_heads`, `n_layers`, `max_seq_len` and keeps attention's options in `attn_config`
(`softmax_scale`: the query scale, 1 / sqrt(head_dim) where unset).

ALiBi: query head h's score of key position k for the query at position p is
softmax_scale * q.k + m_h * (k - p), the bias added after the scaling, in fp32 (transformers adds
m_h * (k - Lk + 1) in fp32 to the scaled scores: the same up to a constant per query row, which
the softmax cancels). The slopes, for n = 2^ceil(log2 H) (the smallest power of two from H on):
m_i = 2^(-8 i / n) for i = 1 .. n; where n > H the even-indexed ones (i = 2, 4, ..) then the odd
(i = 1, 3, ..), the first H of them. transformers builds them with alibi_bias_max 8 whatever the
config says, and so do we: another `alibi_bias_max` is refused by name.

What transformers' MPT does not implement, which a checkpoint's config could ask for, is refused by
name: multi-query attention (`attn_type`), prefix-LM masks (`prefix_lm`), q / k LayerNorms
(`qk_ln`), per-sequence attention ids (`attn_uses_sequence_id`), learnt positions in place of ALiBi
(`alibi` false), biases (`no_bias` false), an MLP other than 4 x hidden (`expansion_ratio`),
scaled logits (`logit_scale`), a norm other than LayerNorm (`norm_type`). `attn_impl` (torch,
flash, triton) only chose the original code's kernel: all three are the same attention here."""
from __future__ import annotations

import math

import torch

from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, config_renamed,
                                                     layers_renamed, spec_from_hf)

_OWN_KEYS = (("d_model", "hidden_size"), ("n_heads", "num_attention_heads"), ("n_layers", "num_hidden_layers"),
             ("max_seq_len", "max_position_embeddings"))
NAMES = WeightNames(qkv="attn.Wqkv", o="attn.out_proj", up="ffn.up_proj", down="ffn.down_proj", attn_norm="norm_1",
                    mlp_norm="norm_2", embed="wte.weight", final_norm="norm_f.weight")
# (attn_config key, its default, the supported values)
_ATTENTION = (("attn_type", "multihead_attention", ("multihead_attention",)), ("prefix_lm", False, (False,)),
              ("qk_ln", False, (False,)), ("attn_uses_sequence_id", False, (False,)), ("alibi", True, (True,)),
              ("alibi_bias_max", 8, (8,)), ("attn_impl", "torch", ("torch", "flash", "triton")))
_MODEL = (("no_bias", True, (True,)), ("expansion_ratio", 4, (4,)), ("logit_scale", None, (None,)),
          ("norm_type", "low_precision_layernorm", ("low_precision_layernorm", "layernorm")))


def alibi_slopes(heads: int, bias_max: float = 8.0) -> tuple[float, ...]:
    """MPT's ALiBi slopes for `heads` heads, in fp32 (see the module's docstring)."""
    n = 2 ** math.ceil(math.log2(heads))
    slopes = 1.0 / torch.pow(2, torch.arange(1, n + 1).float() * (bias_max / n))
    if n != heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:heads]
    return tuple(slopes.tolist())


def _json(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """MPT's layers are `blocks.{i}.`: the shared decoder reads them as `layers.{i}.`."""
    return cfg, layers_renamed(state, "blocks.")


def from_hf(cfg: dict) -> DecoderSpec:
    attention = cfg.get("attn_config") or {}
    for where, options in ((attention, _ATTENTION), (cfg, _MODEL)):
        for key, default, supported in options:
            value = where.get(key, default)
            if value not in supported:
                raise ValueError(f"MPT with {key} {_json(value)} is not supported (supported: {key} "
                                 f"{' / '.join(_json(s) for s in supported)})")
    cfg = config_renamed(cfg, _OWN_KEYS)
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    cfg = {**cfg, "intermediate_size": 4 * hidden, "num_key_value_heads": heads}
    clip = attention.get("clip_qkv")
    return spec_from_hf(cfg, tie_default=True, norm_eps=cfg.get("layer_norm_epsilon", 1e-5), layer_norm=True,
                        gated_mlp=False, activation="gelu", clip_qkv=float(clip) if clip else None,
                        attn_scale=attention.get("softmax_scale"), rope_layers=(False,) * cfg["num_hidden_layers"],
                        alibi_slopes=alibi_slopes(heads), names=NAMES)


MODEL = TransformerDecoder
