"""Gated DeltaNet (Yang, Kautz and Hatamizadeh, 2024): the linear attention of Qwen3-Next's, Qwen3.5's and OLMo
hybrid's `linear_attention` layers, a recurrent token mixer (mixers.py has the contract).

Per token t and value head h the layer keeps a matrix S `[head_k_dim, head_v_dim]` (fp32) and updates it by the
gated delta rule: decay it by a_t = exp(g_t), read what it predicts for the key, and write back the error times
beta_t:

    S' = a_t S;   u_t = beta_t (v_t - S'^T k_t);   S_t = S' + k_t u_t^T;   o_t = S_t^T q_t

q_t and k_t are L2-normalised (q also times head_k_dim ** -0.5), g_t = -exp(A_log) * softplus(a_t + dt_bias) <= 0
and beta_t = sigmoid(b_t) (times `beta_scale`: OLMo hybrid's 2 where `linear_allow_neg_eigval`, beta in [0, 2]).
q, k and v come from one projection through a depthwise causal convolution (kernel 4) and SiLU; each key head
serves num_v_heads / num_k_heads consecutive value heads. The output per value head is RMS-normalised and gated,
norm(o) * w * silu(z) (z a projection of its own; OLMo hybrid's `g_proj`, its norm's eps 1e-5), then projected
back to the hidden size. The projections' layouts: Qwen3-Next's grouped per key head, Qwen3.5's flat, OLMo
hybrid's one linear each (DeltaNetSpec). A sequence's state is that convolution's last inputs
`[conv_dim, kernel - 1]` and S for every value head `[num_v_heads, head_k_dim, head_v_dim]`.

Decode rows take one step of the rule, batched over sequences (states gathered by slot and scattered back, no
host sync: a captured CUDA graph replays it). A prompt chunk runs in the chunked (WY) form, 64 tokens at a time
from the state its slot holds, in fp32: within a chunk, with G_t the cumulative sum of g from the chunk's start
and S0 the state before it, unrolling the rule gives

    (I + L) U = diag(beta) V - diag(beta e^G) K S0,   L_ts = beta_t e^(G_t - G_s) k_t . k_s  (s < t)
    o_t = e^(G_t) S0^T q_t + sum_(s <= t) e^(G_t - G_s) (q_t . k_s) u_s
    S_C = e^(G_C) S0 + sum_s e^(G_C - G_s) k_s u_s^T

so each chunk is two triangular solves and a few matrix products, and only the pass from chunk to chunk is
sequential (kernels.gated_delta_chunk: on the GPU two launches a prompt chunk, the chunks' own terms all at once
and then the pass with each head's state in registers). The same mathematics as transformers'
torch_chunk_gated_delta_rule, written from it.

Where dtypes differ from fp32 they follow Hugging Face's: the projections, the convolution's output and beta
(the sigmoid) in the model's dtype, g from fp32 logits (A_log and dt_bias as the model's dtype holds them), the
rule in fp32, its output rounded to the model's dtype before the gated norm, which multiplies by its weight in
the model's dtype and by the fp32 gate.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tritonformer import kernels
from tritonformer.kernels import reference
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.models.mixers import HeadShare, causal_conv1d, merged

@dataclass(frozen=True)
class DeltaNetSpec:
    """A gated DeltaNet layer's sizes (the config's `linear_*` options). `grouped_in_proj`: Qwen3-Next's
    projections, `in_proj_qkvz` and `in_proj_ba` with rows grouped per key head ([q, k, v, z] of the head and its
    value heads, then [b, a]); `separate_proj`: OLMo hybrid's, one linear each (`q_proj`, `k_proj`, `v_proj`,
    `g_proj` for z, `b_proj`, `a_proj`) and `o_proj` / `o_norm` for `out_proj` / `norm`; else Qwen3.5's
    `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`. `beta_scale`: beta = sigmoid(b) times it. `norm_eps`:
    the gated output norm's."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    norm_eps: float
    grouped_in_proj: bool = False
    separate_proj: bool = False
    beta_scale: float = 1.0

    def __post_init__(self):
        if self.grouped_in_proj and self.separate_proj:
            raise ValueError("a gated DeltaNet's projections are grouped (grouped_in_proj) or separate, not both")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"linear_num_value_heads ({self.num_v_heads}) must be a multiple of "
                             f"linear_num_key_heads ({self.num_k_heads})")
        if self.conv_kernel < 2:
            raise ValueError(f"unsupported linear_conv_kernel_dim {self.conv_kernel} (supported: "
                             f"linear_conv_kernel_dim 2 or more)")

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:  # the convolution runs over [q; k; v]
        return 2 * self.key_dim + self.value_dim


