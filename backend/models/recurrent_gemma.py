"""RecurrentGemma (`recurrent_gemma`: Google's RecurrentGemma-2B / -9B, the Griffin architecture): a hybrid whose
layers take turns by `block_types` (repeated over the layers; published: recurrent, recurrent, attention) between
an RG-LRU recurrent block and local multi-query attention, each followed by a gated MLP.

Every layer is Gemma's pre-norm residual block: x + temporal(norm(x)), then that plus mlp(norm(.)), the norms
RMSNorms applied as (1 + w) in fp32 (`temporal_pre_norm`, `channel_pre_norm`, `final_norm`). The token embeddings
are scaled by sqrt(hidden) rounded to bf16 (transformers' `normalizer` buffer is bf16 whatever the model's dtype:
50.5 for 2,560), the head is tied, and the logits are soft-capped: cap tanh(logits / cap) (`logits_soft_cap`). The
MLP (`mlp_block`) is GeGLU with tanh GELU, biases on all three projections, intermediate_size / 2 columns wide.

Attention (`temporal_block.q_proj` ..): `num_key_value_heads` KV heads (one in the published models), heads of
hidden / heads (transformers ignores a config's head_dim), queries scaled by head_dim^-1/2, a sliding window of
`attention_window_size` tokens, a rotary of base `rope_theta` over the first `partial_rotary_factor` (0.5 where a
config says nothing) of each head's dims in halves (rotate_half), q / k / v biases where `attention_bias`, and a bias
on o_proj always.

The recurrent block (`temporal_block.*`, W = `lru_width` channels, H = num_attention_heads heads of B = W / H): with
x the normalised rows,

    y = gelu_tanh(linear_y(x))                                     the gate branch
    u = conv_1d(linear_x(x))                                       depthwise causal conv of `conv1d_width` taps, bias
    i = sigmoid(u_h W_i[h] + b_i[h]),  r = sigmoid(u_h W_a[h] + b_a[h])   per head h, block-diagonal gate weights
    log a = -8 r softplus(c),  a = exp(log a)                       (c: rg_lru.recurrent_param, [W])
    v = u i sqrt(1 - a^2)                                           (at position 0: v = u i and a = 0: the reset)
    h_t = a h_{t-1} + v                                             per channel, fp32
    out = linear_out(h y)

A sequence carries the convolution's last conv1d_width - 1 inputs and h: `W (conv1d_width - 1) + W` fp32 values
per recurrent layer (decoder/state_cache.py). As transformers rounds in the model's dtype: every step before h
(each op's result rounded), h rounded before the product with y; h itself fp32. The convolution's sum is fp32,
rounded once (mixers.causal_conv1d), as transformers' prompt path (one Conv1d) rounds it; its one-token step rounds
each tap's product and the bias add in the model's dtype, which in bf16 may land a step apart. A decode step is one
kernel (kernels.rglru_decode), a prompt chunk a prefix scan in PyTorch from its slot's state (linear_scan).
`final_w_init_variance_scale` and `w_init_variance_scale` are initialisation only.

Tensor parallelism: the recurrent layers split by RG-LRU heads, each a block of W / H channels (the gates are
block-diagonal per head, the convolution and the recurrence per channel): each rank holds its heads' rows of
linear_y, linear_x, the taps, the gates and the rate, its columns of linear_out (one all-reduce after it, its bias
added by rank 0) and its channels' state; attention and the MLP split as the shared decoder's. Its KV heads must
divide by the ranks as the shared decoder's: the published checkpoints' single KV head does not (refused at load,
saying so), so only a checkpoint with as many KV heads as ranks (or a multiple) splits today.

Refused by name: block types other than recurrent / attention, `hidden_activation` other than tanh GELU, a rope
type other than default, lru_width not a multiple of the heads, a convolution of fewer than 2 taps and
`embeddings_scale_by_sqrt_dim` false (transformers always scales)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.models.mixers import HeadShare, causal_conv1d
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, rope_parameters,
                                                     spec_from_hf)
from tritonformer.backend.parallel.group import adds_biases

KIND = "rg_lru"  # the mixer kind (DecoderSpec.mixers) of a recurrent layer
NAMES = WeightNames(q="temporal_block.q_proj", k="temporal_block.k_proj", v="temporal_block.v_proj",
                    o="temporal_block.o_proj", gate="mlp_block.gate_proj", up="mlp_block.up_proj",
                    down="mlp_block.down_proj", attn_norm="temporal_pre_norm", mlp_norm="channel_pre_norm",
                    final_norm="final_norm.weight")
BLOCK_KINDS = {"recurrent": KIND, "attention": None}
# Without a max_position_embeddings (transformers' config has none: local attention and a fixed-size state), the
# longest sequence: the length RecurrentGemma was trained at (8,192). It only sizes the rotary tables and the
# scheduler's block tables; max_model_len caps it lower.
DEFAULT_MAX_POSITIONS = 8192


@dataclass(frozen=True)
class RecurrentGemmaSpec(DecoderSpec):
    """The shared decoder's spec plus the recurrent blocks' sizes."""

    lru_width: int = 0
    conv_width: int = 4

    def split_mixers(self, tp) -> None:
        """The RG-LRU splits by its heads (blocks of lru_width / heads channels): they must divide by the ranks."""
        HeadShare.of(tp, self.num_heads, "RG-LRU heads (num_attention_heads)")

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A recurrent layer's checkpoint tensors by name (client/model_shapes.tensor_shapes)."""
        h, w, p = self.hidden_size, self.lru_width, prefix + "temporal_block."
        heads, block = self.num_heads, self.lru_width // self.num_heads
        shapes = {p + "linear_y.weight": (w, h), p + "linear_y.bias": (w,), p + "linear_x.weight": (w, h),
                  p + "linear_x.bias": (w,), p + "linear_out.weight": (h, w), p + "linear_out.bias": (h,),
                  p + "conv_1d.weight": (w, 1, self.conv_width), p + "conv_1d.bias": (w,),
                  p + "rg_lru.recurrent_param": (w,)}
        for gate in ("input_gate", "recurrent_gate"):
            shapes.update({f"{p}rg_lru.{gate}_weight": (heads, block, block), f"{p}rg_lru.{gate}_bias": (heads, block)})
        return shapes


