"""Ling 3.0 (`bailing_hybrid`: inclusionAI/Ling-3.0-Flash): a hybrid decoder whose layers are mostly Kimi Delta
Attention (kda.py: the gated delta rule with a decay per key channel, a fixed-size state per sequence) and, the last
of every `layer_group_size` (6), multi-head latent attention (mla.py, queries from q_proj, no query latent, the
interleaved rotary over `qk_rope_head_dim` dims of base `rope_theta`) whose output is gated per head,
o_h * sigmoid(x_n . G_h) (`g_proj`, one row per head); or as `layer_types` lists them. The MLPs are DeepSeek-V3's
experts (glm4_moe.sigmoid_moe: sigmoid scores from fp32 router logits, the top k by score plus
`e_score_correction_bias` among the best `topk_group` of `n_group` groups, renormalised over their sum + 1e-20,
scaled by `routed_scaling_factor`, `n_shared_experts` shared experts of `moe_intermediate_size` each added as they
are), the first `first_k_dense_replace` layers a dense SwiGLU (or as `mlp_layer_types` lists them). Llama's pre-norm
block otherwise, RMSNorms applied as w * x.

What differs from Kimi Linear's KDA (kda.KdaSpec's options for it): the forget gate's logits f and the output gate
each come from one full `[heads * head_dim, hidden]` projection (`f_proj`, `g_proj`; Kimi's are low-rank), A_log is
one value a head, and with `kda_safe_gate` (the default) the log decay is bounded,
g = kda_lower_bound * sigmoid(exp(A_log) (f + dt_bias)) in [kda_lower_bound, 0] (else Kimi's
-exp(A_log) softplus(f + dt_bias)); g is rounded to the model's dtype before the rule, as transformers' forget gate
returns it. The KDA's sizes: `linear_num_heads` / `linear_head_dim` / `linear_conv_kernel_dim` where the config
writes them (transformers' saved configs), else `num_attention_heads`, `head_dim` and `short_conv_kernel_size` (the
published config.json: its `head_dim` is the KDA's; the latent attention's heads are `qk_*_head_dim` wide).

The per-head attention gate is the shared decoder's (attn_output_gate, attn_gate_per_head): one GEMM of g_proj's
rows as published and one element-wise kernel gate the attention's output as transformers' per-head product does.

Checkpoints: the published names (`word_embeddings`, `attention.` for `self_attn.`, `attention.dense` for o_proj,
the KDA's `q_conv1d` / `k_conv1d` / `v_conv1d` and `f_proj` / `dt_bias` / `A_log` beside its projections, experts one
by one, the router's `expert_bias`) or transformers' (one `conv1d` over [q; k; v], `forget_gate.*`, the experts
stacked, `e_score_correction_bias`): both load (`adapt`). The multi-token-prediction layer
(`layers.{num_hidden_layers}`) is left unread, as transformers leaves it. Under tensor parallelism each rank holds
its KDA heads (kda.split) and its latent-attention heads with their gate rows.

Refused by name: an activation other than SiLU, layer kinds other than linear_attention / full_attention, MLP kinds
other than dense / sparse, attention biases (`attention_bias`: transformers' q_proj has none beside kv_a's),
convolutions under 2 taps.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from tritonformer.backend.models import kda
from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.kda import KdaSpec, KimiDeltaAttention
from tritonformer.backend.models.kimi_linear import LAYER_KINDS, moe_layer_flags
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, config_renamed, spec_from_hf

KDA = "kda"  # the mixer kind (DecoderSpec.mixers) of a linear_attention layer
# the published config.json's names -> transformers' BailingHybridConfig's fields (its attribute_map, reversed), and
# num_local_experts -> num_experts (which moe.num_experts reads first)
RENAMES = (("model_max_length", "max_position_embeddings"), ("num_experts_per_token", "num_experts_per_tok"),
           ("moe_renormalize", "norm_topk_prob"), ("num_expert_group", "n_group"),
           ("num_shared_experts", "n_shared_experts"), ("num_local_experts", "num_experts"))
# transformers' BailingHybridConfig defaults, where a config leaves them out
DEFAULTS = {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
            "first_k_dense_replace": 2, "norm_topk_prob": True, "moe_intermediate_size": 768,
            "intermediate_size": 6144, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "num_experts": 512,
            "attention_bias": False, "head_dim": 128, "short_conv_kernel_size": 4, "layer_group_size": 6,
            "kda_safe_gate": True, "kda_lower_bound": -5.0, "rope_theta": 6_000_000.0, "hidden_act": "silu"}
# the published checkpoints' names -> the ones read here (transformers' conversion mapping's renames)
NAME_CHANGES = ((".attention.", ".self_attn."), (".self_attn.dense.", ".self_attn.o_proj."),
                (".self_attn.forget_gate.", ".self_attn."),
                (".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias"))


@dataclass(frozen=True)
class BailingHybridSpec(DecoderSpec):
    """DecoderSpec plus the KDA layers' sizes and options."""

    kda: KdaSpec | None = None

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A KDA layer's checkpoint tensors by name (client/model_shapes.tensor_shapes: a random-weight model at a
        published shape), as `adapt` leaves them."""
        return tensor_shapes(self.kda, prefix + "self_attn.", self.hidden_size)

    def split_mixers(self, tp) -> None:
        kda.split(self.kda, tp)


def _defaults(cfg: dict) -> dict:
    return {**DEFAULTS, **config_renamed(cfg, RENAMES)}


def layer_kinds(cfg: dict) -> tuple[str | None, ...]:
    """Per layer KDA or None (latent attention): `layer_types`, else the last of every `layer_group_size` layers
    latent attention, the others KDA."""
    layers = cfg["num_hidden_layers"]
    group = cfg["layer_group_size"]
    types = cfg.get("layer_types") or ["full_attention" if (i + 1) % group == 0 else "linear_attention"
                                       for i in range(layers)]
    if len(types) != layers or not set(types) <= set(LAYER_KINDS):
        raise ValueError(f"layer_types must list 'linear_attention' / 'full_attention' for each of {layers} layers "
                         f"(supported: layer_types of {', '.join(LAYER_KINDS)})")
    return tuple(KDA if LAYER_KINDS[t] else None for t in types)


def kda_spec(cfg: dict) -> KdaSpec:
    """The KDA layers' sizes and Ling 3.0's options from a (defaulted) config."""
    return KdaSpec(num_heads=cfg.get("linear_num_heads") or cfg.get("num_attention_heads") or 32,
                   head_dim=cfg.get("linear_head_dim") or cfg["head_dim"],
                   conv_kernel=cfg.get("linear_conv_kernel_dim") or cfg["short_conv_kernel_size"],
                   norm_eps=cfg["rms_norm_eps"], full_rank_gates=True,
                   lower_bound=float(cfg["kda_lower_bound"]) if cfg["kda_safe_gate"] else None, round_decay=True)


def from_hf(cfg: dict) -> BailingHybridSpec:
    cfg = _defaults(cfg)
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"Ling 3.0 with hidden_act {cfg['hidden_act']!r} is not supported "
                         f"(supported: hidden_act silu)")
    if cfg["attention_bias"]:
        raise ValueError("Ling 3.0 with attention_bias is not supported (supported: attention_bias false)")
    moe = replace(sigmoid_moe(cfg, first_moe=2), layers=moe_layer_flags(cfg))
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {"rope_type": "default"}
    # MLA without a query latent; the rotary interleaved always (transformers' Ling attention rotates pairs), over
    # qk_rope_head_dim dims (its rotary's head_dim) of base rope_theta
    cfg = {**cfg, "q_lora_rank": None, "rope_interleave": True,
           "rope_parameters": {"rope_theta": cfg["rope_theta"], **params}, "rope_scaling": None}
    spec = spec_from_hf(cfg, **mla_options(cfg), norm_eps=cfg["rms_norm_eps"], moe=moe, mixers=layer_kinds(cfg),
                        attn_output_gate=True, attn_gate_per_head=True)
    return BailingHybridSpec(**{f.name: getattr(spec, f.name) for f in fields(DecoderSpec)}, kda=kda_spec(cfg))


def _whole(t) -> torch.Tensor:
    return t if isinstance(t, torch.Tensor) else t[:]


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors under the names the decoder reads (see the module docstring): the published names
    as transformers' (`word_embeddings` as `embed_tokens`, `attention.` as `self_attn.`, its `dense` as o_proj, the
    router's `expert_bias`), the KDA's `forget_gate.*` up to `self_attn.` as published and transformers' one
    `conv1d.weight` `[3 dim, 1, kernel]` as the published three (read whole: a few kilobytes); a latent-attention
    layer's per-head gate g_proj `[heads, hidden]` under the decoder's name for it, `self_attn.gate_proj`."""
    c = _defaults(cfg)
    heads = c["num_attention_heads"]
    out = {}
    for name, t in state.items():
        name = name.replace("word_embeddings.", "embed_tokens.")
        for old, new in NAME_CHANGES:
            name = name.replace(old, new)
        if name.endswith(".self_attn.conv1d.weight"):
            whole = _whole(t)
            third = whole.shape[0] // 3
            for j, conv in enumerate(kda.CONVS):
                out[name.replace("conv1d", conv)] = whole[j * third : (j + 1) * third]
            continue
        if name.endswith(".self_attn.g_proj.weight") and tuple(t.shape)[0] == heads:  # (latent attention's gate)
            name = name.replace("g_proj", "gate_proj")
        out[name] = t
    return cfg, out


