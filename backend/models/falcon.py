"""Falcon (`falcon`: TII's Falcon-7B, -40B, -180B, Falcon2-11B): LayerNorms with a bias, a rotary
over whole heads, a plain GELU MLP (`dense_h_to_4h`, `dense_4h_to_h`; `ffn_hidden_size`, 4 x
hidden by default), biases on the linears only where `bias` says, a tied head by default. One
fused QKV projection, stored per group of heads sharing a KV head: Falcon-7B's one KV head
(`multi_query`) after all query heads; each head's q, k and v (neither); the "new decoder
architecture" (40B, 180B, 11B) `num_kv_heads` groups of query heads, each followed by its key
and value heads. Attention and the MLP run side by side (`parallel_attn`; always in the new
architecture) on one LayerNorm, or each on its own (`ln_attn`, `ln_mlp`: the new
architecture's default, `num_ln_in_parallel_attn` 2); without `parallel_attn`, one after the
other. Its layers are `h.{i}` and its names older configs' (`n_layer`, `n_head`).

With `alibi` (Falcon-RW-1B / -7B) ALiBi in place of the rotary: query head h's score of key
position k for the query at position p is (q.k + m_h * (k - p)) / sqrt(head_dim), the bias added
before the scaling, as the original RefinedWeb code and transformers' SDPA path do (they add m_h * k:
the same up to a constant per query row, which the softmax cancels). The slopes are BLOOM's
(bloom.alibi_slopes) rounded to bfloat16, as transformers rounds them, then divided by
sqrt(head_dim) here once, in fp32. (transformers also rounds each product m_h * k to bfloat16, exact
for its power-of-two slopes (up to 8 heads) below 256 positions, and its eager attention adds the
biases twice, once in the scores and once more in the mask: its SDPA path is the model's math.)"""
import math

import torch

from tritonformer.backend.models.bloom import alibi_slopes
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, config_renamed,
                                                     layers_renamed, plain_activation, spec_from_hf)

_OLD_KEYS = (("n_layer", "num_hidden_layers"), ("n_head", "num_attention_heads"), ("n_embed", "hidden_size"),
             ("n_head_kv", "num_kv_heads"))


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """Falcon's layers are `h.{i}.`: the shared decoder reads them as `layers.{i}.`."""
    return cfg, layers_renamed(state, "h.")


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = config_renamed(cfg, _OLD_KEYS)
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    new_arch = bool(cfg.get("new_decoder_architecture", False))
    if new_arch:
        kv_heads = cfg.get("num_kv_heads") or heads
    else:
        kv_heads = 1 if cfg.get("multi_query", True) else heads
    two_norms = new_arch and (cfg.get("num_ln_in_parallel_attn") or 2) == 2
    bias = bool(cfg.get("bias", False))
    act = plain_activation({"hidden_act": cfg.get("activation", "gelu")}, "Falcon", ("gelu", "gelu_new",
                                                                                  "gelu_pytorch_tanh"))
    names = WeightNames(qkv="self_attention.query_key_value", qkv_grouped=True, o="self_attention.dense",
                        up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h",
                        attn_norm="ln_attn" if two_norms else "input_layernorm",
                        mlp_norm="ln_mlp" if two_norms else "post_attention_layernorm",
                        embed="word_embeddings.weight", final_norm="ln_f.weight")
    cfg.update(num_key_value_heads=kv_heads, intermediate_size=cfg.get("ffn_hidden_size") or 4 * hidden)
    alibi = None
    if cfg.get("alibi"):  # (no rotary; the slopes rounded as transformers rounds them, over sqrt(head_dim))
        rounded = torch.tensor(alibi_slopes(heads), dtype=torch.float32).bfloat16().float()
        alibi = tuple((rounded / math.sqrt(hidden // heads)).tolist())
    return spec_from_hf(cfg, tie_default=True, norm_eps=cfg.get("layer_norm_epsilon", 1e-5), layer_norm=True,
                        norm_bias=True, gated_mlp=False, activation=act, mlp_bias=bias, qkv_bias=bias, o_bias=bias,
                        parallel_block=new_arch or bool(cfg.get("parallel_attn", True)), parallel_mlp_norm=two_norms,
                        alibi_slopes=alibi, rope_layers=(False,) * cfg["num_hidden_layers"] if alibi else (),
                        names=names)


MODEL = TransformerDecoder
