"""MiMo-V2-Flash (XiaomiMiMo/MiMo-V2-Flash, `mimo_v2_flash`), as transformers' MiMoV2Flash model reads it:
Llama's pre-norm block (RMSNorms) with sliding-window and full-attention layers (`layer_types`; by default the
first and every 6th full, the rest windowed), DeepSeek-V3's kind of experts (glm4_moe.sigmoid_moe: sigmoid
scores from fp32 router logits, the top k by score + `e_score_correction_bias`, renormalised where
`norm_topk_prob`, times `routed_scaling_factor`, group-limited where `topk_group` < `n_group`) on the layers
`mlp_layer_types` names "sparse" (by default all but the first), no shared expert, and this attention:

- q and k heads of `head_dim` (192), v heads of `v_head_dim` (128), values times `attention_value_scale`
  (0.707) before the softmax-weighted sum; scores scaled by head_dim ** -0.5; biases on Q, K, V where
  `attention_bias`, none on the output projection;
- windowed layers have twice the config's KV heads and a learnt sink logit per query head (gpt-oss's: its
  share of the softmax goes nowhere); full layers have `num_key_value_heads` and no sink;
- a rotary over the first int(head_dim * partial_rotary_factor) dims of each head (rotate-half), its base per
  layer type (`rope_parameters` keyed by "full_attention" / "sliding_attention": 5e6 and 1e4);
- the window: `sliding_window` keys back including the query's own (transformers' count; a config.json's
  `sliding_window_size` counts the keys before the query, so it is that + 1).

Mapped onto the shared decoder (one KV layout for every layer), exactly, at load (`adapt`): each full layer's
KV heads repeated in place (head j as 2j and 2j + 1: the query heads of group j read either copy) to the
windowed layers' count, and a sink of -inf on each of its heads (no share: a plain softmax); each layer's v
heads padded with zero dims to head_dim and scaled by attention_value_scale, the output projection's columns
padded alike (the zero dims of the attention's output meet zero columns). The cost: a full layer's cache holds
its keys and values twice, and every v head is head_dim wide (1.5x the values' cache and reads at the
published 192 / 128). The adapted tensors are built on the host in the checkpoint's dtype. A checkpoint in
that layout already (a full layer with sinks: what client/model_shapes.random_decoder builds from the spec)
loads as it is. The published checkpoint's sinks are `self_attn.attention_sink_bias` and its experts one by one
(`mlp.experts.{j}.gate_proj` ...); both load, as do transformers' `sinks` and stacked experts.

Refused by name: per-type rotary shares that differ, `layer_types` without a full-attention layer (a
checkpoint's layout could not be told from the adapted one), a config.json whose own keys disagree with what
transformers builds (`swa_num_key_value_heads` other than twice the KV heads; `add_full_attention_sink_bias`).
The multi-token-prediction layers (`model.mtp.*`) are not read, as transformers skips them."""
from dataclasses import replace

import torch

from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.rope import Rope, params_by_layer_type
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf

# transformers' MiMoV2FlashConfig defaults, where a config leaves them out
DEFAULTS = {"head_dim": 192, "v_head_dim": 128, "attention_value_scale": 0.707, "sliding_window": 129,
            "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "moe_intermediate_size": 2048,
            "num_experts_per_tok": 8, "n_routed_experts": 256}
DEFAULT_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334}}


def _config(cfg: dict) -> dict:
    """The config with transformers' defaults and its derived lists (layer_types, mlp_layer_types, the window)."""
    cfg = {**DEFAULTS, **{k: v for k, v in cfg.items() if v is not None or k not in DEFAULTS}}
    layers = cfg["num_hidden_layers"]
    if not cfg.get("layer_types"):
        cfg["layer_types"] = ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention"
                              for i in range(layers)]
    if not cfg.get("mlp_layer_types"):
        cfg["mlp_layer_types"] = ["dense"] + ["sparse"] * (layers - 1)
    if cfg.get("sliding_window_size") is not None:
        cfg["sliding_window"] = cfg["sliding_window_size"] + 1
    if cfg.get("routed_scaling_factor") is None:
        cfg["routed_scaling_factor"] = 1.0
    if not cfg.get("rope_parameters") or not any(t in cfg["rope_parameters"] for t in DEFAULT_ROPE):
        cfg["rope_parameters"] = DEFAULT_ROPE
    return cfg


