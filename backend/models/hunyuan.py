"""Hunyuan dense (`hunyuan_v1_dense`: Tencent's Hunyuan 0.5B-7B): Llama's block with per-head q / k
RMSNorms (`query_layernorm`, `key_layernorm`) applied after the rotary, not before it. Its rope,
labelled "dynamic" with an `alpha`, is static: the base theta * alpha ** (d / (d - 2)) for a
head of d dims (NTK-alpha)."""
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, rope_parameters,
                                                     spec_from_hf)


def from_hf(cfg: dict, **extra) -> DecoderSpec:
    """`extra`: more DecoderSpec fields (hunyuan_moe.py's experts)."""
    if cfg.get("attention_bias"):
        raise ValueError("Hunyuan with attention_bias is not supported (supported: attention_bias false)")
    params = dict(rope_parameters(cfg) or {})
    options = {}
    if params.get("alpha") and params.get("rope_type", params.get("type")) == "dynamic":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        options["rope"] = Rope(theta * float(params["alpha"]) ** (head_dim / (head_dim - 2)))
        cfg = {**cfg, "rope_parameters": None, "rope_scaling": None}
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), qk_norm=True, qk_norm_after_rope=True,
                        names=WeightNames(q_norm="self_attn.query_layernorm", k_norm="self_attn.key_layernorm"),
                        **options, **extra)


MODEL = TransformerDecoder