def embed_scale(hidden: int) -> float:
    """sqrt(hidden) as transformers applies it: a bf16 buffer."""
    return float(torch.tensor(hidden ** 0.5, dtype=torch.bfloat16))


def from_hf(cfg: dict) -> RecurrentGemmaSpec:
    layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    types = list(cfg.get("block_types") or ("recurrent", "recurrent", "attention"))
    if not types or not set(types) <= set(BLOCK_KINDS):
        raise ValueError(f"unsupported RecurrentGemma block_types {types!r} (supported: block_types of "
                         f"'recurrent' and 'attention')")
    act = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported RecurrentGemma hidden_activation {act!r} (supported: hidden_activation "
                         f"gelu_pytorch_tanh)")
    if cfg.get("embeddings_scale_by_sqrt_dim", True) is False:
        raise ValueError("RecurrentGemma with embeddings_scale_by_sqrt_dim false is not supported (supported: "
                         "embeddings_scale_by_sqrt_dim true, which transformers runs whatever the config says)")
    rope = dict(rope_parameters(cfg) or {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"unsupported RecurrentGemma rope_type {rope.get('rope_type', rope.get('type'))!r} "
                         f"(supported: rope_type default)")
    width = cfg.get("lru_width") or cfg["hidden_size"]
    if width % heads:
        raise ValueError(f"RecurrentGemma lru_width {width} is not a multiple of num_attention_heads {heads} "
                         f"(supported: lru_width split evenly into the RG-LRU's heads)")
    conv = cfg.get("conv1d_width", 4)
    if conv < 2:
        raise ValueError(f"RecurrentGemma conv1d_width {conv} is not supported (supported: conv1d_width 2 or more)")
    kinds = tuple(BLOCK_KINDS[types[i % len(types)]] for i in range(layers))
    window = cfg.get("attention_window_size", 2048)
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5))
    longest = cfg.get("max_position_embeddings") or DEFAULT_MAX_POSITIONS
    plain = {**cfg, "head_dim": cfg["hidden_size"] // heads, "max_position_embeddings": longest,
             "rope_scaling": None, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": partial,
                                                      "rope_theta": rope.get("rope_theta",
                                                                             cfg.get("rope_theta", 10000.0))},
             "intermediate_size": cfg["intermediate_size"] // 2, "mlp_bias": True}
    plain.pop("rope_theta", None)
    spec = spec_from_hf(plain, tie_default=True, norm_offset=1.0, activation="gelu_tanh", names=NAMES,
                        embed_scale=embed_scale(cfg["hidden_size"]), final_softcap=cfg.get("logits_soft_cap", 30.0),
                        qkv_bias=bool(cfg.get("attention_bias", False)), o_bias=True, mixers=kinds,
                        layer_windows=tuple(None if kind else window for kind in kinds))
    return RecurrentGemmaSpec(**{f.name: getattr(spec, f.name) for f in fields(DecoderSpec)}, lru_width=width,
                              conv_width=conv)


