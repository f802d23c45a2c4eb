"""Qwen2 / Qwen2.5: Llama's block with biases on Q, K and V; a sliding window only where the config
turns it on (`use_sliding_window`, layers from `max_window_layers` on)."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf


def qwen_windows(cfg: dict) -> tuple[int | None, ...]:
    """Qwen2 and Qwen3 window layers >= max_window_layers, and only with use_sliding_window."""
    if not cfg.get("use_sliding_window", False):
        return ()
    first = cfg.get("max_window_layers", 28)
    return layer_windows(cfg, cfg.get("sliding_window", 4096),
                         [i >= first for i in range(cfg["num_hidden_layers"])])


def from_hf(cfg: dict) -> DecoderSpec:
    return spec_from_hf(cfg, qkv_bias=True, layer_windows=qwen_windows(cfg))


MODEL = TransformerDecoder
