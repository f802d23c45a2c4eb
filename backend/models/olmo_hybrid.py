"""OLMo hybrid (`olmo_hybrid`: AI2's Olmo-Hybrid-7B): OLMo 3's attention layers beside gated DeltaNet linear
attention (gated_deltanet.py: a fixed-size state per sequence), each layer one or the other (`layer_types`
"linear_attention" / "full_attention"; by default every 4th layer, counting from 1, attends, and the last one
where that leaves none, as transformers' OlmoHybridConfig reads it).

The two kinds of block place their norms differently:

    full attention (OLMo 3's post-norm block):  x += norm_a(attn(x));     x += norm_f(mlp(x))
    linear attention (Llama's pre-norm block):  x += deltanet(norm_i(x)); x += mlp(norm_p(x))

(norm_a is `post_attention_layernorm` and norm_f `post_feedforward_layernorm` in an attending layer; norm_i is
`input_layernorm` and norm_p `post_attention_layernorm` in a linear one: DecoderSpec.post_norm_layers). The
attention is OLMo 2's (q / k RMS-normalised over all of a token's query / key heads at once), without sliding
windows; it rotates q and k only where the config has a rope base: the released checkpoints have none
(`rope_theta` null), and their attention layers are NoPE. The MLP is a SwiGLU; every RMSNorm multiplies by w; the
final norm is `norm`.

The DeltaNet layer (`linear_attn.*`) differs from Qwen3-Next's in its projections, one linear each (`q_proj`,
`k_proj`, `v_proj`, the output gate's `g_proj`, `b_proj`, `a_proj`; `o_proj` and the gated norm `o_norm`, whose eps
is 1e-5 whatever `rms_norm_eps` says), and in beta = 2 sigmoid(b) where `linear_allow_neg_eigval` (the default):
the delta rule's step may then overshoot, a negative eigenvalue of its transition. Its sizes default as
transformers' do: `linear_num_key_heads` and `linear_num_value_heads` the attention's heads, `linear_key_head_dim`
int(0.75 hidden / key heads), `linear_value_head_dim` twice that.

Published checkpoints name some tensors otherwise (transformers renames them as it loads; `adapt` does here):
`attention_layer_norm` / `feedforward_layer_norm` for `input_layernorm` / `post_attention_layernorm` (in every
layer, as transformers' renaming has it), and the convolution in three parts, `q_conv1d` / `k_conv1d` /
`v_conv1d`, for one `conv1d` over [q; k; v].

Refused by name: attention biases (`attention_bias`), value heads other than one per key head (transformers' layer
runs the rule with as many key heads as value heads), an activation other than SiLU (`hidden_act`, the MLP's and
the convolution's), a convolution of fewer than 2 taps, and layer kinds other than those two (at least one of
each, as transformers requires)."""
from __future__ import annotations

from dataclasses import fields

import torch

from tritonformer.backend.models.gated_deltanet import DeltaNetSpec
from tritonformer.backend.models.qwen3_next import HybridDecoder, HybridSpec
from tritonformer.backend.models.transformer import DecoderSpec, WeightNames, rope_parameters, spec_from_hf

LAYER_KINDS = {"linear_attention": "gated_deltanet", "full_attention": None}
# (a linear layer's `post_attention_layernorm` is its norm before the MLP: WeightNames.mlp_norm's default)
NAMES = WeightNames(attn_post_norm="post_attention_layernorm", mlp_post_norm="post_feedforward_layernorm")
GATED_NORM_EPS = 1e-5  # the DeltaNet's output norm's (FLA's FusedRMSNormGated default, as transformers has it)


