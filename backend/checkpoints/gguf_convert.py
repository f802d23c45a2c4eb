"""Convert a Llama-architecture GGUF file into a Hugging Face style checkpoint folder.

The serving code loads plain safetensors + tokenizer.json, so a GGUF (llama.cpp's single-file
format, usually quantized) is turned once into:

    config.json               LlamaForCausalLM config
    generation_config.json    bos / eos / pad ids
    model.safetensors         float32 weights under Hugging Face tensor names
    tokenizer.json            byte-level BPE built with the `tokenizers` library
    tokenizer_config.json     chat template, special token strings, model_max_length
    special_tokens_map.json

This module runs at serve time, inside Triton's Python backend, so it deliberately uses only
`gguf`, `numpy`, `safetensors` and `tokenizers`: no torch, no transformers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from tqdm import tqdm

if TYPE_CHECKING:  # `gguf` is imported where a conversion runs, so serving a ready folder never needs it
    from gguf import GGUFReader

# Bump whenever the output of this module changes: it is part of the cache key, so existing
# converted folders are rebuilt instead of silently reused.
CONVERTER_VERSION = "1"

# Every file convert_gguf_to_hf writes; a folder holding all of them is a finished conversion.
OUTPUT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)

# llama.cpp token types (tokenizer.ggml.token_type).
_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 1, 3, 4
# Hugging Face role -> GGUF metadata key "tokenizer.ggml.<key>"
_SPECIAL_ROLES = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id"}

# GGUF per-layer tensor name -> Hugging Face name inside `model.layers.{i}.`
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

# Split regex of Llama 3 style vocabularies (tokenizer.ggml.pre "llama-bpe"), as in their tokenizer.json.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def convert_gguf_to_hf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Write a Hugging Face checkpoint folder for the Llama-architecture GGUF at `gguf_path`.

    `out_dir` is created if needed and its files are overwritten. Writing is not atomic: callers
    that need that (the cache in defaults.py) convert into a temp folder and rename it.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path.name}: architecture is {arch!r}; only 'llama' is supported")

    config = _llama_config(reader)
    tokenizer, special = _build_tokenizer(reader)  # before the slow part: fail fast if unsupported
    tensors = _hf_tensors(reader, config, progress, desc=f"Dequantizing {gguf_path.name}")
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    config.update({f"{role}_token_id": special[role][0] for role in ("bos", "eos", "pad") if role in special})

    out_dir.mkdir(parents=True, exist_ok=True)
    # "format": "pt" is what transformers checks for before trusting a safetensors file's layout.
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(special))
    _write_json(out_dir / "special_tokens_map.json", _special_tokens_map(reader, special))
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(reader, special, config))
    return out_dir


# --------------------------------------------------------------------------- metadata


_MISSING = object()


def _field(reader: GGUFReader, key: str, default: Any = _MISSING) -> Any:
    """Metadata value as a plain Python value (str, int, float, bool or list)."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise KeyError(f"GGUF metadata has no {key!r}")
        return default
    return field.contents()


def _f32(value: float) -> float:
    # GGUF stores these as float32; 9.999999747378752e-06 reads better (and is the same float32) as 1e-05.
    return float(str(np.float32(value)))  # str, not repr: numpy 2's repr is "np.float32(...)"


