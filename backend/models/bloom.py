"""BLOOM (`bloom`: BigScience's BLOOM-560M to BLOOM-176B, BLOOMZ): ALiBi in place of any position
embedding, a LayerNorm (with a bias) on the token embeddings before the first layer
(`word_embeddings_layernorm`, whose output is the residual stream), then Llama's sequential block
with LayerNorms with biases (`input_layernorm`, `post_attention_layernorm`, `ln_f`), a plain
tanh-GELU MLP 4 x hidden wide (`dense_h_to_4h`, `dense_4h_to_h`), biases on every linear, a head
tied to the embeddings. One fused QKV projection stored per head (q, k and v of head 0, then of
head 1, ...: `query_key_value`, as GPT-NeoX's). Its layers are `h.{i}`, its config names older
ones (`n_layer`, `n_head`, `n_embed`).

ALiBi: query head h's score of key position k for the query at position p is
q.k / sqrt(head_dim) + m_h * (k - p), the bias added after the scaling as Hugging Face's baddbmm
does (it adds m_h * k: the same up to a constant per query row, which the softmax cancels). The
slopes m_h, for H heads and n = 2^floor(log2 H) the largest power of two up to H: (2^(-8/n))^i for
i = 1 .. n, then for the H - n heads past it (2^(-4/n))^i for the odd i = 1, 3, .. 2(H - n) - 1
(ALiBi's rule for a head count that is not a power of two), each computed in fp32 as transformers
does. Megatron's `pretraining_tp` and `slow_but_exact` only order the same sums and are read as
the plain linears; `apply_residual_connection_post_layernorm` (the residual taken after the norms)
is refused by name."""
from __future__ import annotations

import dataclasses
import math

import torch

from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, config_renamed,
                                                     layers_renamed, spec_from_hf)

_OLD_KEYS = (("n_layer", "num_hidden_layers"), ("n_head", "num_attention_heads"), ("n_embed", "hidden_size"))
NAMES = WeightNames(qkv="self_attention.query_key_value", qkv_grouped=True, o="self_attention.dense",
                    up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h", embed="word_embeddings.weight",
                    final_norm="ln_f.weight")
EMBED_NORM = "word_embeddings_layernorm"


def alibi_slopes(heads: int) -> tuple[float, ...]:
    """BLOOM's (and Falcon's) ALiBi slopes for `heads` heads, in fp32 (see the module's docstring)."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = torch.pow(torch.tensor(2.0 ** -(8.0 / n), dtype=torch.float32), torch.arange(1, n + 1))
    if n != heads:
        odd = torch.arange(1, 2 * min(n, heads - n), 2)
        slopes = torch.cat([slopes, torch.pow(torch.tensor(2.0 ** -(4.0 / n), dtype=torch.float32), odd)])
    return tuple(slopes.tolist())


class BloomSpec(DecoderSpec):
    """The shared decoder's spec; its checkpoint also holds the embeddings' LayerNorm."""

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The tensors beside the shared decoder's (client/model_shapes.tensor_shapes)."""
        return {EMBED_NORM + ".weight": (self.hidden_size,), EMBED_NORM + ".bias": (self.hidden_size,)}


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """BLOOM's layers are `h.{i}.`: the shared decoder reads them as `layers.{i}.`."""
    return cfg, layers_renamed(state, "h.")


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("apply_residual_connection_post_layernorm"):
        raise ValueError("BLOOM with apply_residual_connection_post_layernorm true is not supported "
                         "(supported: apply_residual_connection_post_layernorm false)")
    cfg = config_renamed(cfg, _OLD_KEYS)
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    cfg = {**cfg, "intermediate_size": 4 * hidden, "num_key_value_heads": heads}  # (transformers' 4 x hidden, always)
    spec = spec_from_hf(cfg, tie_default=True, norm_eps=cfg.get("layer_norm_epsilon", 1e-5), layer_norm=True,
                        norm_bias=True, gated_mlp=False, activation="gelu_tanh", mlp_bias=True, qkv_bias=True,
                        o_bias=True, rope_layers=(False,) * cfg["num_hidden_layers"],
                        alibi_slopes=alibi_slopes(heads), names=NAMES)
    return BloomSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})


class BloomDecoder(TransformerDecoder):
    """The shared decoder with BLOOM's LayerNorm on the token embeddings (whole on every
    tensor-parallel rank)."""

    def __init__(self, config: DecoderSpec, state: dict, device: torch.device, dtype: torch.dtype, tp=None):
        super().__init__(config, state, device, dtype, tp=tp)
        hidden = (config.hidden_size,)
        self.embed_norm = self.weight(self.checked(state, EMBED_NORM + ".weight", hidden, "hidden"))
        self.embed_norm_b = self.weight(self.checked(state, EMBED_NORM + ".bias", hidden, "hidden"))

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The token embeddings, LayerNorm'd: the residual stream the first layer reads."""
        return self._norm(super()._embed(ids, positions), self.embed_norm, bias=self.embed_norm_b)[0]


MODEL = BloomDecoder
