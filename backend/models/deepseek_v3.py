"""DeepSeek-V3 / R1 (`deepseek_v3`; Kimi K2's checkpoints, `kimi_k2`, are the same architecture): Llama's
pre-norm block with multi-head latent attention (mla.py: queries through a latent of `q_lora_rank`,
keys and values from one of `kv_lora_rank` plus a shared rotary key, the rotary interleaved where
`rope_interleave`, YaRN's `mscale_all_dim` in the softmax scale) and GLM-4.5's kind of experts from
layer `first_k_dense_replace` on: sigmoid scores from fp32 router logits, the top k by score plus
`e_score_correction_bias`, renormalised (`norm_topk_prob`) and scaled by `routed_scaling_factor`,
`n_shared_experts` shared experts added as they are (glm4_moe.sigmoid_moe, which says what group-limited
choice it takes). The multi-token-prediction layer (`layers.{num_hidden_layers}`) is not read; FP8
checkpoints (DeepSeek's published block-scaled ones) are refused at load."""
from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

# transformers' DeepseekV3Config defaults, where a config.json leaves them out
DEFAULTS = {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "rope_interleave": True,
            "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 8, "topk_group": 4}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    return spec_from_hf(cfg, **mla_options(cfg), moe=sigmoid_moe(cfg, first_moe=3))


MODEL = TransformerDecoder
