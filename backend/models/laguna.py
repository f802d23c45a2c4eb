"""Laguna (`laguna`: poolside's Laguna-XS.2 and kin): AFMoE's attention (afmoe.py: per-head q / k RMSNorms before the
rotary, sliding-window layers by `layer_types`) with a softplus output gate, a rotary of its own per layer type, and
DeepSeek-V3's kind of experts after a dense first layer, in Llama's pre-norm block.

- Attention: q, k, v (biases on them and on o_proj where `attention_bias`), q / k normalised per head, rotated, then
  attention over the last `sliding_window` keys on the layers `layer_types` calls "sliding_attention", over all on
  the "full_attention" ones (all of them by default). Its output o is gated before o_proj: o * softplus(x_n @ G^T)
  in fp32, rounded to the activation dtype, G the layer's `self_attn.g_proj`: one gate per head (`gating` true or
  "per-head": `[heads, hidden]`, attn_gate_per_head) or one per element (`[heads * head_dim, hidden]`, any other
  `gating`, as transformers reads it): the shared decoder's output gate with attn_gate_softplus.
- Rotary: `rope_parameters` keyed by layer type, each its own theta, variant (default, YaRN, ...) and
  `partial_rotary_factor` (published: the full layers YaRN over half of each head, theta 500,000; the sliding ones
  the whole head, theta 10,000). The sliding layers read the local table, the full ones the other; where a type
  rotates only its first r dims, its layers' q / k rows (and biases, q / k norm weights) are stored at load in the
  kernels' order for r (rope.rotary_order) and its table's last columns are cos 1, sin 0 (LayerRope), so layers of
  both kinds run the one whole-head rotary.
- MLP: a dense SwiGLU of `intermediate_size` in the layers `mlp_layer_types` calls "dense" (by default the first),
  experts in the "sparse" ones: sigmoid scores of the router's logits (`mlp.gate`, in the activation dtype, then
  fp32), the top k by score + `e_score_correction_bias`, renormalised, rounded to the activation dtype, the experts'
  weighted sum times `moe_routed_scaling_factor`, then the shared expert (`shared_expert_intermediate_size`) added
  as it is. (transformers rounds the weights and scales the sum; the decoder scales the weights, then rounds: the
  same in fp32, a rounding apart in bf16.)

Refused by name: per-layer head counts (`num_attention_heads_per_layer` other than `num_attention_heads` in every
layer: the decoder's layers share one head count), router logit soft-capping (`moe_router_logit_softcapping` > 0)
and `moe_apply_router_weight_on_input` (which transformers refuses too). The published checkpoints' names
(`mlp.experts.e_score_correction_bias`, `mlp.shared_expert.`) load as transformers' (adapt)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.rope import Rope, rotary_order
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf

# transformers' LagunaConfig defaults, where a config.json leaves them out
DEFAULTS = {"vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
            "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 131072, "sliding_window": 512, "num_experts": 256, "num_experts_per_tok": 8,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}
ROPE_DEFAULTS = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}
# (published, transformers') parts of tensor names, transformers' conversion mapping for laguna
PUBLISHED_NAMES = ((".mlp.experts.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
                   (".mlp.shared_expert.", ".mlp.shared_experts."))


@dataclass(frozen=True)
class LayerRope(Rope):
    """A layer type's rotary over its first `dims` dims of each head (None: all), its table's other columns cos 1,
    sin 0, whatever rotary_dim the decoder asks for (the spec's is None: every head dim in the table)."""

    dims: int | None = None

    def cos_sin(self, positions: int, dim: int, device: torch.device, rotary_dim: int | None = None) -> torch.Tensor:
        return super().cos_sin(positions, dim, device, self.dims)


def _layer_types(cfg: dict) -> list[str]:
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or ["full_attention"] * layers
    if len(types) != layers or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"Laguna with layer_types {types} is not supported (supported: layer_types, "
                         f"'full_attention' or 'sliding_attention' for each of {layers} layers)")
    return types


def _rope_params(cfg: dict) -> dict[str, dict]:
    """Each layer type's rope parameters (transformers' defaults for a type the config leaves out)."""
    params = cfg.get("rope_parameters") or {}
    return {t: params.get(t) or ROPE_DEFAULTS[t] for t in ROPE_DEFAULTS}


def _rotary_dims(cfg: dict, params: dict) -> int | None:
    """A layer type's rotating dims of each head, as transformers rounds them (None: all)."""
    head = cfg["head_dim"]
    dims = int(head * params.get("partial_rotary_factor", 1.0))
    rotary_order(head, dims)  # (an odd or empty share is an error that says so)
    return None if dims == head else dims


