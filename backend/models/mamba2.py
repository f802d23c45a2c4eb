"""Mamba-2's token mixer (a state-space duality layer) for the hybrid decoders: IBM Granite 4.0-H
(granitemoehybrid.py), Bamba (bamba.py), Nemotron-H (nemotron_h.py), Falcon-H1 (falcon_h1.py, beside
attention). It runs where the spec's `mixers[i]` is "mamba2" (mixers.py has the contract).

For each token the input projection gives z (the gate, `intermediate` wide), xBC (x: `heads * head_dim`,
then B and C: `groups * state` each) and dt (one per head). xBC passes a depthwise causal convolution of
`conv_kernel` taps and SiLU (mixers.causal_conv1d, over the last `conv_kernel - 1` inputs it saw). Then per
head h, with dt = clamp(softplus(dt + dt_bias), time_step_limit), A = -exp(A_log), and B, C of the head's
group (heads / groups heads share one):

    S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T          (S: [head_dim, state], fp32)
    y_t = S_t C_t + D x_t

y is gated and normalised per group (RMSNorm over `intermediate / groups` values of y * silu(z), the
norm's weight after; Falcon-H1's variants: Mamba2Spec.norm), and the output projection maps it back to the
hidden size.

A sequence's state is its conv inputs `[conv_dim, conv_kernel - 1]` and S per head `[heads, head_dim,
state]`, both fp32. Decode rows take one recurrent step together, one kernel reading and writing each
row's state at its slot (kernels.ssd_decode: no host sync, as a captured graph needs); the gated norm is
one kernel too (kernels.mamba_gated_norm). A prompt chunk runs the same recurrence in its chunked
form (kernels.ssd_chunk), continuing from its slot's state, so chunk after chunk of one prompt continues
exactly: within a chunk of at most `chunk_size` tokens the outputs are a masked, decayed product like
attention's (C_t . B_u weighted by exp(sum of dt A over (u, t])), plus the entering state decayed to t;
the state leaving the chunk is the entering one decayed over the chunk plus each token's x B^T decayed
from its position.

Hugging Face's torch path computes the conv in the model's dtype, softplus(dt + dt_bias) in the model's
dtype and the scan in fp32 (its prefill clamps dt to time_step_limit, its one-token step does not: here
both clamp, a no-op at the default (0, inf)); the gated norm in fp32, rounded to the model's dtype before
the output projection. The same here, the conv summed in fp32 and rounded once (mixers.causal_conv1d).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.models.mixers import HeadShare, causal_conv1d, merged
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder
from tritonformer.backend.parallel.group import adds_biases

KIND = "mamba2"  # the mixer kind a family's spec names (DecoderSpec.mixers)


@dataclass(frozen=True)
class Mamba2Spec:
    """A hybrid model's Mamba-2 layers' sizes (the same in every such layer), from its config."""
    num_heads: int
    head_dim: int
    state_size: int
    num_groups: int
    intermediate_size: int  # num_heads * head_dim
    conv_kernel: int
    chunk_size: int = 256
    conv_bias: bool = True
    proj_bias: bool = False
    norm_eps: float = 1e-5
    time_step_limit: tuple[float, float] = (0.0, float("inf"))
    # How y meets the gate z: "gated" RMSNorm(y * silu(z)) per group (Granite 4.0-H, Bamba, Nemotron-H; Falcon-H1
    # with mamba_norm_before_gate false), "before_gate" RMSNorm(y) * silu(z) (Falcon-H1's default), "none" y * silu(z)
    # (Falcon-H1 without mamba_rms_norm: no norm weight)
    norm: str = "gated"
    out_bias: bool | None = None  # a bias on out_proj (None: as proj_bias; Falcon-H1's projectors_bias)

    def __post_init__(self):
        if self.num_heads * self.head_dim != self.intermediate_size:
            raise ValueError(f"Mamba-2: {self.num_heads} heads of {self.head_dim} are not its intermediate size "
                             f"{self.intermediate_size}")
        if self.num_heads % self.num_groups:
            raise ValueError(f"Mamba-2: {self.num_heads} heads are not a multiple of {self.num_groups} groups")
        if self.norm not in ("gated", "before_gate", "none"):
            raise ValueError(f"Mamba-2 norm {self.norm!r} is not supported (supported: gated, before_gate, none)")
        if self.conv_kernel < 2:
            raise ValueError(f"Mamba-2: a conv kernel of {self.conv_kernel} taps is not supported (supported: >= 2)")

    @property
    def has_out_bias(self) -> bool:
        return self.proj_bias if self.out_bias is None else self.out_bias

    @property
    def conv_dim(self) -> int:
        return self.intermediate_size + 2 * self.num_groups * self.state_size

    @property
    def proj_size(self) -> int:
        return self.intermediate_size + self.conv_dim + self.num_heads

    @classmethod
    def from_hf(cls, cfg: dict, family: str) -> "Mamba2Spec":
        """From the `mamba_*` keys Granite 4.0-H's and Bamba's configs share ("auto" head_dim:
        intermediate / heads, as transformers derives it)."""
        if cfg.get("hidden_act", "silu") != "silu":  # (transformers' Mamba-2 conv takes hidden_act too)
            raise ValueError(f"unsupported {family} hidden_act {cfg['hidden_act']!r} (supported: silu)")
        inter = int(cfg.get("mamba_expand", 2) * cfg["hidden_size"])
        heads = cfg.get("mamba_n_heads", 128)
        head_dim = cfg.get("mamba_d_head", "auto")
        head_dim = inter // heads if head_dim in (None, "auto") else head_dim
        limit = cfg.get("time_step_limit") or (0.0, float("inf"))
        return cls(num_heads=heads, head_dim=head_dim, state_size=cfg.get("mamba_d_state", 256),
                   num_groups=cfg.get("mamba_n_groups", 1), intermediate_size=inter,
                   conv_kernel=cfg.get("mamba_d_conv", 4), chunk_size=cfg.get("mamba_chunk_size") or 256,
                   conv_bias=bool(cfg.get("mamba_conv_bias", True)), proj_bias=bool(cfg.get("mamba_proj_bias", False)),
                   norm_eps=cfg.get("rms_norm_eps", 1e-5), time_step_limit=(float(limit[0]), float(limit[1])))


def tensor_shapes(spec: Mamba2Spec, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    """A Mamba-2 layer's checkpoint tensors under `prefix` (e.g. "layers.0.mamba.")."""
    s = spec
    shapes = {"in_proj.weight": (s.proj_size, hidden), "conv1d.weight": (s.conv_dim, 1, s.conv_kernel),
              "dt_bias": (s.num_heads,), "A_log": (s.num_heads,), "D": (s.num_heads,),
              "norm.weight": (s.intermediate_size,), "out_proj.weight": (hidden, s.intermediate_size)}
    if s.norm == "none":
        del shapes["norm.weight"]
    if s.conv_bias:
        shapes["conv1d.bias"] = (s.conv_dim,)
    if s.proj_bias:
        shapes["in_proj.bias"] = (s.proj_size,)
    if s.has_out_bias:
        shapes["out_proj.bias"] = (hidden,)
    return {prefix + name: shape for name, shape in shapes.items()}


