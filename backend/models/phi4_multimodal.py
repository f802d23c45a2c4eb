"""Phi-4-multimodal (microsoft/Phi-4-multimodal-instruct as transformers writes it, model_type `phi4_multimodal`)
served text-only: its language model, Phi-3's block (phi3.py: fused `qkv_proj` and `gate_up_proj`, grouped-query
attention, the default or the longrope rotary over `partial_rotary_factor` of each head (0.75 published: 96 of
128 dims), a sliding window where set).

The checkpoint is flat: the text model's options at the top of config.json (`vision_config` and `audio_config`
beside them), its tensors named as a Phi-3's, the image and audio towers under `embed_tokens_extend.` (left unread).
The vision and speech LoRA adapters are not part of the model: transformers' conversion keeps each wrapped linear's
base weight (the original layout's `X.base_layer.weight`, written as `X.weight`) and drops the adapters (`lora_A` /
`lora_B`), which are loaded apart and switched on for an image or audio input; a text prompt runs the base weights
(the original model, too, unsets its adapters for text). `adapt` reads tensors in the original layout the same way.

Without pixels or audio features transformers embeds every id through the embedding alone; the image and audio
placeholders (`<|endoftext10|>` 200010, `<|endoftext11|>` 200011) are rows of it, inside the 200,064-id vocabulary, so
a text prompt holding them embeds them as any token, here as there. The head is tied to the embedding where
`tie_word_embeddings` (true as published; transformers' default false). Rope types `su` and `yarn` are read as
longrope, as transformers reads them; the longrope is Phi-3's here (rope.py: a rotation per position, transformers'
inside the original context length, 4,096 tokens; the long factors for each position past it). Refused by name:
an activation other than silu; a rope type other than default / longrope, or a longrope without its factor lists;
`attention_bias`, `mlp_bias` or `lm_head_bias` (biases that transformers' model has no place for)."""
from tritonformer.backend.models import phi3
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, rope_parameters

# transformers' Phi4MultimodalConfig defaults, where a config.json leaves a key out
DEFAULTS = {"vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False, "bos_token_id": 199999, "pad_token_id": 199999, "sliding_window": None}
EOS_DEFAULT = [199999, 200020]  # (transformers' end-of-sequence ids where the config sets none)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The tensors as transformers' conversion writes them: a LoRA-wrapped linear's base weight under the linear's
    own name, the adapters left out (text runs without them); a checkpoint without adapters as it is."""
    if not any(".base_layer." in name or ".lora_" in name for name in state):
        return cfg, state
    return cfg, {name.replace(".base_layer.", "."): t for name, t in state.items() if ".lora_" not in name}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    if not cfg.get("eos_token_id"):
        cfg["eos_token_id"] = EOS_DEFAULT
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"unsupported Phi-4-multimodal hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    for option in ("attention_bias", "mlp_bias", "lm_head_bias"):
        if cfg.get(option):
            raise ValueError(f"Phi-4-multimodal with {option} is not supported (supported: {option} unset or false; "
                             f"transformers' model has no such biases)")
    rope = rope_parameters(cfg)
    if rope:
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_type = "longrope" if rope_type in ("su", "yarn") else rope_type
        if rope_type not in ("default", "longrope"):
            raise ValueError(f"unsupported Phi-4-multimodal rope_type {rope_type!r} (supported: rope_type default, "
                             f"longrope (su, yarn))")
        if rope_type == "longrope" and not (rope.get("short_factor") and rope.get("long_factor")):
            raise ValueError("Phi-4-multimodal longrope without short_factor / long_factor is not supported "
                             "(supported: short_factor and long_factor, both given)")
        rope = {k: v for k, v in rope.items() if k != "type"}
        cfg = {**cfg, "rope_scaling": {**rope, "rope_type": rope_type}}
    return phi3.from_hf(cfg)


MODEL = TransformerDecoder