def spec_from_hf(cfg: dict, grouped_in_proj: bool) -> DeltaNetSpec:
    """The layer's sizes from a Qwen3-Next / Qwen3.5 config (transformers' defaults where it omits them)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":  # (the convolution's activation is the config's hidden_act)
        raise ValueError(f"unsupported gated DeltaNet hidden_act {act!r} (supported: hidden_act silu)")
    return DeltaNetSpec(num_k_heads=cfg.get("linear_num_key_heads", 16),
                        num_v_heads=cfg.get("linear_num_value_heads", 32),
                        head_k_dim=cfg.get("linear_key_head_dim", 128),
                        head_v_dim=cfg.get("linear_value_head_dim", 128),
                        conv_kernel=cfg.get("linear_conv_kernel_dim", 4), norm_eps=cfg.get("rms_norm_eps", 1e-6),
                        grouped_in_proj=grouped_in_proj)


def l2_normalised(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim (FLA's and transformers' form of the q / k norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNet:
    """One layer's gated DeltaNet (the mixer contract: mixers.py). Its input projection is stored as one
    `[2 key_dim + 2 value_dim + 2 num_v_heads, hidden]` matrix, rows [q; k; v; z; b; a] with value head j's rows
    after head j - 1's (key head j // (num_v_heads / num_k_heads) serves it), whatever order the checkpoint had."""

    def __init__(self, spec: DeltaNetSpec, in_proj: torch.Tensor, conv: torch.Tensor, dt_bias: torch.Tensor,
                 a_log: torch.Tensor, norm: torch.Tensor, out_proj: torch.Tensor):
        self.spec = spec
        self.in_proj, self.conv, self.norm, self.out_proj = in_proj, conv, norm, out_proj
        self.dt_bias = dt_bias.float()  # (added to fp32 logits as Hugging Face adds its model-dtype parameter)
        self.neg_a = -a_log.float().exp()  # -exp(A_log): g's per-head rate
        self.state_shapes = {"conv": (spec.conv_dim, spec.conv_kernel - 1),
                             "recurrent": (spec.num_v_heads, spec.head_k_dim, spec.head_v_dim)}

    def __call__(self, x: torch.Tensor, pre, batch: DecoderBatch, state: dict[str, torch.Tensor]) -> torch.Tensor:
        s = self.spec
        if pre is not None:
            x = kernels.prenormed(x, pre)
        rows = x.shape[0]
        proj = kernels.linear_act(x, self.in_proj)
        c, vd, nv = s.conv_dim, s.value_dim, s.num_v_heads
        z = proj[:, c : c + vd]
        b, a = proj[:, c + vd : c + vd + nv], proj[:, c + vd + nv :]
        mixed = causal_conv1d(proj[:, :c], self.conv, None, batch, state["conv"], "silu")
        out = torch.empty(rows, nv, s.head_v_dim, dtype=x.dtype, device=x.device)
        held, d = state["recurrent"], batch.num_decode
        if d:  # one step for every decoding sequence, its state read and written at its slot: one kernel
            out[:d] = kernels.gated_delta_decode(mixed[:d], b[:d], a[:d], self.neg_a, self.dt_bias, held,
                                                 batch.state_slots[:d], s.num_k_heads, s.beta_scale)
        if batch.prefill_lens:  # each prompt chunk from its sequence's state, in the chunked form
            q, k, v, g, beta = reference.gated_delta_inputs(mixed[d:], b[d:], a[d:], self.neg_a, self.dt_bias,
                                                            s.num_k_heads, s.head_k_dim, s.beta_scale)
            row = 0
            for j, n in enumerate(batch.prefill_lens):  # (the kernel writes the rows in the model's dtype)
                part = slice(row, row + n)
                kernels.gated_delta_chunk(q[part], k[part], v[part], g[part], beta[part], held,
                                          batch.state_slots[d + j : d + j + 1], out[d + row : d + row + n])
                row += n
        return kernels.linear_act(kernels.gated_rms_norm(out, z, self.norm, s.norm_eps).reshape(rows, vd),
                                  self.out_proj)


