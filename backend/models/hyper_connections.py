"""Hyper-connections: a residual stream of N (`hc_mult`) rows a token in place of one (HY-V4; DeepSeek-V4's form
differs only in how the streams mix, see below).

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
matrix C that mixes the streams themselves: S'_j = sum_k C_jk S_k + post_j * sublayer(x). `read` hands back
`Gates` with a `comb` slot for that matrix (None here: the identity) and `write` takes them, so that form is a
new way to fill `comb`, not a new call shape. Only HY-V4's form (no `comb`) is built.

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
        """The streams after the sub-layer: S_j + post_j * out (out `[T, H]`), in fp32, rounded once."""
        if gates.comb is not None:
            raise NotImplementedError("stream-mixing hyper-connections (DeepSeek-V4's comb) are not built")
        return (gates.post[..., None] * out.float()[:, None, :] + s.float()).to(s.dtype)


@dataclass
class HyperHead:
    """The final collapse of the streams into one row a token (before the final norm)."""

    fn: torch.Tensor  # [N, N H]
    base: torch.Tensor  # [N]
    scale: torch.Tensor  # [1]
    eps: float
    norm_eps: float

    def __call__(self, s: torch.Tensor) -> torch.Tensor:
        pre = torch.sigmoid(_mixes(s, self.fn, self.norm_eps) * self.scale + self.base) + self.eps
        return _collapse(s, pre)


def hc_tensor_shapes(prefix: str, streams: int, hidden: int, head: bool = False) -> dict[str, tuple[int, ...]]:
    """A hyper-connection's tensors under `prefix` (ending in "."), or with `head` a HyperHead's."""
    if head:
        return {prefix + "hc_fn": (streams, streams * hidden), prefix + "hc_base": (streams,),
                prefix + "hc_scale": (1,)}
    return {prefix + "fn": (2 * streams, streams * hidden), prefix + "base": (2 * streams,), prefix + "scale": (2,)}


def load_hyper_connection(read: Callable[[str, tuple[int, ...]], torch.Tensor], prefix: str, streams: int,
                          hidden: int, magnitude: float, eps: float, norm_eps: float) -> HyperConnection:
    """The hyper-connection under `prefix`; `read(name, shape)` gives a checkpoint tensor in fp32 on the device."""
    shapes = hc_tensor_shapes(prefix, streams, hidden)
    fn, base, scale = (read(name, shape) for name, shape in shapes.items())
    return HyperConnection(fn, base, scale, magnitude, eps, norm_eps)


def load_hyper_head(read: Callable[[str, tuple[int, ...]], torch.Tensor], prefix: str, streams: int, hidden: int,
                    eps: float, norm_eps: float) -> HyperHead:
    shapes = hc_tensor_shapes(prefix, streams, hidden, head=True)
    fn, base, scale = (read(name, shape) for name, shape in shapes.items())
    return HyperHead(fn, base, scale, eps, norm_eps)
