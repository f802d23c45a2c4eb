"""Aria (rhymes-ai/Aria) served text-only: its language model (`aria_text`, AriaTextForCausalLM's checkpoint) and the
multimodal `aria` checkpoint's text model (multimodal.text_part under `language_model.`; the vision tower and the
projector left unread, the head tied as the outer config says, as transformers ties it).

The block is Llama's (RMSNorm before attention and the MLP, grouped-query attention, Llama's rotary and any rope
scaling transformers reads for it; biases on the attention's four projections where `attention_bias`); every layer's
MLP is a mixture of experts (moe.py): `moe_num_experts` experts of `intermediate_size` columns each, SiLU-gated, the
top `moe_topk` by router logit weighted by the softmax over those k logits alone (which is a softmax over every
expert renormalised over the k: MoeSpec.normalize), rounded to the activation dtype as transformers' softmax in it
leaves them; plus shared experts every token passes through, added as they are: one gated MLP of
`moe_num_shared_experts` x `intermediate_size` columns (`mlp.shared_experts`). The experts are stored as x @ W, gate
columns then up (`[E, H, 2I]`, down `[E, I, H]`): transformers' `experts.gate_up_proj` / `experts.down_proj`, or the
published (and saved) `experts.fc1.weight` / `experts.fc2.weight`, the same tensors renamed. Refused by name: an
activation other than silu (transformers' routed experts are always SiLU-gated while its shared experts follow
`hidden_act`, which one activation per layer cannot follow), `mlp_bias` (biases on the shared experts)."""
from tritonformer.backend.models.moe import MoeNames, MoeSpec
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

TEXT_TYPE = "aria_text"
# transformers' AriaTextConfig defaults, where a config.json leaves a key out
DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
            "pad_token_id": 2, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
            "moe_num_experts": 8, "moe_topk": 2, "moe_num_shared_experts": 2}
MOE_NAMES = MoeNames(blocks=("mlp",), routers=("router",),
                     stacked=(("experts.gate_up_proj", "experts.down_proj"),
                              ("experts.fc1.weight", "experts.fc2.weight")),
                     shared="mlp.shared_experts", shared_gate=None, columns=True, interleaved=False)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A multimodal Aria checkpoint (model_type aria): its text model's config and tensors, the head tied as the outer
    config says."""
    if cfg.get("model_type") != "aria":
        return cfg, state
    tie = bool(cfg.get("tie_word_embeddings", False))
    text, tensors = text_part(cfg, state, TEXT_TYPE)
    return {**text, "tie_word_embeddings": tie}, tensors


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"unsupported {TEXT_TYPE} hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu, "
                         f"the routed experts' own)")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{TEXT_TYPE} with mlp_bias is not supported (supported: mlp_bias false, as published)")
    inter = cfg["intermediate_size"]
    moe = MoeSpec(num_experts=cfg["moe_num_experts"], top_k=cfg["moe_topk"], intermediate_size=inter, normalize=True,
                  round_weights=True, layers=(True,) * cfg["num_hidden_layers"],
                  shared_intermediate_size=inter * cfg["moe_num_shared_experts"], names=MOE_NAMES)
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, qkv_bias=bias, o_bias=bias, moe=moe)


MODEL = TransformerDecoder
