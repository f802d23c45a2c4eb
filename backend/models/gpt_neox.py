"""GPT-NeoX (Pythia, GPT-NeoX-20B and their fine-tunes; `model_type` gpt_neox): LayerNorms with a
bias, a rotary over a quarter of each head by default (`rotary_pct` / `partial_rotary_factor`),
one fused QKV projection stored per head (q, k and v of head 0, then of head 1, ...), a plain
GELU MLP (`dense_h_to_4h`, `dense_4h_to_h`) with biases, biases on the attention's linears
(`attention_bias`, on by default). With `use_parallel_residual` (the default) attention and the
MLP run side by side, each on a LayerNorm of its own, both added to the residual stream; without
it, one after the other, as Llama's block."""
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, plain_activation,
                                                     spec_from_hf)

NAMES = WeightNames(qkv="attention.query_key_value", qkv_grouped=True, o="attention.dense", up="mlp.dense_h_to_4h",
                    down="mlp.dense_4h_to_h", embed="embed_in.weight", final_norm="final_layer_norm.weight")


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """Checkpoints written before transformers 5 (Pythia's on the hub) name the output head
    `embed_out`, later ones `lm_head`."""
    if "embed_out.weight" in state and "lm_head.weight" not in state:
        state = {("lm_head.weight" if k == "embed_out.weight" else k): v for k, v in state.items()}
    return cfg, state


def from_hf(cfg: dict) -> DecoderSpec:
    act = plain_activation(cfg, "GPT-NeoX", ("gelu", "gelu_new", "gelu_pytorch_tanh"))
    # config.json as older transformers wrote it: rotary_pct and rotary_emb_base
    cfg = {"partial_rotary_factor": cfg.get("rotary_pct", 0.25), **cfg}
    if "rotary_emb_base" in cfg:
        cfg.setdefault("rope_theta", cfg["rotary_emb_base"])
    parallel = bool(cfg.get("use_parallel_residual", True))
    bias = bool(cfg.get("attention_bias", True))
    return spec_from_hf(cfg, norm_eps=cfg.get("layer_norm_eps", 1e-5), layer_norm=True, norm_bias=True, gated_mlp=False,
                        activation=act, mlp_bias=True, qkv_bias=bias, o_bias=bias, parallel_block=parallel,
                        parallel_mlp_norm=parallel, names=NAMES)


MODEL = TransformerDecoder
