"""Mixtral: Mistral's block with a mixture-of-experts MLP in every layer (8 experts, the top 2 per
token, their weights renormalised and kept in fp32); published checkpoints name the block
`block_sparse_moe` and an expert's gate / down / up projections `w1` / `w2` / `w3` (moe.py)."""
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    moe = MoeSpec(num_experts=num_experts(cfg, 8), top_k=cfg.get("num_experts_per_tok", 2),
                  intermediate_size=cfg["intermediate_size"], normalize=True, round_weights=False,
                  layers=(True,) * cfg["num_hidden_layers"],
                  names=MoeNames(blocks=("block_sparse_moe", "mlp"), gate="w1", up="w3", down="w2"))
    return spec_from_hf(cfg, default_theta=1e6, layer_windows=layer_windows(cfg, cfg.get("sliding_window")), moe=moe)


MODEL = TransformerDecoder
