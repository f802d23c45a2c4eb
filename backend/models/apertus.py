"""Apertus (Swiss AI's Apertus-8B / 70B; `model_type` apertus): Llama's attention with a per-head
RMSNorm on q and k before the rotary (Qwen3's), the llama3 rope scaling, and a plain MLP (`up_proj`,
the activation, `down_proj`: no gate) whose activation is xIELU, with per-layer learnt scalars:

    xielu(h) = alpha_p * h^2 + beta * h                           for h > 0
    xielu(h) = alpha_n * (expm1(min(h, eps)) - h) + beta * h      otherwise

alpha_p = softplus(a_p), alpha_n = beta + softplus(a_n) from the checkpoint's `mlp.act_fn.alpha_p` /
`alpha_n`, beta (0.5) and eps (-1e-6) from its `beta` / `eps` (transformers' XIELUActivation: its
Python path; the optional CUDA extension computes the same function). They are read once into an
fp32 tensor per layer and applied by kernels.xielu between the two linears (transformer.py's
`act_params`). The norms are `attention_layernorm` and `feedforward_layernorm`."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, plain_activation,
                                                     spec_from_hf)

NAMES = WeightNames(attn_norm="attention_layernorm", mlp_norm="feedforward_layernorm")


def from_hf(cfg: dict) -> DecoderSpec:
    act = plain_activation(cfg, "Apertus", ("xielu",))
    if not cfg.get("rope_scaling") and not cfg.get("rope_parameters"):  # (transformers' default: llama3 scaling)
        cfg = {**cfg, "rope_parameters": {"rope_type": "llama3", "rope_theta": cfg.get("rope_theta", 12000000.0),
                                          "factor": 8.0, "original_max_position_embeddings": 8192,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0}}
    bias = bool(cfg.get("attention_bias", False))  # (on q, k, v and o; the MLP never has biases)
    return spec_from_hf(cfg, default_theta=12000000.0, norm_eps=cfg.get("rms_norm_eps", 1e-5), gated_mlp=False,
                        activation=act, mlp_bias=False, qk_norm=True, qkv_bias=bias, o_bias=bias, names=NAMES)


MODEL = TransformerDecoder
