"""A.X-K1 (`axk1`: SK Telecom's A.X-K1): DeepSeek-V3's block (deepseek_v3.py) with one change, an RMSNorm on the
output of each mixture-of-experts MLP before the residual add.

- Attention: multi-head latent attention (mla.py), always through a query latent (transformers builds q_a_proj /
  q_b_proj only: `q_lora_rank` null is refused by name), keys and values from one latent of `kv_lora_rank` plus a
  shared rotary key, the rotary interleaved where `rope_interleave`, YaRN's `mscale_all_dim` in the softmax scale.
- MLP: dense SwiGLU in the layers `mlp_layer_types` calls "dense" (without it: the first `first_k_dense_replace`,
  1 by default, and those off `moe_layer_freq`), experts in the "sparse" ones, routed as DeepSeek-V3's
  (glm4_moe.sigmoid_moe: sigmoid scores from fp32 logits, the top k by score + `e_score_correction_bias` among the
  best `topk_group` of `n_group` groups, renormalised, times `routed_scaling_factor`, shared experts added). A
  checkpoint without the choice's bias (the released ones route without it) routes with a zero one.
- The expert layers' block output (routed + shared) is RMS-normalised by `post_mlp_layernorm`, y = x + N(moe(N'(x))):
  the shared decoder's norm after the MLP (its sandwich norm's second half), in those layers only. Published
  checkpoints keep it beside the layer (`layers.{i}.post_mlp_layernorm`), transformers under the block
  (`layers.{i}.mlp.post_mlp_layernorm`): both load; the dense layers' copies, which the model does not use, are
  not read.

The multi-token-prediction layers are not read."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.moe import MoeSpec
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

# transformers' AXK1Config defaults, where a config.json leaves them out
DEFAULTS = {"n_shared_experts": 1, "n_routed_experts": 192, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
            "rope_interleave": True, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
            "moe_intermediate_size": 2048, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768}
POST_MLP_NORMS = ("post_mlp_layernorm.weight", "mlp.post_mlp_layernorm.weight")  # (published, transformers')


@dataclass(frozen=True)
class Axk1Spec(DecoderSpec):
    """DeepSeek-V3's spec; the expert layers' norms after the MLP are read by Axk1Decoder."""

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The expert layers' post-MLP norms (client/model_shapes.tensor_shapes), under transformers' names."""
        return {f"layers.{i}.{POST_MLP_NORMS[1]}": (self.hidden_size,) for i, moe in enumerate(self.moe.layers) if moe}


def mlp_layers(cfg: dict) -> tuple[bool, ...]:
    """Per layer whether its MLP is the experts: `mlp_layer_types`, else transformers' rule from the legacy
    `first_k_dense_replace` (1) and `moe_layer_freq` (1)."""
    layers, types = cfg["num_hidden_layers"], cfg.get("mlp_layer_types")
    if types is None:
        first, every = cfg.get("first_k_dense_replace", 1), cfg.get("moe_layer_freq", 1)
        return tuple(i >= first and i % every == 0 for i in range(layers))
    if len(types) != layers or not set(types) <= {"dense", "sparse"}:
        raise ValueError(f"A.X-K1 with mlp_layer_types {types} is not supported (supported: mlp_layer_types, "
                         f"'dense' or 'sparse' for each of {layers} layers)")
    return tuple(t == "sparse" for t in types)


def with_zero_choice_biases(state: dict, moe: MoeSpec) -> dict:
    """The checkpoint's tensors plus a zero choice bias (`e_score_correction_bias`, beside the router) in each expert
    layer that has none: what transformers leaves it at when a checkpoint does not hold it."""
    state, bias = dict(state), f"{moe.names.routers[0]}.{moe.names.score_bias}"
    for i, experts in enumerate(moe.layers):
        name = f"layers.{i}.{moe.names.blocks[0]}.{bias}"
        if experts and name not in state:
            state[name] = torch.zeros(moe.num_experts)
    return state


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    if cfg.get("q_lora_rank") is None:
        raise ValueError("A.X-K1 with q_lora_rank null is not supported (supported: q_lora_rank, a query latent: "
                         "transformers builds q_a_proj / q_b_proj only)")
    spec = spec_from_hf(cfg, **mla_options(cfg), moe=replace(sigmoid_moe(cfg, first_moe=1), layers=mlp_layers(cfg)))
    return Axk1Spec(**{f.name: getattr(spec, f.name) for f in fields(spec)})


class Axk1Decoder(TransformerDecoder):
    """The shared decoder with the expert layers' norms after the MLP (and a zero choice bias where the checkpoint
    has none)."""

    def __init__(self, config: Axk1Spec, state: dict, device, dtype, tp=None):
        state = with_zero_choice_biases(state, config.moe)
        super().__init__(config, state, device, dtype, tp=tp)
        sizes = f"hidden {config.hidden_size}"
        for i, moe in enumerate(config.moe.layers):
            if moe:
                name = next((f"layers.{i}.{n}" for n in POST_MLP_NORMS if f"layers.{i}.{n}" in state),
                            f"layers.{i}.{POST_MLP_NORMS[0]}")
                self.layers[i].mlp_post_norm = self.weight(self.checked(state, name, (config.hidden_size,), sizes))


MODEL = Axk1Decoder