def split(spec: Mamba2Spec, tp) -> tuple[Mamba2Spec, HeadShare, HeadShare]:
    """This rank's layer sizes under tensor parallelism `tp` (or None) and its shares of the heads and of the
    groups of B / C: its own groups where they divide by the ranks, else (one group) the group whole on every
    rank, its gated norm then taken over all ranks' values (Mamba2Mixer.norm_tp)."""
    heads = HeadShare.of(tp, spec.num_heads, "Mamba-2 heads (mamba_n_heads)")
    groups = HeadShare(slice(0, spec.num_groups), spec.num_groups)
    if tp is not None and spec.num_groups > 1:
        if spec.num_groups % tp.world:
            raise ValueError(f"Mamba-2's {spec.num_groups} groups of B / C do not divide by tensor_parallel_size "
                             f"{tp.world} (supported: groups that divide by it, or one group)")
        groups = HeadShare.of(tp, spec.num_groups, "Mamba-2 groups")
    return replace(spec, num_heads=heads.count, num_groups=groups.count,
                   intermediate_size=heads.count * spec.head_dim), heads, groups


class Mamba2Mixer:
    def __init__(self, spec: Mamba2Spec, prefix: str, hidden: int, weight, out_scale: float | None = None, tp=None):
        """Layer weights under `prefix` ("layers.{i}.mamba."), read by `weight(name, *shape, rows=, cols=)` (the
        decoder's: checked, on the device in the model's dtype). `out_scale` (Granite's
        residual_multiplier) is folded into the output projection, as the decoder folds it into
        attention's. With `tp`, this rank's share (split): its heads' rows of z, x and dt, its groups' of B
        and C (of the input projection and the convolution), their parameters and norm weights, their
        columns of the output projection, whose bias rank 0 adds."""
        whole = spec
        s, heads, groups = split(spec, tp)
        self.spec = s
        inter, hd, bc = whole.intermediate_size, whole.head_dim, whole.num_groups * whole.state_size
        xbc = [heads.rows(hd), groups.rows(whole.state_size, inter), groups.rows(whole.state_size, inter + bc)]
        conv_rows = merged(xbc)
        in_rows = merged([heads.rows(hd)] + [slice(r.start + inter, r.stop + inter) for r in xbc]
                         + [heads.rows(1, 2 * inter + 2 * bc)])
        self.in_w = weight(prefix + "in_proj.weight", whole.proj_size, hidden, rows=in_rows)
        self.in_b = weight(prefix + "in_proj.bias", whole.proj_size, rows=in_rows) if s.proj_bias else None
        self.conv_w = weight(prefix + "conv1d.weight", whole.conv_dim, 1, s.conv_kernel, rows=conv_rows)[:, 0]
        self.conv_b = weight(prefix + "conv1d.bias", whole.conv_dim, rows=conv_rows) if s.conv_bias else None
        one = heads.rows(1)
        self.dt_bias = weight(prefix + "dt_bias", whole.num_heads, rows=one)  # (added in the model's dtype, as HF)
        self.A = -torch.exp(weight(prefix + "A_log", whole.num_heads, rows=one).float())
        self.D = weight(prefix + "D", whole.num_heads, rows=one).float()
        self.norm_w = (weight(prefix + "norm.weight", inter, rows=heads.rows(hd)).float() if s.norm != "none"
                       else None)
        # One group split over the ranks: its norm's mean square is summed over them (its whole width's)
        self.norm_tp = tp if not heads.whole and whole.num_groups == 1 and s.norm != "none" else None
        self.norm_width = inter
        out_w = weight(prefix + "out_proj.weight", hidden, inter, cols=heads.rows(hd))
        out_b = weight(prefix + "out_proj.bias", hidden) if s.has_out_bias and adds_biases(tp) else None
        if out_scale is not None and out_scale != 1.0:
            out_w = (out_w.float() * out_scale).to(out_w.dtype)
            out_b = (out_b.float() * out_scale).to(out_b.dtype) if out_b is not None else None
        self.out_w, self.out_b = out_w, out_b
        self.state_shapes = {"conv": (s.conv_dim, s.conv_kernel - 1),
                             "ssm": (s.num_heads, s.head_dim, s.state_size)}

    def __call__(self, x: torch.Tensor, pre, batch: DecoderBatch, state: dict[str, torch.Tensor]) -> torch.Tensor:
        s = self.spec
        rows = x.shape[0]
        zxbcdt = kernels.linear_act(x, self.in_w, self.in_b, prenorm=pre)  # (the layer's norm in its prologue)
        z, xbc, dt = zxbcdt.split([s.intermediate_size, s.conv_dim, s.num_heads], dim=-1)
        xbc = causal_conv1d(xbc, self.conv_w, self.conv_b, batch, state["conv"], "silu")
        d, ssm = batch.num_decode, state["ssm"]
        if d and d == rows:  # decode rows only (a decode graph's step): the kernel's output is y, no copy
            y = kernels.ssd_decode(xbc, dt, self.dt_bias, self.A, self.D, ssm, batch.state_slots[:d], s.num_groups,
                                   s.time_step_limit)
        else:
            y = torch.empty(rows, s.num_heads, s.head_dim, dtype=torch.float32, device=x.device)
        if d and d < rows:  # one step of every decoding sequence, its state read and written at its slot: one kernel
            y[:d] = kernels.ssd_decode(xbc[:d], dt[:d], self.dt_bias, self.A, self.D, ssm, batch.state_slots[:d],
                                       s.num_groups, s.time_step_limit)
        if batch.prefill_lens:  # each prompt chunk from its sequence's state, in the chunked form
            xs, b, c = xbc[d:].split([s.intermediate_size, s.num_groups * s.state_size,
                                      s.num_groups * s.state_size], dim=-1)
            dt = F.softplus(dt[d:] + self.dt_bias).clamp(*s.time_step_limit).float()  # [T, H]
            xs = xs.float().view(-1, s.num_heads, s.head_dim)
            b = b.float().view(-1, s.num_groups, s.state_size)
            c = c.float().view(-1, s.num_groups, s.state_size)
            row = 0
            for j, n in enumerate(batch.prefill_lens):
                slot = batch.state_slots[d + j : d + j + 1]
                part = slice(row, row + n)
                out = kernels.ssd_chunk(xs[part], dt[part], self.A, b[part], c[part], ssm, slot, s.chunk_size)
                y[d + row : d + row + n] = out + self.D[:, None] * xs[part]
                row += n
        y = y.view(rows, -1)
        squares = None
        if self.norm_tp is not None:  # one group split over the ranks: their sums of squares, summed (fp32)
            squares = self.norm_tp.all_reduce(kernels.mamba_gated_squares(y, z, s.num_groups, s.norm))
        normed = kernels.mamba_gated_norm(y, z, self.norm_w, s.num_groups, s.norm_eps, s.norm, squares=squares,
                                          group_size=self.norm_width)
        return kernels.linear_act(normed, self.out_w, self.out_b)


