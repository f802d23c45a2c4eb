"""Default checkpoints and the GGUF -> Hugging Face converter.

    prepare_default_checkpoints()        -> {"embedder": Path, "generator": Path}
    prepare_generator_checkpoint(name)   -> Path  ("smollm2-135m", "gemma-3-270m")
    convert_gguf_to_hf(gguf, out)        -> out (config.json, model.safetensors, tokenizer.json, ...)
"""

from .defaults import (
    DEFAULT_GENERATOR,
    GENERATOR_CHECKPOINTS,
    cache_dir,
    gemma3_270m_chunks,
    minilm_dir,
    prepare_default_checkpoints,
    prepare_gemma3_270m,
    prepare_generator_checkpoint,
    prepare_smollm2,
    smollm2_gguf,
)
from .gguf_convert import CONVERTER_VERSION, convert_gguf_to_hf

__all__ = [
    "CONVERTER_VERSION",
    "DEFAULT_GENERATOR",
    "GENERATOR_CHECKPOINTS",
    "cache_dir",
    "convert_gguf_to_hf",
    "gemma3_270m_chunks",
    "minilm_dir",
    "prepare_default_checkpoints",
    "prepare_gemma3_270m",
    "prepare_generator_checkpoint",
    "prepare_smollm2",
    "smollm2_gguf",
]
