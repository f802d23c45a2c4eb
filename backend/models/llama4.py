"""Llama 4 (`llama4_text`; `llama4`, the text part of Llama-4-Scout / Maverick's multimodal checkpoint): Llama's
pre-norm block with four differences, each a layer option of the shared decoder:

- rope layers and NoPE layers: `no_rope_layers[i]` is 1 where layer i rotates q and k (every fourth layer does
  not, by default). The rotary turns neighbouring pairs (2i, 2i + 1), Hugging Face's complex product
  (rotary_interleaved), its frequencies llama3-scaled where `rope_scaling` says so;
- the rope layers' attention is chunked (`layer_types` "chunked_attention", by default the rope layers'): a
  query at position p sees keys (p // C) * C .. p, C = `attention_chunk_size`; the NoPE layers see every key.
  The cache keeps every key of a chunked layer (no block is freed early);
- with `use_qk_norm`, q and k of each rope layer are L2-normalised per head after the rotary:
  x / sqrt(mean(x^2) + eps), an RMSNorm without a weight (ones, added at load); the NoPE layers have none.
  A rotation keeps each head's mean square, so without a weight the norm after it is the norm before it:
  they run before it, in the QKV projection's fused kernel, unless the rope scales cos and sin (YaRN,
  LongRoPE's attention factor), where the norm would undo that scale (then after it, as written);
- with `attn_temperature_tuning`, a NoPE layer's queries are scaled by their position p:
  q * (log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1), computed in fp32, before attention.

The MLP: in the MoE layers (`moe_layers`, else every `interleave_moe_layer_step`-th: Scout every layer,
Maverick every other) a shared expert plus the top 1 of `num_local_experts` experts (`intermediate_size`
columns each), whose input, not output, is scaled by sigmoid(its router logit) rounded to the activation
dtype: expert(s * x), which for a SiLU-gated expert is not s * expert(x) (moe.py's scale_input). The experts
are stored as x @ W (`experts.gate_up_proj` `[E, H, 2I]`, gate columns then up; `experts.down_proj`
`[E, I, H]`). Dense layers are a gated MLP of `intermediate_size_mlp` columns. Refused: more than one expert
per token (Hugging Face scales each chosen expert's input by its own score; no published config has it), an
activation other than SiLU, chunked layers without a chunk size.
"""
from dataclasses import replace

import torch

from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames, spec_from_hf

NAMES = WeightNames(gate="feed_forward.gate_proj", up="feed_forward.up_proj", down="feed_forward.down_proj")
MOE_NAMES = MoeNames(blocks=("feed_forward",), routers=("router",),
                     stacked=(("experts.gate_up_proj", "experts.down_proj"),), shared="feed_forward.shared_expert",
                     shared_gate=None, columns=True, interleaved=False)


def _rotating(cfg: dict) -> tuple[bool, ...]:
    """Per layer whether it rotates q and k: `no_rope_layers` (1: rope, 0: NoPE; at least one entry a
    layer), else every `no_rope_layer_interval`-th layer NoPE, counting from 1 (transformers' rule)."""
    layers, interval = cfg["num_hidden_layers"], cfg.get("no_rope_layer_interval", 4)
    listed = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    if len(listed) < layers:
        raise ValueError(f"no_rope_layers lists {len(listed)} layers, fewer than {layers}")
    return tuple(bool(r) for r in listed[:layers])


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The multimodal checkpoint's text model (model_type llama4); the rope layers' weightless q / k
    norms as ones where the checkpoint has no such tensors."""
    if cfg.get("model_type") == "llama4":
        cfg, state = text_part(cfg, state, "llama4_text")
    if not cfg.get("use_qk_norm", True):
        return cfg, state
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    ones = {}
    for i, rotates in enumerate(_rotating(cfg)):
        if rotates:
            ones.update({f"layers.{i}.{NAMES.q_norm}.weight": torch.ones(head_dim),
                         f"layers.{i}.{NAMES.k_norm}.weight": torch.ones(head_dim)})
    return cfg, {**ones, **state}


def from_hf(cfg: dict) -> DecoderSpec:
    layers = cfg["num_hidden_layers"]
    top_k = cfg.get("num_experts_per_tok", 1)
    if top_k != 1:
        raise ValueError(f"Llama 4 with num_experts_per_tok {top_k} is not supported (supported: "
                         f"num_experts_per_tok 1: each chosen expert's input scaled by its own score)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported Llama 4 hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    rotates = _rotating(cfg)
    types = cfg.get("layer_types") or ["chunked_attention" if r else "full_attention" for r in rotates]
    if len(types) != layers or not set(types) <= {"chunked_attention", "full_attention"}:
        raise ValueError(f"layer_types must list 'chunked_attention' / 'full_attention' for each of {layers} layers")
    chunk = cfg.get("attention_chunk_size", 8192)
    if chunk is None and "chunked_attention" in types:
        raise ValueError("Llama 4's chunked_attention layers need an attention_chunk_size (supported: "
                         "attention_chunk_size a positive integer)")
    step = cfg.get("interleave_moe_layer_step", 1)
    moe_layers = cfg.get("moe_layers")
    moe_layers = set(range(step - 1, layers, step) if moe_layers is None else moe_layers)
    expert = cfg.get("intermediate_size", 8192)
    moe = MoeSpec(num_experts=num_experts(cfg, 16), top_k=1, intermediate_size=expert, normalize=False,
                  round_weights=True, layers=tuple(i in moe_layers for i in range(layers)),
                  shared_intermediate_size=expert, names=MOE_NAMES, scoring="sigmoid", scale_input=True)
    temperature = None
    if cfg.get("attn_temperature_tuning", True):
        temperature = (float(cfg.get("floor_scale", 8192)), float(cfg.get("attn_scale", 0.1)))
    qk_norm = bool(cfg.get("use_qk_norm", True))
    bias = bool(cfg.get("attention_bias", False))
    spec = spec_from_hf(
        cfg, default_theta=500000.0, intermediate_size=cfg.get("intermediate_size_mlp", 16384),
        norm_eps=cfg.get("rms_norm_eps", 1e-5), qkv_bias=bias, o_bias=bias, rotary_interleaved=True,
        rope_layers=rotates if not all(rotates) else (), qk_norm=qk_norm,
        qk_norm_layers=rotates if qk_norm and not all(rotates) else (),
        layer_chunks=tuple(chunk if t == "chunked_attention" else None for t in types), nope_temperature=temperature,
        moe=moe if any(moe.layers) else None, names=NAMES,
    )
    # (the weightless norm commutes with a rotation, not with a rotation scaled: see above)
    return replace(spec, qk_norm_after_rope=True) if qk_norm and spec.rope.cos_sin_scale() != 1.0 else spec


MODEL = TransformerDecoder
