"""OLMoE (`olmoe`: AI2's OLMoE-1B-7B): Llama's pre-norm block with OLMo's q / k norms over all heads
at once and a mixture-of-experts MLP in every layer (64 experts, the top 8 by softmax, not
renormalised unless `norm_topk_prob`; the weights rounded to the activation dtype). `clip_qkv`
(clamping q, k and v) is refused."""
from tritonformer.backend.models.moe import MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("clip_qkv") is not None:
        raise ValueError("OLMoE with clip_qkv is not supported (supported: clip_qkv null)")
    moe = MoeSpec(num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                  intermediate_size=cfg["intermediate_size"], normalize=bool(cfg.get("norm_topk_prob", False)),
                  round_weights=True, layers=(True,) * cfg["num_hidden_layers"])
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), qk_norm=True, qk_norm_full=True, moe=moe)


MODEL = TransformerDecoder
