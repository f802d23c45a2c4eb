"""Cohere2 MoE (`cohere2_moe`: Cohere's Command A Plus): Command R7B's parallel block (attention and the
MLP side by side on one norm's output, both added; a rotary pairing neighbouring dims; sliding-window
layers by `layer_types`, three of every four by default; the logits times `logit_scale`; a tied
embedding) with experts in the layers `mlp_layer_types` calls sparse (the first `first_k_dense_replace`
dense, of `prefix_dense_intermediate_size` columns). The norm is an RMSNorm where `rms_norm_eps` is set,
else Cohere's LayerNorm without a bias. Global layers are NoPE, but for the dense layers when
`prefix_dense_sliding_window_pattern` is 1 (they rotate). The router takes the top k logits and weighs
them by a softmax over those k (the full softmax renormalised over the k: the same numbers) or by their
sigmoids, renormalised where `norm_topk_prob`; the weights are rounded to the activation dtype.
`num_shared_experts` shared experts (one MLP of that many times the expert width) are added to the
routed sum, or averaged with it (`shared_expert_combination_strategy` "average": the routing weights
scaled by 1/2 and the shared down projection halved at load). Biases on the attention's four
projections where `attention_bias`."""
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf

NAMES = MoeNames(shared="mlp.shared_experts", shared_gate=None)
SELECTIONS = ("softmax", "sigmoid")
COMBINATIONS = ("average", "sum")


def _averaged(cfg: dict) -> bool:
    """Whether the shared experts' output is averaged with the routed sum (rather than added)."""
    combination = cfg.get("shared_expert_combination_strategy", "average")
    if combination not in COMBINATIONS:
        raise ValueError(f"Cohere2 MoE shared_expert_combination_strategy {combination!r} is not supported "
                         f"(supported: shared_expert_combination_strategy {' or '.join(COMBINATIONS)})")
    return bool(cfg.get("num_shared_experts", 0)) and combination == "average"


def _layer_types(cfg: dict) -> tuple[list[str], list[str]]:
    """(attention types, MLP types) per layer: the config's lists, else transformers' rule (the first
    `first_k_dense_replace` layers dense, windowed but every `prefix_dense_sliding_window_pattern`-th;
    the rest sparse, windowed but every `sliding_window_pattern`-th)."""
    layers, dense = cfg["num_hidden_layers"], cfg.get("first_k_dense_replace", 0)
    prefix, pattern = cfg.get("prefix_dense_sliding_window_pattern", 1), cfg.get("sliding_window_pattern", 4)
    types = cfg.get("layer_types") or (
        ["sliding_attention" if (i + 1) % prefix else "full_attention" for i in range(dense)]
        + ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers - dense)])
    mlp_types = cfg.get("mlp_layer_types") or ["dense" if i < dense else "sparse" for i in range(layers)]
    return types, mlp_types


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """Averaged shared experts: their down projections halved (the routed half rides on the routing weights)."""
    if not _averaged(cfg):
        return cfg, state
    state = dict(state)
    for i in range(cfg["num_hidden_layers"]):
        name = f"layers.{i}.{NAMES.shared}.down_proj.weight"
        if name in state:
            state[name] = state[name][:] * 0.5
    return cfg, state


def from_hf(cfg: dict) -> DecoderSpec:
    selection = cfg.get("expert_selection_fn", "softmax")
    if selection not in SELECTIONS:
        raise ValueError(f"Cohere2 MoE expert_selection_fn {selection!r} is not supported "
                         f"(supported: expert_selection_fn {' or '.join(SELECTIONS)})")
    types, mlp_types = _layer_types(cfg)
    window = cfg.get("sliding_window", 4096)
    windows = layer_windows({**cfg, "layer_types": types}, window)
    forced = cfg.get("prefix_dense_sliding_window_pattern", 1) == 1  # (dense layers rotate whatever their type)
    rotates = tuple(bool(windows and windows[i]) or (forced and t == "dense") for i, t in enumerate(mlp_types))
    expert, shared = cfg["intermediate_size"], cfg.get("num_shared_experts", 0)
    moe = MoeSpec(num_experts=num_experts(cfg, 8), top_k=cfg.get("num_experts_per_tok", 2), intermediate_size=expert,
                  normalize=selection == "softmax" or bool(cfg.get("norm_topk_prob", True)), round_weights=True,
                  layers=tuple(t == "sparse" for t in mlp_types), shared_intermediate_size=expert * shared,
                  names=NAMES, scoring=selection, scale=0.5 if _averaged(cfg) else 1.0)
    rms = cfg.get("rms_norm_eps")
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, tie_default=True, intermediate_size=cfg.get("prefix_dense_intermediate_size") or expert,
                        norm_eps=rms if rms is not None else cfg.get("layer_norm_eps", 1e-5), layer_norm=rms is None,
                        parallel_block=True, rotary_interleaved=True, qkv_bias=bias, o_bias=bias,
                        logit_scale=float(cfg.get("logit_scale", 0.0625)), layer_windows=windows, rope_layers=rotates,
                        moe=moe)


MODEL = TransformerDecoder
