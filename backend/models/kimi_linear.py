"""Kimi Linear (`kimi_linear`: moonshotai/Kimi-Linear-48B-A3B-Base / -Instruct): a hybrid decoder whose layers are
mostly Kimi Delta Attention (kda.py: a gated delta rule with a decay per key channel, a fixed-size state per
sequence) and, every so often, multi-head latent attention without any rotary (mla.py with no layer rotating: the
"rope" share of each key, `qk_rope_head_dim` of kv_a's output, is still one key part every head shares, and each
query has its matching dims; scores times qk_head_dim ** -0.5); the MLPs DeepSeek-V3's experts (glm4_moe.sigmoid_moe:
sigmoid scores from fp32 router logits, the top k by score plus `e_score_correction_bias` among the best `topk_group`
of `n_group` groups, renormalised over their sum + 1e-20, scaled by `routed_scaling_factor`, `n_shared_experts`
shared experts added as they are), the first `first_k_dense_replace` layers a dense SwiGLU (or as `mlp_layer_types`
lists them). Llama's pre-norm block otherwise, RMSNorms applied as w * x.

The published config.json writes the KDA layers' sizes and the layer kinds in `linear_attn_config` (`head_dim`,
`num_heads`, `short_conv_kernel_size`, `full_attn_layers` / `kda_layers` counting from 1) and several options
under names of its own (`num_experts`, `num_experts_per_token`, `moe_renormalize`, `num_expert_group`,
`num_shared_experts`, `model_max_length`); transformers' KimiLinearConfig reads those and its own (`layer_types`
over the lists, `linear_head_dim` and kin under `linear_attn_config`'s), and so does `from_hf`, with transformers'
precedence and defaults.

Checkpoints: the published names (`block_sparse_moe.*` with experts one by one as `w1` / `w3` / `w2`; the KDA's
`self_attn.q_conv1d` / `k_conv1d` / `v_conv1d`, `f_a_proj`, `f_b_proj`, `dt_bias`, `A_log` beside its projections)
or transformers' (`mlp.*` with the experts stacked; one `self_attn.conv1d` over [q; k; v], the forget gate's
tensors under `self_attn.forget_gate.`): both load (`adapt`: the KDA's tensors under the published names, the MoE
blocks under `mlp.`).

Refused by name: `mla_use_nope` false (the checkpoint's attention would rotate: transformers never does),
`moe_layer_freq` other than 1 and a router other than sigmoid (`moe_router_activation_func`: transformers reads
neither and always routes every layer from `first_k_dense_replace` on by sigmoid), an activation other than SiLU,
layer kinds other than linear_attention / full_attention, dense / sparse MLP kinds, convolutions under 2 taps.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from tritonformer.backend.models import kda
from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.kda import KdaSpec
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.moe import MoeNames
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, config_renamed, spec_from_hf

KDA = "kda"  # the mixer kind (DecoderSpec.mixers) of a linear_attention layer
LAYER_KINDS = {"linear_attention": KDA, "full_attention": None}
# the published config.json's names -> transformers' KimiLinearConfig's fields (its attribute_map, reversed), and
# num_local_experts -> num_experts (which moe.num_experts reads first)
RENAMES = (("model_max_length", "max_position_embeddings"), ("num_experts_per_token", "num_experts_per_tok"),
           ("moe_renormalize", "norm_topk_prob"), ("num_expert_group", "n_group"),
           ("num_shared_experts", "n_shared_experts"), ("num_local_experts", "num_experts"))
# transformers' KimiLinearConfig defaults, where a config leaves them out
DEFAULTS = {"n_shared_experts": 1, "routed_scaling_factor": 2.446, "kv_lora_rank": 512, "q_lora_rank": None,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1,
            "num_experts_per_tok": 8, "norm_topk_prob": True, "moe_intermediate_size": 1024, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 1048576, "num_experts": 256, "first_k_dense_replace": 1,
            "attention_bias": False, "intermediate_size": 9216}
# the experts one by one as published, under `mlp` (adapt renames `block_sparse_moe`); or stacked, as transformers
MOE_NAMES = MoeNames(gate="w1", up="w3", down="w2", shared="mlp.shared_experts", shared_gate=None)


@dataclass(frozen=True)
class KimiLinearSpec(DecoderSpec):
    """DecoderSpec plus the KDA layers' sizes."""

    kda: KdaSpec | None = None

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A KDA layer's checkpoint tensors by name (client/model_shapes.tensor_shapes: a random-weight model at a
        published shape)."""
        return kda.tensor_shapes(self.kda, prefix + "self_attn.", self.hidden_size)

    def split_mixers(self, tp) -> None:
        kda.split(self.kda, tp)


def _linear_attn(cfg: dict) -> dict:
    return cfg.get("linear_attn_config") or {}


def layer_kinds(cfg: dict) -> tuple[str | None, ...]:
    """Per layer KDA or None (latent attention): `layer_types`, else `linear_attn_config`'s `full_attn_layers` and
    `kda_layers` (counting from 1), else transformers' rule (every 4th from the 5th attends: i > 0, i % 4 == 0)."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    linear = _linear_attn(cfg)
    if not types and "full_attn_layers" in linear and "kda_layers" in linear:
        named = {**{i: "full_attention" for i in linear["full_attn_layers"]},
                 **{i: "linear_attention" for i in linear["kda_layers"]}}
        if set(named) != set(range(1, layers + 1)):
            raise ValueError(f"linear_attn_config's full_attn_layers and kda_layers must name each of the "
                             f"{layers} layers once, counting from 1 (supported: layer_types, or those lists)")
        types = [named[i + 1] for i in range(layers)]
    elif not types:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
    if len(types) != layers or not set(types) <= set(LAYER_KINDS):
        raise ValueError(f"layer_types must list 'linear_attention' / 'full_attention' for each of {layers} layers "
                         f"(supported: layer_types of {', '.join(LAYER_KINDS)})")
    return tuple(LAYER_KINDS[t] for t in types)


