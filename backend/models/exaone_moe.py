"""EXAONE MoE (`exaone_moe`: LG's K-EXAONE): EXAONE 4's attention (per-head q / k norms; local
layers by `sliding_window_pattern` whose global layers do not rotate q and k) in a pre-norm block
(norms before attention and the MLP, as OLMoE's), with DeepSeek-V3's mixture of experts (glm4_moe.
sigmoid_moe: sigmoid scores plus `e_score_correction_bias`, renormalised, scaled by
`routed_scaling_factor`, `num_shared_experts` shared experts added) in the layers that
`mlp_layer_types` calls sparse (by default all from `first_k_dense_replace` on)."""
from dataclasses import replace

from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, layer_windows, sliding_pattern,
                                                     spec_from_hf)


def from_hf(cfg: dict) -> DecoderSpec:
    window = cfg.get("sliding_window", 4096)
    windows = layer_windows(cfg, window, sliding_pattern(cfg, 4)) if window else ()
    rope_layers = tuple(w is not None for w in windows)  # hybrid: the global layers are NoPE
    cfg = {"n_shared_experts": cfg.get("num_shared_experts", 1), "routed_scaling_factor": 2.5, **cfg}
    moe = sigmoid_moe(cfg, first_moe=1)
    types = cfg.get("mlp_layer_types")
    if types:
        if len(types) != cfg["num_hidden_layers"] or not set(types) <= {"dense", "sparse"}:
            raise ValueError(f"mlp_layer_types must list 'dense' / 'sparse' for each of "
                             f"{cfg['num_hidden_layers']} layers")
        moe = replace(moe, layers=tuple(t == "sparse" for t in types))
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), qk_norm=True, layer_windows=windows,
                        rope_layers=rope_layers, moe=moe)


MODEL = TransformerDecoder
