"""Beam (`beam`: Reflection AI's Beam-1.0-501B-A23B): AFMoE's kind of attention (afmoe.py) and DeepSeek-V3's kind of
experts in a block of four norms whose residual adds are scaled by depth.

- Attention: q, k, v (biases on them and on o_proj where `attention_bias`), q / k normalised per head; the layers
  `layer_types` calls "sliding_attention" (five of every six, by default) attend over the last `sliding_window` keys
  and rotate q and k by their `rope_parameters` entry; the "full_attention" ones (every sixth and the last) attend
  over all keys without a rotary (their entry None), each query times (1 + (p + 1) / 2048) ** 0.1 at its position p,
  in fp32 (nope_query_power). The output o is gated per element before o_proj, o * sigmoid(x_n @ G^T + b), G the
  layer's `self_attn.gate_proj` and b its `self_attn.gate_bias`, one per head (attn_gate_head_bias).
- MLP: a dense SwiGLU of `intermediate_size` in the layers `mlp_layer_types` calls "dense" (the first three by
  default), experts in the "sparse" ones: sigmoid scores of fp32 router logits (`mlp.gate`), the top k by score +
  `e_score_correction_bias` among the best `topk_group` of `n_group` groups (each ranked by its two largest),
  renormalised, times `routed_scaling_factor`; no shared expert. (transformers scales the experts' weighted sum,
  the decoder the weights: the same in fp32, a rounding apart in bf16.)
- Block: norms before and after attention and the MLP (`input_layernorm` / `post_attention_layernorm`,
  `pre_feedforward_layernorm` / `post_feedforward_layernorm`), and each residual add scaled by its depth: the k-th
  stream (the embeddings the first) is x_k = y / sqrt(k) + x_{k-1} sqrt((k - 1) / k), y the sublayer's normalised
  output, k = 2 (l + 1) after layer l's attention and one more after its MLP. The decoder runs that chain itself
  (`hidden_states`): each norm a kernel of its own, each scaled sum element-wise ops in the model's dtype, as
  transformers rounds them. (Up to the norms' eps the scales cancel in the RMSNorms that read the stream: s_k =
  sqrt(k) x_k is the plain sum y + s_{k-1}, and RMSNorm(x_k) is RMSNorm(s_k) at eps k * eps. The shared decoder's
  fused norm-and-add could run Beam so, with an eps per norm; not done here.) Logits soft-capped at
  `final_logit_softcapping` in fp32, as transformers caps them.

Refused by name: an activation other than SiLU, layer kinds other than those above, a rotary other than the default
one (`rope_type`) or over part of a head (`partial_rotary_factor`), `rope_parameters` not keyed by layer type, and
no `sliding_window` where the two layer kinds rotate differently. The published checkpoint's experts one by one
(`mlp.experts.{j}.gate_proj`, as transformers' conversion for beam reads them) load as the stacked ones do."""
from __future__ import annotations

import math

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.glm4_moe import expert_groups
from tritonformer.backend.models.moe import MoeSpec, num_experts
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, layer_windows,
                                                     per_layer_kinds, spec_from_hf)

NAMES = WeightNames(mlp_norm="pre_feedforward_layernorm", attn_post_norm="post_attention_layernorm",
                    mlp_post_norm="post_feedforward_layernorm")
# transformers' BeamConfig defaults, where a config.json leaves them out
DEFAULTS = {"vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 20480, "num_hidden_layers": 52,
            "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6, "sliding_window": 512, "moe_intermediate_size": 2560, "num_experts_per_tok": 8,
            "num_experts": 256, "norm_topk_prob": True, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
            "final_logit_softcapping": 30.0}
LAYER_TYPES = ("sliding_attention", "full_attention")
# The full-attention (NoPE) layers' query scale, (1 + (p + 1) / 2048) ** 0.1: transformers' constants, not the config's
NOPE_QUERY_POWER = (2048.0, 0.1)


def _layer_types(layers: int) -> list[str]:
    """Per layer its attention kind where the config lists none: transformers' rule (every sixth layer and the last
    full)."""
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    types[-1] = "full_attention"
    return types


def _mlp_types(layers: int) -> list[str]:
    """Per layer its MLP kind where the config lists none: transformers' rule (the first three dense)."""
    dense = min(3, layers)
    return ["dense"] * dense + ["sparse"] * (layers - dense)


