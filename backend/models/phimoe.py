"""Phi-3.5-MoE (microsoft/Phi-3.5-MoE-instruct, `phimoe`): Mixtral's block with LayerNorms (weight and
bias) in place of RMSNorms, biases on Q, K, V and the output projection (`attention_bias`), a bias
on the output head (`lm_head_bias`), Phi-3's `longrope` rotary scaled by the config's own
`short_mscale` / `long_mscale`, a sliding window on every layer where `sliding_window` is set
(131,072 in the published config: longer than any sequence), and 16 SiLU-gated experts a layer of
which each token takes two, chosen and weighted by the "sparsemixer" router.

The router at inference (transformers' `sparsemixer` without training or jitter), over a token's
logits s (a linear of the normalised row, no bias) and eps = `router_jitter_noise` (0.01):
- the first expert is the largest logit m1; its weight is a softmax of the logits over only the
  experts near it, those with (m1 - s) / max(|s|, m1) <= 2 eps, at m1: w1 = 1 / sum exp(s - m1);
- the second is the largest logit m2 among the others, its weight the same masked softmax over the
  experts but the first near m2 by the same rule: w2 = 1 / sum exp(s - m2).
No renormalisation (w1 + w2 is not 1 in general); the weights are rounded to the activations'
dtype, as Hugging Face's softmax in that dtype returns them. The choice and the weights run in
the MoE routing kernel (reference.moe_route's `sparsemixer`), on the GPU, no host sync: the decode
step stays one captured graph.

Rotary: transformers' PhimoeRotaryEmbedding scales cos and sin by `long_mscale` for a whole call
once its longest position passes the original length (`short_mscale` before), and always uses the
short factors; here, as for Phi-3's longrope (rope.py), each position inside the original length
uses the short factors and `short_mscale`, each past it the long ones and `long_mscale`. Identical
inside the original length (4,096), and everywhere where the two factor lists and the two scales
are equal (the published config's, as far as we know it).

Refused by name: `num_experts_per_tok` other than 2 (sparsemixer picks exactly two), a
`hidden_act` other than SiLU, a longrope without both mscales. Checkpoints name the block
`block_sparse_moe` with `gate` and the experts' `w1` / `w3` / `w2`, as published, or `mlp` with
`router` and the stacked `experts.gate_up_proj` / `down_proj`, as transformers >= 5 saves them."""
from dataclasses import replace

from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, layer_windows, rope_parameters,
                                                     spec_from_hf)

NAMES = MoeNames(blocks=("block_sparse_moe", "mlp"), routers=("gate", "router"), gate="w1", up="w3", down="w2")
TOP_K = 2  # (sparsemixer's two picks)


def from_hf(cfg: dict) -> DecoderSpec:
    top_k = cfg.get("num_experts_per_tok", TOP_K)
    if top_k != TOP_K:
        raise ValueError(f"num_experts_per_tok {top_k} is not supported (supported: num_experts_per_tok {TOP_K}, "
                         f"the sparsemixer router's two picks)")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"Phi-3.5-MoE hidden_act {act!r} is not supported (supported: hidden_act silu)")
    rope = rope_parameters(cfg)
    mscales = {}
    if rope and rope.get("rope_type", rope.get("type")) in ("longrope", "su"):
        if not all(isinstance(rope.get(k), (int, float)) for k in ("short_mscale", "long_mscale")):
            raise ValueError("a Phi-3.5-MoE longrope without numbers for short_mscale and long_mscale is not supported "
                             "(supported: short_mscale and long_mscale set, as transformers requires)")
        mscales = dict(short_mscale=float(rope["short_mscale"]), long_mscale=float(rope["long_mscale"]))
        # transformers reads the original length from the rope dict only (the length of the model where it has none)
        original = rope.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 4096 * 32))
        cfg = {**cfg, "rope_scaling": {**rope, "rope_type": "longrope", "original_max_position_embeddings": original}}
    layers = cfg["num_hidden_layers"]
    moe = MoeSpec(num_experts=num_experts(cfg, 16), top_k=TOP_K, intermediate_size=cfg["intermediate_size"],
                  normalize=False, round_weights=True, layers=(True,) * layers, names=NAMES, scoring="sparsemixer",
                  mask_eps=float(cfg.get("router_jitter_noise", 0.01)))
    bias = bool(cfg.get("attention_bias", False))
    spec = spec_from_hf(cfg, default_theta=1e6, norm_eps=cfg.get("rms_norm_eps", 1e-5), layer_norm=True,
                        norm_bias=True, qkv_bias=bias, o_bias=bias, head_bias=bool(cfg.get("lm_head_bias", False)),
                        layer_windows=layer_windows(cfg, cfg.get("sliding_window")), moe=moe)
    return replace(spec, rope=replace(spec.rope, **mscales)) if mscales else spec


MODEL = TransformerDecoder
