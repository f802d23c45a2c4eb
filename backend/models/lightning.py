"""Lightning attention (MiniMax-Text-01 / MiniMax-M1's `linear_attention` layers): a linear attention whose
state decays by a fixed factor per head, a recurrent token mixer (mixers.py has the contract).

Per token t and head h the layer keeps a matrix S `[head_dim (keys), head_dim (values)]` (fp32) and updates it as

    S_t = e^(-lambda_h) S_(t-1) + k_t^T v_t;   o_t = q_t S_t

with q, k, v = SiLU(qkv_proj x), each head's [q | k | v] side by side in the projection's rows (no scaling, no
normalisation of q or k). The rates are fixed, not learnt: with H the layer's heads, l its index and L the model's
layers (`num_hidden_layers`),

    lambda_h = (2^(-8 / H))^(h + 1) * (1 - l / (L - 1 + 1e-5) + 1e-5)

(ALiBi's slopes, smaller in deeper layers; computed in fp32 as transformers computes them). The heads' outputs
`[H * head_dim]` are RMS-normalised together (one norm over all heads, weight `[H * head_dim]`, eps 1e-6: transformers
builds it with its default eps, not the config's rms_norm_eps), times sigmoid(output_gate x) per element, then
out_proj.

Decode rows take one step, batched over sequences (states gathered by slot and scattered back, no host sync: a
captured CUDA graph replays it; kernels.lightning_decode, a Triton kernel). A prompt chunk runs the block form,
64 tokens at a time from the state its slot holds, in fp32 (kernels.lightning_chunk: for now the PyTorch reference's
form on every device, no Triton kernel), which unrolls the recurrence: within a block of n tokens, with S0 the
state before it,

    o_t = e^(-lambda (t + 1)) q_t S0 + sum_(s <= t) e^(-lambda (t - s)) (q_t . k_s) v_s
    S_n = e^(-lambda n) S0 + sum_s e^(-lambda (n - 1 - s)) k_s^T v_s

(every exponent <= 0). transformers computes the prompt in that form (blocks of `block_size`) and decodes by the
recurrence, in the model's dtype; here the state and its sums are fp32, the output rounded to the model's dtype
before the norm. A sequence's state is S for every head `[H, head_dim, head_dim]`.

Under tensor parallelism each rank holds its heads (`split`): their rows of qkv_proj (each head's [q | k | v]
block), of output_gate and of the norm's weight, their decay rates (the whole layer's slopes, sliced) and states,
and their columns of out_proj. The norm spans every head, so each rank's sums of squares of its outputs are summed
over the ranks first (one fp32 all-reduce, our push kernel on GPUs) and every rank normalises by the whole width's
mean square (in PyTorch ops, fp32, rounded once as kernels.rms_norm rounds).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tritonformer import kernels
from tritonformer.kernels import reference
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.models.mixers import HeadShare

NORM_EPS = 1e-6  # the output norm's (transformers' MiniMaxRMSNorm default, which its lightning layer keeps)


@dataclass(frozen=True)
class LightningSpec:
    """A lightning-attention layer's sizes: `num_heads` heads of `head_dim`, in a model of `num_layers` layers
    (the decay rates fall with depth)."""

    num_heads: int
    head_dim: int
    num_layers: int

    @property
    def dim(self) -> int:  # q, k, v and the output each
        return self.num_heads * self.head_dim

    def slopes(self, layer: int) -> torch.Tensor:
        """lambda `[H]` fp32 of layer `layer` (see the module docstring), as transformers computes it."""
        base = 1 / (2 ** (8 / self.num_heads))
        factor = 1 - layer / (self.num_layers - 1 + 1e-5) + 1e-5
        return (base ** (torch.arange(self.num_heads) + 1)).float() * factor


class LightningAttention:
    """One layer's lightning attention (the mixer contract: mixers.py). Its input projections are stored as one
    `[4 dim, hidden]` matrix, rows [qkv_proj; output_gate]: one GEMM for both."""

    def __init__(self, spec: LightningSpec, layer: int, in_proj: torch.Tensor, norm: torch.Tensor,
                 out_proj: torch.Tensor, tp=None):
        """`spec`: the whole layer's sizes; with `tp` the weights are this rank's heads' (split)."""
        local, heads = split(spec, tp)
        self.spec, self.norm_tp = local, (None if heads.whole else tp)
        self.in_proj, self.norm, self.out_proj = in_proj, norm, out_proj
        self.slope = spec.slopes(layer)[heads.heads].to(norm.device)  # lambda per head (the prompt's block form)
        self.decay = torch.exp(-self.slope)  # e^-lambda per head (a decode step's factor)
        self.state_shapes = {"recurrent": (local.num_heads, local.head_dim, local.head_dim)}

    def __call__(self, x: torch.Tensor, pre, batch: DecoderBatch, state: dict[str, torch.Tensor]) -> torch.Tensor:
        s = self.spec
        if pre is not None:
            x = kernels.prenormed(x, pre)
        rows, dim = x.shape[0], s.dim
        proj = kernels.linear_act(x, self.in_proj)
        qkv, gate = proj[:, : 3 * dim], proj[:, 3 * dim :]
        out = torch.empty(rows, s.num_heads, s.head_dim, dtype=x.dtype, device=x.device)
        held, d = state["recurrent"], batch.num_decode
        if d:  # one step for every decoding sequence, its state read and written at its slot: one kernel
            out[:d] = kernels.lightning_decode(qkv[:d], self.decay, held, batch.state_slots[:d])
        if batch.prefill_lens:  # each prompt chunk from its sequence's state, in the block form: one op each
            q, k, v = reference.lightning_inputs(qkv[d:], s.num_heads)
            row = 0
            for j, n in enumerate(batch.prefill_lens):  # (the op reads and writes the slot, rows in the model's dtype)
                part = slice(row, row + n)
                kernels.lightning_chunk(q[part], k[part], v[part], self.slope, held,
                                        batch.state_slots[d + j : d + j + 1], out[d + row : d + row + n])
                row += n
        out = out.reshape(rows, dim)
        if self.norm_tp is None:
            normed, _ = kernels.rms_norm(out, self.norm, NORM_EPS)
        else:  # the heads split over the ranks: their sums of squares summed, then the whole width's mean square
            normed = self.norm_tp.rms_norms([out], [self.norm], NORM_EPS)[0]
        return kernels.linear_act(kernels.sigmoid_mul(normed, gate), self.out_proj)


