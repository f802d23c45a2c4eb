"""Zamba (`zamba`: Zyphra's Zamba-7B-v1): Zamba2's structure (zamba2.py) over Mamba-1 layers (mamba1.py) and ONE
shared transformer block without adapters. Every layer i is a pre-norm Mamba-1 layer over the residual stream h
(its norm `input_layernorm`):

    h <- h + Mamba1(RMSNorm(h + t_i))          (t_i = 0 in a plain layer)

A hybrid layer (`layers_block_type` "hybrid") has t_i from the shared block over [h ; e] (e: the token embeddings):

    u = RMSNorm_2H([h ; e])                   (input_layernorm, 2 x hidden wide)
    a = W_o Attention(W_q u, W_k u, W_v u)    (heads of `attention_head_dim` (2 x hidden / heads unless the config
                                               names it), scores scaled by (head_dim / 2) ** -0.5, no rotary, no
                                               biases; its own KV cache layer per invocation)
    t_i = L_i W_down act(W_gate m) * W_up m   (m = RMSNorm(a), pre_ff_layernorm; L_i the layer's own `linear`)

The block's weights are the same at every invocation, read from the first hybrid layer's `shared_transf.*` (later
copies in a checkpoint are the same tensors, tied), except with `tie_word_embeddings` false: transformers ties the
copies only where it ties the head, so then each hybrid layer runs its own copy (zamba2.py's rule). The final norm is
`final_layernorm`, the head tied unless `tie_word_embeddings` is false.

The Mamba-1 mixer is mamba1.py's with `n_mamba_heads` heads (ZambaMixer): in_proj's rows interleave x and the gate
(row 2c is channel c's x, 2c + 1 its gate: reordered at load to [x ; gate]), and each head (hd = I / n_mamba_heads
consecutive channels) has an x_proj of its own over its channels, so its own dt_low (rank `mamba_dt_rank`), B and C,
and a dt_proj of its own (hd x rank):

    [dt_low_j ; B_j ; C_j] = X_j x_j        dt_j = W_dt,j dt_low_j        (x_j: head j's channels after the conv)

then the selective scan of each head's channels with its B_j / C_j (softplus(dt + bias) in fp32, no clamp, D and
the SiLU gate as Mamba-1's), the heads' outputs side by side into out_proj. The per-head projections run as one
linear each (block-diagonal weights built at load: x_proj's rows ordered [all heads' dt_low ; B_0 ; C_0 ; B_1 ; ...]
so that dt_low is one slice), the scan as one kernel launch per head over that head's channels and its slice of
the recurrent state (kernels.selective_scan_decode / selective_scan_chunk: the same kernels as Mamba-1's). With one
head this is plain Mamba-1. A hybrid layer's Mamba layer is `mamba_decoder.*` (renamed to a plain layer's names by
`adapt`). Decode rows are one batched pass per layer (the linears, the attention over the paged cache, one
selective-scan step kernel per Mamba head), no host sync.

Refused by name: n_mamba_heads that do not divide mamba_expand x hidden, layer kinds other than mamba /
linear_attention and hybrid, a hidden_act other than gelu / gelu_pytorch_tanh / gelu_new / silu, a hidden_mamba_act
other than silu, an attention_hidden_size other than 2 x hidden, tensor parallelism, and FP8 linears (hybrid models:
decoder.py)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.models import mamba1, zamba2
from tritonformer.backend.models.mamba1 import Mamba1Mixer, Mamba1Spec
from tritonformer.backend.models.mixers import causal_conv1d
from tritonformer.backend.models.transformer import spec_from_hf

BLOCK = "shared_transf."


@dataclass(frozen=True)
class ZambaSpec(zamba2.Zamba2Spec):
    """Zamba2's spec over Mamba-1 layers (`mamba1`, `mamba_heads` heads), one shared block, no adapters
    (adapter_rank 0)."""
    mamba1: Mamba1Spec | None = None
    mamba_heads: int = 1  # n_mamba_heads

    def split_mixers(self, tp) -> None:
        raise ValueError("Zamba with tensor parallelism is not supported (supported: tensor_parallel 1)")

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A layer's tensors as transformers saves them (client/model_shapes.tensor_shapes; a hybrid layer's norm,
        `mamba_decoder.input_layernorm`, listed as a plain layer's, the name adapt gives it)."""
        s, h, wide = self.mamba1, self.hidden_size, 2 * self.hidden_size
        hybrid = layer in self.hybrid_layers
        m = prefix + ("mamba_decoder.mamba." if hybrid else "mamba.")
        inner, n, r, heads = s.intermediate_size, s.state_size, s.dt_rank, self.mamba_heads
        hd = inner // heads
        shapes = {m + "in_proj.weight": (2 * inner, h), m + "conv1d.weight": (inner, 1, s.conv_kernel),
                  m + "x_proj_weight": (heads, r + 2 * n, hd), m + "dt_proj_weight": (heads, hd, r),
                  m + "dt_proj_bias": (heads, hd), m + "A_log": (heads, hd, n), m + "D": (heads, hd),
                  m + "out_proj.weight": (h, inner)}
        if s.conv_bias:
            shapes[m + "conv1d.bias"] = (inner,)
        if s.proj_bias:
            shapes.update({m + "in_proj.bias": (2 * inner,), m + "out_proj.bias": (h,)})
        if not hybrid:
            return shapes
        shapes[prefix + "linear.weight"] = (h, h)
        if layer == self.hybrid_layers[0] or not self.tied_blocks:
            b, inter = prefix + BLOCK, self.intermediate_size
            q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            shapes.update({b + "self_attn.q_proj.weight": (q, wide), b + "self_attn.k_proj.weight": (kv, wide),
                           b + "self_attn.v_proj.weight": (kv, wide), b + "self_attn.o_proj.weight": (h, q),
                           b + "feed_forward.gate_proj.weight": (inter, h),
                           b + "feed_forward.up_proj.weight": (inter, h),
                           b + "feed_forward.down_proj.weight": (h, inter),
                           b + "input_layernorm.weight": (wide,), b + "pre_ff_layernorm.weight": (h,)})
        return shapes


