"""CWM (`cwm`: Meta's 32B Code World Model): Llama's block (no biases, the llama3 rope scaling)
with three of every four layers attending to a sliding window of `sliding_window` tokens (8,192) and
the rest to every key. Which layers are global is `layer_types`; a config without it follows
transformers' rule for CWM, every fourth layer from the first (0, 4, 8, ...) global, which is not the
every-fourth-from-the-fourth rule of `sliding_pattern` (Gemma 3, Cohere2)."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, layer_windows, rope_parameters,
                                                     spec_from_hf)

# The rope of a config that names none (transformers' CwmConfig's): Llama 3's scaling of an 8,192-token
# original context 16 times.
DEFAULT_ROPE = {"rope_type": "llama3", "rope_theta": 1_000_000.0, "factor": 16.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def from_hf(cfg: dict) -> DecoderSpec:
    if not rope_parameters(cfg):
        cfg = {**cfg, "rope_parameters": DEFAULT_ROPE}
    sliding = [i % 4 != 0 for i in range(cfg["num_hidden_layers"])]
    return spec_from_hf(cfg, default_theta=1_000_000.0, norm_eps=cfg.get("rms_norm_eps", 1e-5),
                        layer_windows=layer_windows(cfg, cfg.get("sliding_window", 8192), sliding))


MODEL = TransformerDecoder
