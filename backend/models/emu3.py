"""Emu3 (BAAI/Emu3-Chat, Emu3-Gen as transformers writes them) served text-only: the multimodal `emu3` checkpoint's
text model (multimodal.text_part under `text_model.`; the VQ-GAN image tokenizer, `vqmodel.`, left unread) and a bare
text model's checkpoint (`emu3_text_model`, which transformers writes for Emu3ForCausalLM).

The text model is Llama's block (llama.py): RMSNorm before attention and the MLP, SwiGLU, grouped-query attention,
Llama's rotary (dims i and i + d/2 turned together) over the whole head at base 1e6 where the config sets none, any
of the rope scalings transformers reads for it; biases on the attention's four projections where `attention_bias`,
on the MLP's where `mlp_bias` (both false as published); its dropout is training's only. Images are tokens of the
vocabulary itself (the VQ-GAN's codes written as `<|visual token ...|>` ids inside the 184,622 rows): with no pixels
transformers embeds every id through the embedding, as here, and greedy text may continue with visual tokens, as
there. The multimodal checkpoint's layouts: `text_model.model.layers...` and `text_model.lm_head` as published (and
as transformers saves it), `model.text_model.layers...` and a top-level `lm_head` as its model names them. The head
is tied where the config says (the multimodal checkpoint's: the outer config's `tie_word_embeddings`, as transformers
reads it; false by default either way). Refused by name: an activation other than silu; a partial rotary (which
transformers' Emu3 does not apply); Llama's refusals (`clip_qkv`, `use_sliding_window`)."""
from tritonformer.backend.models import llama
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, rope_parameters

TEXT_TYPE = "emu3_text_model"
# transformers' Emu3TextConfig defaults, where a config.json leaves a key out
DEFAULTS = {"vocab_size": 184622, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 9216,
            "rms_norm_eps": 1e-5, "pad_token_id": 151643, "bos_token_id": 151849, "eos_token_id": 151850,
            "tie_word_embeddings": False}
DEFAULT_THETA = 1000000.0  # (Emu3TextConfig's default_theta)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A multimodal Emu3 checkpoint (model_type emu3): its text model's config and tensors, the head tied as the
    outer config says."""
    if cfg.get("model_type") != "emu3":
        return cfg, state
    tie = bool(cfg.get("tie_word_embeddings", False))
    text, tensors = text_part(cfg, state, TEXT_TYPE, marker="text_model.")
    return {**text, "tie_word_embeddings": tie}, tensors


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"unsupported {TEXT_TYPE} hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    params = rope_parameters(cfg) or {}
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1.0):
        raise ValueError(f"{TEXT_TYPE} partial_rotary_factor {partial} is not supported (supported: "
                         f"partial_rotary_factor 1, the whole head rotating, as transformers' Emu3 rotates it)")
    if "rope_theta" not in cfg and "rope_theta" not in params:
        cfg["rope_theta"] = DEFAULT_THETA
    return llama.from_hf(cfg)


MODEL = TransformerDecoder
