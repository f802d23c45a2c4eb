"""ModernBERT decoder (`modernbert-decoder`: the Ettin decoders, jhu-clsp/ettin-decoder-17m .. 1b): ModernBERT's
encoder layers run causally, as a generator.

- The token embeddings go through a LayerNorm (`embeddings.norm`) whose output is the residual stream; the first
  layer has no norm before its attention (it reads that output as it is), every later layer a LayerNorm
  (`attn_norm`), every layer one before its MLP (`mlp_norm`), one at the end (`final_norm`). The LayerNorms have no
  biases unless `norm_bias` (then every one has).
- Attention: as many KV heads as query heads (head_dim = hidden / heads), q / k / v and the output projection (`Wo`)
  with biases where `attention_bias` is set, scale head_dim ** -0.5. Layers are global (`full_attention`) or local
  (`sliding_attention`) by `layer_types`, else by `global_attn_every_n_layers` n (default 3: layer i is global where
  i % n == 0). A local layer's query at p sees keys p - W + 1 .. p, W = local_attention // 2 (transformers' own
  halving: ModernBERT's window is centred, the decoder's looks back only). Each kind has its rotary base:
  rope_parameters keyed by layer type, else `global_rope_theta` (160,000) / `local_rope_theta` (10,000), a
  `rope_scaling` applying to both.
- MLP: GeGLU: `Wi` makes [a | g] (2 x intermediate_size), act(a) * g through `Wo`; the activation is
  `hidden_activation` (gelu: the exact erf GELU), biases where `mlp_bias` is set.
- Head: final_norm, then the prediction head: dense (hidden x hidden, a bias where `classifier_bias`), its
  `classifier_activation`, a LayerNorm (`lm_head.norm`), then the vocabulary projection `decoder` (tied to the token
  embeddings unless tie_word_embeddings is false) with a bias where `decoder_bias` (default true).

On the shared decoder: LayerNorms, the gated MLP with the exact GELU, per-layer windows and a local rotary table,
the first layer without its attention norm (attn_norm_layers); this file adds the embedding norm (whole on every
tensor-parallel rank) and the prediction head before the (vocabulary-parallel) projection (whole on every rank).
Refused by name: hidden_activation / classifier_activation other than the GELUs and silu listed in the errors,
layer_types other than full_attention / sliding_attention, a local layer with local_attention under 2."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tritonformer import kernels
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames, spec_from_hf

NAMES = WeightNames(q="attn.q_proj", k="attn.k_proj", v="attn.v_proj", o="attn.Wo", gate_up="mlp.Wi", down="mlp.Wo",
                    attn_norm="attn_norm", mlp_norm="mlp_norm", embed="embeddings.tok_embeddings.weight",
                    final_norm="final_norm.weight", lm_head="decoder.weight")
EMBED_NORM, HEAD_DENSE, HEAD_NORM = "embeddings.norm", "lm_head.dense", "lm_head.norm"
# transformers' defaults where a config.json leaves a key out
DEFAULTS = {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
            "num_attention_heads": 12, "max_position_embeddings": 8192, "norm_eps": 1e-5, "tie_word_embeddings": True,
            "bos_token_id": 50281, "eos_token_id": 50282}
MLP_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}  # hidden_activation -> spec's
HEAD_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}  # classifier_activation -> linear_act's


@dataclass(frozen=True)
class ModernBertDecoderSpec(DecoderSpec):
    """The shared decoder's spec plus the prediction head's activation and whether its dense has a bias."""

    head_activation: str = "gelu"
    head_dense_bias: bool = False

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The tensors beside the shared decoder's (client/model_shapes.tensor_shapes)."""
        hidden = (self.hidden_size,)
        shapes = {EMBED_NORM + ".weight": hidden, HEAD_DENSE + ".weight": (self.hidden_size,) * 2,
                  HEAD_NORM + ".weight": hidden}
        if self.head_dense_bias:
            shapes[HEAD_DENSE + ".bias"] = hidden
        if self.norm_bias:
            shapes.update({EMBED_NORM + ".bias": hidden, HEAD_NORM + ".bias": hidden})
        return shapes