def tensor_shapes(spec: LightningSpec, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    """A layer's checkpoint tensors under `prefix` (`layers.{i}.self_attn.`) by name."""
    dim = spec.dim
    return {prefix + "qkv_proj.weight": (3 * dim, hidden), prefix + "output_gate.weight": (dim, hidden),
            prefix + "norm.weight": (dim,), prefix + "out_proj.weight": (hidden, dim)}


def split(spec: LightningSpec, tp) -> tuple[LightningSpec, HeadShare]:
    """This rank's layer sizes under tensor parallelism `tp` (or None) and its share of the heads."""
    heads = HeadShare.of(tp, spec.num_heads, "lightning attention heads (num_attention_heads)")
    return replace(spec, num_heads=heads.count), heads


def load_lightning(spec: LightningSpec, layer: int, prefix: str, weight, hidden: int, tp=None) -> LightningAttention:
    """Layer `layer`'s lightning attention from its tensors under `prefix` (`layers.{i}.self_attn.`: tensor_shapes);
    `weight(name, *shape, rows=, cols=)` reads one (or its rows / columns) in the model's dtype
    (TransformerDecoder.load_mixer's). With `tp`, this rank's heads' (the module docstring)."""
    p, dim, hd = prefix, spec.dim, spec.head_dim
    heads = split(spec, tp)[1]
    own = heads.rows(hd)
    in_proj = torch.cat([weight(p + "qkv_proj.weight", 3 * dim, hidden, rows=heads.rows(3 * hd)),
                         weight(p + "output_gate.weight", dim, hidden, rows=own)])
    return LightningAttention(spec, layer, in_proj.contiguous(), weight(p + "norm.weight", dim, rows=own),
                              weight(p + "out_proj.weight", hidden, dim, cols=own), tp)
