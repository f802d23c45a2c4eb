"""GGUF architecture "gemma3" -> Hugging Face `Gemma3ForCausalLM` (model_type "gemma3_text").

What differs from the Llama mapping:

- Gemma's RMSNorm scales by (1 + w). Hugging Face stores w; llama.cpp's converter stores w + 1
  (in float32) for every norm, q_norm and k_norm included. Subtracting 1 gives Hugging Face's
  values back exactly: on gemma-3-270m every norm weight is then a bfloat16 number again (the
  original checkpoint's dtype), while ~25% of the stored ones are not.
- q and k rows are stored as Hugging Face holds them: llama.cpp runs Gemma with NeoX-style
  (rotate-half) rotary embeddings, the same as Hugging Face, so its converter does not permute.
- The GGUF leaves out several settings; they are filled from llama.cpp's fixed Gemma 3 rules, which
  match the published gemma-3 configs (see hf_config).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .gguf_file import COMMON_LAYER_TENSORS, GGUFFile, MISSING, f32, field, hf_tensor_name, tensor_names, tensor_shape

ARCHITECTURE = "gemma3"

# GGUF per-layer tensor name -> Hugging Face name inside `model.layers.{i}.`: four norms a layer
# ("sandwich" norms around attention and MLP) and RMSNorms on q and k.
_LAYER_TENSORS = {
    **COMMON_LAYER_TENSORS,
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}

# Gemma 3 has five sliding-window layers for each global one. llama.cpp fixes this for the
# architecture instead of storing it (a file may carry attention.sliding_window_pattern).
_SLIDING_WINDOW_PATTERN = 6
# Rotary base of the sliding-window layers: fixed by the architecture, not stored in the GGUF
# (rope.freq_base is the global layers' base). 10000 in every published Gemma 3 config.
_LOCAL_ROPE_BASE = 10000.0
# Gemma 3 27B (62 layers) scales queries by 1/sqrt(hidden / heads); every other size by
# 1/sqrt(head_dim). llama.cpp applies the same rule; the published configs agree
# (query_pre_attn_scalar 256 = head_dim for 270m, 1b, 4b, 12b; 168 for 27b).
_LAYERS_27B = 62
# Ends a chat turn; Gemma 3 stops on it as well as on <eos>. Like the published gemma-3
# checkpoints (pretrained ones included), config.json keeps eos_token_id = <eos> and
# generation_config.json lists both.
EXTRA_EOS_TOKENS = ("<end_of_turn>",)


def hf_config(reader: GGUFFile) -> dict[str, Any]:
    def gemma(key: str, default: Any = MISSING) -> Any:
        return field(reader, f"gemma3.{key}", default)

    hidden = int(gemma("embedding_length"))
    heads = int(gemma("attention.head_count"))
    layers = int(gemma("block_count"))
    head_dim = int(gemma("attention.key_length", 256))
    if int(gemma("attention.value_length", head_dim)) != head_dim:
        raise NotImplementedError("Gemma 3 GGUF files with value_length != key_length are not supported")
    rotary_dims = int(gemma("rope.dimension_count", head_dim))
    if rotary_dims != head_dim:
        raise NotImplementedError(f"partial rotary embeddings ({rotary_dims} of {head_dim} dims) are unsupported")
    if "rope_freqs.weight" in tensor_names(reader):
        raise NotImplementedError("GGUF files with per-dimension RoPE frequencies are not supported")

    window = int(gemma("attention.sliding_window"))
    sliding, period = _sliding_layers(gemma("attention.sliding_window_pattern", _SLIDING_WINDOW_PATTERN), layers)

    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "hidden_size": hidden,
        "intermediate_size": int(gemma("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(gemma("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "query_pre_attn_scalar": hidden // heads if layers == _LAYERS_27B else head_dim,
        "rms_norm_eps": f32(gemma("attention.layer_norm_rms_epsilon")),
        # Written the way every transformers version reads them: rope_theta for the global layers,
        # rope_local_base_freq for the sliding ones, rope_scaling for the global ones only.
        "rope_theta": f32(gemma("rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": _LOCAL_ROPE_BASE,
        "rope_scaling": _rope_scaling(reader),
        "sliding_window": window,
        # Older readers of Gemma 3 configs only know the period; newer ones read layer_types.
        **({"sliding_window_pattern": period} if period else {}),
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "max_position_embeddings": int(gemma("context_length")),
        "final_logit_softcapping": _optional_f32(gemma("final_logit_softcapping", None)),
        "attn_logit_softcapping": _optional_f32(gemma("attn_logit_softcapping", None)),
        "use_bidirectional_attention": False,
        "vocab_size": tensor_shape(reader, "token_embd.weight")[0],
        "torch_dtype": "float32",
    }


def hf_tensor(gguf_name: str, values: np.ndarray, config: dict[str, Any]) -> tuple[str, np.ndarray]:
    """(Hugging Face name, values in Hugging Face layout) of one dequantized GGUF tensor."""
    if gguf_name.endswith("norm.weight"):
        values = values - np.float32(1.0)  # stored as 1 + w, see the module docstring
    return hf_tensor_name(gguf_name, _LAYER_TENSORS, "Gemma 3"), values


def _sliding_layers(pattern: Any, layers: int) -> tuple[list[bool], int | None]:
    """(per layer whether it uses the sliding window, the period when the layers follow one).

    `pattern` is a period (every period-th layer is global) or one flag per layer (true = sliding).
    """
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ValueError(f"attention.sliding_window_pattern lists {len(pattern)} layers, not {layers}")
        return [bool(p) for p in pattern], None
    period = int(pattern)
    return [bool((i + 1) % period) for i in range(layers)], period


def _rope_scaling(reader: GGUFFile) -> dict[str, Any] | None:
    kind = field(reader, "gemma3.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind != "linear":
        raise NotImplementedError(f"Gemma 3 GGUF files with {kind!r} RoPE scaling are not supported")
    return {"rope_type": "linear", "factor": f32(field(reader, "gemma3.rope.scaling.factor"))}


def _optional_f32(value: Any) -> float | None:
    return None if value is None else f32(value)
