"""LFM3 (`lfm3`: Liquid AI's LFM3-1.7B and kin): LFM2's hybrid (lfm2.py) of attention and gated short
convolutions with three kinds of layer (`layer_types` "conv" / "full_attention" / "sliding_attention"; by default
layer i attends globally where i % 4 == 2, within a window where i % 4 == 0 past the first, and convolves
otherwise, as transformers' Lfm3Config reads it). Where it differs from LFM2:

- sandwich norms (`use_sandwich_norm`, the default): the operator's and the MLP's outputs RMS-normalised
  (`post_operator_norm`, `post_ffn_norm`) before each residual add, on conv layers as on attention layers:

      x += post_op(op(operator_norm(x)));   x += post_ffn(mlp(ffn_norm(x)))

- the attention is Qwen3's under Qwen3's names (`q_proj` .. `o_proj`, per-head `q_norm` / `k_norm` before the
  rotary), `sliding_window` tokens on the windowed layers, and each head's output scaled by its own sigmoid gate
  (`use_attention_gate`): o_h * sigmoid(x_n . g_h), `g_proj` `[heads, hidden]`: the shared decoder's per-head
  output gate (attn_output_gate, attn_gate_per_head);
- a rotary per layer type (`rope_parameters` keyed by "full_attention" / "sliding_attention"; transformers'
  defaults where the config has none: the windowed layers' plain rotary of base 10,000 over whole heads, the global
  layers' "proportional" one of base 1e6 over half of each head's frequency pairs, rope.py);
- `conv_L_cache` 7 by default (the convolution's state holds the last 6 inputs per channel);
- the MLP is a SwiGLU of `intermediate_size` columns as written (LFM2's block_* sizing is gone), `head_dim` 128
  where the config does not say.

Refused by name: attention biases (`attention_bias`), windowed layers without a `sliding_window`, rope parameters
not keyed by layer type (transformers' rotary reads them per type), a partial rotary other than the proportional
one's, and whatever LFM2 refuses (a convolution of fewer than 2 taps)."""
from __future__ import annotations

from dataclasses import replace

from tritonformer.backend.models import lfm2
from tritonformer.backend.models.lfm2 import SHORT_CONV, Lfm2Decoder, Lfm2Spec
from tritonformer.backend.models.rope import Rope

NAMES = replace(lfm2.NAMES, o="self_attn.o_proj", q_norm="self_attn.q_norm", k_norm="self_attn.k_norm",
                attn_post_norm="post_operator_norm", mlp_post_norm="post_ffn_norm")
LAYER_KINDS = ("conv", "full_attention", "sliding_attention")
# transformers' Lfm3Config defaults where a config leaves them out
DEFAULTS = {"head_dim": 128, "conv_L_cache": 7, "sliding_window": 256, "intermediate_size": 7680,
            "max_position_embeddings": 128000, "tie_word_embeddings": True}
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5}}


def layer_types(cfg: dict) -> list[str]:
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or ["full_attention" if i % 4 == 2 else
                                       "sliding_attention" if i % 4 == 0 and i > 0 else "conv" for i in range(layers)]
    if len(types) != layers or not set(types) <= set(LAYER_KINDS):
        raise ValueError(f"unsupported LFM3 layer_types {types!r} (supported: layer_types "
                         f"{' / '.join(map(repr, LAYER_KINDS))} for each of the {layers} layers)")
    return list(types)


def ropes(cfg: dict, types: list[str]) -> tuple[Rope, Rope]:
    """The global layers' rotary and the windowed layers'."""
    params = cfg.get("rope_parameters") or DEFAULT_ROPE
    used = [t for t in ("full_attention", "sliding_attention") if t in types]
    if not all(isinstance(params.get(t), dict) for t in used):
        raise ValueError(f"LFM3 rope_parameters {params!r} are not supported (supported: rope_parameters keyed by "
                         f"layer type, {' / '.join(used)})")
    out = []
    for t in ("full_attention", "sliding_attention"):
        p = params.get(t) or DEFAULT_ROPE[t]
        if p.get("partial_rotary_factor", 1.0) != 1.0 and p.get("rope_type", "default") != "proportional":
            raise ValueError(f"LFM3 {t} partial_rotary_factor with rope_type {p.get('rope_type')!r} is not supported "
                             f"(supported: partial_rotary_factor with rope_type 'proportional')")
        out.append(Rope.from_hf(p, p.get("rope_theta", 1e6), cfg["max_position_embeddings"]))
    return out[0], out[1]


def from_hf(cfg: dict) -> Lfm2Spec:
    cfg = {**DEFAULTS, **cfg}
    if cfg.get("attention_bias"):
        raise ValueError("LFM3 with attention_bias is not supported (supported: attention_bias false)")
    types = layer_types(cfg)
    window = cfg.get("sliding_window")
    if "sliding_attention" in types and not window:
        raise ValueError(f"LFM3 sliding_attention layers with sliding_window {window!r} are not supported "
                         f"(supported: sliding_window, a number of tokens)")
    rope, local_rope = ropes(cfg, types)
    windows = tuple(window if t == "sliding_attention" else None for t in types)
    mixers = tuple(SHORT_CONV if t == "conv" else None for t in types)
    sandwich, gated = bool(cfg.get("use_sandwich_norm", True)), bool(cfg.get("use_attention_gate", True))
    return lfm2.lfm2_spec({**cfg, "rope_parameters": None, "rope_scaling": None},  # (the ropes: given here)
                          "LFM3", cfg["intermediate_size"], mixers, names=NAMES, rope=rope,
                          local_rope=None if local_rope == rope else local_rope, layer_windows=windows,
                          sandwich_norms=sandwich, attn_output_gate=gated, attn_gate_per_head=gated)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """Each attention layer's per-head gate `[heads, hidden]` (transformers' `self_attn.g_proj`; the published
    checkpoints' `self_attn.gate_proj`, which transformers renames) under the decoder's name for it,
    `self_attn.gate_proj`."""
    return cfg, {name.replace(".self_attn.g_proj.", ".self_attn.gate_proj."): t for name, t in state.items()}


MODEL = Lfm2Decoder
