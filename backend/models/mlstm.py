"""The mLSTM token mixer (Beck et al., "xLSTM", 2024; NX-AI's xLSTM-7b: xlstm.py): a recurrent layer with a matrix
memory, run where the spec's `mixers[i]` is "mlstm" (mixers.py has the contract).

Per token t and head h the layer keeps a matrix memory C `[qk_head_dim, v_head_dim]`, a normaliser n `[qk_head_dim]`
and a stabiliser m (a scalar: the log of the scale C and n are kept divided by), all fp32. With the input gate's
logit i_t and the forget gate's f_t (each one per head, soft-capped: cap * tanh(x / cap)), and log f = logsigmoid(f_t):

    m_t = max(log f + m_(t-1), i_t);   f' = exp(log f + m_(t-1) - m_t);   i' = exp(i_t - m_t)
    C_t = f' C_(t-1) + i' k_t v_t^T;   n_t = f' n_(t-1) + i' k_t
    h_t = (q_t C_t) / (max(|q_t . n_t|, exp(-m_t)) + eps),   q_t scaled by qk_head_dim ** -0.5

(the exponential input gate is kept finite by m, which cancels in the ratio up to the max and eps). The output per
head is LayerNorm'd (mean subtracted, no bias, fp32, rounded to the model's dtype, times the weight `[v_dim]`), gated
by sigmoid(o_t) and projected back (out_proj). A sequence's state is C, n and m per head.

Decode rows take one step of the rule, batched over sequences (`kernels.mlstm_decode`: each state updated in place
at its slot, no host sync, a captured CUDA graph replays it). A prompt chunk runs as Hugging Face's inference path runs a forward call:
its whole `chunk_size` blocks in the chunkwise form from the slot's state, the rest as one shorter block (Hugging
Face steps through the rest: the same rule, rounded otherwise). Within a block of
L tokens, with b_t = sum_(j <= t) log f_j (from the block's start), g = b_L and the state (C0, n0, m0) before it:

    log D_ts = b_t - b_s + i_s (s <= t);   m_t = max(b_t + m0, max_s log D_ts)
    h_t = (e^(b_t + m0 - m_t) q_t C0 + sum_s (q_t . k_s) e^(log D_ts - m_t) v_s) / (max(|den_t|, e^(-m_t)) + eps)
    (den_t the same sums with n0 and 1 for C0 and v_s), and after the block, with a_s = g - b_s + i_s:
    m' = max(g + m0, max_s a_s);   C' = e^(g + m0 - m') C0 + sum_s e^(a_s - m') k_s v_s^T   (n' likewise)

Every exponent is <= 0 by the choice of m, so nothing overflows; only the pass from block to block is sequential.

The decode step is a kernel of its own; the prompts' chunkwise form runs in PyTorch ops (on the GPU too), the
projections through the shared linears. Dtypes where they differ from fp32: the projections, the soft-capped gates and o in the model's dtype; the
step and the chunkwise form in fp32 (Hugging Face's step reads C and n rounded to the model's dtype for h, as here;
its chunkwise form computes in the model's dtype where its states are not fp32, here in fp32: the same in fp32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch

KIND = "mlstm"  # the mixer kind a family's spec names (DecoderSpec.mixers)


@dataclass(frozen=True)
class MlstmSpec:
    """A model's mLSTM layers' sizes and options (the same in every layer). `fused`: the checkpoint stores q, k, v
    and o as one projection and the two gates as another (xLSTM's weight_mode "fused")."""

    num_heads: int
    qk_dim: int
    v_dim: int
    gate_soft_cap: float | None
    eps: float  # the rule's (h's denominator)
    norm_eps: float  # the per-head LayerNorm's
    chunk_size: int
    fused: bool = False

    def __post_init__(self):
        if self.qk_dim % self.num_heads or self.v_dim % self.num_heads:
            raise ValueError(f"mLSTM q/k width {self.qk_dim} and value width {self.v_dim} must divide into "
                             f"num_heads {self.num_heads}")
        if self.chunk_size < 1:
            raise ValueError(f"unsupported chunk_size {self.chunk_size} (supported: chunk_size 1 or more)")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_dim // self.num_heads

    @property
    def v_head_dim(self) -> int:
        return self.v_dim // self.num_heads


def tensor_shapes(spec: MlstmSpec, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    """A layer's checkpoint tensors under `prefix` (`layers.{i}.mlstm_layer.`), as transformers names them."""
    s, heads = spec, spec.num_heads
    if s.fused:
        shapes = {"qkv_opreact.weight": (2 * s.qk_dim + 2 * s.v_dim, hidden),
                  "ifgate_preact.weight": (2 * heads, hidden), "ifgate_preact.bias": (2 * heads,)}
    else:
        shapes = {"q.weight": (s.qk_dim, hidden), "k.weight": (s.qk_dim, hidden), "v.weight": (s.v_dim, hidden),
                  "ogate_preact.weight": (s.v_dim, hidden), "igate_preact.weight": (heads, hidden),
                  "igate_preact.bias": (heads,), "fgate_preact.weight": (heads, hidden), "fgate_preact.bias": (heads,)}
    shapes.update({"multihead_norm.weight": (s.v_dim,), "out_proj.weight": (hidden, s.v_dim)})
    return {prefix + name: shape for name, shape in shapes.items()}


class MlstmMixer:
    """One layer's mLSTM. Its input projections are one `[2 qk_dim + 2 v_dim + 2 heads, hidden]` matrix, rows
    [q; k; v; o; i; f], with a bias that is zero but on the gates' rows: one GEMM for all six."""

    def __init__(self, spec: MlstmSpec, prefix: str, hidden: int, weight, tp=None):
        """Layer weights under `prefix` ("layers.{i}.mlstm_layer."), read by `weight(name, *shape)` (the decoder's:
        checked, on the device in the model's dtype). Not split under tensor parallelism (xlstm.py refuses it)."""
        if tp is not None:
            raise ValueError("tensor parallelism is not supported for mLSTM layers")
        s, p, heads = spec, prefix, spec.num_heads
        self.spec = s
        if s.fused:
            self.in_w = torch.cat([weight(p + "qkv_opreact.weight", 2 * s.qk_dim + 2 * s.v_dim, hidden),
                                   weight(p + "ifgate_preact.weight", 2 * heads, hidden)])
            gate_b = weight(p + "ifgate_preact.bias", 2 * heads)
        else:
            self.in_w = torch.cat([weight(p + name + ".weight", rows, hidden) for name, rows in (
                ("q", s.qk_dim), ("k", s.qk_dim), ("v", s.v_dim), ("ogate_preact", s.v_dim), ("igate_preact", heads),
                ("fgate_preact", heads))])
            gate_b = torch.cat([weight(p + "igate_preact.bias", heads), weight(p + "fgate_preact.bias", heads)])
        self.in_b = torch.cat([gate_b.new_zeros(2 * s.qk_dim + 2 * s.v_dim), gate_b])
        self.norm_w = weight(p + "multihead_norm.weight", s.v_dim)
        self.out_w = weight(p + "out_proj.weight", hidden, s.v_dim)
        self.state_shapes = {"C": (heads, s.qk_head_dim, s.v_head_dim), "n": (heads, s.qk_head_dim),
                             "m": (heads, 1)}

    def __call__(self, x: torch.Tensor, pre, batch: DecoderBatch, state: dict[str, torch.Tensor]) -> torch.Tensor:
        s = self.spec
        if batch.state_slots is None:
            raise ValueError("a recurrent layer needs its sequences' state slots (DecoderBatch.state_slots)")
        rows, heads, dk, dv = x.shape[0], s.num_heads, s.qk_head_dim, s.v_head_dim
        proj = kernels.linear_act(x, self.in_w, self.in_b, prenorm=pre)  # (the layer's norm in its prologue)
        q, k, v, o, i, f = proj.split([s.qk_dim, s.qk_dim, s.v_dim, s.v_dim, heads, heads], dim=-1)
        if s.gate_soft_cap is not None:  # (in the model's dtype, as the logits come)
            i, f = (s.gate_soft_cap * torch.tanh(g / s.gate_soft_cap) for g in (i, f))
        q, k, v = q.reshape(rows, heads, dk), k.reshape(rows, heads, dk), v.reshape(rows, heads, dv)
        h = torch.empty(rows, heads, dv, dtype=x.dtype, device=x.device)
        d, slots = batch.num_decode, batch.state_slots
        if d:  # one step of every decoding sequence, its state updated in place at its slot: no host sync
            h[:d] = kernels.mlstm_decode(q[:d], k[:d], v[:d], i[:d], f[:d], state["C"], state["n"], state["m"],
                                         slots[:d], s.eps)
        row = d
        for j, n in enumerate(batch.prefill_lens):  # each prompt chunk from its slot's state, written back
            at = slots[d + j : d + j + 1]
            held = (state["C"][at], state["n"][at], state["m"][at])
            part = slice(row, row + n)
            h[part], (c1, n1, m1) = mlstm_sequence(q[part], k[part], v[part], i[part], f[part], *held, s.eps,
                                                   s.chunk_size)
            state["C"][at], state["n"][at], state["m"][at] = c1, n1, m1
            row += n
        # each head's LayerNorm (fp32, no bias), rounded, times the weight; gated by sigmoid(o); projected back
        hf = h.float()
        normed = (hf - hf.mean(-1, keepdim=True)) * torch.rsqrt(hf.var(-1, keepdim=True, unbiased=False) + s.norm_eps)
        out = normed.to(x.dtype).reshape(rows, s.v_dim) * self.norm_w
        return kernels.linear_act(torch.sigmoid(o) * out, self.out_w)


def mlstm_sequence(q, k, v, i, f, c0, n0, m0, eps: float, chunk_size: int):
    """One sequence's T tokens from its state (as kernels.mlstm_decode's for one row: q, k, v `[T, H, d]`, i, f
    `[T, H]`; C, n, m `[1, ...]`): its first whole `chunk_size` blocks in the chunkwise form, the rest as one
    shorter block of the same form (Hugging Face steps through the rest one token at a time: the same rule,
    rounded otherwise; step by step a 63-token rest was 63 x ~20 small launches a layer). Returns (h `[T, H,
    dv]`, (C, n, m) after them)."""
    t = q.shape[0]
    whole = t // chunk_size * chunk_size
    outs = []
    state = (c0, n0, m0)
    if whole:
        h, state = _chunkwise(q[:whole], k[:whole], v[:whole], i[:whole], f[:whole], *state, eps, chunk_size)
        outs.append(h)
    if t > whole:
        h, state = _chunkwise(q[whole:], k[whole:], v[whole:], i[whole:], f[whole:], *state, eps, t - whole)
        outs.append(h)
    return torch.cat(outs), state


def _chunkwise(q, k, v, i, f, c0, n0, m0, eps: float, size: int):
    """The chunkwise form (the module's docstring) over T = nc * size tokens, in fp32: the states at each block's
    start in one pass over the blocks, then every block's outputs at once."""
    dtype = q.dtype
    t, heads, dk = q.shape
    nc = t // size
    # [H, nc, L, d] and [H, nc, L]
    q, k, v = (x.float().permute(1, 0, 2).reshape(heads, nc, size, -1) for x in (q, k, v))
    i, f = (x.float().t().reshape(heads, nc, size) for x in (i, f))
    b = F.logsigmoid(f).cumsum(-1)  # log decay from the block's start through each token
    g = b[..., -1]  # [H, nc]: the whole block's
    a = g[..., None] - b + i  # [H, nc, L]: each token's log weight in the block's final state
    a_max = a.max(-1).values
    c, n, m = c0[0], n0[0], m0[0, :, 0]  # [H, dk, dv], [H, dk], [H]
    starts_c, starts_n, starts_m = [], [], []
    for blk in range(nc):
        starts_c.append(c)
        starts_n.append(n)
        starts_m.append(m)
        m_next = torch.max(g[:, blk] + m, a_max[:, blk])
        kw = k[:, blk] * torch.exp(a[:, blk] - m_next[:, None])[..., None]  # [H, L, dk]
        decay = torch.exp(g[:, blk] + m - m_next)[:, None]
        c = decay[..., None] * c + kw.transpose(-2, -1) @ v[:, blk]
        n = decay * n + kw.sum(-2)
        m = m_next
    c_s, n_s, m_s = torch.stack(starts_c, 1), torch.stack(starts_n, 1), torch.stack(starts_m, 1)  # [H, nc, ...]
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    log_d = torch.where(causal, b[..., :, None] - b[..., None, :], -float("inf")) + i[..., None, :]  # [H, nc, L, L]
    m_inter = b + m_s[..., None]  # [H, nc, L]
    m_t = torch.maximum(m_inter, log_d.max(-1).values)[..., None]  # [H, nc, L, 1]
    scale = dk ** -0.5
    weights = (q @ k.transpose(-2, -1)) * scale * torch.exp(log_d - m_t)
    q_inter = q * torch.exp(m_inter[..., None] - m_t) * scale
    num = q_inter @ c_s + weights @ v
    den = q_inter @ n_s[..., None] + weights.sum(-1, keepdim=True)
    h = num / (torch.maximum(den.abs(), torch.exp(-m_t)) + eps)  # [H, nc, L, dv]
    h = h.reshape(heads, t, -1).permute(1, 0, 2).to(dtype)
    return h, (c[None], n[None], m[None, :, None])
