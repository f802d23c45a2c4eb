"""dots.llm1 (`dots1`: rednote's dots.llm1, 142B in all, 14B active): Qwen3's attention (per-head
q/k RMSNorms before the rotary) with GLM-4.5's (DeepSeek-V3's) mixture of experts from
`first_k_dense_replace` on: sigmoid scores from fp32 router logits, the top k chosen by score plus
`e_score_correction_bias`, renormalised (`norm_topk_prob`) and scaled by `routed_scaling_factor`;
`n_shared_experts` shared experts added as they are (glm4_moe.sigmoid_moe). Windows on the layers
from `max_window_layers` on where `sliding_window` is set (or as `layer_types` lists them)."""
from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    layers = cfg["num_hidden_layers"]
    first_window = cfg.get("max_window_layers", layers)
    windows = layer_windows(cfg, cfg.get("sliding_window"), [i >= first_window for i in range(layers)])
    return spec_from_hf(cfg, qkv_bias=bool(cfg.get("attention_bias", False)), qk_norm=True, layer_windows=windows,
                        moe=sigmoid_moe(cfg, first_moe=0))


MODEL = TransformerDecoder
