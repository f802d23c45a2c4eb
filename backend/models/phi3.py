"""Phi-3: Llama's block with fused `qkv_proj` and `gate_up_proj` weights, the default or the
`longrope` rotary schedule (the 128k-context models), and a sliding window where set."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, layer_windows,
                                                     rope_parameters, spec_from_hf)


def from_hf(cfg: dict) -> DecoderSpec:
    rope = rope_parameters(cfg)
    if rope and "original_max_position_embeddings" not in rope and "original_max_position_embeddings" in cfg:
        # Phi-3 keeps the pre-training length beside the rope dict, not in it.
        cfg = {**cfg, "rope_scaling": {**rope, "original_max_position_embeddings": cfg["original_max_position_embeddings"]}}
    if cfg.get("attention_bias"):
        raise ValueError("Phi-3 with attention_bias is not supported")
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5),
                        layer_windows=layer_windows(cfg, cfg.get("sliding_window")),
                        names=WeightNames(qkv="self_attn.qkv_proj", gate_up="mlp.gate_up_proj"))


MODEL = TransformerDecoder
