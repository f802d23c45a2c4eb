"""OLMo 2 (`olmo2`: AI2's fully open OLMo-2 1B-32B): Llama's attention and MLP with the norms moved
after them (each block's output RMS-normalised, then added to the residual stream; nothing
normalises a block's input), and q / k RMS-normalised over all of a token's query / key heads at
once (weights of `heads x head_dim`) before the rotary."""
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames, spec_from_hf

NAMES = WeightNames(attn_post_norm="post_attention_layernorm", mlp_post_norm="post_feedforward_layernorm")


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("attention_bias"):
        raise ValueError("OLMo 2 with attention_bias is not supported")
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), sandwich_norms=True, pre_norms=False,
                        qk_norm=True, qk_norm_full=True, names=NAMES)


MODEL = TransformerDecoder
