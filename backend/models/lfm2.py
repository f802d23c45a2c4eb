"""LFM2 (`lfm2`: Liquid AI's LFM2-350M / 700M / 1.2B / 2.6B): a hybrid of attention layers and gated short
convolutions, each layer one or the other (`layer_types` "full_attention" / "conv"; older configs list the
attending layers as `full_attn_idxs`; with neither every layer attends, as transformers reads it).

A conv layer replaces attention with a token mixer of its own (`conv.*`): the normalised rows x go through
in_proj to three rows of the hidden width, B, C and v; B * v runs through a depthwise causal convolution over
time (`conv_L_cache` taps per channel, a bias where `conv_bias`), its output gated by C, then out_proj:

    out = W_out (C * conv(B * v))

A sequence carries the convolution's last `conv_L_cache - 1` inputs from one token to the next: a recurrent
state of `hidden x (L - 1)` floats per conv layer (decoder/state_cache.py), continued by mixers.causal_conv1d.
`conv_bias` puts biases on in_proj and out_proj too (transformers' `bias=conv_bias` on all three).

The rest is Llama's pre-norm block under its own names: `operator_norm` before the mixer or attention,
`ffn_norm` before the SwiGLU MLP (`feed_forward.w1` gate, `w3` up, `w2` down), RMSNorms applied as w * x;
attention with per-head RMSNorms on q and k before the rotary (`q_layernorm` / `k_layernorm`), its output
projection `out_proj`; the final norm is `embedding_norm` (applied after the last layer, whatever its name
says); the head tied to the embeddings (`tie_embedding`, transformers' `tie_word_embeddings`).

The MLP's width is computed as transformers does: from `block_ff_dim` (or `intermediate_size`), where
`block_auto_adjust_ff_dim` two thirds of it (rounded down), times `block_ffn_dim_multiplier` (rounded down),
rounded up to a multiple of `block_multiple_of`: LFM2-1.2B's 12,288 is 8,192 wide.

Refused by name: layer kinds other than those two, a convolution of fewer than 2 taps, and the published
configs' `use_pos_enc` / `block_use_swiglu` set false (transformers does not read them: it always rotates
and always gates; a checkpoint that says otherwise was not trained as transformers would run it)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.models.mixers import HeadShare, causal_conv1d, merged
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames, spec_from_hf
from tritonformer.backend.parallel.group import adds_biases

SHORT_CONV = "short_conv"  # the mixer kind (DecoderSpec.mixers) of a conv layer
NAMES = WeightNames(o="self_attn.out_proj", q_norm="self_attn.q_layernorm", k_norm="self_attn.k_layernorm",
                    gate="feed_forward.w1", up="feed_forward.w3", down="feed_forward.w2", attn_norm="operator_norm",
                    mlp_norm="ffn_norm", final_norm="embedding_norm.weight")
LAYER_KINDS = {"full_attention": None, "conv": SHORT_CONV}


@dataclass(frozen=True)
class Lfm2Spec(DecoderSpec):
    """The shared decoder's spec plus the short convolution's options."""

    conv_kernel: int = 3  # conv_L_cache: taps per channel (the state holds the last conv_kernel - 1 inputs)
    conv_bias: bool = False  # biases on in_proj, the convolution and out_proj

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A conv layer's checkpoint tensors by name (client/model_shapes.tensor_shapes: a random-weight
        model at a published shape)."""
        h, p = self.hidden_size, prefix + "conv."
        shapes = {p + "in_proj.weight": (3 * h, h), p + "conv.weight": (h, 1, self.conv_kernel),
                  p + "out_proj.weight": (h, h)}
        if self.conv_bias:
            shapes.update({p + "in_proj.bias": (3 * h,), p + "conv.bias": (h,), p + "out_proj.bias": (h,)})
        return shapes

    def split_mixers(self, tp) -> None:
        HeadShare.of(tp, self.hidden_size, "LFM2 conv channels (hidden_size)")


