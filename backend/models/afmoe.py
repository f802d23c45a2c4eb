"""AFMoE (`afmoe`: Arcee's Trinity Nano, Mini and Large): Qwen3's attention (per-head q / k RMSNorms before the
rotary; biases on the four projections where `attention_bias`) whose output is gated per element before the
output projection, o * sigmoid(x_n @ G^T) with G the layer's `self_attn.gate_proj` (attn_output_gate);
sliding-window layers that alone rotate q and k, and every `global_attn_every_n_layers`-th layer global without a
rotary (NoPE), or as `layer_types` lists them; norms before and after attention and the MLP (sandwich norms:
`input_layernorm` / `post_attention_layernorm`, `pre_mlp_layernorm` / `post_mlp_layernorm`); the token embeddings
times sqrt(hidden) where `mup_enabled`. The first `num_dense_layers` layers have a dense SwiGLU MLP, the others
experts routed as DeepSeek-V3 routes: sigmoid scores of the router's logits (`router.gate`, in the activation
dtype, then fp32), the top k chosen by score plus the block's `expert_bias`, renormalised and scaled by
`route_scale`; `num_shared_experts` shared experts (one MLP of that many expert widths) added as they are.

Published configs also carry `score_func`, `route_norm` and the expert groups (`n_group` / `topk_group`, or
`num_expert_groups` / `num_limited_groups`), which transformers does not read: a softmax score, unnormalised
weights and group-limited choice (fewer groups kept than there are) are refused by name. transformers keeps
the norms in fp32 and scales the embeddings by sqrt(hidden) unrounded; the decoder applies the norms' weights
and the scale rounded to the activation dtype (in bf16 a rounding apart, none in fp32)."""
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, layer_windows,
                                                     spec_from_hf)

NAMES = WeightNames(mlp_norm="pre_mlp_layernorm", attn_post_norm="post_attention_layernorm",
                    mlp_post_norm="post_mlp_layernorm")
MOE_NAMES = MoeNames(routers=("router.gate",), shared="mlp.shared_experts", shared_gate=None, score_bias="expert_bias")


def _check_routing(cfg: dict) -> None:
    if cfg.get("score_func", "sigmoid") != "sigmoid":
        raise ValueError(f"AFMoE with score_func {cfg['score_func']!r} is not supported "
                         f"(supported: score_func sigmoid)")
    if cfg.get("route_norm") is False:
        raise ValueError("AFMoE with route_norm false is not supported (supported: route_norm true)")
    for groups_key, kept_key in (("n_group", "topk_group"), ("num_expert_groups", "num_limited_groups")):
        groups, kept = cfg.get(groups_key) or 1, cfg.get(kept_key) or 1
        if kept < groups:
            raise ValueError(f"group-limited expert choice ({groups_key} {groups}, {kept_key} {kept}) is not "
                             f"supported; supported: {kept_key} equal to {groups_key} (every group kept)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported AFMoE hidden_act {cfg['hidden_act']!r} (supported: silu)")


def from_hf(cfg: dict) -> DecoderSpec:
    _check_routing(cfg)
    layers = cfg["num_hidden_layers"]
    every = cfg.get("global_attn_every_n_layers") or 4
    sliding = [bool((i + 1) % every) for i in range(layers)]
    if cfg.get("layer_types"):  # (what transformers' config writes: the same rule, or the checkpoint's own)
        sliding = [t == "sliding_attention" for t in cfg["layer_types"]]
    windows = layer_windows(cfg, cfg.get("sliding_window", 1024), sliding)
    expert, shared = cfg.get("moe_intermediate_size", 1408), cfg.get("num_shared_experts", 2) or 0
    dense = cfg.get("num_dense_layers", 1) or 0
    moe = MoeSpec(num_experts=num_experts(cfg, 64), top_k=cfg.get("num_experts_per_tok") or 6,
                  intermediate_size=expert, normalize=True, round_weights=False,
                  layers=tuple(i >= dense for i in range(layers)), shared_intermediate_size=expert * shared,
                  names=MOE_NAMES, scoring="sigmoid", score_bias=True, scale=float(cfg.get("route_scale", 1.0)))
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf({"head_dim": 128, **cfg}, norm_eps=cfg.get("rms_norm_eps", 1e-5), qkv_bias=bias, o_bias=bias,
                        qk_norm=True, attn_output_gate=True, sandwich_norms=True, layer_windows=windows,
                        rope_layers=tuple(sliding), moe=moe, names=NAMES,
                        embed_scale=cfg["hidden_size"] ** 0.5 if cfg.get("mup_enabled") else None)


MODEL = TransformerDecoder
