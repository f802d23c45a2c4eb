"""EXAONE 4.0 (`exaone4`: LG's EXAONE-4.0 1.2B and 32B): OLMo 2's placement of the norms (after
attention and the MLP, before each residual add; none before them) with per-head q / k norms
(Qwen3's), and, where `sliding_window` is set, sliding-window layers by `sliding_window_pattern`
("LLLG": three local layers, then a global one; an int n: every n-th layer global) whose global
layers do not rotate q and k (NoPE)."""
from tritonformer.backend.models.olmo2 import NAMES
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf


def sliding_layers(cfg: dict) -> list[bool]:
    """Per layer whether it attends through the sliding window (`sliding_window_pattern`)."""
    pattern, layers = cfg.get("sliding_window_pattern"), cfg["num_hidden_layers"]
    if isinstance(pattern, str):
        return [pattern[i % len(pattern)] == "L" for i in range(layers)]
    return [bool(pattern) and (i + 1) % pattern != 0 for i in range(layers)]


def from_hf(cfg: dict) -> DecoderSpec:
    window = cfg.get("sliding_window")
    windows = layer_windows(cfg, window, sliding_layers(cfg)) if window else ()
    rope_layers = tuple(w is not None for w in windows)  # hybrid: the global layers are NoPE
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), sandwich_norms=True, pre_norms=False,
                        qk_norm=True, layer_windows=windows, rope_layers=rope_layers, names=NAMES)


MODEL = TransformerDecoder
