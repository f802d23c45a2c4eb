"""Dots3 (`dots3_note_text`, and the text model of a multimodal `dots3_note` checkpoint, dots-studio/dots3-note-prev,
served text only) as transformers' Dots3NoteTextModel computes it: Llama's pre-norm block (RMSNorms, `rms_norm_eps`)
whose attention is multi-head latent attention (mla.py) with three kinds of layer (`layer_types`):

- "indexed_attention": DeepSeek Sparse Attention (deepseek_v32.py), served as dense latent attention up to
  `index_topk` tokens a sequence (2,048 published), where the two are the same: the longest sequence is capped there
  and a max_model_len past it is refused by name. The indexer's tensors (its rotary on interleaved pairs, as GLM-5's)
  are read-checked at load and not used.
- "sliding_attention": the last `sliding_window` keys (the query's own included), at a rotary base of their own.
- "full_attention": every earlier key, no indexer (transformers' "plain" layers, where `use_dsa` is false).

Layers differ in their latent attention's shape: `per_layer_config` overrides the heads, ranks and head dims layer
by layer (the published sliding layers: 64 heads from a kv latent of 1,024, keys of 192 + 64 dims, beside the others'
128 heads from 512, 128 + 64); a config without one (the published config.json) writes the sliding layers' as
`swa_*` keys. Each layer runs its own shape (transformer.DecoderSpec.layer_mla), its cache layer at its own heads
and head dim (the paged cache keeps one tensor per shape), its scores times its own qk_head_dim ** -0.5.

Dots3's own parts of the latent attention, as transformers applies them:
- the query latent's norm output times sqrt(hidden / q_lora_rank) and c_kv's times sqrt(hidden / kv_lora_rank)
  (MlaSpec.q_scale / kv_scale, folded into the norms' weights at load); both norms at `rms_norm_eps`;
- an RMSNorm on the shared rotary key k_pe before its rotary (`k_rope_only_layernorm`, MlaSpec.k_pe_norm);
- the rotary always on interleaved pairs, over qk_rope_head_dim dims (transformers' head_dim times the
  partial_rotary_factor it derives from them), each layer type's base from `rope_parameters` (published: 8e7, and
  `swa_rope_theta` 5e4 for the sliding layers);
- each head's output times sigmoid(x_n . G_h) before o_proj (`g_proj`, one row per head): the shared decoder's
  per-head output gate (attn_output_gate, attn_gate_per_head), `adapt` renaming it `self_attn.gate_proj`.

The MLPs: a dense SwiGLU where `mlp_layer_types` says "dense" (by default the first `first_k_dense_replace`, 1),
else DeepSeek-V3's experts (glm4_moe.sigmoid_moe: sigmoid scores from fp32 router logits, the top
`num_experts_per_tok` by score + `e_score_correction_bias` among the best `topk_group` of `n_group` groups, each
ranked by its two best, renormalised over their sum + 1e-20 where `norm_topk_prob`, times `routed_scaling_factor`),
plus `n_shared_experts` shared experts of `shared_experts_intermediate_size` (one SwiGLU of their total width) added
as they are. The multi-token-prediction layer (`layers.{num_hidden_layers}`, `mtp.*`) is not read, as transformers
skips it.

The multimodal checkpoint (`dots3_note`): its `text_config`, or the text model's options at its top level as the
published config.json writes them; its tensors under `language_model.` (as transformers saves them) or at the top
level (as published); the head tied as the outer config says. The vision and audio towers are not read.

Refused by name: a `hidden_act` other than SiLU, a query without its latent (`q_lora_rank` null), `layer_types`
other than the three, `mlp_layer_types` other than dense / sparse, `per_layer_config` keys other than the latent
attention's shape (and KV heads unlike the query heads), rotary key widths that differ between layers
(`qk_rope_head_dim`), rope types other than the default, indexed and plain layers at rotaries that differ
(`rope_parameters`), an `index_head_dim` narrower than the rotary key; tensor parallelism (not checked split)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from tritonformer.backend.models.deepseek_v32 import DsaDecoder, DsaSpec
from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.mla import LayerMla, MlaSpec
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import DecoderSpec, per_layer_kinds, spec_from_hf

# transformers' Dots3NoteTextConfig defaults, where a config leaves them out
DEFAULTS = {"vocab_size": 152064, "hidden_size": 5120, "intermediate_size": 13824, "moe_intermediate_size": 1536,
            "num_hidden_layers": 46, "num_attention_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
            "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": 1024, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
            "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 524288, "rms_norm_eps": 1e-5,
            "bos_token_id": 151643, "eos_token_id": 151668, "tie_word_embeddings": False, "attention_bias": False,
            "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64, "head_dim": 256,
            "shared_experts_intermediate_size": 1536}
DEFAULT_THETA = 80_000_000.0  # (the indexed and plain layers'; the sliding ones' is swa_rope_theta's)
# the sliding layers' latent attention where a config has no per_layer_config: its `swa_*` keys, else these
SLIDING = {"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1024, "kv_lora_rank": 1024,
           "head_dim": 256, "qk_nope_head_dim": 192, "v_head_dim": 128}
LAYER_KEYS = ("num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "head_dim",
              "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")  # (what per_layer_config may override)
LAYER_TYPES = ("indexed_attention", "sliding_attention", "full_attention")
GATE = "self_attn.g_proj.weight"  # (one row per head: the checkpoint's)


@dataclass(frozen=True)
class Dots3Spec(DsaSpec):
    """DsaSpec (the indexers' sizes, the layers that have one) whose layers' latent attention differs in shape."""

    family: str = "Dots3"

    def check_max_model_len(self, max_model_len: int) -> None:
        if any(self.indexer_layers):  # (without indexed layers nothing caps the length)
            super().check_max_model_len(max_model_len)

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...] | None]:
        """The indexers' tensors and each layer's per-head gate `[heads, hidden]` under its published name (`adapt`
        renames it)."""
        shapes = super().extra_tensor_shapes()
        for i, own in enumerate(self.layer_mla):
            shapes[f"layers.{i}.{GATE}"] = (own.heads, self.hidden_size)
            shapes[f"layers.{i}.{self.names.attn_gate}.weight"] = None
        return shapes

    def check_split(self, tp) -> None:
        raise ValueError("tensor parallelism is not supported for model_type 'dots3_note_text' (its layers' latent "
                         "attention shapes differ; their split is not checked)")


def _types(c: dict) -> list[str]:
    """Per layer its kind: `layer_types`, else transformers' rule (the first two and every 4th from the second
    indexed, the rest sliding; all indexed without `use_sliding_window`); `use_dsa` false makes the indexed ones
    plain ("full_attention"), true the plain ones indexed (a config with per_layer_config leaves them as they are)."""
    layers = c["num_hidden_layers"]
    use_dsa = c.get("use_dsa", None if "per_layer_config" in c else True)
    types = c.get("layer_types")
    if types is None:
        attending = "full_attention" if use_dsa is False else "indexed_attention"
        sliding = c.get("use_sliding_window", True)
        types = [attending if not sliding or i < 2 or i % 4 == 1 else "sliding_attention" for i in range(layers)]
    types = list(types)
    if use_dsa is not None:
        old, new = ("full_attention", "indexed_attention") if use_dsa else ("indexed_attention", "full_attention")
        types = [new if t == old else t for t in types]
    if len(types) != layers or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"Dots3 with layer_types {types} is not supported (supported: layer_types of "
                         f"{' / '.join(LAYER_TYPES)}, one per layer of {layers})")
    return types


def _mlp_types(c: dict) -> list[str]:
    """Per layer "dense" or "sparse": `mlp_layer_types`, else sparse from `first_k_dense_replace` (1) on where
    `moe_layer_freq` (an int: every n-th layer; a list: per layer) says so."""
    first, freq = c.get("first_k_dense_replace", 1), c.get("moe_layer_freq", 1)
    return per_layer_kinds(c, "mlp_layer_types", ("dense", "sparse"), lambda layers: [
        "sparse" if i >= first and (bool(freq[i]) if isinstance(freq, (list, tuple)) else i % freq == 0) else "dense"
        for i in range(layers)], "Dots3")


def _layer_configs(c: dict, types: list[str]) -> list[dict]:
    """Each layer's latent attention options: the config's, overridden by `per_layer_config` (its keys layer
    indices), else on the sliding layers by the `swa_*` keys (SLIDING's where absent)."""
    overrides = c.get("per_layer_config")
    if overrides is None:
        sliding = {name: c.get(f"swa_{name}", default) for name, default in SLIDING.items()}
        sliding["qk_rope_head_dim"] = c.get("swa_qk_rope_head_dim", sliding["head_dim"] - sliding["qk_nope_head_dim"])
        overrides = {i: sliding for i, t in enumerate(types) if t == "sliding_attention"}
    overrides = {int(i): values for i, values in overrides.items()}
    stray = sorted({key for values in overrides.values() for key in values} - set(LAYER_KEYS))
    if stray or not set(overrides) <= set(range(len(types))):
        raise ValueError(f"Dots3 with per_layer_config keys {stray or sorted(overrides)} is not supported "
                         f"(supported: per_layer_config, layer indices below {len(types)} overriding "
                         f"{', '.join(LAYER_KEYS)})")
    base = {key: c.get(key) for key in LAYER_KEYS}
    base["num_key_value_heads"] = base["num_key_value_heads"] or base["num_attention_heads"]
    return [{**base, **overrides.get(i, {})} for i in range(len(types))]


def _layer_mla(c: dict, layer: dict) -> LayerMla:
    heads, hidden = layer["num_attention_heads"], c["hidden_size"]
    if layer["q_lora_rank"] is None:
        raise ValueError("Dots3 with q_lora_rank null is not supported (supported: q_lora_rank, a query latent: "
                         "transformers builds q_a_proj / q_b_proj only)")
    if layer["num_key_value_heads"] != heads:
        raise ValueError(f"Dots3 with num_key_value_heads {layer['num_key_value_heads']} is not supported "
                         f"(supported: num_key_value_heads equal to the layer's num_attention_heads, {heads}, as "
                         f"transformers requires)")
    spec = MlaSpec(q_lora_rank=layer["q_lora_rank"], kv_lora_rank=layer["kv_lora_rank"],
                   qk_nope_head_dim=layer["qk_nope_head_dim"], qk_rope_head_dim=layer["qk_rope_head_dim"],
                   v_head_dim=layer["v_head_dim"], rope_interleaved=True, bias=bool(c["attention_bias"]),
                   norm_eps=c["rms_norm_eps"], q_scale=(hidden / layer["q_lora_rank"]) ** 0.5,
                   kv_scale=(hidden / layer["kv_lora_rank"]) ** 0.5, k_pe_norm=True)
    return LayerMla(spec, heads, spec.qk_head_dim ** -0.5)


def _ropes(c: dict, types: list[str], max_positions: int) -> tuple[Rope, Rope | None]:
    """(the indexed and plain layers' rotary, the sliding layers' where there are any): `rope_parameters` (or
    `rope_scaling`) keyed by layer type, or one dict for every type; else the default rotary at `rope_theta` (8e7)
    and the sliding layers' at `swa_rope_theta` (5e4)."""
    params = c.get("rope_parameters") or c.get("rope_scaling")
    theta = c.get("rope_theta", DEFAULT_THETA)
    if params is None:
        params = {t: {"rope_type": "default", "rope_theta": c.get("swa_rope_theta", 50_000.0)
                      if t == "sliding_attention" else theta} for t in types}
    elif not any(t in params for t in LAYER_TYPES):
        params = {t: params for t in types}
    ropes = {}
    for t in dict.fromkeys(types):
        p = params.get(t) or {}
        rope_type = p.get("rope_type", p.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"Dots3 with rope_type {rope_type!r} is not supported (supported: rope_type default)")
        ropes[t] = Rope.from_hf({"rope_type": "default"}, float(p.get("rope_theta", theta)), max_positions)
    attending = {ropes[t] for t in ("indexed_attention", "full_attention") if t in ropes}
    if len(attending) > 1:
        raise ValueError(f"Dots3 with rope_parameters {params} is not supported (supported: rope_parameters with the "
                         f"same rotary for indexed_attention and full_attention layers)")
    main = next(iter(attending), None)
    local = ropes.get("sliding_attention")
    return main or local, local


def _resolved(cfg: dict) -> dict:
    """The config with transformers' defaults and what it derives: `_types`, `_mlp_types`, `_layers` (each
    layer's LayerMla), the shared experts' width and the window."""
    c = {**DEFAULTS, **cfg}
    if "n_routed_experts" not in cfg and "num_local_experts" in cfg:
        c["n_routed_experts"] = cfg["num_local_experts"]
    c["shared_experts_intermediate_size"] = cfg.get("moe_shared_expert_intermediate_size",
                                                    c["shared_experts_intermediate_size"])
    if cfg.get("sliding_window") is None:
        c["sliding_window"] = cfg.get("sliding_window_size", 512)
    types = _types(c)
    c.update(_types=types, _mlp_types=_mlp_types(c), _layers=[_layer_mla(c, layer) for layer in
                                                                 _layer_configs(c, types)])
    return c


def from_hf(cfg: dict) -> Dots3Spec:
    c = _resolved(cfg)
    if c["hidden_act"] != "silu":
        raise ValueError(f"Dots3 with hidden_act {c['hidden_act']!r} is not supported (supported: hidden_act silu)")
    types, layers = c["_types"], c["_layers"]
    rope_dims = {own.spec.qk_rope_head_dim for own in layers}
    if len(rope_dims) > 1:
        raise ValueError(f"Dots3 with qk_rope_head_dim {sorted(rope_dims)} across layers is not supported "
                         f"(supported: qk_rope_head_dim, one for every layer)")
    rope_dim = rope_dims.pop()
    if "indexed_attention" in types and c["index_head_dim"] < rope_dim:
        raise ValueError(f"Dots3 with index_head_dim {c['index_head_dim']} is not supported (supported: "
                         f"index_head_dim at least qk_rope_head_dim, {rope_dim})")
    indexed = tuple(t == "indexed_attention" for t in types)
    longest = c["max_position_embeddings"]
    if any(indexed):
        longest = min(longest, int(c["index_topk"]))
    rope, local = _ropes(c, types, c["max_position_embeddings"])
    top = layers[indexed.index(True)] if any(indexed) else layers[0]  # (the indexers read its query latent)
    moe = replace(sigmoid_moe(c, first_moe=1), layers=tuple(t == "sparse" for t in c["_mlp_types"]),
                  shared_intermediate_size=c["shared_experts_intermediate_size"] * c["n_shared_experts"])
    spec = spec_from_hf(
        {**c, "rope_parameters": None, "rope_scaling": None, "num_attention_heads": top.heads,
         "head_dim": top.spec.qk_head_dim},
        num_kv_heads=top.heads, mla=top.spec, layer_mla=tuple(layers), rotary_dim=rope_dim, attn_scale=top.scale,
        o_bias=top.spec.bias, norm_eps=c["rms_norm_eps"], moe=moe, attn_output_gate=True, attn_gate_per_head=True, rope=rope,
        local_rope=None if local == rope else local, max_position_embeddings=longest,
        layer_windows=tuple(c["sliding_window"] if t == "sliding_attention" else None for t in types))
    return Dots3Spec(**{f.name: getattr(spec, f.name) for f in fields(DecoderSpec)}, index_topk=int(c["index_topk"]),
                     index_heads=c["index_n_heads"], index_head_dim=c["index_head_dim"], indexer_layers=indexed)


def _text_model(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A multimodal `dots3_note` checkpoint's text model: its config (`text_config`, or the top level's options)
    and tensors (under `language_model.`, or at the top level as published), the head tied as the outer config
    says (transformers unties it where that is false, whatever the text config says)."""
    tie = bool(cfg.get("tie_word_embeddings", False))
    text = cfg.get("text_config")
    if text is None:  # (the published config.json: the text model's options beside the towers' configs)
        text = {k: v for k, v in cfg.items() if k not in ("vision_config", "audio_config", "model_type")}
    if any("language_model." in name for name in state):
        text, state = text_part({**cfg, "text_config": text}, state, "dots3_note_text")
    return {**text, "model_type": "dots3_note_text", "tie_word_embeddings": tie}, state


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The text model of a multimodal checkpoint (`_text_model`); each layer's per-head gate `g_proj`
    `[heads, hidden]` under the decoder's name for it, `self_attn.gate_proj`."""
    if cfg.get("model_type") == "dots3_note":
        cfg, state = _text_model(cfg, state)
    if not state:
        return cfg, state
    return cfg, {name.replace(f".{GATE}", f".{GATE.replace('g_proj', 'gate_proj')}"): t for name, t in state.items()}


MODEL = DsaDecoder