def _check(cfg: dict) -> None:
    heads, layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    per_layer = cfg.get("num_attention_heads_per_layer") or [heads] * layers
    if list(per_layer) != [heads] * layers:
        raise ValueError(f"Laguna with num_attention_heads_per_layer {per_layer} is not supported (supported: "
                         f"num_attention_heads_per_layer, {heads} (num_attention_heads) in every layer)")
    if cfg.get("moe_router_logit_softcapping"):
        raise ValueError(f"Laguna with moe_router_logit_softcapping {cfg['moe_router_logit_softcapping']} is not "
                         f"supported (supported: moe_router_logit_softcapping 0, no soft-capping)")
    if cfg.get("moe_apply_router_weight_on_input"):
        raise ValueError("Laguna with moe_apply_router_weight_on_input true is not supported (supported: "
                         "moe_apply_router_weight_on_input false)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported Laguna hidden_act {cfg['hidden_act']!r} (supported: silu)")


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    _check(cfg)
    layers, types = cfg["num_hidden_layers"], _layer_types(cfg)
    mlp_types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    if len(mlp_types) != layers or not set(mlp_types) <= {"dense", "sparse"}:
        raise ValueError(f"Laguna with mlp_layer_types {mlp_types} is not supported (supported: mlp_layer_types, "
                         f"'dense' or 'sparse' for each of {layers} layers)")
    windows = layer_windows({**cfg, "layer_types": types}, cfg.get("sliding_window"))
    params, positions = _rope_params(cfg), cfg["max_position_embeddings"]

    def rope(t: str) -> LayerRope:
        base = Rope.from_hf(params[t], 10000.0, positions)
        return LayerRope(**{f: getattr(base, f) for f in base.__dataclass_fields__}, dims=_rotary_dims(cfg, params[t]))

    moe = MoeSpec(num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                  intermediate_size=cfg["moe_intermediate_size"], normalize=True, round_weights=True,
                  layers=tuple(t == "sparse" for t in mlp_types),
                  shared_intermediate_size=cfg["shared_expert_intermediate_size"],
                  names=MoeNames(shared="mlp.shared_experts", shared_gate=None), scoring="sigmoid", score_bias=True,
                  scale=float(cfg.get("moe_routed_scaling_factor", 1.0)))
    bias, gating = bool(cfg.get("attention_bias", False)), cfg.get("gating", True)
    return spec_from_hf(cfg, norm_eps=cfg["rms_norm_eps"], qkv_bias=bias, o_bias=bias, qk_norm=True,
                        attn_output_gate=True, attn_gate_softplus=True, layer_windows=windows,
                        attn_gate_per_head=gating is True or gating == "per-head",
                        rope=rope("full_attention"), local_rope=rope("sliding_attention") if any(windows) else None,
                        rotary_dim=None, moe=moe)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The tensors as the shared decoder reads them: the published names as transformers'; each layer's gate
    `self_attn.g_proj` as `self_attn.gate_proj`; the q / k rows, biases and norm weights of each layer whose type
    rotates part of a head in the kernels' order for it (rope.rotary_order)."""
    full = {**DEFAULTS, **cfg}
    head, heads, kv_heads = full["head_dim"], full["num_attention_heads"], full["num_key_value_heads"]
    params = _rope_params(full)
    orders = {t: rotary_order(head, dims) for t in params if (dims := _rotary_dims(full, params[t])) is not None}
    types = _layer_types(full)
    out = {}
    for name, t in state.items():
        for published, own in PUBLISHED_NAMES:
            name = name.replace(published, own)
        parts = name.split(".")
        layer = int(parts[1]) if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() else None
        order = orders.get(types[layer]) if layer is not None and layer < len(types) else None
        if name.endswith("self_attn.g_proj.weight"):
            name = name.replace(".g_proj.", ".gate_proj.")
        elif order is not None and name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias",
                                                  "self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            t = _tensor(t)
            rows = (heads if ".q_proj." in name else kv_heads, head)
            t = t.reshape(*rows, *t.shape[1:])[:, order].reshape(t.shape)
        elif order is not None and name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
            t = _tensor(t)[order]
        out[name] = t
    return cfg, out


def _tensor(t) -> torch.Tensor:
    """A checkpoint tensor (or a lazy one, read whole)."""
    return t if isinstance(t, torch.Tensor) else t.to("cpu")


MODEL = TransformerDecoder
