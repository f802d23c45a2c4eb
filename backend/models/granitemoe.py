"""Granite MoE (IBM's Granite 3.x MoE: 1B-A400M, 3B-A800M; `granitemoeshared` adds a shared MLP):
Granite's block and its four muP scalars (granite.py) with a mixture-of-experts MLP in every
layer. The router takes each token's k largest logits and a softmax over those k, which is the
softmax over all experts renormalised over the k; the weights are rounded to the activation
dtype. Published checkpoints stack the experts as `block_sparse_moe.input_linear` ([gate; up]
of each) and `output_linear`, the router as `router.layer`; the shared MLP is `shared_mlp`'s
`input_linear` / `output_linear`, added without a gate."""
from tritonformer.backend.models import granite
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder

NAMES = MoeNames(blocks=("block_sparse_moe",), routers=("router", "router.layer"),
                 stacked=(("experts.gate_up_proj", "experts.down_proj"), ("input_linear", "output_linear")),
                 shared="shared_mlp", shared_gate=None, shared_fused=("input_linear", "output_linear"))


def from_hf(cfg: dict, **options) -> DecoderSpec:
    """`options`: more DecoderSpec fields (granite_swa.py's windows, sinks and ropes)."""
    moe = MoeSpec(num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                  intermediate_size=cfg["intermediate_size"], normalize=True, round_weights=True,
                  layers=(True,) * cfg["num_hidden_layers"],
                  shared_intermediate_size=cfg.get("shared_intermediate_size", 0), names=NAMES)
    return granite.from_hf(cfg, moe=moe, **options)


MODEL = TransformerDecoder
