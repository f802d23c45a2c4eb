"""Default checkpoints and the GGUF -> Hugging Face converter.

    prepare_default_checkpoints()  -> {"embedder": Path, "generator": Path}
    convert_gguf_to_hf(gguf, out)  -> out (config.json, model.safetensors, tokenizer.json, ...)
"""

from .defaults import (
    cache_dir,
    minilm_dir,
    prepare_default_checkpoints,
    prepare_smollm2,
    smollm2_gguf,
)
from .gguf_convert import CONVERTER_VERSION, convert_gguf_to_hf

__all__ = [
    "CONVERTER_VERSION",
    "cache_dir",
    "convert_gguf_to_hf",
    "minilm_dir",
    "prepare_default_checkpoints",
    "prepare_smollm2",
    "smollm2_gguf",
]
