"""Convert a GGUF file (llama.cpp's single-file format, usually quantized) into a Hugging Face style
checkpoint folder.

The serving code loads plain safetensors + tokenizer.json, so a GGUF is turned once into:

    config.json               the architecture's Hugging Face config (gguf_llama.py, gguf_gemma3.py)
    generation_config.json    bos / eos / pad ids
    model.safetensors         float32 weights under Hugging Face tensor names
    tokenizer.json            built with the `tokenizers` library (gguf_tokenizers.py)
    tokenizer_config.json     chat template, special token strings, model_max_length
    special_tokens_map.json

Architectures (general.architecture): "llama" (LlamaForCausalLM) and "gemma3" (Gemma3ForCausalLM,
text only). This module runs at serve time, inside Triton's Python backend, so it deliberately uses
only `gguf`, `numpy`, `safetensors` and `tokenizers`: no torch, no transformers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tqdm import tqdm

from . import gguf_gemma3, gguf_llama
from .gguf_file import GGUFFile, field
from .gguf_tokenizers import GGUFTokenizer, build_tokenizer, special_tokens_map, tokenizer_config

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

# general.architecture -> its mapping: hf_config(reader), hf_tensor(name, values, config) and
# EXTRA_EOS_TOKENS (what generation stops on besides config.json's eos_token_id).
ARCHITECTURES = {module.ARCHITECTURE: module for module in (gguf_llama, gguf_gemma3)}


def convert_gguf_to_hf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Write a Hugging Face checkpoint folder for the GGUF at `gguf_path`.

    `out_dir` is created if needed and its files are overwritten. Writing is not atomic: callers
    that need that (the cache in defaults.py) convert into a temp folder and rename it.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = GGUFFile(gguf_path)
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{gguf_path.name}: architecture is {arch!r}; supported: {', '.join(ARCHITECTURES)}")
    mapping = ARCHITECTURES[arch]

    config = mapping.hf_config(reader)
    built = build_tokenizer(reader)  # before the slow part: fail fast if unsupported
    tensors = _hf_tensors(reader, mapping, config, progress, desc=f"Dequantizing {gguf_path.name}")
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    for role in ("bos", "eos", "pad"):
        if role in built.special:
            config.setdefault(f"{role}_token_id", built.special[role][0])

    out_dir.mkdir(parents=True, exist_ok=True)
    # "format": "pt" is what transformers checks for before trusting a safetensors file's layout.
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    built.tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(config, built, mapping.EXTRA_EOS_TOKENS))
    _write_json(out_dir / "special_tokens_map.json", special_tokens_map(reader, built))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(reader, built, config["max_position_embeddings"]))
    return out_dir


def _hf_tensors(
    reader: GGUFFile, mapping: Any, config: dict[str, Any], progress: bool, desc: str
) -> dict[str, np.ndarray]:
    # `gguf` is imported where a conversion runs, so serving a ready folder never needs it.
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    tensors: dict[str, np.ndarray] = {}
    for t in tqdm(reader.tensors, desc=desc, unit="tensor", file=sys.stderr, disable=not progress):
        values = dequantize(t.data, t.tensor_type)
        if t.tensor_type == GGMLQuantizationType.F32:
            values = values.copy()  # a view into the memory-mapped file otherwise
        # GGUF lists dims fastest-first (ne0 = columns); numpy / torch want them the other way round.
        values = values.astype(np.float32, copy=False).reshape(tuple(int(d) for d in reversed(t.shape)))
        name, values = mapping.hf_tensor(t.name, values, config)
        tensors[name] = np.ascontiguousarray(values)
    return tensors


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _generation_config(config: dict[str, Any], built: GGUFTokenizer, extra_eos: tuple[str, ...]) -> dict[str, Any]:
    result = {key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id") if key in config}
    eos = [result["eos_token_id"]] if "eos_token_id" in result else []
    eos += [i for i in map(built.tokenizer.token_to_id, extra_eos) if i is not None and i not in eos]
    if len(eos) > 1:
        result["eos_token_id"] = eos
    return result
