"""Qwen3-Next (`qwen3_next`: Qwen3-Next-80B-A3B): a hybrid decoder whose layers are mostly gated DeltaNet linear
attention (gated_deltanet.py: a fixed-size state per sequence) and every `full_attention_interval`-th (4th) layer
gated full attention, or as `layer_types` lists them; every MLP Qwen2-MoE's experts with a shared expert behind a
sigmoid gate (or a dense MLP where `decoder_sparse_step` / `mlp_only_layers` say).

The attention is Qwen3's (per-head q / k RMSNorms before the rotary) over a partial rotary (`partial_rotary_factor`,
a quarter of each 256-wide head by default), its output gated per element before the output projection,
o * sigmoid(x_n @ G^T) (attn_output_gate). The checkpoint's q_proj holds the query and that gate interleaved per
head (each head's D query rows, then its D gate rows): `adapt` splits it into q_proj and the gate's rows. Every
RMSNorm of the block, the q / k norms and the final norm multiply by (1 + w) (norm_offset); the DeltaNet's gated
norm by w.

The published checkpoints also hold multi-token-prediction weights (`mtp.*`): a speculative-decoding head that
transformers ignores too; they are left unread. Attention biases (`attention_bias`) are refused: the gate's
share of q_proj's bias would need a bias on the gate, which the shared decoder's gate does not have."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tritonformer.backend.models import gated_deltanet
from tritonformer.backend.models.gated_deltanet import DeltaNetSpec
from tritonformer.backend.models.moe import MoeSpec, moe_layers, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

LAYER_KINDS = {"linear_attention": "gated_deltanet", "full_attention": None}


@dataclass(frozen=True)
class HybridSpec(DecoderSpec):
    """DecoderSpec plus the DeltaNet layers' sizes."""

    deltanet: DeltaNetSpec | None = None

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A DeltaNet layer's checkpoint tensors by name (client/model_shapes.tensor_shapes: a random-weight model
        at a published shape)."""
        return gated_deltanet.tensor_shapes(self.deltanet, prefix + "linear_attn.", self.hidden_size)

    def split_mixers(self, tp) -> None:
        gated_deltanet.split(self.deltanet, tp)


def layer_kinds(cfg: dict) -> tuple[str | None, ...]:
    """Per layer its mixer kind ("gated_deltanet") or None (full attention): `layer_types`, else every
    `full_attention_interval`-th layer (counting from 1) full attention, the others linear."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if not types:
        every = cfg.get("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
    if len(types) != layers or not set(types) <= set(LAYER_KINDS):
        raise ValueError(f"layer_types must list 'linear_attention' / 'full_attention' for each of {layers} layers "
                         f"(supported: layer_types of {', '.join(LAYER_KINDS)})")
    return tuple(LAYER_KINDS[t] for t in types)


def hybrid_spec(cfg: dict, family: str, grouped_in_proj: bool, **options) -> HybridSpec:
    """The options Qwen3-Next and Qwen3.5 share: (1 + w) norms, gated attention with q / k norms over a partial
    rotary (a quarter of each head where the config does not say), the DeltaNet layers."""
    if cfg.get("attention_bias"):
        raise ValueError(f"{family} with attention_bias is not supported (supported: attention_bias false)")
    if cfg.get("use_sliding_window"):
        raise ValueError(f"{family} with use_sliding_window is not supported (supported: use_sliding_window false)")
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if "partial_rotary_factor" not in params and "partial_rotary_factor" not in cfg:
        cfg = {**cfg, "partial_rotary_factor": 0.25}  # (transformers' default for these configs)
    spec = spec_from_hf({"head_dim": 256, **cfg}, norm_offset=1.0, qk_norm=True, attn_output_gate=True,
                        mixers=layer_kinds(cfg), **options)
    return HybridSpec(**{f.name: getattr(spec, f.name) for f in fields(DecoderSpec)},
                      deltanet=gated_deltanet.spec_from_hf(cfg, grouped_in_proj))


def from_hf(cfg: dict) -> HybridSpec:
    experts = num_experts(cfg, 512)
    moe = None
    if experts:  # Qwen2-MoE's experts: softmax top k (renormalised where norm_topk_prob), a gated shared expert
        moe = MoeSpec(num_experts=experts, top_k=cfg.get("num_experts_per_tok", 10),
                      intermediate_size=cfg.get("moe_intermediate_size", 512),
                      normalize=bool(cfg.get("norm_topk_prob", True)), round_weights=True,
                      layers=moe_layers({**cfg, "num_experts": experts}),
                      shared_intermediate_size=cfg.get("shared_expert_intermediate_size", 512))
    return hybrid_spec(cfg, "Qwen3-Next", grouped_in_proj=True, moe=moe)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    return cfg, gate_split(cfg, state)


def gate_split(cfg: dict, state: dict) -> dict:
    """The checkpoint's tensors with each full-attention layer's q_proj `[heads * 2D, hidden]` (per head its D
    query rows, then its D gate rows) as q_proj `[heads * D, hidden]` and the gate's `self_attn.gate_proj`
    (attn_output_gate's weight), lazily where the checkpoint is read lazily."""
    heads = cfg.get("num_attention_heads", 16)
    head_dim = cfg.get("head_dim") or 256
    out = dict(state)
    for name, t in state.items():
        if (not name.endswith("self_attn.q_proj.weight") or name.startswith("mtp.")  # (unread: see above)
                or tuple(t.shape)[0] != 2 * heads * head_dim):  # (or already split)
            continue
        query, gate = (_HalfOfEachHead(t, heads, which) for which in (0, 1))
        out[name], out[name.replace("q_proj", "gate_proj")] = ((part.read() if isinstance(t, torch.Tensor) else part)
                                                               for part in (query, gate))
    return out


class _HalfOfEachHead:
    """Rows `[heads * 2D, hidden]` seen as each head's first (`which` 0) or second (1) D rows `[heads * D, hidden]`:
    read whole, then indexed (a tensor-parallel rank's rows)."""

    def __init__(self, stored, heads: int, which: int):
        self.stored, self.heads, self.which = stored, heads, which
        rows, hidden = tuple(stored.shape)
        self.shape, self.dtype = (rows // 2, hidden), getattr(stored, "dtype", None)

    def read(self) -> torch.Tensor:
        t = self.stored if isinstance(self.stored, torch.Tensor) else self.stored.to("cpu")
        return t.reshape(self.heads, 2, -1, t.shape[-1])[:, self.which].reshape(self.shape)

    def __getitem__(self, index) -> torch.Tensor:
        return self.read()[index]

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.read().to(*args, **kwargs)


class HybridDecoder(TransformerDecoder):
    """The shared decoder with gated DeltaNet layers where the spec's mixers say."""

    def load_mixer(self, i: int, prefix: str, weight, read):
        if self.config.mixer(i) != "gated_deltanet":
            return super().load_mixer(i, prefix, weight, read)
        return gated_deltanet.load_gated_deltanet(self.config.deltanet, prefix + "linear_attn.", weight,
                                                  self.config.hidden_size, self.tp)


MODEL = HybridDecoder