def moe_layer_flags(cfg: dict) -> tuple[bool, ...]:
    """Per layer whether its MLP is the experts: `mlp_layer_types` ("dense" / "sparse"), else every layer from
    `first_k_dense_replace` on."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("mlp_layer_types") or ["dense" if i < cfg["first_k_dense_replace"] else "sparse"
                                           for i in range(layers)]
    if len(types) != layers or not set(types) <= {"dense", "sparse"}:
        raise ValueError(f"mlp_layer_types must list 'dense' / 'sparse' for each of {layers} layers "
                         f"(supported: mlp_layer_types of dense, sparse)")
    return tuple(t == "sparse" for t in types)


def from_hf(cfg: dict) -> KimiLinearSpec:
    cfg = {**DEFAULTS, **config_renamed(cfg, RENAMES)}
    for key, supported in (("mla_use_nope", True), ("moe_layer_freq", 1), ("moe_router_activation_func", "sigmoid"),
                           ("hidden_act", "silu")):
        if cfg.get(key, supported) != supported:
            raise ValueError(f"Kimi Linear with {key} {cfg[key]!r} is not supported (supported: {key} "
                             f"{str(supported).lower() if isinstance(supported, bool) else supported})")
    linear = _linear_attn(cfg)
    # (linear_attn_config's sizes over transformers' fields, as its KimiLinearConfig takes them)
    spec_kda = KdaSpec(num_heads=linear.get("num_heads") or cfg.get("linear_num_heads") or 32,
                       head_dim=linear.get("head_dim") or cfg.get("linear_head_dim") or 128,
                       conv_kernel=linear.get("short_conv_kernel_size", cfg.get("linear_conv_kernel_dim", 4)),
                       norm_eps=cfg["rms_norm_eps"])
    moe = replace(sigmoid_moe(cfg, first_moe=1), layers=moe_layer_flags(cfg), names=MOE_NAMES)
    # No rotary anywhere (rope_layers all False: nothing reads the table), and none of a rope's score scaling:
    # transformers scales the scores by qk_head_dim ** -0.5 whatever rope options the config carries.
    cfg = {**cfg, "rope_scaling": None, "rope_parameters": None, "rope_interleave": False}
    spec = spec_from_hf(cfg, **mla_options(cfg), norm_eps=cfg["rms_norm_eps"], moe=moe, mixers=layer_kinds(cfg),
                        rope_layers=(False,) * cfg["num_hidden_layers"])
    return KimiLinearSpec(**{f.name: getattr(spec, f.name) for f in fields(DecoderSpec)}, kda=spec_kda)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors under the names the decoder reads (see the module docstring): a published MoE block's
    `block_sparse_moe.` as transformers' `mlp.` (its experts one by one or stacked: both load); transformers'
    `self_attn.forget_gate.` tensors up to `self_attn.` as published, and its one `self_attn.conv1d.weight`
    `[3 dim, 1, kernel]` as the published three convolutions (read whole here: a few kilobytes)."""
    out = {}
    for name, t in state.items():
        name = name.replace(".block_sparse_moe.", ".mlp.").replace(".self_attn.forget_gate.", ".self_attn.")
        if name.endswith(".self_attn.conv1d.weight"):
            whole = t if isinstance(t, torch.Tensor) else t[:]
            third = whole.shape[0] // 3
            for j, conv in enumerate(kda.CONVS):
                out[name.replace("conv1d", conv)] = whole[j * third : (j + 1) * third]
            continue
        out[name] = t
    return cfg, out


class KimiLinearDecoder(TransformerDecoder):
    """The shared decoder with KDA layers where the spec's mixers say."""

    def load_mixer(self, i: int, prefix: str, weight, read):
        if self.config.mixer(i) != KDA:
            return super().load_mixer(i, prefix, weight, read)
        return kda.load_kda(self.config.kda, prefix + "self_attn.", weight, self.config.hidden_size, self.tp)


MODEL = KimiLinearDecoder