def _checked(cfg: dict) -> dict:
    cfg = _config(cfg)
    types, kv = cfg["layer_types"], cfg["num_key_value_heads"]
    if "full_attention" not in types or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"MiMo-V2-Flash layer_types {types} are not supported (supported: layer_types of "
                         f"'full_attention' / 'sliding_attention', at least one full)")
    if set(cfg["mlp_layer_types"]) - {"dense", "sparse"} or len(cfg["mlp_layer_types"]) != len(types):
        raise ValueError(f"MiMo-V2-Flash mlp_layer_types {cfg['mlp_layer_types']} are not supported (supported: "
                         f"mlp_layer_types of 'dense' / 'sparse', one per layer)")
    if cfg.get("swa_num_key_value_heads") not in (None, 2 * kv):
        raise ValueError(f"swa_num_key_value_heads {cfg['swa_num_key_value_heads']} is not supported (supported: "
                         f"swa_num_key_value_heads {2 * kv}, twice num_key_value_heads, as transformers builds it)")
    if cfg.get("add_full_attention_sink_bias"):
        raise ValueError("add_full_attention_sink_bias is not supported (supported: add_full_attention_sink_bias "
                         "false: sinks on the windowed layers only, as transformers builds them)")
    if cfg["v_head_dim"] > cfg["head_dim"]:
        raise ValueError(f"v_head_dim {cfg['v_head_dim']} is not supported (supported: v_head_dim at most "
                         f"head_dim {cfg['head_dim']})")
    return cfg


def _rotary_dim(cfg: dict) -> int:
    full, local = params_by_layer_type(cfg)
    shares = {p.get("partial_rotary_factor", 0.334) for p in (full, local) if p}
    if len(shares) != 1:
        raise ValueError(f"MiMo-V2-Flash partial_rotary_factor {sorted(shares)} per layer type is not supported "
                         f"(supported: partial_rotary_factor the same for both layer types)")
    return int(cfg["head_dim"] * shares.pop())


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors in one KV layout for every layer (the module's docstring)."""
    if not state:
        return cfg, state
    c = _checked(cfg)
    types, kv, head, v_head = c["layer_types"], c["num_key_value_heads"], c["head_dim"], c["v_head_dim"]
    heads, scale = c["num_attention_heads"], c["attention_value_scale"] or 1.0
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    # (the published checkpoint's name of the sinks, which transformers renames)
    state = {k.replace(".self_attn.attention_sink_bias", ".self_attn.sinks"): v for k, v in state.items()}
    if all(f"layers.{i}.self_attn.sinks" in state for i in full):  # (adapted already)
        return cfg, state

    def padded(t: torch.Tensor, n: int) -> torch.Tensor:  # [n * v_head, ...] rows -> [n * head, ...], zeros after
        rows = t.reshape(n, v_head, *t.shape[1:])
        return torch.cat([rows, rows.new_zeros(n, head - v_head, *t.shape[1:])], dim=1).reshape(n * head, *t.shape[1:])

    for i, kind in enumerate(types):
        p = f"layers.{i}.self_attn."
        n = kv if kind == "full_attention" else 2 * kv
        for name in ("v_proj.weight", "v_proj.bias"):
            if p + name in state:
                state[p + name] = padded(state[p + name].float() * scale, n).to(state[p + name].dtype)
        if kind == "full_attention":  # KV head j as heads 2j and 2j + 1
            for name in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
                if p + name in state:
                    t = state[p + name]
                    state[p + name] = t.reshape(n, head, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(
                        2 * n * head, *t.shape[1:])
            state[p + "sinks"] = torch.full((heads,), float("-inf"), dtype=torch.float32)
        o = state[p + "o_proj.weight"]  # [hidden, heads * v_head] -> [hidden, heads * head]
        state[p + "o_proj.weight"] = padded(o.t(), heads).t().contiguous()
    return cfg, state


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = _checked(cfg)
    max_positions = cfg.get("max_position_embeddings", 131072)
    full, local = params_by_layer_type(cfg)
    rope = Rope.from_hf(full, full.get("rope_theta", 5_000_000.0), max_positions)
    local_rope = Rope.from_hf(local, local.get("rope_theta", 10_000.0), max_positions)
    moe = sigmoid_moe({**cfg, "n_shared_experts": 0, "first_k_dense_replace": 0}, first_moe=0)
    moe = replace(moe, layers=tuple(t == "sparse" for t in cfg["mlp_layer_types"]))
    rotary = _rotary_dim(cfg)
    return spec_from_hf(
        {**cfg, "rope_parameters": None, "rope_scaling": None, "num_key_value_heads": 2 * cfg["num_key_value_heads"]},
        norm_eps=cfg.get("rms_norm_eps", 1e-5), qkv_bias=bool(cfg.get("attention_bias", False)), sinks=True,
        rope=rope, local_rope=None if local_rope == rope else local_rope,
        rotary_dim=rotary if rotary < cfg["head_dim"] else None, moe=moe,
        layer_windows=layer_windows(cfg, cfg["sliding_window"]),
    )


MODEL = TransformerDecoder