def rglru_inputs(u: torch.Tensor, mixer: "RgLru", positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The RG-LRU's decay a and normalised input v `[T, W]` fp32 for convolved rows u (a prompt chunk's), rounded
    where transformers rounds in the model's dtype (as reference.rglru_decode); a = 0 and no normalisation at
    position 0."""
    dtype = u.dtype
    rows, width = u.shape
    heads, block = mixer.gate_i_w.shape[:2]

    def r(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).float()

    uf = u.float()
    uh = uf.view(rows, heads, block)
    gi = r(torch.sigmoid(r(torch.einsum("thi,hij->thj", uh, mixer.gate_i_w.float()) + mixer.gate_i_b.float())))
    ga = r(torch.sigmoid(r(torch.einsum("thi,hij->thj", uh, mixer.gate_a_w.float()) + mixer.gate_a_b.float())))
    log_a = r(-8.0 * ga.reshape(rows, width) * mixer.rate.float())
    a = r(torch.exp(log_a))
    multiplier = r(torch.sqrt(r(1.0 - r(torch.exp(2.0 * log_a)))))
    reset = (positions == 0)[:, None]
    multiplier = torch.where(reset, torch.ones_like(multiplier), multiplier)
    return torch.where(reset, torch.zeros_like(a), a), r(r(uf * gi.reshape(rows, width)) * multiplier)


def linear_scan(a: torch.Tensor, v: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """h_t = a_t h_{t-1} + v_t from h0 `[W]` over `[L, W]` (fp32): Hillis and Steele's prefix scan, the pairs
    (a, v) composing associatively ((a1, v1) then (a2, v2) = (a1 a2, a2 v1 + v2)) in log2(L) whole-tensor steps.
    Returns every h `[L, W]`."""
    v = v.clone()
    v[0] += a[0] * h0
    step = 1
    while step < a.shape[0]:
        v_next, a_next = v.clone(), a.clone()
        v_next[step:] += a[step:] * v[:-step]
        a_next[step:] *= a[:-step]
        v, a, step = v_next, a_next, 2 * step
    return v


@dataclass
class RgLru:
    """A recurrent layer's token mixer (mixers.py's contract): the gate branch, the convolution, the RG-LRU and
    linear_out. The convolution's taps and bias are kept in fp32 (exact), the rate softplus(c) in the model's dtype
    (as transformers computes it)."""

    y_w: torch.Tensor  # [W, H]
    y_b: torch.Tensor
    x_w: torch.Tensor  # [W, H]
    x_b: torch.Tensor
    conv_w: torch.Tensor  # [W, K] fp32
    conv_b: torch.Tensor  # [W] fp32
    gate_i_w: torch.Tensor  # [heads, B, B]
    gate_i_b: torch.Tensor  # [heads, B]
    gate_a_w: torch.Tensor
    gate_a_b: torch.Tensor
    rate: torch.Tensor  # [W]: softplus(recurrent_param)
    out_w: torch.Tensor  # [H, W]
    out_b: torch.Tensor | None  # (None on ranks other than 0: rank 0 adds it)

    @property
    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"conv": (self.conv_w.shape[0], self.conv_w.shape[1] - 1), "rnn": (self.conv_w.shape[0],)}

    def __call__(self, x: torch.Tensor, pre, batch: DecoderBatch, state: dict[str, torch.Tensor]) -> torch.Tensor:
        if batch.state_slots is None:
            raise ValueError("RecurrentGemma's recurrent layers need each sequence's state slot "
                             "(DecoderBatch.state_slots)")
        if pre is not None:  # (the norm once, read by both branches)
            x = kernels.prenormed(x, pre)
        y = kernels.linear_act(x, self.y_w, self.y_b, "gelu_tanh")
        u = causal_conv1d(kernels.linear_act(x, self.x_w, self.x_b), self.conv_w, self.conv_b, batch, state["conv"])
        d, rnn, slots = batch.num_decode, state["rnn"], batch.state_slots
        gates = (self.gate_i_w, self.gate_i_b, self.gate_a_w, self.gate_a_b, self.rate)
        if d and d == u.shape[0]:  # decode rows only (a decode graph's step): one kernel
            out = kernels.rglru_decode(u, y, *gates, rnn, slots[:d], batch.positions[:d])
            return kernels.linear_act(out, self.out_w, self.out_b)
        out = torch.empty_like(u)
        if d:
            out[:d] = kernels.rglru_decode(u[:d], y[:d], *gates, rnn, slots[:d], batch.positions[:d])
        row = d
        for j, n in enumerate(batch.prefill_lens):  # each prompt chunk: a prefix scan from its slot's state
            part, slot = slice(row, row + n), slots[d + j : d + j + 1]
            a, v = rglru_inputs(u[part], self, batch.positions[part])
            h = linear_scan(a, v, rnn.index_select(0, slot)[0])
            rnn.index_copy_(0, slot, h[-1:])
            out[part] = (h.to(u.dtype).float() * y[part].float()).to(u.dtype)
            row += n
        return kernels.linear_act(out, self.out_w, self.out_b)


class RecurrentGemmaDecoder(TransformerDecoder):
    """The shared decoder with RecurrentGemma's recurrent layers as RgLru mixers."""

    def load_mixer(self, i: int, prefix: str, weight, read) -> RgLru:
        c = self.config
        if c.mixer(i) != KIND:
            return super().load_mixer(i, prefix, weight, read)
        h, w, p = c.hidden_size, c.lru_width, prefix + "temporal_block."
        heads, block = c.num_heads, c.lru_width // c.num_heads
        # (tensor parallelism: this rank's RG-LRU heads, each a block of channels: its rows of linear_y, linear_x,
        # the taps, the gates and the rate, its columns of linear_out, whose bias rank 0 adds)
        share = HeadShare.of(self.tp, heads, "RG-LRU heads (num_attention_heads)")
        own, gates = (None, None) if share.whole else (share.rows(block), share.heads)
        param = weight(p + "rg_lru.recurrent_param", w, rows=own)
        return RgLru(y_w=weight(p + "linear_y.weight", w, h, rows=own), y_b=weight(p + "linear_y.bias", w, rows=own),
                     x_w=weight(p + "linear_x.weight", w, h, rows=own), x_b=weight(p + "linear_x.bias", w, rows=own),
                     conv_w=weight(p + "conv_1d.weight", w, 1, c.conv_width, rows=own)[:, 0].float().contiguous(),
                     conv_b=weight(p + "conv_1d.bias", w, rows=own).float(),
                     gate_i_w=weight(p + "rg_lru.input_gate_weight", heads, block, block, rows=gates),
                     gate_i_b=weight(p + "rg_lru.input_gate_bias", heads, block, rows=gates),
                     gate_a_w=weight(p + "rg_lru.recurrent_gate_weight", heads, block, block, rows=gates),
                     gate_a_b=weight(p + "rg_lru.recurrent_gate_bias", heads, block, rows=gates),
                     rate=torch.nn.functional.softplus(param).contiguous(),
                     out_w=weight(p + "linear_out.weight", h, w, cols=own),
                     out_b=weight(p + "linear_out.bias", h) if adds_biases(self.tp) else None)


MODEL = RecurrentGemmaDecoder
