"""GPT-J (`gptj`: EleutherAI's GPT-J-6B and its fine-tunes): attention and a plain GELU MLP (`fc_in`,
`fc_out`, with biases) side by side on one LayerNorm with a bias (`ln_1`), both added to the
residual stream; no biases on Q, K, V or the output projection; a rotary over the first
`rotary_dim` dims of each head (64 of GPT-J-6B's 256) pairing neighbouring dims (2i, 2i + 1),
base 10,000; a final LayerNorm and an output head with a bias. Its config uses GPT-2's names and
its layers are `h.{i}`. A config without `rotary_dim` is refused."""
from tritonformer.backend.models import gpt_bigcode
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, plain_activation,
                                                     spec_from_hf)

NAMES = WeightNames(q="attn.q_proj", k="attn.k_proj", v="attn.v_proj", o="attn.out_proj", up="mlp.fc_in",
                    down="mlp.fc_out", attn_norm="ln_1", embed="wte.weight", final_norm="ln_f.weight")


adapt = gpt_bigcode.adapt  # (its layers are `h.{i}.` too)


def from_hf(cfg: dict) -> DecoderSpec:
    if not cfg.get("rotary_dim"):
        raise ValueError("GPT-J without rotary_dim is not supported (supported: rotary_dim set)")
    cfg = gpt_bigcode.with_canonical_names(cfg)
    act = plain_activation({"hidden_act": cfg.get("activation_function", "gelu_new")}, "GPT-J",
                           ("gelu_new", "gelu_pytorch_tanh", "gelu"))
    return spec_from_hf(cfg, norm_eps=cfg.get("layer_norm_epsilon", 1e-5), parallel_block=True, layer_norm=True,
                        norm_bias=True, gated_mlp=False, activation=act, mlp_bias=True, head_bias=True,
                        rotary_dim=int(cfg["rotary_dim"]), rotary_interleaved=True, names=NAMES)


MODEL = TransformerDecoder
