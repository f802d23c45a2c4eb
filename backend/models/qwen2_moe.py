"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's block (Q/K/V biases) with a mixture-of-experts
MLP in the layers `decoder_sparse_step` / `mlp_only_layers` name (moe.moe_layers): top-k routing
(renormalised where `norm_topk_prob`, the weights rounded to the activation dtype) and a shared
expert every token passes through, weighted by sigmoid(shared_expert_gate @ x)."""
from tritonformer.backend.models.moe import MoeSpec, moe_layers, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf


def qwen_moe(cfg: dict, shared: bool) -> MoeSpec:
    """The MoE part of a Qwen2-MoE or Qwen3-MoE config."""
    return MoeSpec(num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                   intermediate_size=cfg["moe_intermediate_size"], normalize=bool(cfg.get("norm_topk_prob", False)),
                   round_weights=True, layers=moe_layers(cfg),
                   shared_intermediate_size=cfg["shared_expert_intermediate_size"] if shared else 0)


def from_hf(cfg: dict) -> DecoderSpec:
    windows = ()
    if cfg.get("use_sliding_window"):  # Qwen2-MoE's rule: every other layer below max_window_layers
        first_dense = cfg.get("max_window_layers", 28)
        windows = layer_windows(cfg, cfg.get("sliding_window", 4096),
                                [i % 2 == 0 and i < first_dense for i in range(cfg["num_hidden_layers"])])
    return spec_from_hf(cfg, qkv_bias=bool(cfg.get("qkv_bias", True)), layer_windows=windows,
                        moe=qwen_moe(cfg, shared=True))


MODEL = TransformerDecoder