@dataclass(frozen=True)
class HybridSpec(DecoderSpec):
    """The shared decoder's spec with the sizes of its Mamba-2 layers (those whose `mixers` kind is
    KIND)."""
    mamba: Mamba2Spec | None = None
    mixer_prefix: str = "mamba."  # where a Mamba-2 layer keeps its tensors, relative to `layers.{i}.`

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A Mamba-2 layer's checkpoint tensors by name (client/model_shapes.tensor_shapes: a random-weight
        model at a published shape)."""
        return tensor_shapes(self.mamba, prefix + self.mixer_prefix, self.hidden_size)

    def split_mixers(self, tp) -> None:
        split(self.mamba, tp)


def hybrid_spec(spec: DecoderSpec, mamba: Mamba2Spec, mixer_prefix: str = "mamba.") -> HybridSpec:
    """`spec` (a family's, built by spec_from_hf with its `mixers`) with its Mamba-2 layers' sizes."""
    if KIND not in spec.mixers:
        raise ValueError("a Mamba-2 hybrid spec names its Mamba-2 layers in `mixers`")
    return HybridSpec(**{f.name: getattr(spec, f.name) for f in fields(spec)}, mamba=mamba, mixer_prefix=mixer_prefix)


def layer_mixers(kinds: list[str], family: str) -> tuple[str | None, ...]:
    """Per layer KIND (a Mamba-2 layer) or None (attention) from a config's layer types: transformers'
    "linear_attention" / "full_attention" or the published "mamba" / "attention"."""
    mixers = []
    for i, kind in enumerate(kinds):
        if kind not in ("mamba", "linear_attention", "attention", "full_attention"):
            raise ValueError(f"{family} layer {i}'s type {kind!r} is not supported (supported: mamba / "
                             f"linear_attention, attention / full_attention)")
        mixers.append(KIND if kind in ("mamba", "linear_attention") else None)
    return tuple(mixers)


class Mamba2Decoder(TransformerDecoder):
    """The shared decoder whose KIND layers run a Mamba2Mixer (a HybridSpec's `mamba`, its tensors under
    `mixer_prefix`)."""

    def load_mixer(self, i: int, prefix: str, weight, read):
        c = self.config
        if c.mixer(i) != KIND:
            return super().load_mixer(i, prefix, weight, read)
        return Mamba2Mixer(c.mamba, prefix + c.mixer_prefix, c.hidden_size, weight, out_scale=c.residual_scale,
                           tp=self.tp)