def _llama_config(reader: GGUFReader) -> dict[str, Any]:
    def llama(key: str, default: Any = _MISSING) -> Any:
        return _field(reader, f"llama.{key}", default)

    hidden = int(llama("embedding_length"))
    heads = int(llama("attention.head_count"))
    head_dim = int(llama("attention.key_length", hidden // heads))
    rotary_dims = int(llama("rope.dimension_count", head_dim))
    # Things this converter would get silently wrong, so refuse instead.
    if rotary_dims != head_dim:
        raise NotImplementedError(f"partial rotary embeddings ({rotary_dims} of {head_dim} dims) are unsupported")
    scaled_rope = llama("rope.scaling.type", "none") != "none" or "rope_freqs.weight" in _tensor_names(reader)
    if scaled_rope:
        raise NotImplementedError("GGUF files with RoPE scaling are not supported")
    if "llama.expert_count" in reader.fields:
        raise NotImplementedError("mixture-of-experts Llama GGUF files are not supported")

    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
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
        "rms_norm_eps": _f32(llama("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(llama("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(llama("context_length")),
        # The embedding table is the ground truth; llama.vocab_size is optional metadata.
        "vocab_size": int(embd.shape[1]),
        "torch_dtype": "float32",
    }


def _tensor_names(reader: GGUFReader) -> set[str]:
    return {t.name for t in reader.tensors}


# --------------------------------------------------------------------------- weights


def _hf_name(gguf_name: str) -> str:
    stem, _, suffix = gguf_name.rpartition(".")  # suffix: "weight" (or "bias")
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{suffix}"
    if len(parts) == 1 and parts[0] in _TOP_TENSORS:
        return f"{_TOP_TENSORS[parts[0]]}.{suffix}"
    raise NotImplementedError(f"GGUF tensor {gguf_name!r} has no Llama counterpart this converter knows")


def _undo_rotary_permutation(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation.

    Hugging Face rotates the two halves of each head ([x0..x31 | x32..x63] pairs i with i+32);
    llama.cpp rotates adjacent pairs, so its converter interleaves each head's rows as
    (h0, h32, h1, h33, ...). Reading rows as (head, pair index, half) and swapping the last two
    axes gives back (head, half, pair index), i.e. the Hugging Face order.
    """
    rows = weight.shape[0]
    half = rows // n_heads // 2
    return weight.reshape(n_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _hf_tensors(
    reader: GGUFReader, config: dict[str, Any], progress: bool, desc: str
) -> dict[str, np.ndarray]:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    heads_for = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    tensors: dict[str, np.ndarray] = {}
    for t in tqdm(reader.tensors, desc=desc, unit="tensor", file=sys.stderr, disable=not progress):
        values = dequantize(t.data, t.tensor_type)
        if t.tensor_type == GGMLQuantizationType.F32:
            values = values.copy()  # a view into the memory-mapped file otherwise
        # GGUF lists dims fastest-first (ne0 = columns); numpy / torch want them the other way round.
        values = values.astype(np.float32, copy=False).reshape(tuple(int(d) for d in reversed(t.shape)))
        kind = t.name.split(".")[-2]
        if t.name.startswith("blk.") and kind in heads_for:
            values = _undo_rotary_permutation(values, heads_for[kind])
        tensors[_hf_name(t.name)] = np.ascontiguousarray(values)
    return tensors


# --------------------------------------------------------------------------- tokenizer


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in.

    Printable Latin-1 bytes stand for themselves; the remaining 68 (control chars, space, ...) are
    moved, in byte order, to code points 256, 257, ... so every byte has a visible character.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    moved = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(moved)})
    return dict(sorted(table.items()))


def _pre_tokenizer(pre: str, add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
    """How text is cut into words before BPE; must match how the vocabulary's merges were learned."""
    if pre == "smollm":
        # SmolLM / SmolLM2 (and StarCoder-family) vocabularies: every digit is its own word, then
        # GPT-2's split. llama.cpp's "smollm" regex does the same; the vocab holds no multi-digit tokens.
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True),
            ]
        )
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
            ]
        )
    if pre in ("gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    raise NotImplementedError(f"tokenizer.ggml.pre {pre!r} is not supported (known: smollm, llama-bpe, gpt2)")


def _build_tokenizer(reader: GGUFReader) -> tuple[Tokenizer, dict[str, tuple[int, str]]]:
    """Byte-level BPE tokenizer from GGUF metadata, plus {role: (id, text)} for bos/eos/pad/unk."""
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise NotImplementedError(f"only byte-level BPE ('gpt2') GGUF tokenizers are supported, not {kind!r}")
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    types: list[int] = _field(reader, "tokenizer.ggml.token_type", [_TOKEN_NORMAL] * len(tokens))
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges")]
    if any(len(m) != 2 for m in merges):
        raise ValueError("tokenizer.ggml.merges holds an entry that is not two space-separated tokens")

    # Ordinary tokens must be spelled in the byte alphabet for BPE to find them; a few files store
    # some as raw text, so respell those. Control / user-defined tokens are matched whole on the
    # raw text (added tokens below), so they keep their spelling.
    alphabet = _byte_alphabet()
    chars = set(alphabet.values())

    def spelled(token: str, token_type: int) -> str:
        if token_type in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED) or set(token) <= chars:
            return token
        return "".join(alphabet[b] for b in token.encode("utf-8"))

    vocab = {spelled(tok, typ): i for i, (tok, typ) in enumerate(zip(tokens, types))}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF vocabulary has duplicate tokens")

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    add_prefix_space = bool(_field(reader, "tokenizer.ggml.add_space_prefix", False))
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    tokenizer.pre_tokenizer = _pre_tokenizer(pre, add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    # Whole-string matching so "<|im_start|>" is one token, never split by the pre-tokenizer.
    # Control tokens are special (dropped by decode(skip_special_tokens=True)); user-defined are not.
    typed = list(zip(tokens, types))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, typ in typed if typ == _TOKEN_CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, typ in typed if typ == _TOKEN_USER_DEFINED]
    )

    special: dict[str, tuple[int, str]] = {}
    for role, key in _SPECIAL_ROLES.items():
        token_id = _field(reader, f"tokenizer.ggml.{key}", None)
        if token_id is not None:
            special[role] = (int(token_id), tokens[int(token_id)])
    tokenizer.post_processor = _post_processor(reader, special)
    return tokenizer, special