def tensor_shapes(spec: KdaSpec, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    """A Ling KDA layer's tensors under `prefix` (`layers.{i}.self_attn.`) by name, as `adapt` leaves them."""
    dim, hd, k = spec.dim, spec.head_dim, spec.conv_kernel
    shapes = {prefix + name + ".weight": (dim, hidden) for name in ("q_proj", "k_proj", "v_proj", "f_proj", "g_proj")}
    shapes.update({prefix + name + ".weight": (dim, 1, k) for name in kda.CONVS})
    shapes.update({prefix + "dt_bias": (dim,), prefix + "A_log": (spec.num_heads,),
                   prefix + "b_proj.weight": (spec.num_heads, hidden), prefix + "o_norm.weight": (hd,),
                   prefix + "o_proj.weight": (hidden, dim)})
    return shapes


def load_kda(spec: KdaSpec, prefix: str, weight, hidden: int, tp=None) -> KimiDeltaAttention:
    """A Ling KDA layer from its tensors under `prefix` (tensor_shapes' names); `weight(name, *shape, rows=, cols=)`
    reads one (or its rows / columns) in the model's dtype. With `tp`, this rank's heads: their rows of q, k, v, f,
    g and b, their convolutions, decays and output-projection columns; the norm whole."""
    p = prefix
    local, heads = kda.split(spec, tp)
    dim, hd, n = spec.dim, spec.head_dim, spec.num_heads
    own = heads.rows(hd)
    in_proj = torch.cat([weight(p + name + ".weight", dim, hidden, rows=own)
                         for name in ("q_proj", "k_proj", "v_proj", "f_proj", "g_proj")]
                        + [weight(p + "b_proj.weight", n, hidden, rows=heads.rows(1))])
    conv = torch.cat([weight(p + name + ".weight", dim, 1, spec.conv_kernel, rows=own) for name in kda.CONVS])
    return KimiDeltaAttention(local, in_proj.contiguous(), conv.view(3 * local.dim, -1).contiguous(), None, None,
                              weight(p + "dt_bias", dim, rows=own), weight(p + "A_log", n, rows=heads.rows(1)),
                              weight(p + "o_norm.weight", hd), weight(p + "o_proj.weight", hidden, dim, cols=own))


class BailingHybridDecoder(TransformerDecoder):
    """The shared decoder with Ling's KDA layers where the spec's mixers say."""

    def load_mixer(self, i: int, prefix: str, weight, read):
        if self.config.mixer(i) != KDA:
            return super().load_mixer(i, prefix, weight, read)
        return load_kda(self.config.kda, prefix + "self_attn.", weight, self.config.hidden_size, self.tp)


MODEL = BailingHybridDecoder
