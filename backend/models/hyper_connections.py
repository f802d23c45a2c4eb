"""Hyper-connections: a residual stream of N (`hc_mult`) rows a token in place of one (HY-V4; DeepSeek-V4's form
differs mainly in how the streams mix, see below).

The streams S `[T, N, H]` start as N copies of the token embeddings (`expand`). A sub-layer (attention, the MLP)
reads one row mixed from them and writes its output back to every one. With f = S flattened to `[T, N H]` and
r = rsqrt(mean(f^2) + eps) (an RMSNorm without a weight, of which only the factor is used):

    m = (f @ fn^T) * r                              fn `[2N, N H]`: N "pre" logits, then N "post" logits
    pre  = sigmoid(m_pre * scale[0] + base_pre) + hc_eps
    post = magnitude * sigmoid(m_post * scale[1] + base_post) + hc_eps
    x = sum_j pre_j S_j                             (what the sub-layer's own norm reads)
    S'_j = S_j + post_j * sublayer(x)               (HyperConnection.write)

and at the end a HyperHead collapses the streams the same way with N logits of its own (no post), before the final
norm. All of it runs in fp32 whatever the activations' dtype (transformers forces fp32 here), the reads and writes
rounded once to that dtype.

DeepSeek-V4's hyper-connections add a third group of N x N logits, normalised by Sinkhorn iterations into a
matrix C that mixes the streams themselves: S'_j = sum_k C_kj S_k + post_j * sublayer(x) (its post without
hc_eps, the streams normalised before the product rather than after). `read` hands back
`Gates` with a `comb` slot for that matrix (None: the identity) and `write` takes them; `SinkhornHyperConnection`
fills it (DeepSeek-V4, below).

Plain PyTorch ops over the packed rows, no host sync (a captured decode graph replays them)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Gates:
    """One read's result: the sub-layer's input row and the gates its write uses."""

    x: torch.Tensor  # [T, H] in the streams' dtype
    post: torch.Tensor  # [T, N] fp32: each stream's share of the sub-layer's output
    comb: torch.Tensor | None = None  # [T, N, N] fp32 stream-mixing matrix (DeepSeek-V4's); None: the identity


def expand(x: torch.Tensor, streams: int) -> torch.Tensor:
    """The first streams `[T, N, H]`: N copies of the rows x `[T, H]`."""
    return x[:, None, :].expand(-1, streams, -1).contiguous()


def _mixes(s: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """(flattened streams @ fn^T) times the flattened streams' inverse RMS, in fp32."""
    flat = s.flatten(1).float()
    return torch.nn.functional.linear(flat, fn) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)


