"""Mellum (`mellum`: JetBrains' Mellum2-12B-A2.5B): Qwen3-MoE's block (per-head q / k norms before the
rotary; experts routed by a softmax over the router's logits, the top k renormalised where
`norm_topk_prob`, Mellum's default) with three per-layer choices: sliding-window attention on the
layers `layer_types` names (`sliding_window`, 1,024), a rope of each layer type's own
(`rope_parameters` per type: base 500,000 for the full layers, 10,000 for the sliding ones by default),
and a dense MLP (`intermediate_size`) or the experts by `mlp_layer_types`. Biases on the attention's four
projections where `attention_bias`. The multi-token-prediction layer (`mtp.*`) is not read. Layer
types rotating different shares of each head (`partial_rotary_factor`) are refused: the decoder has one
rotary width."""
from dataclasses import replace

from tritonformer.backend.models.qwen2_moe import qwen_moe
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, layer_windows, rotary_dims,
                                                     spec_from_hf)

# transformers' MellumConfig's rope where the config names none
DEFAULT_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {"head_dim": 128, "norm_topk_prob": True, **cfg}  # (Mellum's defaults where the config omits them)
    layers, positions = cfg["num_hidden_layers"], cfg.get("max_position_embeddings", 131072)
    params = cfg.get("rope_parameters") or DEFAULT_ROPE
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    types = cfg.get("layer_types") or ["full_attention"] * layers
    shares = {(full if t == "full_attention" else local).get("partial_rotary_factor", 1.0) for t in types}
    if len(shares) > 1:
        raise ValueError(f"Mellum with partial_rotary_factor {sorted(shares)} by layer type is not supported "
                         f"(supported: partial_rotary_factor the same for every layer type)")
    rope, local_rope = Rope.from_hf(full, 500000.0, positions), Rope.from_hf(local, 10000.0, positions)
    mlp_types = cfg.get("mlp_layer_types") or ["sparse"] * layers
    moe = replace(qwen_moe(cfg, shared=False), layers=tuple(t == "sparse" for t in mlp_types))
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf({**cfg, "rope_parameters": None, "rope_scaling": None}, qkv_bias=bias, o_bias=bias,
                        qk_norm=True, rope=rope, local_rope=None if local_rope == rope else local_rope,
                        rotary_dim=rotary_dims({"partial_rotary_factor": shares.pop()}, cfg["head_dim"]),
                        layer_windows=layer_windows(cfg, cfg.get("sliding_window", 1024), [False] * layers), moe=moe)


MODEL = TransformerDecoder
