"""SmolLM3: Llama's block in which some layers use no rotary embedding at all (NoPE):
`no_rope_layers[i]` is 1 where layer i rotates its queries and keys, 0 where it does not (by
default every fourth layer does not); sliding windows where `use_sliding_window` is set."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("attention_bias"):
        raise ValueError("SmolLM3 with attention_bias is not supported")
    layers = cfg["num_hidden_layers"]
    rotates = cfg.get("no_rope_layers")
    if rotates is None:
        interval = cfg.get("no_rope_layer_interval", 4)
        rotates = [(i + 1) % interval != 0 for i in range(layers)]
    if len(rotates) != layers:
        raise ValueError(f"no_rope_layers lists {len(rotates)} layers for {layers}")
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    return spec_from_hf(cfg, rope_layers=tuple(bool(r) for r in rotates), layer_windows=layer_windows(cfg, window))


MODEL = TransformerDecoder
