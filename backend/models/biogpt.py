"""BioGPT (`biogpt`: Microsoft's BioGPT and BioGPT-Large): OPT's block (learnt absolute positions whose first 2
rows are unused, no rotary; LayerNorms with a bias before attention and the MLP and at the end; a plain GELU MLP
`fc1`, `fc2`; biases on every linear; a tied head, `output_projection`) with the token embeddings scaled by
sqrt(hidden_size) before the positions are added (`scale_embedding`, BioGPT's default). Its LayerNorms take
torch's default epsilon, 1e-5, whatever `layer_norm_eps` says (transformers' BioGPT does not pass it to them).
Its tensors are under `biogpt.`, which the checkpoint reader strips (checkpoints/weights.py)."""
from dataclasses import replace

from tritonformer.backend.models import opt
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, plain_activation, spec_from_hf

NAMES = replace(opt.NAMES, final_norm="layer_norm.weight", lm_head="output_projection.weight")


def from_hf(cfg: dict) -> DecoderSpec:
    act = plain_activation(cfg, "BioGPT", ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"))
    scale = cfg["hidden_size"] ** 0.5 if cfg.get("scale_embedding", True) else None
    return spec_from_hf(cfg, tie_default=True, norm_eps=1e-5, layer_norm=True, norm_bias=True, gated_mlp=False,
                        activation=act, mlp_bias=True, qkv_bias=True, o_bias=True, embed_scale=scale,
                        learned_positions=True, position_offset=2, rope_layers=(False,) * cfg["num_hidden_layers"],
                        names=NAMES)


MODEL = TransformerDecoder
