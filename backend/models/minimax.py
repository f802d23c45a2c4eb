"""MiniMax-Text-01 / MiniMax-M1 (`minimax`): a hybrid decoder whose layers are lightning attention (lightning.py: a
linear attention whose state decays by a fixed factor per head and layer, normalised over all heads and gated by
sigmoid(output_gate x)) or Mixtral's softmax attention (GQA, a rotary over whole heads, over `sliding_window`
tokens where the config sets one: transformers windows the softmax layers only), per `layer_types`
("linear_attention" / "full_attention"; the original config's `attn_type_list`, 0 / 1, where those are absent;
without either, transformers' rule: the even layers attend). Every layer's MLP is Mixtral's experts (softmax over
fp32 router logits, the top k, their weights renormalised and kept in fp32; moe.py), published as
`block_sparse_moe` with experts one by one (`w1` / `w3` / `w2`) or as transformers stacks them under `mlp`.

The block is not Llama's: the residual stream is the normalised input, scaled. With n = RMSNorm(x),

    x' = alpha_attn n + beta_attn attn(n);   n' = RMSNorm(x');   x'' = alpha_mlp n' + beta_mlp moe(n')

(alpha / beta per kind of layer: `full_attn_alpha_factor` / `full_attn_beta_factor` or `linear_attn_...`, and
`mlp_alpha_factor` / `mlp_beta_factor`; the original config's `layernorm_full_attention_alpha` and kin where
transformers' names are absent; 1 where both are). The decoder runs that chain itself (`hidden_states`): each norm a
kernel of its own, each scaled sum element-wise ops, in the model's dtype as transformers rounds them.

Refused by name: `rotary_dim` / `partial_rotary_factor` other than a whole head (transformers' MiniMax rotates
every dim of a head whatever the config says: the original model's partial rotary would differ), `postnorm` false
(the original's residual from the un-normalised input: transformers always takes the normalised one), an activation
other than SiLU (the lightning layers' and the experts'), layer kinds other than linear_attention / full_attention.
Under tensor parallelism the lightning layers split by heads (lightning.py), the attention and the experts as the
decoder splits them; each row-parallel output is summed over the ranks before its scaled sum (`_summed`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models import lightning
from tritonformer.backend.models.lightning import LightningSpec
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

LIGHTNING = "lightning"  # the mixer kind (DecoderSpec.mixers) of a linear_attention layer
LAYER_KINDS = {"linear_attention": LIGHTNING, "full_attention": None}
# transformers' residual factors -> the original config's names for them
FACTORS = (("full_attn_alpha_factor", "layernorm_full_attention_alpha"),
           ("full_attn_beta_factor", "layernorm_full_attention_beta"),
           ("linear_attn_alpha_factor", "layernorm_linear_attention_alpha"),
           ("linear_attn_beta_factor", "layernorm_linear_attention_beta"),
           ("mlp_alpha_factor", "layernorm_mlp_alpha"), ("mlp_beta_factor", "layernorm_mlp_beta"))


@dataclass(frozen=True)
class MiniMaxSpec(DecoderSpec):
    """DecoderSpec plus the lightning layers' sizes and the residual factors, (alpha, beta) of the full-attention
    layers', the lightning layers' and the MLPs'."""

    lightning: LightningSpec | None = None
    full_factors: tuple[float, float] = (1.0, 1.0)
    linear_factors: tuple[float, float] = (1.0, 1.0)
    mlp_factors: tuple[float, float] = (1.0, 1.0)

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A lightning layer's checkpoint tensors by name (client/model_shapes.tensor_shapes)."""
        return lightning.tensor_shapes(self.lightning, prefix + "self_attn.", self.hidden_size)

    def split_mixers(self, tp) -> None:
        lightning.split(self.lightning, tp)