def tensor_shapes(spec: DeltaNetSpec, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    """A layer's checkpoint tensors under `prefix` by name, as the checkpoint's layout (grouped_in_proj,
    separate_proj) has them."""
    s = spec
    kd, vd, nv = s.key_dim, s.value_dim, s.num_v_heads
    if s.grouped_in_proj:
        shapes = {prefix + "in_proj_qkvz.weight": (2 * kd + 2 * vd, hidden),
                  prefix + "in_proj_ba.weight": (2 * nv, hidden)}
    elif s.separate_proj:
        shapes = {prefix + name + ".weight": (rows, hidden) for name, rows in _separate_rows(s)}
    else:
        shapes = {prefix + "in_proj_qkv.weight": (2 * kd + vd, hidden), prefix + "in_proj_z.weight": (vd, hidden),
                  prefix + "in_proj_b.weight": (nv, hidden), prefix + "in_proj_a.weight": (nv, hidden)}
    norm, out = _output_names(s)
    return {**shapes, prefix + "conv1d.weight": (s.conv_dim, 1, s.conv_kernel), prefix + "dt_bias": (nv,),
            prefix + "A_log": (nv,), prefix + norm + ".weight": (s.head_v_dim,), prefix + out + ".weight": (hidden, vd)}


def _separate_rows(spec: DeltaNetSpec) -> list[tuple[str, int]]:
    """OLMo hybrid's input linears (separate_proj) and their rows, in the mixer's order [q; k; v; z; b; a]."""
    s = spec
    return [("q_proj", s.key_dim), ("k_proj", s.key_dim), ("v_proj", s.value_dim), ("g_proj", s.value_dim),
            ("b_proj", s.num_v_heads), ("a_proj", s.num_v_heads)]


def _output_names(spec: DeltaNetSpec) -> tuple[str, str]:
    """The gated norm's and the output projection's names."""
    return ("o_norm", "o_proj") if spec.separate_proj else ("norm", "out_proj")


def split(spec: DeltaNetSpec, tp) -> tuple[DeltaNetSpec, HeadShare, HeadShare]:
    """This rank's layer sizes under tensor parallelism `tp` (or None) and its shares of the key and the value
    heads (each key head with the value heads it serves)."""
    keys = HeadShare.of(tp, spec.num_k_heads, "gated DeltaNet key heads (linear_num_key_heads)")
    per = spec.num_v_heads // spec.num_k_heads
    values = HeadShare(slice(keys.heads.start * per, keys.heads.stop * per), spec.num_v_heads)
    return replace(spec, num_k_heads=keys.count, num_v_heads=values.count), keys, values


def load_gated_deltanet(spec: DeltaNetSpec, prefix: str, weight, hidden: int, tp=None) -> GatedDeltaNet:
    """A layer's gated DeltaNet from its tensors under `prefix` (`layers.{i}.linear_attn.`); `weight(name, *shape,
    rows=, cols=)` reads one (or its rows / columns) in the model's dtype (TransformerDecoder's). With `tp`, this
    rank's share: its key heads' q and k rows, their value heads' v, z, b and a rows, convolution channels,
    decay parameters and output-projection columns (the gated norm, per value head, whole)."""
    s = spec
    local, keys, values = split(spec, tp)
    kd, vd, nv, hk, hv = s.key_dim, s.value_dim, s.num_v_heads, s.head_k_dim, s.head_v_dim
    qkv_rows = merged([keys.rows(hk), keys.rows(hk, kd), values.rows(hv, 2 * kd)])  # (the convolution's too)
    if s.grouped_in_proj:  # Qwen3-Next: per key head [q, k, v, z] rows, then per key head [b, a]
        per = nv // s.num_k_heads
        group = 2 * hk + 2 * per * hv
        qkvz = weight(prefix + "in_proj_qkvz.weight", 2 * kd + 2 * vd, hidden, rows=keys.rows(group))
        ba = weight(prefix + "in_proj_ba.weight", 2 * nv, hidden, rows=keys.rows(2 * per))
        qkvz = qkvz.view(local.num_k_heads, group, hidden)
        parts = torch.split(qkvz, [hk, hk, per * hv, per * hv], dim=1)
        b, a = torch.split(ba.view(local.num_k_heads, 2 * per, hidden), [per, per], dim=1)
        in_proj = torch.cat([t.reshape(-1, hidden) for t in (*parts, b, a)])
    else:  # OLMo hybrid: q, k, v, g (z), b, a; Qwen3.5: [q; k; v], z, b, a
        heads = {"q_proj": keys.rows(hk), "k_proj": keys.rows(hk), "v_proj": values.rows(hv),
                 "g_proj": values.rows(hv), "b_proj": values.rows(1), "a_proj": values.rows(1)}
        names = ([(name, rows, heads[name]) for name, rows in _separate_rows(s)] if s.separate_proj else
                 [("in_proj_qkv", 2 * kd + vd, qkv_rows), ("in_proj_z", vd, values.rows(hv)),
                  ("in_proj_b", nv, values.rows(1)), ("in_proj_a", nv, values.rows(1))])
        in_proj = torch.cat([weight(prefix + name + ".weight", size, hidden, rows=part) for name, size, part in names])
    conv = weight(prefix + "conv1d.weight", s.conv_dim, 1, s.conv_kernel, rows=qkv_rows)
    norm, out = _output_names(s)
    return GatedDeltaNet(local, in_proj.contiguous(), conv.view(local.conv_dim, s.conv_kernel).contiguous(),
                         weight(prefix + "dt_bias", nv, rows=values.rows(1)),
                         weight(prefix + "A_log", nv, rows=values.rows(1)), weight(prefix + norm + ".weight", hv),
                         weight(prefix + out + ".weight", hidden, vd, cols=values.rows(hv)))