def from_hf(cfg: dict) -> ZambaSpec:
    heads, inner = cfg.get("n_mamba_heads", 2), int(cfg.get("mamba_expand", 2) * cfg["hidden_size"])
    if heads < 1 or inner % heads:
        raise ValueError(f"Zamba n_mamba_heads {heads} does not divide its Mamba width {inner} (supported: "
                         f"n_mamba_heads dividing mamba_expand x hidden_size)")
    if cfg.get("hidden_mamba_act", "silu") != "silu":
        raise ValueError(f"unsupported Zamba hidden_mamba_act {cfg['hidden_mamba_act']!r} (supported: "
                         f"hidden_mamba_act silu)")
    hidden = cfg["hidden_size"]
    if cfg.get("attention_hidden_size") not in (None, 2 * hidden):
        raise ValueError(f"Zamba attention_hidden_size {cfg['attention_hidden_size']} is not supported (supported: "
                         f"attention_hidden_size 2 x hidden_size, {2 * hidden})")
    layers = cfg["num_hidden_layers"]
    kinds = cfg.get("layers_block_type") or cfg.get("layer_types")
    if kinds is None:  # (transformers' default: two Mamba layers and a hybrid one, then hybrid where the i-th of the
        # rest has i % period == offset)
        period, offset = cfg.get("attn_layer_period", 6), cfg.get("attn_layer_offset", 4)
        kinds = ["mamba", "mamba", "hybrid"] + ["hybrid" if i % period == offset else "mamba"
                                                for i in range(layers - 3)]
    kinds = zamba2.layer_kinds({"num_hidden_layers": layers, "layers_block_type": kinds})
    act = cfg.get("hidden_act", "gelu")
    if act not in zamba2.ACTIVATIONS:
        raise ValueError(f"unsupported Zamba hidden_act {act!r} (supported: hidden_act "
                         f"{', '.join(zamba2.ACTIVATIONS)})")
    n_heads = cfg["num_attention_heads"]
    head_dim = cfg.get("attention_head_dim") or 2 * hidden // n_heads
    hybrid = tuple(i for i, kind in enumerate(kinds) if kind == zamba2.HYBRID)
    spec = spec_from_hf({**cfg, "head_dim": head_dim, "num_key_value_heads": cfg.get("num_key_value_heads") or n_heads},
                        tie_default=True, norm_eps=cfg.get("rms_norm_eps", 1e-5), mixers=(mamba1.KIND,) * layers,
                        mlp_layers=(False,) * layers, attn_scale=(head_dim / 2) ** -0.5, names=zamba2.NAMES)
    rank = cfg.get("mamba_dt_rank", "auto")
    mamba = Mamba1Spec(intermediate_size=int(cfg.get("mamba_expand", 2) * hidden),
                       state_size=cfg.get("mamba_d_state", 16),
                       dt_rank=-(-hidden // 16) if rank == "auto" else int(rank),
                       conv_kernel=cfg.get("mamba_d_conv", 4), conv_bias=bool(cfg.get("mamba_conv_bias", True)),
                       proj_bias=bool(cfg.get("mamba_proj_bias", False)))
    return ZambaSpec(**{f.name: getattr(spec, f.name) for f in fields(spec)}, mixer_prefix="mamba.",
                     hybrid_layers=hybrid, num_mem_blocks=1, adapter_rank=0, block_activation=zamba2.ACTIVATIONS[act],
                     tied_blocks=spec.tie_word_embeddings, mamba1=mamba, mamba_heads=heads)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """transformers' tensors under zamba2.Zamba2Decoder's and ZambaMixer's names: the hybrid layers' Mamba layer as
    a plain one's, the block under `shared_transformer.` with gate and up stacked, in_proj's interleaved rows as
    [x ; gate], the per-head x_proj / dt_proj as block-diagonal linears (x_proj's rows [every head's dt_low ; B_0 ;
    C_0 ; B_1 ; C_1 ...]), dt_proj_bias / A_log / D with the heads' channels end to end."""
    out = {}
    for name, t in state.items():
        name = name.replace(".mamba_decoder.", ".", 1).replace("." + BLOCK, "." + zamba2.BLOCK, 1)
        if ".mamba." in name:
            if name.endswith(("mamba.in_proj.weight", "mamba.in_proj.bias")):
                t = torch.cat([t[0::2], t[1::2]])
            elif name.endswith("x_proj_weight"):
                name = name.replace("x_proj_weight", "x_proj.weight")
                t = _x_proj(t, _rank(cfg, t))
            elif name.endswith("dt_proj_weight"):
                name = name.replace("dt_proj_weight", "dt_proj.weight")
                t = torch.block_diag(*t)
            elif name.endswith(("dt_proj_bias", "A_log", "mamba.D")):
                name = name.replace("dt_proj_bias", "dt_proj.bias")
                t = t.reshape(-1, *t.shape[2:])
        out[name] = t
    for name in [n for n in out if n.endswith("feed_forward.gate_proj.weight")]:
        mlp = name[: -len("gate_proj.weight")]
        out[mlp + "gate_up_proj.weight"] = torch.cat([out.pop(name), out.pop(mlp + "up_proj.weight")])
    return cfg, out


def _rank(cfg: dict, x_proj: torch.Tensor) -> int:
    """The dt rank of a per-head x_proj `[heads, rank + 2 state, hd]`."""
    return x_proj.shape[1] - 2 * cfg.get("mamba_d_state", 16)


def _x_proj(w: torch.Tensor, rank: int) -> torch.Tensor:
    """Per-head x_proj `[heads, rank + 2N, hd]` as one `[heads (rank + 2N), heads hd]` linear, block-diagonal, its
    rows every head's dt_low first, then each head's B and C."""
    heads, rows, hd = w.shape
    out = w.new_zeros(heads * rows, heads * hd)
    bc = rows - rank
    for j in range(heads):
        cols = slice(j * hd, (j + 1) * hd)
        out[j * rank : (j + 1) * rank, cols] = w[j, :rank]
        out[heads * rank + j * bc : heads * rank + (j + 1) * bc, cols] = w[j, rank:]
    return out


class ZambaMixer(Mamba1Mixer):
    """Mamba-1 with `heads` heads, each its own dt, B and C (see the module's docstring); tensors as adapt leaves
    them. No tensor parallelism."""

    def __init__(self, spec: Mamba1Spec, heads: int, prefix: str, hidden: int, weight):
        s, inner = spec, spec.intermediate_size
        self.spec, self.tp, self.heads, self.norm_w = s, None, heads, None
        self.in_w = weight(prefix + "in_proj.weight", 2 * inner, hidden)
        self.in_b = weight(prefix + "in_proj.bias", 2 * inner) if s.proj_bias else None
        self.conv_w = weight(prefix + "conv1d.weight", inner, 1, s.conv_kernel)[:, 0]
        self.conv_b = weight(prefix + "conv1d.bias", inner) if s.conv_bias else None
        self.x_w = weight(prefix + "x_proj.weight", heads * (s.dt_rank + 2 * s.state_size), inner)
        self.dt_w = weight(prefix + "dt_proj.weight", inner, heads * s.dt_rank)
        self.dt_bias = weight(prefix + "dt_proj.bias", inner).float()  # (added in fp32, as HF adds it)
        self.A = -torch.exp(weight(prefix + "A_log", inner, s.state_size).float()).contiguous()
        self.D = weight(prefix + "D", inner).float()
        self.out_w = weight(prefix + "out_proj.weight", hidden, inner)
        self.out_b = weight(prefix + "out_proj.bias", hidden) if s.proj_bias else None
        self.state_shapes = {"conv": (inner, s.conv_kernel - 1), "ssm": (inner, s.state_size)}

    def __call__(self, x: torch.Tensor, pre, batch: DecoderBatch, state: dict[str, torch.Tensor]) -> torch.Tensor:
        s, heads = self.spec, self.heads
        inner, n, low = s.intermediate_size, s.state_size, heads * s.dt_rank
        hd = inner // heads
        xz = kernels.linear_act(x, self.in_w, self.in_b, prenorm=pre)  # (the layer's norm in its prologue)
        xs, z = xz.split([inner, inner], dim=-1)
        xs = causal_conv1d(xs, self.conv_w, self.conv_b, batch, state["conv"], "silu")
        dbc = kernels.linear_act(xs, self.x_w)  # [T, heads (rank + 2N)]: every head's dt_low, then B_j, C_j
        dt = kernels.linear_act(dbc[:, :low].contiguous(), self.dt_w)  # [T, I]: dt before its bias
        d, ssm, y = batch.num_decode, state["ssm"], torch.empty_like(xs)
        for j in range(heads):  # (one launch per head: its channels, its B / C, its slice of the state)
            ch = slice(j * hd, (j + 1) * hd)
            b, c = dbc[:, low + 2 * n * j : low + 2 * n * j + n], dbc[:, low + 2 * n * j + n : low + 2 * n * (j + 1)]
            args = (self.dt_bias[ch], self.A[ch], self.D[ch], ssm[:, ch])
            if d:  # one step of every decoding sequence, its state read and written at its slot
                y[:d, ch] = kernels.selective_scan_decode(xs[:d, ch], dt[:d, ch], b[:d], c[:d], z[:d, ch], *args,
                                                          batch.state_slots[:d])
            row = d
            for k, length in enumerate(batch.prefill_lens):  # each prompt chunk from its slot's state
                part = slice(row, row + length)
                kernels.selective_scan_chunk(xs[part, ch], dt[part, ch], b[part], c[part], z[part, ch], *args,
                                             batch.state_slots[d + k : d + k + 1], y[part, ch])
                row += length
        return kernels.linear_act(y, self.out_w, self.out_b)


class ZambaDecoder(zamba2.Zamba2Decoder):
    """Zamba2's decoder whose layers run a Mamba1Mixer."""

    def __init__(self, config: ZambaSpec, state, device, dtype, tp=None):
        if tp is not None:
            config.split_mixers(tp)
        super().__init__(config, state, device, dtype)

    def load_mixer(self, i: int, prefix: str, weight, read):
        c = self.config
        if c.mixer(i) != mamba1.KIND:
            return super().load_mixer(i, prefix, weight, read)
        return ZambaMixer(c.mamba1, c.mamba_heads, prefix + c.mixer_prefix, c.hidden_size, weight)


MODEL = ZambaDecoder