def layer_kinds(cfg: dict) -> tuple[str | None, ...]:
    """Per layer LIGHTNING or None (softmax attention): `layer_types`, else `attn_type_list` (0 lightning, 1
    softmax), else transformers' rule (the even layers attend)."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if not types and cfg.get("attn_type_list") is not None:
        types = [{0: "linear_attention", 1: "full_attention"}.get(t, t) for t in cfg["attn_type_list"]]
    elif not types:
        types = ["full_attention" if i % 2 == 0 else "linear_attention" for i in range(layers)]
    if len(types) != layers or not set(types) <= set(LAYER_KINDS):
        raise ValueError(f"layer_types must list 'linear_attention' / 'full_attention' for each of {layers} layers "
                         f"(supported: layer_types of {', '.join(LAYER_KINDS)}, or attn_type_list of 0 / 1)")
    return tuple(LAYER_KINDS[t] for t in types)


def _factor(cfg: dict, name: str, original: str) -> float:
    value = cfg.get(name)
    return float(cfg.get(original, 1.0) if value is None else value)


def from_hf(cfg: dict) -> MiniMaxSpec:
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    for key, value, supported in (
            ("rotary_dim", cfg.get("rotary_dim") or head_dim, head_dim),
            ("partial_rotary_factor", rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)), 1.0),
            ("postnorm", cfg.get("postnorm", True), True), ("hidden_act", cfg.get("hidden_act", "silu"), "silu")):
        if value != supported:
            raise ValueError(f"MiniMax with {key} {value!r} is not supported (supported: {key} "
                             f"{str(supported).lower() if isinstance(supported, bool) else supported})")
    kinds = layer_kinds(cfg)
    window = cfg.get("sliding_window")
    moe = MoeSpec(num_experts=num_experts(cfg, 8), top_k=cfg.get("num_experts_per_tok", 2),
                  intermediate_size=cfg["intermediate_size"], normalize=True, round_weights=False,
                  layers=(True,) * cfg["num_hidden_layers"],
                  names=MoeNames(blocks=("block_sparse_moe", "mlp"), gate="w1", up="w3", down="w2"))
    spec = spec_from_hf(cfg, default_theta=1e6, moe=moe, mixers=kinds,
                        layer_windows=tuple(window if k is None else None for k in kinds) if window else ())
    factors = [_factor(cfg, name, original) for name, original in FACTORS]
    return MiniMaxSpec(**{f.name: getattr(spec, f.name) for f in fields(DecoderSpec)},
                       lightning=LightningSpec(num_heads=heads, head_dim=head_dim,
                                               num_layers=cfg["num_hidden_layers"]),
                       full_factors=tuple(factors[0:2]), linear_factors=tuple(factors[2:4]),
                       mlp_factors=tuple(factors[4:6]))


def _scaled_sum(normed: torch.Tensor, alpha: float, out: torch.Tensor, beta: float) -> torch.Tensor:
    """alpha normed + beta out, each product and the sum rounded to the model's dtype (as transformers adds them)."""
    return (normed * alpha if alpha != 1.0 else normed) + (out * beta if beta != 1.0 else out)


class MiniMaxDecoder(TransformerDecoder):
    """The shared decoder with lightning layers where the spec's mixers say, and MiniMax's residual chain."""

    def load_mixer(self, i: int, prefix: str, weight, read):
        if self.config.mixer(i) != LIGHTNING:
            return super().load_mixer(i, prefix, weight, read)
        return lightning.load_lightning(self.config.lightning, i, prefix + "self_attn.", weight,
                                        self.config.hidden_size, self.tp)

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for the rows in `batch.logits_index`: each layer normalises the
        stream, and the normalised rows scaled are the stream its output joins (the module docstring)."""
        c, eps = self.config, self.config.norm_eps
        cos_sin = self.rope_cos_sin[batch.positions]
        x = self._embed(batch.input_ids)
        for li, layer in enumerate(self.layers):
            normed, _ = kernels.rms_norm(x, layer.attn_norm, eps)
            alpha, beta = c.full_factors if layer.mixer is None else c.linear_factors
            x = _scaled_sum(normed, alpha, self._summed(self._attend(normed, li, layer, batch, cache, cos_sin, None)),
                            beta)
            normed, _ = kernels.rms_norm(x, layer.mlp_norm, eps)
            x = _scaled_sum(normed, c.mlp_factors[0], self._summed(self._mlp(normed, layer)), c.mlp_factors[1])
        if not batch.logits_every_row:
            x = x[batch.logits_index]
        return kernels.rms_norm(x, self.final_norm, eps)[0]

    def _summed(self, part: torch.Tensor) -> torch.Tensor:
        """A row-parallel output's rows whole: summed over the ranks (as it is without tensor parallelism)."""
        return part if self.tp is None else self.tp.all_reduce(part)


MODEL = MiniMaxDecoder
