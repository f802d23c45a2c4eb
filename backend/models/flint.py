"""Flint (`flint`: RecursiveSI's Flint): Qwen3-MoE's block (per-head q / k norms before the rotary; biases on the
attention's four projections where `attention_bias`) with gpt-oss's per-head sink logits in every layer's softmax,
sliding-window layers by `layer_types` (513 tokens; by default all but the first two, every fourth from the second
and the last) that alone rotate q and k (the global layers are NoPE), and experts in all but the `mlp_only_layers`
(the first two by default): the top k by sigmoid score of fp32 router logits (no bias), renormalised where
`norm_topk_prob`, kept in fp32, plus one shared expert (`shared_expert_intermediate_size`) added as it is.
Published checkpoints name the sinks `softmax_offset`: renamed at load."""
from tritonformer.backend.models.moe import MoeNames, MoeSpec, moe_layers, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    return cfg, {name.replace("self_attn.softmax_offset", "self_attn.sinks"): t for name, t in state.items()}


def default_layer_types(layers: int) -> list[str]:
    """transformers' FlintConfig's attention types where the config lists none."""
    return ["full_attention" if i < 2 or i % 4 == 1 or i == layers - 1 else "sliding_attention" for i in range(layers)]


def from_hf(cfg: dict) -> DecoderSpec:
    layers = cfg["num_hidden_layers"]
    cfg = {**cfg, "mlp_only_layers": cfg.get("mlp_only_layers") or [0, 1],
           "layer_types": cfg.get("layer_types") or default_layer_types(layers)}  # (FlintConfig's defaults)
    windows = layer_windows(cfg, cfg.get("sliding_window", 513))
    moe = MoeSpec(num_experts=num_experts(cfg, 256), top_k=cfg.get("num_experts_per_tok", 6),
                  intermediate_size=cfg.get("moe_intermediate_size", 512),
                  normalize=bool(cfg.get("norm_topk_prob", True)), round_weights=False, layers=moe_layers(cfg),
                  shared_intermediate_size=cfg.get("shared_expert_intermediate_size", 1024),
                  names=MoeNames(shared_gate=None), scoring="sigmoid", router_fp32=True)
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, qkv_bias=bias, o_bias=bias, qk_norm=True, sinks=True, layer_windows=windows,
                        rope_layers=tuple(w is not None for w in windows) if windows else (False,) * layers, moe=moe)


MODEL = TransformerDecoder
