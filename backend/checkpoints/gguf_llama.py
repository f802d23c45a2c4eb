"""GGUF architecture "llama" -> Hugging Face `LlamaForCausalLM`: config and tensor names.

llama.cpp's converter permutes the rows of q and k (see `undo_rotary_permutation`); every other
tensor is stored as Hugging Face holds it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .gguf_file import COMMON_LAYER_TENSORS, GGUFFile, MISSING, f32, field, hf_tensor_name, tensor_names, tensor_shape

ARCHITECTURE = "llama"
# Tokens generation stops on besides eos_token_id (generation_config.json).
EXTRA_EOS_TOKENS: tuple[str, ...] = ()

# GGUF per-layer tensor name -> Hugging Face name inside `model.layers.{i}.`
_LAYER_TENSORS = {
    **COMMON_LAYER_TENSORS,
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_config(reader: GGUFFile) -> dict[str, Any]:
    def llama(key: str, default: Any = MISSING) -> Any:
        return field(reader, f"llama.{key}", default)

    hidden = int(llama("embedding_length"))
    heads = int(llama("attention.head_count"))
    head_dim = int(llama("attention.key_length", hidden // heads))
    rotary_dims = int(llama("rope.dimension_count", head_dim))
    # Things this converter would get silently wrong, so refuse instead.
    if rotary_dims != head_dim:
        raise NotImplementedError(f"partial rotary embeddings ({rotary_dims} of {head_dim} dims) are unsupported")
    scaled_rope = llama("rope.scaling.type", "none") != "none" or "rope_freqs.weight" in tensor_names(reader)
    if scaled_rope:
        raise NotImplementedError("GGUF files with RoPE scaling are not supported")
    if "llama.expert_count" in reader.fields:
        raise NotImplementedError("mixture-of-experts Llama GGUF files are not supported")

    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_size": hidden,
        "intermediate_size": int(llama("feed_forward_length")),
        "num_hidden_layers": int(llama("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(llama("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": f32(llama("attention.layer_norm_rms_epsilon")),
        "rope_theta": f32(llama("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(llama("context_length")),
        # The embedding table is the ground truth; llama.vocab_size is optional metadata.
        "vocab_size": tensor_shape(reader, "token_embd.weight")[0],
        "torch_dtype": "float32",
    }


def hf_tensor(gguf_name: str, values: np.ndarray, config: dict[str, Any]) -> tuple[str, np.ndarray]:
    """(Hugging Face name, values in Hugging Face layout) of one dequantized GGUF tensor."""
    heads_for = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    kind = gguf_name.split(".")[-2]
    if gguf_name.startswith("blk.") and kind in heads_for:
        values = undo_rotary_permutation(values, heads_for[kind])
    return hf_tensor_name(gguf_name, _LAYER_TENSORS, "Llama"), values


def undo_rotary_permutation(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation.

    Hugging Face rotates the two halves of each head ([x0..x31 | x32..x63] pairs i with i+32);
    llama.cpp rotates adjacent pairs, so its converter interleaves each head's rows as
    (h0, h32, h1, h33, ...). Reading rows as (head, pair index, half) and swapping the last two
    axes gives back (head, half, pair index), i.e. the Hugging Face order.
    """
    rows = weight.shape[0]
    half = rows // n_heads // 2
    return weight.reshape(n_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