def _collapse(s: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """sum_j pre_j S_j in fp32, rounded to the streams' dtype."""
    return (pre[..., None] * s.float()).sum(dim=1).to(s.dtype)


@dataclass
class HyperConnection:
    """One sub-layer's hyper-connection: its weights (fp32) and constants."""

    fn: torch.Tensor  # [2N, N H]
    base: torch.Tensor  # [2N]
    scale: torch.Tensor  # [2]: the pre and post logits' scales
    magnitude: float  # post's sigmoid times this (`hc_magnitude`)
    eps: float  # added to each gate (`hc_eps`)
    norm_eps: float  # the unweighted RMSNorm's (`rms_norm_eps`)

    @property
    def streams(self) -> int:
        return self.base.shape[0] // 2

    def read(self, s: torch.Tensor) -> Gates:
        """The sub-layer's input mixed from the streams s `[T, N, H]`, and the gates of its write."""
        n = self.streams
        m = _mixes(s, self.fn, self.norm_eps)
        pre = torch.sigmoid(m[:, :n] * self.scale[0] + self.base[:n]) + self.eps
        post = self.magnitude * torch.sigmoid(m[:, n:] * self.scale[1] + self.base[n:]) + self.eps
        return Gates(_collapse(s, pre), post)

    @staticmethod
    def write(s: torch.Tensor, out: torch.Tensor, gates: Gates) -> torch.Tensor:
        """The streams after the sub-layer: S_j + post_j * out (out `[T, H]`), in fp32, rounded once; with a `comb`
        sum_k C_kj S_k + post_j * out in the streams' dtype (transformers' DeepSeek-V4 mixes there)."""
        if gates.comb is not None:
            mixed = torch.matmul(gates.comb.to(s.dtype).transpose(-1, -2), s)
            return gates.post.to(s.dtype)[..., None] * out[:, None, :] + mixed
        return (gates.post[..., None] * out.float()[:, None, :] + s.float()).to(s.dtype)


def _normed_mixes(s: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """The flattened streams normalised (an RMSNorm without a weight, fp32), then times fn^T: DeepSeek-V4's order
    (HY-V4's, `_mixes`, scales after the product: one rounding apart)."""
    flat = s.flatten(1).float()
    return torch.nn.functional.linear(flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps), fn)


@dataclass
class SinkhornHyperConnection(HyperConnection):
    """DeepSeek-V4's manifold-constrained form: fn `[(2 + N) N, N H]` gives N pre, N post and N x N comb logits,
    scale `[3]` one scale each. pre = sigmoid(.) + eps; post = magnitude * sigmoid(.) (no eps); comb = softmax over
    each row + eps, then made doubly stochastic: columns normalised, then `sinkhorn_iters - 1` times rows and
    columns in turn (each sum + eps)."""

    sinkhorn_iters: int = 20

    @property
    def streams(self) -> int:
        return int(round((1 + self.base.shape[0]) ** 0.5)) - 1  # ((2 + N) N logits)

    def read(self, s: torch.Tensor) -> Gates:
        n = s.shape[1]
        m = _normed_mixes(s, self.fn, self.norm_eps)
        base, scale = self.base, self.scale
        pre = torch.sigmoid(m[:, :n] * scale[0] + base[:n]) + self.eps
        post = self.magnitude * torch.sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n])
        comb = m[:, 2 * n:].view(-1, n, n) * scale[2] + base[2 * n:].view(n, n)
        comb = torch.softmax(comb, dim=-1) + self.eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        for _ in range(self.sinkhorn_iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        return Gates(_collapse(s, pre), post, comb)


@dataclass
class HyperHead:
    """The final collapse of the streams into one row a token (before the final norm)."""

    fn: torch.Tensor  # [N, N H]
    base: torch.Tensor  # [N]
    scale: torch.Tensor  # [1]
    eps: float
    norm_eps: float
    norm_first: bool = False  # the streams normalised before the product (DeepSeek-V4's order, `_normed_mixes`)

    def __call__(self, s: torch.Tensor) -> torch.Tensor:
        mixes = (_normed_mixes if self.norm_first else _mixes)(s, self.fn, self.norm_eps)
        pre = torch.sigmoid(mixes * self.scale + self.base) + self.eps
        return _collapse(s, pre)


def hc_tensor_shapes(prefix: str, streams: int, hidden: int, head: bool = False,
                     sinkhorn: bool = False) -> dict[str, tuple[int, ...]]:
    """A hyper-connection's tensors under `prefix` (ending in "."), or with `head` a HyperHead's; with `sinkhorn` a
    SinkhornHyperConnection's (its N x N comb logits and their scale beside pre and post)."""
    if head:
        return {prefix + "hc_fn": (streams, streams * hidden), prefix + "hc_base": (streams,),
                prefix + "hc_scale": (1,)}
    if sinkhorn:
        logits = (2 + streams) * streams
        return {prefix + "fn": (logits, streams * hidden), prefix + "base": (logits,), prefix + "scale": (3,)}
    return {prefix + "fn": (2 * streams, streams * hidden), prefix + "base": (2 * streams,), prefix + "scale": (2,)}


def load_hyper_connection(read: Callable[[str, tuple[int, ...]], torch.Tensor], prefix: str, streams: int,
                          hidden: int, magnitude: float, eps: float, norm_eps: float) -> HyperConnection:
    """The hyper-connection under `prefix`; `read(name, shape)` gives a checkpoint tensor in fp32 on the device."""
    shapes = hc_tensor_shapes(prefix, streams, hidden)
    fn, base, scale = (read(name, shape) for name, shape in shapes.items())
    return HyperConnection(fn, base, scale, magnitude, eps, norm_eps)


def load_sinkhorn_hyper_connection(read: Callable[[str, tuple[int, ...]], torch.Tensor], prefix: str, streams: int,
                                   hidden: int, magnitude: float, eps: float, norm_eps: float,
                                   sinkhorn_iters: int) -> SinkhornHyperConnection:
    shapes = hc_tensor_shapes(prefix, streams, hidden, sinkhorn=True)
    fn, base, scale = (read(name, shape) for name, shape in shapes.items())
    return SinkhornHyperConnection(fn, base, scale, magnitude, eps, norm_eps, sinkhorn_iters)


def load_hyper_head(read: Callable[[str, tuple[int, ...]], torch.Tensor], prefix: str, streams: int, hidden: int,
                    eps: float, norm_eps: float, norm_first: bool = False) -> HyperHead:
    shapes = hc_tensor_shapes(prefix, streams, hidden, head=True)
    fn, base, scale = (read(name, shape) for name, shape in shapes.items())
    return HyperHead(fn, base, scale, eps, norm_eps, norm_first)


def grouped_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """An RMSNorm of each row of x `[..., N, H]` over its last dim (each stream on its own), times `weight`
    `[N H]` (fp32, as applied: Qwen's 1 + w), in fp32, rounded to x's dtype."""
    h = x.float()
    normed = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    return (normed * weight.view(x.shape[-2:])).to(x.dtype)


@dataclass
class GatedResidual:
    """Qwen4-Exp's gated residual over N streams S `[T, N, H]`: no logits over the flattened streams as above, but
    a gate per element of each stream. With n = each stream RMS-normalised (grouped_rms_norm) and f = n flattened:

        m = sigmoid(up(silu(down(f) / N)))                  down `[rank, N H]`, up `[N H, rank]`, m `[T, N, H]`
        x = mean_j (m_j * n_j)                              (what the sub-layer reads: no norm of its own)
        inject = 2 sigmoid(f @ W^T / N)                     W `[N, N H]`
        S'_j = S_j + inject_j * sublayer(x)                 (write)

    The last one of the stack has no W: it collapses the streams into the rows the output head reads (no final
    norm). In the streams' dtype as transformers computes it (the norm in fp32)."""

    norm: torch.Tensor  # [N H] fp32: 1 + w
    down: torch.Tensor  # [rank, N H]
    up: torch.Tensor  # [N H, rank]
    inject: torch.Tensor | None  # [N, N H]; None: the final collapse
    eps: float

    def read(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the sub-layer's input rows `[T, H]`, each stream's share of its output `[T, N]` or None)."""
        t, n, _ = s.shape
        normed = grouped_rms_norm(s, self.norm, self.eps)
        flat = normed.flatten(1)
        mix = torch.sigmoid(torch.nn.functional.linear(
            torch.nn.functional.silu(torch.nn.functional.linear(flat, self.down) / n), self.up))
        x = (mix.view_as(normed) * normed).mean(dim=1)
        if self.inject is None:
            return x, None
        return x, 2 * torch.sigmoid(torch.nn.functional.linear(flat, self.inject) / n)

    @staticmethod
    def write(s: torch.Tensor, out: torch.Tensor, inject: torch.Tensor) -> torch.Tensor:
        return s + out[:, None, :] * inject[..., None]


def gated_residual_shapes(prefix: str, streams: int, hidden: int, rank: int,
                          final: bool = False) -> dict[str, tuple[int, ...]]:
    """A GatedResidual's tensors under `prefix` (ending in "."), by transformers' names."""
    wide = streams * hidden
    shapes = {prefix + "hc_norm.weight": (wide,), prefix + "input_mix_weight_down.weight": (rank, wide),
              prefix + "input_mix_weight_up.weight": (wide, rank)}
    return shapes if final else {**shapes, prefix + "block_inject_weight.weight": (streams, wide)}
