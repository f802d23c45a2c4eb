"""GLM-4.5 / 4.6 (`glm4_moe`: GLM-4.5-Air, GLM-4.5, GLM-4.6): Llama's block with biases on Q, K,
V, a rotary over the first half of each head's dims (rotate-half, partial 0.5), optional per-head
q/k norms (`use_qk_norm`), and a mixture-of-experts MLP in every layer from
`first_k_dense_replace` on. Its router scores each expert by sigmoid(logit) from fp32 logits,
chooses the top k by that score plus `e_score_correction_bias`, renormalises the chosen scores
(`norm_topk_prob`) and scales them by `routed_scaling_factor`; `n_shared_experts` shared experts
(one MLP of n times the expert width) are added as they are. Group-limited choice (`n_group`
groups, the best `topk_group` of them) is refused unless every group is kept."""
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def sigmoid_moe(cfg: dict, first_moe: int) -> MoeSpec:
    """The MoE layers of GLM-4.5's (and dots.llm1's: DeepSeek-V3's) kind, from layer `first_moe`
    on where the config has no `first_k_dense_replace`."""
    groups, kept = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    if kept < groups:
        raise ValueError(f"group-limited expert choice (n_group {groups}, topk_group {kept}) is not supported; "
                         f"supported: topk_group equal to n_group (every group kept)")
    first_moe = cfg.get("first_k_dense_replace", first_moe)
    return MoeSpec(num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                   intermediate_size=cfg["moe_intermediate_size"], normalize=bool(cfg.get("norm_topk_prob", True)),
                   round_weights=False, layers=tuple(i >= first_moe for i in range(cfg["num_hidden_layers"])),
                   shared_intermediate_size=cfg["moe_intermediate_size"] * (cfg.get("n_shared_experts") or 0),
                   names=MoeNames(shared="mlp.shared_experts", shared_gate=None), scoring="sigmoid", score_bias=True,
                   scale=float(cfg.get("routed_scaling_factor", 1.0)), router_fp32=True)


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {"partial_rotary_factor": 0.5, "n_shared_experts": 1, **cfg}  # GLM's defaults where the config omits them
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), qkv_bias=bool(cfg.get("attention_bias", False)),
                        qk_norm=bool(cfg.get("use_qk_norm", False)), moe=sigmoid_moe(cfg, first_moe=1))


MODEL = TransformerDecoder
