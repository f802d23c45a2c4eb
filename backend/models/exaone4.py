"""EXAONE 4.0 (`exaone4`: LG's EXAONE-4.0 1.2B and 32B): OLMo 2's placement of the norms (after
attention and the MLP, before each residual add; none before them) with per-head q / k norms
(Qwen3's), and, where `sliding_window` is set, sliding-window layers by `sliding_window_pattern`
("LLLG": three local layers, then a global one; an int n: every n-th layer global) whose global
layers do not rotate q and k (NoPE)."""
from tritonformer.backend.models.olmo2 import NAMES
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, layer_windows, sliding_pattern,
                                                     spec_from_hf)


def from_hf(cfg: dict) -> DecoderSpec:
    window = cfg.get("sliding_window")
    windows = layer_windows(cfg, window, sliding_pattern(cfg, None)) if window else ()
    rope_layers = tuple(w is not None for w in windows)  # hybrid: the global layers are NoPE
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), sandwich_norms=True, pre_norms=False,
                        qk_norm=True, layer_windows=windows, rope_layers=rope_layers, names=NAMES)


MODEL = TransformerDecoder
