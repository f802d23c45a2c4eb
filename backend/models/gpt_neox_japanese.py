"""GPT-NeoX-Japanese (`gpt_neox_japanese`: ABEJA's gpt-neox-japanese-2.7b): GPT-NeoX's sequential block (gpt_neox.py
with `use_parallel_residual` off: LayerNorms with biases before attention, `input_layernorm`, and the MLP,
`post_attention_layernorm`, and at the end; one QKV projection stored per head; a rotate-half rotary over the first
`partial_rotary_factor` of each head's dims) with none of its biases: no bias on the QKV projection, the output
projection or the plain MLP, which is `intermediate_multiple_size` x hidden wide (whatever `intermediate_size` says).

One bias stands alone: the last layer's attention has `dense_bias`, added to the output projection's rows before
the residual add (as the output projection's own bias would be). It is read as that layer's `attention.dense.bias`,
the other layers' a zero one (adding zero is exact).

Config as transformers reads it: the rope's dict (`rope_parameters`, or `rope_scaling`) first, then `rotary_emb_base`
(10,000 where absent) as its base and `rotary_pct` (1.0 where absent: the whole head, not GPT-NeoX's quarter) as its
share. Tensors under `gpt_neox_japanese.`, the head `embed_out`, tied to the embeddings unless
`tie_word_embeddings` is false. Activations other than gelu / gelu_new / gelu_pytorch_tanh / relu are refused."""
import torch

from tritonformer.backend.models import gpt_neox
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, plain_activation, rope_parameters,
                                                     spec_from_hf)

NAMES = gpt_neox.NAMES
_DENSE_BIAS = "attention.dense_bias"


def _rope(cfg: dict) -> dict:
    """The rope's dict as transformers completes it (see the module's docstring)."""
    params = dict(rope_parameters(cfg) or {})
    params.setdefault("rope_theta", cfg.get("rotary_emb_base", 10000.0))
    params.setdefault("partial_rotary_factor", cfg.get("rotary_pct", 1.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def _config(cfg: dict) -> dict:
    """The config under the names spec_from_hf reads: the completed rope dict alone (no top-level base or share,
    which transformers does not read beside it) and the MLP's width."""
    hidden, rope = cfg.get("hidden_size", 2560), _rope(cfg)
    cfg = {k: v for k, v in cfg.items() if k not in ("rope_scaling", "rope_theta", "partial_rotary_factor")}
    return {"vocab_size": 32000, "hidden_size": hidden, "num_hidden_layers": 32, "num_attention_heads": 32,
            "max_position_embeddings": 2048, **cfg, "rope_parameters": rope,
            "intermediate_size": int(hidden * cfg.get("intermediate_multiple_size", 4))}


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The tensors without `gpt_neox_japanese.`, the head as `lm_head` (gpt_neox.adapt), the last layer's
    `dense_bias` as its output projection's bias and a zero one on every other layer (unless a checkpoint in the
    decoder's own names, random_decoder's, has them)."""
    prefix = "gpt_neox_japanese."
    state = {name.removeprefix(prefix): t for name, t in state.items()}
    cfg, state = gpt_neox.adapt(cfg, state)
    state = {(name.removesuffix(_DENSE_BIAS) + NAMES.o + ".bias" if name.endswith(_DENSE_BIAS) else name): t
             for name, t in state.items()}
    full = _config(cfg)
    if state:  # (a config alone, as the split check reads it: no tensors to complete)
        zero = torch.zeros(full["hidden_size"])
        for i in range(full["num_hidden_layers"] - 1):
            state.setdefault(f"layers.{i}.{NAMES.o}.bias", zero)
    return cfg, state


def from_hf(cfg: dict) -> DecoderSpec:
    act = plain_activation(cfg, "GPT-NeoX-Japanese", ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"))
    cfg = _config(cfg)
    return spec_from_hf(cfg, default_theta=10000.0, tie_default=True, norm_eps=cfg.get("layer_norm_eps", 1e-5),
                        layer_norm=True, norm_bias=True, gated_mlp=False, activation=act, mlp_bias=False,
                        qkv_bias=False, o_bias=True, num_kv_heads=cfg["num_attention_heads"], names=NAMES)


MODEL = TransformerDecoder
