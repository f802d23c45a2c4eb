"""ERNIE 4.5 MoE (`ernie4_5_moe`: ERNIE-4.5-21B-A3B, 300B-A47B): ERNIE 4.5's block (its rotary
pairing neighbouring dims) with a mixture-of-experts MLP in the layers from
`moe_layer_start_index` to `moe_layer_end_index`, every `moe_layer_interval`-th. The router's
logits come from fp32 rows and weights; each token takes the k experts of the largest softmax
probability plus `moe_statics.e_score_correction_bias`, weighted by their probabilities
renormalised and rounded to the activations' dtype; `moe_num_shared_experts` shared experts (one
MLP of that many times the expert width) are added as they are."""
from dataclasses import replace

from tritonformer.backend.models import ernie4_5
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder


def moe_layers(cfg: dict) -> tuple[bool, ...]:
    """ERNIE's rule: layer i is MoE when (i + 1) is a multiple of the interval and i lies between
    the start and end indices (end -1: the last layer)."""
    layers = cfg["num_hidden_layers"]
    start, end = cfg.get("moe_layer_start_index", 1), cfg.get("moe_layer_end_index", -1)
    end = layers - 1 if end == -1 else end
    interval = cfg.get("moe_layer_interval", 1)
    return tuple((i + 1) % interval == 0 and start <= i <= end for i in range(layers))


def from_hf(cfg: dict) -> DecoderSpec:
    inter = cfg["moe_intermediate_size"]
    top_k = cfg.get("moe_k", cfg.get("num_experts_per_tok", 6))  # (published configs: moe_k)
    moe = MoeSpec(num_experts=num_experts(cfg, default=64), top_k=top_k, intermediate_size=inter,
                  normalize=True, round_weights=True, layers=moe_layers(cfg),
                  shared_intermediate_size=inter * cfg.get("moe_num_shared_experts", 0),
                  names=MoeNames(shared="mlp.shared_experts", shared_gate=None,
                                 score_bias="moe_statics.e_score_correction_bias"),
                  score_bias=True, router_fp32=True)
    return replace(ernie4_5.from_hf(cfg), norm_eps=cfg.get("rms_norm_eps", 1e-5), moe=moe)


MODEL = TransformerDecoder