def layer_kinds(cfg: dict) -> tuple[str | None, ...]:
    """Per layer "gated_deltanet" or None (full attention): `layer_types`, else transformers' default."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if not types:
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
        if "full_attention" not in types:
            types[-1] = "full_attention"
    if len(types) != layers or set(types) != set(LAYER_KINDS):
        raise ValueError(f"unsupported OLMo hybrid layer_types {types!r} (supported: layer_types 'linear_attention' "
                         f"or 'full_attention' for each of the {layers} layers, at least one of each)")
    return tuple(LAYER_KINDS[t] for t in types)


def rope_theta(cfg: dict) -> float | None:
    """The rotary's base as transformers resolves it: the rope parameters' own `rope_theta`, else the config's,
    else 10,000; None (written as null) for no rotary."""
    params = rope_parameters(cfg) or {}
    if "rope_theta" in params:
        return params["rope_theta"]
    return cfg.get("rope_theta", 10000.0)


def deltanet_spec(cfg: dict) -> DeltaNetSpec:
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    key_heads = cfg.get("linear_num_key_heads") or heads
    value_heads = cfg.get("linear_num_value_heads") or heads
    if value_heads != key_heads:
        raise ValueError(f"OLMo hybrid with linear_num_value_heads {value_heads} over linear_num_key_heads "
                         f"{key_heads} is not supported (supported: linear_num_value_heads equal to "
                         f"linear_num_key_heads)")
    key_dim = cfg.get("linear_key_head_dim") or int(0.75 * hidden / key_heads)
    return DeltaNetSpec(num_k_heads=key_heads, num_v_heads=value_heads, head_k_dim=key_dim,
                        head_v_dim=cfg.get("linear_value_head_dim") or 2 * key_dim,
                        conv_kernel=cfg.get("linear_conv_kernel_dim", 4), norm_eps=GATED_NORM_EPS, separate_proj=True,
                        beta_scale=2.0 if cfg.get("linear_allow_neg_eigval", True) else 1.0)


def from_hf(cfg: dict) -> HybridSpec:
    if cfg.get("attention_bias"):
        raise ValueError("OLMo hybrid with attention_bias is not supported (supported: attention_bias false)")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported OLMo hybrid hidden_act {act!r} (supported: hidden_act silu)")
    mixers = layer_kinds(cfg)
    theta = rope_theta(cfg)
    # (the rope base resolved here, once: a NoPE model's table is never read)
    params = {**(rope_parameters(cfg) or {}), "rope_theta": theta} if theta is not None else None
    options = {"rope_layers": (False,) * len(mixers)} if theta is None else {}
    spec = spec_from_hf({**cfg, "rope_theta": theta or 10000.0, "rope_parameters": params, "rope_scaling": None,
                         "max_position_embeddings": cfg.get("max_position_embeddings", 65536)},
                        norm_eps=cfg.get("rms_norm_eps", 1e-6), qk_norm=True, qk_norm_full=True, names=NAMES,
                        mixers=mixers, post_norm_layers=tuple(kind is None for kind in mixers), **options)
    return HybridSpec(**{f.name: getattr(spec, f.name) for f in fields(DecoderSpec)}, deltanet=deltanet_spec(cfg))


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A published checkpoint's tensors under the names transformers' model has (the module docstring)."""
    renamed, parts = {}, {}
    for name, t in state.items():
        name = name.replace("attention_layer_norm", "input_layernorm").replace("feedforward_layer_norm",
                                                                              "post_attention_layernorm")
        part = next((p for p in "qkv" if name.endswith(f"linear_attn.{p}_conv1d.weight")), None)
        if part is None:
            renamed[name] = t
        else:
            parts.setdefault(name[: -len(f"{part}_conv1d.weight")], {})[part] = t
    for prefix, qkv in parts.items():
        if set(qkv) != set("qkv"):
            raise KeyError(f"checkpoint has {', '.join(sorted(qkv))} of {prefix}q / k / v_conv1d.weight, not all three")
        renamed[prefix + "conv1d.weight"] = torch.cat([t if isinstance(t, torch.Tensor) else t.read()
                                                       for t in (qkv["q"], qkv["k"], qkv["v"])])
    return cfg, renamed


MODEL = HybridDecoder
