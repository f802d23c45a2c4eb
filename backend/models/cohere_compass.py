"""Cohere Compass text (`cohere_compass_text`), and the multimodal `cohere_compass` checkpoint's text model
(North-Micro-Vision; the vision tower left unread, multimodal.text_part).

Cohere2's block: attention and the MLP side by side on one LayerNorm without a bias, both added to the
residual stream; sliding-window layers where `layer_types` says (every layer global by default, whatever
`sliding_window_pattern` says); the logits times `logit_scale` (1 where unset), folded into the final norm.
Unlike Cohere's, the rotary turns dims i and i + d/2 together (Llama's pairs, not neighbouring ones), and
its parameters are per layer type: `rope_parameters` keyed by "full_attention" / "sliding_attention", each
with its own `rope_theta` and `rope_type`, or None for a type whose layers have no rotary (NoPE). The
rotary is multimodal (M-RoPE: a token's time, height and width positions share out its frequencies); a
text token's three positions are equal, so for text it is the ordinary rotary of the same frequencies,
the sections (`mrope_section`) left unread. Biases on q, k, v and the output projection where
`attention_bias`.

A text model's head is tied to its embeddings by default; the multimodal checkpoint's head is tied where
the outer config's `tie_word_embeddings` says (default false), as transformers reads it. Refused by name:
`rope_parameters` not keyed by layer type, or missing a type the layers use; a partial rotary; sliding
layers without `sliding_window`; an activation other than silu."""
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf

# transformers' CohereCompassTextConfig defaults, where a config.json leaves a key out
DEFAULTS = {"vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
            "num_attention_heads": 64, "hidden_act": "silu", "max_position_embeddings": 8192, "layer_norm_eps": 1e-5,
            "bos_token_id": 5, "eos_token_id": 255001, "tie_word_embeddings": True, "attention_bias": False,
            "sliding_window": 4096}
LAYER_TYPES = ("full_attention", "sliding_attention")
# transformers' rope types for a layer type's rotary (ROPE_INIT_FUNCTIONS, and the default)
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A multimodal Cohere Compass checkpoint (model_type cohere_compass): its text model's config and tensors,
    the head tied as the outer config says."""
    if cfg.get("model_type") != "cohere_compass":
        return cfg, state
    tie = bool(cfg.get("tie_word_embeddings", False))
    text, tensors = text_part(cfg, state, "cohere_compass_text")
    return {**text, "tie_word_embeddings": tie}, tensors


def _layer_ropes(cfg: dict, types: list[str]) -> dict[str, Rope | None]:
    """Each layer type's rotary (None: NoPE) from `rope_parameters` keyed by layer type (its top-level
    `rope_theta` / `rope_type` beside the keys ignored, as transformers ignores them)."""
    params = cfg.get("rope_parameters") or {}
    missing = [t for t in dict.fromkeys(types) if t not in params]
    if missing:
        raise ValueError(f"Cohere Compass rope_parameters {params!r} are not supported: no entry for "
                         f"{', '.join(missing)} (supported: rope_parameters keyed by layer type, "
                         f"{' / '.join(LAYER_TYPES)}, each a dict or None for no rotary)")
    ropes = {}
    for t in dict.fromkeys(types):
        p = params[t]
        if p is None:
            ropes[t] = None
            continue
        rope_type = p.get("rope_type", p.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported Cohere Compass {t} rope_type {rope_type!r} "
                             f"(supported: rope_type {', '.join(ROPE_TYPES)})")
        partial = p.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        if partial not in (None, 1.0):
            raise ValueError(f"Cohere Compass {t} partial_rotary_factor {partial} is not supported "
                             f"(supported: partial_rotary_factor 1, the whole head rotating)")
        if "rope_theta" not in p:
            raise ValueError(f"Cohere Compass {t} rope_parameters without a rope_theta are not supported "
                             f"(supported: rope_theta in each layer type's rope_parameters)")
        p = {k: v for k, v in p.items() if k not in ("mrope_section", "mrope_interleaved")}
        ropes[t] = Rope.from_hf(p, p["rope_theta"], cfg["max_position_embeddings"])
    return ropes


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"unsupported Cohere Compass hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    layers = cfg["num_hidden_layers"]
    types = list(cfg.get("layer_types") or ["full_attention"] * layers)
    if len(types) != layers or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"unsupported Cohere Compass layer_types {types!r} (supported: layer_types "
                         f"{' / '.join(map(repr, LAYER_TYPES))} for each of the {layers} layers)")
    window = cfg.get("sliding_window")
    if "sliding_attention" in types and not window:
        raise ValueError(f"Cohere Compass sliding_attention layers with sliding_window {window!r} are not supported "
                         f"(supported: sliding_window, a number of tokens)")
    ropes = _layer_ropes(cfg, types)
    full, local = ropes.get("full_attention"), ropes.get("sliding_attention")
    rope = full or local or Rope(10000.0)  # (every layer NoPE: a table no layer reads)
    scale = cfg.get("logit_scale")
    return spec_from_hf(
        {**cfg, "rope_parameters": None, "rope_scaling": None, "partial_rotary_factor": 1.0},  # (the ropes: here)
        tie_default=True, norm_eps=cfg["layer_norm_eps"], parallel_block=True, layer_norm=True, rope=rope,
        local_rope=local if full is not None and local is not None and local != full else None,
        layer_windows=layer_windows({**cfg, "layer_types": types}, window),
        rope_layers=tuple(ropes[t] is not None for t in types) if None in ropes.values() else (),
        logit_scale=float(scale) if scale is not None and scale != 1.0 else None,
        qkv_bias=bool(cfg["attention_bias"]), o_bias=bool(cfg["attention_bias"]),
    )


MODEL = TransformerDecoder
