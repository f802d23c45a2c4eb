"""Kimi Delta Attention (KDA: Moonshot's Kimi Linear, 2025): the linear attention of Kimi Linear's `linear_attention`
layers, a recurrent token mixer (mixers.py has the contract). Gated DeltaNet (gated_deltanet.py) with its decay
per key channel instead of per head.

Per token t and head h the layer keeps a matrix S `[head_dim (keys), head_dim (values)]` (fp32) and updates it by
the gated delta rule, each key channel c decayed by its own a_t[c] = exp(g_t[c]):

    S' = diag(e^(g_t)) S;   u_t = beta_t (v_t - S'^T k_t);   S_t = S' + k_t u_t^T;   o_t = S_t^T q_t

q_t and k_t are L2-normalised (x / sqrt(sum x^2 + 1e-6); q also times head_dim ** -0.5), beta_t = sigmoid(b_proj x)
and g_t = -exp(A_log[h]) * softplus(f_t + dt_bias) <= 0 per channel, f_t = f_b_proj(f_a_proj x) (a low-rank
projection, head_dim wide in the middle; dt_bias one per channel). q, k and v come from their own projections
(q_proj, k_proj, v_proj, each num_heads * head_dim) through depthwise causal convolutions (`short_conv_kernel_size`
taps, no bias) and SiLU. The output per head is RMS-normalised and gated, norm(o) * w * sigmoid(gate) in fp32
(gate = g_b_proj(g_a_proj x), low-rank as f), then o_proj. A sequence's state is the convolutions' last inputs
`[3 num_heads head_dim, kernel - 1]` and S for every head `[num_heads, head_dim, head_dim]`.

Decode rows take one step of the rule, batched over sequences (states gathered by slot and scattered back, no host
sync: a captured CUDA graph replays it; kernels.kda_decode). A prompt chunk runs in the chunked (WY) form, 64 tokens
at a time from the state its slot holds, in fp32, one op that reads and writes the slot (kernels.kda_chunk, whose
reference states the form). Within a chunk, with G_t = sum_(j <= t) g_j (a vector over key channels, cumulative from
the chunk's start) and S0 the state before it, unrolling the rule gives

    (I + L) U = diag(beta) V - diag(beta) (K * e^G) S0,   L_ts = beta_t sum_c k_t[c] k_s[c] e^(G_t[c] - G_s[c])  (s < t)
    o_t = (q_t * e^(G_t))^T S0 + sum_(s <= t) (sum_c q_t[c] k_s[c] e^(G_t[c] - G_s[c])) u_s
    S_C = diag(e^(G_C)) S0 + sum_s diag(e^(G_C - G_s)) k_s u_s^T

(* per channel). Every exponent is <= 0 (the differences are taken before the exp, masked above the diagonal), so
nothing overflows; only the pass from chunk to chunk is sequential. Transformers' torch fallback
(chunk_kimi_delta_attention, written from FLA's chunk_kda) runs the same chunked form in fp32; its decode
(recurrent_kimi_delta_attention) the plain rule in fp32, as here.

Where dtypes differ from fp32 they follow Hugging Face's: the projections, the convolutions' output and beta (the
sigmoid) in the model's dtype, g from fp32 logits (f in the model's dtype plus dt_bias, A_log as the model's dtype
holds them), the rule in fp32, its output rounded to the model's dtype before the gated norm, which computes in fp32
(its weight not rounded) and rounds once.

Refused by name: a convolution of fewer than 2 taps, an activation other than SiLU (the convolution's is the
config's hidden_act, as transformers reads it).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tritonformer import kernels
from tritonformer.kernels import reference
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.models.mixers import HeadShare, causal_conv1d

CONVS = ("q_conv1d", "k_conv1d", "v_conv1d")  # the published checkpoints' convolutions, one per projection


@dataclass(frozen=True)
class KdaSpec:
    """A KDA layer's sizes (Kimi Linear's `linear_attn_config`): heads of head_dim keys and as many values.
    Ling 3.0's (bailing_hybrid.py) options: `full_rank_gates`, the forget gate's logits and the output gate each
    one `[dim, hidden]` projection (f_proj, g_proj) instead of two low-rank ones; `lower_bound`, the bounded log
    decay g = lower_bound * sigmoid(exp(A_log) (f + dt_bias)) in place of -exp(A_log) softplus(f + dt_bias);
    `round_decay`, g rounded to the model's dtype before the rule (kernels.kda_decode's options)."""

    num_heads: int
    head_dim: int
    conv_kernel: int
    norm_eps: float
    full_rank_gates: bool = False
    lower_bound: float | None = None
    round_decay: bool = False

    def __post_init__(self):
        if self.conv_kernel < 2:
            raise ValueError(f"unsupported short_conv_kernel_size {self.conv_kernel} (supported: "
                             f"short_conv_kernel_size 2 or more)")

    @property
    def dim(self) -> int:  # q, k and v each
        return self.num_heads * self.head_dim


class KimiDeltaAttention:
    """One layer's KDA (the mixer contract: mixers.py). Its input projections are stored as one
    `[3 dim + 2 head_dim + num_heads, hidden]` matrix, rows [q; k; v; f_a; g_a; b]: one GEMM for all six
    (full_rank_gates: `[5 dim + num_heads, hidden]`, rows [q; k; v; f; g; b], f_b and g_b None)."""

    def __init__(self, spec: KdaSpec, in_proj: torch.Tensor, conv: torch.Tensor, f_b: torch.Tensor,
                 g_b: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor, norm: torch.Tensor,
                 out_proj: torch.Tensor):
        self.spec = spec
        self.in_proj, self.conv, self.f_b, self.g_b, self.norm, self.out_proj = in_proj, conv, f_b, g_b, norm, out_proj
        self.dt_bias = dt_bias.float().contiguous()  # (added to fp32 logits as Hugging Face adds its parameter)
        self.neg_a = -a_log.float().reshape(spec.num_heads).exp()  # -exp(A_log): each head's rate
        self.state_shapes = {"conv": (3 * spec.dim, spec.conv_kernel - 1),
                             "recurrent": (spec.num_heads, spec.head_dim, spec.head_dim)}

    def __call__(self, x: torch.Tensor, pre, batch: DecoderBatch, state: dict[str, torch.Tensor]) -> torch.Tensor:
        s = self.spec
        if pre is not None:
            x = kernels.prenormed(x, pre)
        rows, c, d_head = x.shape[0], 3 * s.dim, s.head_dim
        proj = kernels.linear_act(x, self.in_proj)
        mixed = causal_conv1d(proj[:, :c], self.conv, None, batch, state["conv"], "silu")
        if s.full_rank_gates:  # (the gates' logits straight from the one GEMM)
            f, gate, b = proj[:, c : c + s.dim], proj[:, c + s.dim : c + 2 * s.dim], proj[:, c + 2 * s.dim :]
        else:
            f = kernels.linear_act(proj[:, c : c + d_head].contiguous(), self.f_b)  # the forget gate's logits [T, dim]
            gate = kernels.linear_act(proj[:, c + d_head : c + 2 * d_head].contiguous(), self.g_b)  # [T, dim]
            b = proj[:, c + 2 * d_head :]
        out = torch.empty(rows, s.num_heads, d_head, dtype=x.dtype, device=x.device)
        held, d = state["recurrent"], batch.num_decode
        if d:  # one step for every decoding sequence, its state read and written at its slot: one kernel
            out[:d] = kernels.kda_decode(mixed[:d], f[:d], b[:d], self.neg_a, self.dt_bias, held, batch.state_slots[:d],
                                         s.lower_bound, s.round_decay)
        if batch.prefill_lens:  # each prompt chunk from its sequence's state, in the chunked form: one op each
            q, k, v, g, beta = reference.kda_inputs(mixed[d:], f[d:], b[d:], self.neg_a, self.dt_bias, s.lower_bound,
                                                    s.round_decay)
            row = 0
            for j, n in enumerate(batch.prefill_lens):  # (the op reads and writes the slot, rows in the model's dtype)
                part = slice(row, row + n)
                kernels.kda_chunk(q[part], k[part], v[part], g[part], beta[part], held,
                                  batch.state_slots[d + j : d + j + 1], out[d + row : d + row + n])
                row += n
        return kernels.linear_act(kernels.kda_gated_norm(out, gate, self.norm, s.norm_eps).reshape(rows, s.dim),
                                  self.out_proj)


def tensor_shapes(spec: KdaSpec, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    """A layer's checkpoint tensors under `prefix` (`layers.{i}.self_attn.`) by name, as the published checkpoints
    name them (transformers' own names in memory: kimi_linear.adapt)."""
    s = spec
    dim, hd, k = s.dim, s.head_dim, s.conv_kernel
    shapes = {prefix + name + ".weight": (dim, hidden) for name in ("q_proj", "k_proj", "v_proj")}
    shapes.update({prefix + name + ".weight": (dim, 1, k) for name in CONVS})
    shapes.update({prefix + "f_a_proj.weight": (hd, hidden), prefix + "f_b_proj.weight": (dim, hd),
                   prefix + "dt_bias": (dim,), prefix + "A_log": (1, 1, s.num_heads, 1),
                   prefix + "b_proj.weight": (s.num_heads, hidden), prefix + "g_a_proj.weight": (hd, hidden),
                   prefix + "g_b_proj.weight": (dim, hd), prefix + "o_norm.weight": (hd,),
                   prefix + "o_proj.weight": (hidden, dim)})
    return shapes


def split(spec: KdaSpec, tp) -> tuple[KdaSpec, HeadShare]:
    """This rank's layer sizes under tensor parallelism `tp` (or None) and its share of the heads."""
    heads = HeadShare.of(tp, spec.num_heads, "KDA heads (linear_attn_config num_heads)")
    return replace(spec, num_heads=heads.count), heads


def load_kda(spec: KdaSpec, prefix: str, weight, hidden: int, tp=None) -> KimiDeltaAttention:
    """A layer's KDA from its tensors under `prefix` (`layers.{i}.self_attn.`, the published names: tensor_shapes);
    `weight(name, *shape, rows=, cols=)` reads one (or its rows / columns) in the model's dtype
    (TransformerDecoder.load_mixer's). With `tp`, this rank's heads: their rows of q, k, v, b and of the gates'
    second projections, their convolutions, decays and output-projection columns; the gates' low-rank first
    projections and the norm whole."""
    p = prefix
    local, heads = split(spec, tp)
    dim, hd, n = spec.dim, spec.head_dim, spec.num_heads
    own = heads.rows(hd)
    in_proj = torch.cat([weight(p + "q_proj.weight", dim, hidden, rows=own),
                         weight(p + "k_proj.weight", dim, hidden, rows=own),
                         weight(p + "v_proj.weight", dim, hidden, rows=own), weight(p + "f_a_proj.weight", hd, hidden),
                         weight(p + "g_a_proj.weight", hd, hidden),
                         weight(p + "b_proj.weight", n, hidden, rows=heads.rows(1))])
    conv = torch.cat([weight(p + name + ".weight", dim, 1, spec.conv_kernel, rows=own) for name in CONVS])
    return KimiDeltaAttention(local, in_proj.contiguous(), conv.view(3 * local.dim, -1).contiguous(),
                              weight(p + "f_b_proj.weight", dim, hd, rows=own),
                              weight(p + "g_b_proj.weight", dim, hd, rows=own), weight(p + "dt_bias", dim, rows=own),
                              weight(p + "A_log", 1, 1, n, 1)[:, :, heads.heads], weight(p + "o_norm.weight", hd),
                              weight(p + "o_proj.weight", hidden, dim, cols=own))