def _ropes(cfg: dict) -> dict[str, Rope | None]:
    """Each layer kind's rotary (None: that kind's layers run without one), from `rope_parameters` keyed by kind
    (transformers' default: the sliding layers' at theta 10,000, the full ones' none)."""
    params = cfg.get("rope_parameters")
    if params is None:
        params = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": None}
    if not isinstance(params, dict) or not set(params) <= set(LAYER_TYPES):
        raise ValueError(f"Beam with rope_parameters {params} is not supported (supported: rope_parameters keyed by "
                         f"layer type, {' / '.join(LAYER_TYPES)}, each a dict or null)")
    ropes = {}
    for kind in LAYER_TYPES:
        p = params.get(kind)
        if p is not None:
            if p.get("rope_type", p.get("type", "default")) != "default":
                raise ValueError(f"Beam with rope_type {p.get('rope_type', p.get('type'))!r} for its {kind} layers "
                                 f"is not supported (supported: rope_type default)")
            if p.get("partial_rotary_factor", 1.0) != 1.0:
                raise ValueError(f"Beam with partial_rotary_factor {p['partial_rotary_factor']} for its {kind} "
                                 f"layers is not supported (supported: partial_rotary_factor 1.0)")
        ropes[kind] = None if p is None else Rope.from_hf(p, 10000.0, cfg["max_position_embeddings"])
    return ropes


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Beam with hidden_act {cfg['hidden_act']!r} is not supported (supported: hidden_act silu)")
    types = per_layer_kinds(cfg, "layer_types", LAYER_TYPES, _layer_types, "Beam")
    mlp_types = per_layer_kinds(cfg, "mlp_layer_types", ("dense", "sparse"), _mlp_types, "Beam")
    ropes = _ropes(cfg)
    # the full layers' table where they rotate, else the sliding ones' (a NoPE layer reads none)
    rope = ropes["full_attention"] or ropes["sliding_attention"] or Rope(10000.0)
    local = ropes["sliding_attention"]
    windows = layer_windows({**cfg, "layer_types": types}, cfg.get("sliding_window"))
    if not any(windows) and local is not None and local != rope and "sliding_attention" in types:
        raise ValueError("Beam without a sliding_window whose sliding and full layers rotate differently is not "
                         "supported (supported: sliding_window set, or one rotary for both layer types)")
    moe = MoeSpec(num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                  intermediate_size=cfg["moe_intermediate_size"], normalize=bool(cfg.get("norm_topk_prob", True)),
                  round_weights=False, layers=tuple(t == "sparse" for t in mlp_types), scoring="sigmoid",
                  score_bias=True, scale=float(cfg.get("routed_scaling_factor", 1.0)), router_fp32=True,
                  **expert_groups(cfg))
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf({**cfg, "rope_parameters": None, "rope_scaling": None}, qkv_bias=bias, o_bias=bias,
                        qk_norm=True, attn_output_gate=True, attn_gate_head_bias=True, sandwich_norms=True,
                        names=NAMES, rope=rope, local_rope=local if any(windows) and local != rope else None,
                        layer_windows=windows, rope_layers=tuple(ropes[t] is not None for t in types),
                        nope_query_power=NOPE_QUERY_POWER, moe=moe,
                        final_softcap=cfg.get("final_logit_softcapping"), final_softcap_fp32=True)


def depth_scaled_add(y: torch.Tensor, x: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th residual stream, y / sqrt(k) + x sqrt((k - 1) / k): each product and the sum in y's dtype."""
    return y * (1.0 / math.sqrt(k)) + x * math.sqrt((k - 1) / k)


class BeamDecoder(TransformerDecoder):
    """The shared decoder with Beam's depth-scaled residual adds (the module docstring)."""

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for the rows in `batch.logits_index`: each sublayer reads the stream
        normalised, its output normalised again joins the stream by depth_scaled_add."""
        eps = self.config.norm_eps
        cos_sin = self.rope_cos_sin[batch.positions]
        local = self.local_cos_sin[batch.positions] if self.local_cos_sin is not None else None
        x = self._embed(batch.input_ids)
        for li, layer in enumerate(self.layers):
            normed, _ = kernels.rms_norm(x, layer.attn_norm, eps)
            h = self._summed(self._attend(normed, li, layer, batch, cache, cos_sin, local))
            x = depth_scaled_add(kernels.rms_norm(h, layer.attn_post_norm, eps)[0], x, 2 * li + 2)
            normed, _ = kernels.rms_norm(x, layer.mlp_norm, eps)
            m = self._summed(self._mlp(normed, layer))
            x = depth_scaled_add(kernels.rms_norm(m, layer.mlp_post_norm, eps)[0], x, 2 * li + 3)
        if not batch.logits_every_row:
            x = x[batch.logits_index]
        return kernels.rms_norm(x, self.final_norm, eps)[0]

    def _summed(self, part: torch.Tensor) -> torch.Tensor:
        """A row-parallel output's rows whole: summed over the ranks (as it is without tensor parallelism)."""
        return part if self.tp is None else self.tp.all_reduce(part)


MODEL = BeamDecoder
