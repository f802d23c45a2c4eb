"""MiniMax-M2 (`minimax_m2`: MiniMaxAI's MiniMax-M2, 230B in all, 10B active): Mixtral's block with
q and k RMS-normalised over all of a token's query / key heads at once (weights of `heads x head_dim`)
before a rotary over the first `rotary_dim` dims of each head (64 of 128: the published config's
name for the share; transformers' `partial_rotary_factor`), and experts in every layer routed as
GLM-4.5 routes: sigmoid(logit) scores, the top k chosen by score plus the block's
`e_score_correction_bias`, their scores renormalised; no shared expert and no scaling. The router's
logits come from the activations as they are, not fp32 (transformers' MiniMax-M2 router casts to the
router weight's dtype). Published checkpoints name the block `block_sparse_moe` and an expert's gate /
down / up `w1` / `w2` / `w3`, as Mixtral's. The multi-token-prediction modules are not read.
Its whole-width q / k norms split over tensor-parallel ranks as OLMo 2's do (kernels.qk_squares, all-reduced)."""
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {"head_dim": 128, "rms_norm_eps": 1e-6, **cfg}  # (MiniMax-M2's defaults where the config omits them)
    if cfg.get("rotary_dim") and "partial_rotary_factor" not in (cfg.get("rope_parameters") or {}):
        cfg["partial_rotary_factor"] = cfg["rotary_dim"] / cfg["head_dim"]  # (the published config's name)
    moe = MoeSpec(num_experts=num_experts(cfg, 256), top_k=cfg.get("num_experts_per_tok", 8),
                  intermediate_size=cfg["intermediate_size"], normalize=True, round_weights=False,
                  layers=(True,) * cfg["num_hidden_layers"], scoring="sigmoid", score_bias=True,
                  names=MoeNames(blocks=("block_sparse_moe", "mlp"), gate="w1", up="w3", down="w2"))
    return spec_from_hf(cfg, default_theta=5e6, qk_norm=True, qk_norm_full=True, moe=moe)


MODEL = TransformerDecoder
