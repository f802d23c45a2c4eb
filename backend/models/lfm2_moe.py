"""LFM2-MoE (`lfm2_moe`: Liquid AI's LFM2-8B-A1B): LFM2's hybrid of attention and gated short convolutions
(lfm2.py) with experts in place of the MLP past the first `num_dense_layers` layers.

The dense layers' SwiGLU MLP is `intermediate_size` wide as written (LFM2's block_* sizing is not applied
here, as transformers' Lfm2MoeMLP does not). An MoE layer (`feed_forward.*`) routes each token by sigmoid
scores of its router's logits (`gate`): the top `num_experts_per_tok` of `num_experts` by score plus the
block's learnt `expert_bias` where `use_expert_bias` (the bias only chooses), weighted by their scores,
renormalised where `norm_topk_prob` and times `routed_scaling_factor`; each expert a SwiGLU MLP of
`moe_intermediate_size` columns (published one by one as `experts.{j}.w1` / `w3` / `w2`, stacked by
transformers >= 5: both load). No shared expert.

Two roundings differ from transformers': it renormalises over the weights' sum + 1e-6 (the kernels: + 1e-20; a
relative 1e-6 / sum, a few fp32 ulps), and in bf16 it takes the sigmoid of bf16 logits in bf16 (the kernels
score in fp32 and round the weights to the activation dtype): near ties may choose otherwise in bf16.

Layer kinds come from `layer_types` (or `full_attn_idxs`); a config with neither is refused (transformers'
Lfm2MoeConfig has no default for them)."""
from __future__ import annotations

from tritonformer.backend.models.lfm2 import Lfm2Decoder, Lfm2Spec, layer_mixers, lfm2_spec
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts

MOE_NAMES = MoeNames(blocks=("feed_forward",), routers=("gate",), gate="w1", up="w3", down="w2", shared_gate=None,
                     score_bias="expert_bias")


def from_hf(cfg: dict) -> Lfm2Spec:
    layers = cfg["num_hidden_layers"]
    dense = cfg.get("num_dense_layers", 2) or 0
    moe = MoeSpec(num_experts=num_experts(cfg, 32), top_k=cfg.get("num_experts_per_tok") or 4,
                  intermediate_size=cfg.get("moe_intermediate_size", 1792),
                  normalize=bool(cfg.get("norm_topk_prob", True)), round_weights=True,
                  layers=tuple(i >= dense for i in range(layers)), names=MOE_NAMES, scoring="sigmoid",
                  score_bias=bool(cfg.get("use_expert_bias", True)),
                  scale=float(cfg.get("routed_scaling_factor") or 1.0))
    return lfm2_spec(cfg, "LFM2-MoE", cfg.get("intermediate_size", 7168),
                     layer_mixers(cfg, "LFM2-MoE", full_attn_default=False), moe=moe)


MODEL = Lfm2Decoder