def layer_mixers(cfg: dict, family: str, full_attn_default: bool = True) -> tuple[str | None, ...]:
    """Per layer None (attention) or SHORT_CONV, from `layer_types`, else `full_attn_idxs`, else (where
    `full_attn_default`, as transformers' Lfm2Config does) every layer attending."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        attending = cfg.get("full_attn_idxs")
        if attending is None:
            if not full_attn_default:
                raise ValueError(f"{family} without layer_types is not supported (supported: layer_types, or "
                                 f"full_attn_idxs, naming the layers that attend)")
            attending = range(layers)
        attending = set(attending)
        types = ["full_attention" if i in attending else "conv" for i in range(layers)]
    if len(types) != layers or not set(types) <= set(LAYER_KINDS):
        raise ValueError(f"unsupported {family} layer_types {types!r} (supported: layer_types 'full_attention' or "
                         f"'conv' for each of the {layers} layers)")
    return tuple(LAYER_KINDS[t] for t in types)


def mlp_width(cfg: dict) -> int:
    """The dense MLP's columns as transformers' Lfm2MLP sizes them (see the module docstring)."""
    width = cfg.get("block_ff_dim", cfg.get("intermediate_size", 12288))
    if cfg.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = cfg.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            multiple = cfg.get("block_multiple_of", 256)
            width = int(multiplier * width)
            width = multiple * ((width + multiple - 1) // multiple)
    return width


def lfm2_spec(cfg: dict, family: str, intermediate_size: int, mixers: tuple[str | None, ...],
              names: WeightNames = NAMES, **options) -> Lfm2Spec:
    """What LFM2, LFM2-MoE and LFM3 share: names (LFM3's its own), norms, q / k norms, the tied head, the
    convolution's options."""
    for key in ("use_pos_enc", "block_use_swiglu"):
        if cfg.get(key, True) is False:
            raise ValueError(f"{family} with {key} false is not supported (supported: {key} true, which is what "
                             f"transformers runs whatever the config says)")
    kernel = cfg.get("conv_L_cache", 3)
    if kernel < 2:
        raise ValueError(f"{family} conv_L_cache {kernel} is not supported (supported: conv_L_cache 2 or more)")
    tie = cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True))
    spec = spec_from_hf({**cfg, "intermediate_size": intermediate_size, "tie_word_embeddings": tie},
                        default_theta=1e6, norm_eps=cfg.get("norm_eps", 1e-5), qk_norm=True, mixers=mixers,
                        names=names, **options)
    return Lfm2Spec(**{f.name: getattr(spec, f.name) for f in fields(DecoderSpec)}, conv_kernel=kernel,
                    conv_bias=bool(cfg.get("conv_bias", False)))


def from_hf(cfg: dict) -> Lfm2Spec:
    return lfm2_spec(cfg, "LFM2", mlp_width(cfg), layer_mixers(cfg, "LFM2"))


@dataclass
class ShortConv:
    """A conv layer's token mixer (mixers.py's contract): in_proj to B, C, v; C * conv(B * v); out_proj. The
    convolution's taps and bias are kept in fp32 (the checkpoint's values: exact), so its fp32 sum reads them
    with no conversion per call."""

    in_w: torch.Tensor  # [3H, H]: B's rows, C's, v's
    in_b: torch.Tensor | None  # [3H]
    conv_w: torch.Tensor  # [H, L] fp32
    conv_b: torch.Tensor | None  # [H] fp32
    out_w: torch.Tensor  # [H, H]
    out_b: torch.Tensor | None  # [H]

    @property
    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"conv": (self.conv_w.shape[0], self.conv_w.shape[1] - 1)}

    def __call__(self, x: torch.Tensor, pre: kernels.PreNorm | None, batch: DecoderBatch,
                 state: dict[str, torch.Tensor]) -> torch.Tensor:
        if batch.state_slots is None:  # (a batch built without slots, e.g. whole prompts into a scratch cache)
            raise ValueError("LFM2's conv layers need each sequence's state slot (DecoderBatch.state_slots)")
        h = self.conv_w.shape[0]
        bcv = kernels.linear_act(x, self.in_w, self.in_b, prenorm=pre)  # (the prenorm applied once, here)
        b, c, v = bcv[:, :h], bcv[:, h : 2 * h], bcv[:, 2 * h :]
        conv = causal_conv1d(b * v, self.conv_w, self.conv_b, batch, state["conv"])
        return kernels.linear_act(c * conv, self.out_w, self.out_b)


class Lfm2Decoder(TransformerDecoder):
    """The shared decoder with LFM2's conv layers as recurrent mixers."""

    def load_mixer(self, i: int, prefix: str, weight, read) -> ShortConv:
        c = self.config
        if c.mixer(i) != SHORT_CONV:
            return super().load_mixer(i, prefix, weight, read)
        h, p = c.hidden_size, prefix + "conv."
        # (tensor parallelism: this rank's channels of B, C and v, of the taps, and its columns of out_proj,
        # whose bias rank 0 adds)
        channels = HeadShare.of(self.tp, h, "LFM2 conv channels (hidden_size)")
        own, in_rows = channels.rows(1), merged([channels.rows(1, offset) for offset in (0, h, 2 * h)])

        def bias(name: str, size: int, rows: slice | list[slice] | None) -> torch.Tensor | None:
            return weight(p + name + ".bias", size, rows=rows) if c.conv_bias else None

        conv_b = bias("conv", h, own)
        return ShortConv(in_w=weight(p + "in_proj.weight", 3 * h, h, rows=in_rows),
                         in_b=bias("in_proj", 3 * h, in_rows),
                         conv_w=weight(p + "conv.weight", h, 1, c.conv_kernel, rows=own)[:, 0].float(),
                         conv_b=conv_b.float() if conv_b is not None else None,
                         out_w=weight(p + "out_proj.weight", h, h, cols=own),
                         out_b=bias("out_proj", h, None) if adds_biases(self.tp) else None)


MODEL = Lfm2Decoder