def _ropes(cfg: dict, max_positions: int) -> tuple[Rope, Rope]:
    """(the global layers' rope, the local layers'), as transformers' config reads them."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    else:  # (an older config: one rope_scaling for both kinds)
        full = local = cfg.get("rope_scaling") or params
    return (Rope.from_hf(full, cfg.get("global_rope_theta", 160_000.0), max_positions),
            Rope.from_hf(local, cfg.get("local_rope_theta", 10_000.0), max_positions))


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    act, head_act = cfg.get("hidden_activation", "gelu"), cfg.get("classifier_activation", "gelu")
    if act not in MLP_ACTIVATIONS:
        raise ValueError(f"unsupported ModernBERT decoder hidden_activation {act!r} "
                         f"(supported: hidden_activation {', '.join(MLP_ACTIVATIONS)})")
    if head_act not in HEAD_ACTIVATIONS:
        raise ValueError(f"unsupported ModernBERT decoder classifier_activation {head_act!r} "
                         f"(supported: classifier_activation {', '.join(HEAD_ACTIVATIONS)})")
    layers, heads, hidden = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"]
    if hidden % heads:
        raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    types = cfg.get("layer_types")
    if not types:
        every = cfg.get("global_attn_every_n_layers", 3)
        types = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(layers)]
    if len(types) != layers or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"ModernBERT decoder layer_types {types!r} for {layers} layers are not supported "
                         f"(supported: layer_types of full_attention / sliding_attention, one a layer)")
    local_attention = cfg.get("local_attention", 128)
    if "sliding_attention" in types and not (local_attention and local_attention >= 2):
        raise ValueError(f"ModernBERT decoder sliding layers with local_attention {local_attention!r} are not "
                         f"supported (supported: local_attention of 2 tokens or more; the window is half of it)")
    max_positions = cfg["max_position_embeddings"]
    rope, local_rope = _ropes(cfg, max_positions)
    norm_bias, attention_bias = bool(cfg.get("norm_bias", False)), bool(cfg.get("attention_bias", False))
    spec = spec_from_hf(
        {**cfg, "head_dim": hidden // heads, "num_key_value_heads": heads, "rope_parameters": None,
         "rope_scaling": None},
        tie_default=True, norm_eps=cfg["norm_eps"], layer_norm=True, norm_bias=norm_bias,
        activation=MLP_ACTIVATIONS[act], qkv_bias=attention_bias, o_bias=attention_bias,
        head_bias=bool(cfg.get("decoder_bias", True)), rope=rope, local_rope=None if local_rope == rope else local_rope,
        layer_windows=tuple(local_attention // 2 if t == "sliding_attention" else None for t in types),
        attn_norm_layers=(False,) + (True,) * (layers - 1), names=NAMES)
    return ModernBertDecoderSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)},
                                 head_activation=HEAD_ACTIVATIONS[head_act],
                                 head_dense_bias=bool(cfg.get("classifier_bias", False)))


class ModernBertDecoder(TransformerDecoder):
    """The shared decoder with ModernBERT's embedding LayerNorm and its prediction head before the output projection."""

    def __init__(self, config: ModernBertDecoderSpec, state: dict, device: torch.device, dtype: torch.dtype, tp=None):
        super().__init__(config, state, device, dtype, tp=tp)
        hidden = (config.hidden_size,)

        def read(name: str, shape: tuple[int, ...], present: bool = True) -> torch.Tensor | None:
            return self.weight(self.checked(state, name, shape, f"hidden {config.hidden_size}")) if present else None

        self.embed_norm = read(EMBED_NORM + ".weight", hidden)
        self.embed_norm_b = read(EMBED_NORM + ".bias", hidden, config.norm_bias)
        self.head_dense = read(HEAD_DENSE + ".weight", hidden * 2)
        self.head_dense_b = read(HEAD_DENSE + ".bias", hidden, config.head_dense_bias)
        self.head_norm = read(HEAD_NORM + ".weight", hidden)
        self.head_norm_b = read(HEAD_NORM + ".bias", hidden, config.norm_bias)

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The token embeddings, LayerNorm'd: the residual stream, and the first layer's attention input."""
        return self._norm(super()._embed(ids, positions), self.embed_norm, bias=self.embed_norm_b)[0]

    def logits(self, x: torch.Tensor, fp32: bool = True) -> torch.Tensor:
        """The prediction head (dense, its activation, a LayerNorm) on the final norm's rows, then the projection."""
        h = kernels.linear_act(x, self.head_dense, self.head_dense_b, self.config.head_activation)
        return super().logits(self._norm(h, self.head_norm, bias=self.head_norm_b)[0], fp32)


MODEL = ModernBertDecoder
