"""FlexOlmo (`flex_olmo`: AI2's FlexOlmo-7x7B): OLMo 2's post-norm block (norms after attention and
the MLP, none before; q / k norms over all heads: olmo2.py) with a mixture-of-experts MLP in
every layer, routed as OLMoE routes: the top k by softmax, renormalised where `norm_topk_prob`
says, the weights rounded to the activation dtype."""
from tritonformer.backend.models import olmo2
from tritonformer.backend.models.moe import MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder


def from_hf(cfg: dict) -> DecoderSpec:
    moe = MoeSpec(num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                  intermediate_size=cfg["intermediate_size"], normalize=bool(cfg.get("norm_topk_prob", False)),
                  round_weights=True, layers=(True,) * cfg["num_hidden_layers"])
    return olmo2.from_hf(cfg, moe=moe)


MODEL = TransformerDecoder
