"""GLM-4.5 / 4.6 (`glm4_moe`: GLM-4.5-Air, GLM-4.5, GLM-4.6): Llama's block with biases on Q, K,
V, a rotary over the first half of each head's dims (rotate-half, partial 0.5), optional per-head
q/k norms (`use_qk_norm`), and a mixture-of-experts MLP in every layer from
`first_k_dense_replace` on. Its router scores each expert by sigmoid(logit) from fp32 logits,
chooses the top k by that score plus `e_score_correction_bias`, renormalises the chosen scores
(`norm_topk_prob`) and scales them by `routed_scaling_factor`; `n_shared_experts` shared experts
(one MLP of n times the expert width) are added as they are. Where `topk_group` < `n_group`
the choice is group-limited as DeepSeek-V3's (`noaux_tc`): the experts in `n_group` equal groups,
each group ranked by the sum of its two largest score + bias, the k chosen among the best
`topk_group` groups' experts only (MoeSpec.groups / kept_groups / group_score)."""
from dataclasses import replace

from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def sigmoid_moe(cfg: dict, first_moe: int, *, group_score: str = "top2_sum") -> MoeSpec:
    """The MoE layers of GLM-4.5's (and dots.llm1's: DeepSeek-V3's) kind, from layer `first_moe`
    on where the config has no `first_k_dense_replace`. The choice is group-limited where
    `topk_group` < `n_group` (absent: 1, no limit), the groups ranked by `group_score`
    (reference.moe_route: "top2_sum", DeepSeek-V3's `noaux_tc`; "max")."""
    first_moe = cfg.get("first_k_dense_replace", first_moe)
    return MoeSpec(num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                   intermediate_size=cfg["moe_intermediate_size"], normalize=bool(cfg.get("norm_topk_prob", True)),
                   round_weights=False, layers=tuple(i >= first_moe for i in range(cfg["num_hidden_layers"])),
                   shared_intermediate_size=cfg["moe_intermediate_size"] * (cfg.get("n_shared_experts") or 0),
                   names=MoeNames(shared="mlp.shared_experts", shared_gate=None), scoring="sigmoid", score_bias=True,
                   scale=float(cfg.get("routed_scaling_factor", 1.0)), router_fp32=True,
                   **expert_groups(cfg, group_score))


def expert_groups(cfg: dict, group_score: str = "top2_sum") -> dict:
    """MoeSpec's group-limited choice from a DeepSeek-style config: `n_group` groups, the best
    `topk_group` kept (either absent or null: 1), ranked by `group_score`."""
    return dict(groups=cfg.get("n_group") or 1, kept_groups=cfg.get("topk_group") or 1, group_score=group_score)


def softmax_group_moe(cfg: dict, first_moe: int = 0) -> MoeSpec:
    """DeepSeek-V2's MoE layers (Hugging Face's DeepseekV2Moe), from `first_k_dense_replace` (or
    `first_moe`) on: softmax probabilities from fp32 router logits, no choice bias; `topk_method`
    "greedy" takes the k most probable experts, "group_limited_greedy" takes them among the
    `topk_group` of `n_group` groups whose most probable expert is the most probable (group
    score "max"); the k probabilities are not renormalised (Hugging Face's router ignores
    `norm_topk_prob`, false in DeepSeek-V2's published configs), times `routed_scaling_factor`;
    `n_shared_experts` shared experts (`mlp.shared_experts`) added as they are. A family file
    passes the result as spec_from_hf's `moe`."""
    method = cfg.get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"unsupported topk_method {method!r} for softmax routing (supported: greedy, "
                         f"group_limited_greedy)")
    if method == "greedy":  # (n_group / topk_group, where set, do not apply)
        cfg = {**cfg, "n_group": 1, "topk_group": 1}
    return replace(sigmoid_moe(cfg, first_moe, group_score="max"), scoring="softmax", score_bias=False, normalize=False)


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {"partial_rotary_factor": 0.5, "n_shared_experts": 1, **cfg}  # GLM's defaults where the config omits them
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), qkv_bias=bool(cfg.get("attention_bias", False)),
                        qk_norm=bool(cfg.get("use_qk_norm", False)), moe=sigmoid_moe(cfg, first_moe=1))


MODEL = TransformerDecoder