def _post_processor(reader: GGUFReader, special: dict[str, tuple[int, str]]) -> processors.PostProcessor:
    """Adds bos/eos around encoded text only when the GGUF asks for it (SmolLM2 asks for neither)."""
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False)) and "bos" in special
    add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False)) and "eos" in special
    if not (add_bos or add_eos):
        return processors.ByteLevel(trim_offsets=False)
    used = [role for role, wanted in (("bos", add_bos), ("eos", add_eos)) if wanted]
    bos = [special["bos"][1]] if add_bos else []
    eos = [special["eos"][1]] if add_eos else []
    return processors.TemplateProcessing(
        single=" ".join([*bos, "$A:0", *eos]),
        pair=" ".join([*bos, "$A:0", *eos, *bos, "$B:1", *eos]),
        special_tokens=[(special[role][1], special[role][0]) for role in used],
    )


# --------------------------------------------------------------------------- small JSON files


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _generation_config(special: dict[str, tuple[int, str]]) -> dict[str, Any]:
    return {f"{role}_token_id": special[role][0] for role in ("bos", "eos", "pad") if role in special}


def _special_tokens_map(reader: GGUFReader, special: dict[str, tuple[int, str]]) -> dict[str, Any]:
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type", [])
    roles = {f"{role}_token": text for role, (_, text) in special.items()}
    named = set(roles.values())
    extra = [t for t, typ in zip(tokens, types) if typ == _TOKEN_CONTROL and t not in named]
    return {**roles, "additional_special_tokens": extra}


def _tokenizer_config(
    reader: GGUFReader, special: dict[str, tuple[int, str]], config: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = {
        # The generic fast tokenizer loads tokenizer.json as written; a model-specific class
        # (LlamaTokenizer...) could impose its own pre-tokenizer instead.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config["max_position_embeddings"],
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        # Byte-level BPE round-trips text exactly; the legacy clean-up would change " ." to ".".
        "clean_up_tokenization_spaces": False,
        **{f"{role}_token": text for role, (_, text) in special.items()},
    }
    template = _field(reader, "tokenizer.chat_template", None)
    if template is not None:
        result["chat_template"] = template
    return result
