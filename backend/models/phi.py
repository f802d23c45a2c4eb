"""Phi (Phi-1, Phi-1.5, Phi-2; `model_type` phi): a parallel block, attention and the MLP side by
side on one LayerNorm's output (with a bias), both added to the residual stream; a rotary over
a part of each head (`partial_rotary_factor`: 0.4 of Phi-2's 80 dims, 0.5 by default); a plain
GELU MLP (`fc1`, `fc2`); biases on every linear, the output head's too; a final LayerNorm.
The per-head q / k LayerNorms (`qk_layernorm`, off in the published checkpoints) are refused."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, plain_activation,
                                                     spec_from_hf)


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("qk_layernorm"):
        raise ValueError("Phi with q/k LayerNorms (qk_layernorm) is not supported (supported: qk_layernorm false)")
    act = plain_activation(cfg, "Phi", ("gelu_new", "gelu_pytorch_tanh", "gelu"))
    cfg = {"partial_rotary_factor": 0.5, **cfg}  # (Hugging Face's default where the config has none)
    return spec_from_hf(cfg, norm_eps=cfg.get("layer_norm_eps", 1e-5), parallel_block=True, layer_norm=True,
                        norm_bias=True, gated_mlp=False, activation=act, mlp_bias=True, qkv_bias=True, o_bias=True,
                        head_bias=True, names=WeightNames(o="self_attn.dense", up="mlp.fc1", down="mlp.fc2",
                                                          final_norm="final_layernorm.weight"))


MODEL = TransformerDecoder
