"""Multi-head latent attention (MLA: DeepSeek-V2 / V3, Kimi K2, GLM-4.7-Flash, Youtu-LLM) for the shared
decoder (transformer.py).

Each token's keys and values come from one low-rank latent: kv_a (`kv_a_proj_with_mqa`) maps the
hidden row to c_kv (`kv_lora_rank` wide) and one rotary key k_pe (`qk_rope_head_dim`) that every head
shares; c_kv is RMS-normalised (`kv_a_layernorm`) and kv_b maps it to every head's k_nope
(`qk_nope_head_dim`) and v (`v_head_dim`). Queries come from q_proj, or through a latent of their own
(`q_lora_rank`): q_b(RMSNorm(q_a(x))). A head's key is [k_nope; rotary(k_pe)], its query
[q_nope; rotary(q_pe)], and the scores are q . k times qk_head_dim ** -0.5 (times mscale ** 2 under a
YaRN rope with `mscale_all_dim`, as DeepSeek scales them). LongCat-Flash multiplies the query latent's norm
output by sqrt(hidden / q_lora_rank) and c_kv's by sqrt(hidden / kv_lora_rank) (MlaSpec.q_scale / kv_scale):
folded into those norms' weights at load. Dots3 RMS-normalises k_pe before its rotary (MlaSpec.k_pe_norm), and
its layers' latent attention differs in shape (LayerMla: heads, ranks, head dims and softmax scale per layer).

Here the cache holds the expanded keys and values ("expanded MLA"): per head a full key of
qk_head_dim = nope + rope dims and the value padded with zeros to that size, as many KV heads as
query heads, so the paged attention kernels run unchanged at one head_dim. Each head stores its
rotary dims first ([q_pe; q_nope], [k_pe; k_nope]): one order for queries and keys leaves the dot
products as they are, and rotating a head's first `rope` dims is kernels.rotary_in_place on a
view. DeepSeek's interleaved rotary (`rope_interleave`, and DeepSeek-V2's always: dims 2i, 2i + 1
at frequency i) becomes the kernels' rotate-half (dims i, i + rope / 2) by storing the rows that
make q_pe and k_pe in the order [even dims; odd dims] at load. The attention's output per head is
[its v; zeros]: the first v_head_dim dims go on to o_proj (a slice: padding o_proj's columns with
zeros instead would cost weight memory in every layer, 7 GB of DeepSeek-V3's in bf16, to save one
copy of the attention output). The cost of this scheme is the cache: DeepSeek-V3's 128 heads of
192 + 192 values a token and layer, where the latent is 576.

The q_a (or q_proj) and kv_a projections read the same normalised rows: one GEMM of their rows
stacked, with the block's PreNorm in it. Under tensor parallelism a rank holds its heads' rows of
q_b (or q_proj) and kv_b and their columns of o_proj; the latent projections and norms whole.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tritonformer import kernels
from tritonformer.kernels.fp8 import cat_rows, scaled


@dataclass(frozen=True)
class MlaNames:
    """Where a layer's MLA keeps its tensors, relative to `layers.{i}.`."""

    q: str = "self_attn.q_proj"
    q_a: str = "self_attn.q_a_proj"
    q_a_norm: str = "self_attn.q_a_layernorm"
    q_b: str = "self_attn.q_b_proj"
    kv_a: str = "self_attn.kv_a_proj_with_mqa"
    kv_a_norm: str = "self_attn.kv_a_layernorm"
    kv_b: str = "self_attn.kv_b_proj"
    k_pe_norm: str = "self_attn.k_rope_only_layernorm"


@dataclass(frozen=True)
class MlaSpec:
    q_lora_rank: int | None  # None: queries from q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleaved: bool  # the checkpoint's q_pe / k_pe rotate dims 2i, 2i + 1 together
    bias: bool = False  # biases on q_a and kv_a (attention_bias; o_proj's is DecoderSpec.o_bias)
    norm_eps: float = 1e-6  # the latent norms' (transformers builds them with the default eps)
    names: MlaNames = field(default_factory=MlaNames)
    q_scale: float = 1.0  # the query latent's norm output times this (LongCat-Flash's LoRA scale), in its weight
    kv_scale: float = 1.0  # c_kv's norm output likewise
    k_pe_norm: bool = False  # an RMSNorm (norm_eps) on the shared rotary key k_pe before its rotary (Dots3's)

    def __post_init__(self):
        if self.qk_rope_head_dim % 2 or self.qk_rope_head_dim <= 0:
            raise ValueError(f"qk_rope_head_dim must be even and positive, got {self.qk_rope_head_dim}")
        if self.q_scale != 1.0 and self.q_lora_rank is None:
            raise ValueError("a query latent scale (q_scale) needs the query latent (q_lora_rank)")
        if self.v_head_dim > self.qk_head_dim:
            raise ValueError(f"v_head_dim {self.v_head_dim} above qk_nope_head_dim + qk_rope_head_dim "
                             f"({self.qk_head_dim}) is not supported (supported: v_head_dim at most the query's)")

    @property
    def qk_head_dim(self) -> int:
        """A head's query and key dims: what the cache stores per head (its values zero-padded to it)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def rope_rows(self) -> torch.Tensor:
        """The order to store the rows making a head's rotary dims in: [even; odd] where the
        checkpoint rotates neighbouring dims together, else as they are."""
        r = self.qk_rope_head_dim
        if not self.rope_interleaved:
            return torch.arange(r)
        return torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2)])

    def query_rows(self, heads: int) -> torch.Tensor:
        """Indices of the stored rows of `heads` heads' query projection (q_b or q_proj, per head
        [nope; rope]) in our order: per head [rope (rope_rows); nope]."""
        nope, d = self.qk_nope_head_dim, self.qk_head_dim
        head = torch.cat([nope + self.rope_rows(), torch.arange(nope)])
        return (torch.arange(heads)[:, None] * d + head[None, :]).reshape(-1)


@dataclass(frozen=True)
class LayerMla:
    """One layer's latent attention where the layers' differ in shape (DecoderSpec.layer_mla: Dots3's sliding
    layers have half the heads, wider ones, from a wider kv latent): its spec, its query heads (as many KV heads
    in its cache layer, each qk_head_dim wide) and its softmax scale."""

    spec: MlaSpec
    heads: int
    scale: float


def mla_options(cfg: dict) -> dict:
    """The DecoderSpec options of a DeepSeek-style MLA config: the spec, the
    cache's head (qk_head_dim, as many KV heads as query heads), the rotary over a head's first
    qk_rope_head_dim dims, the softmax scale, o_proj's bias."""
    spec = MlaSpec(q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=cfg["kv_lora_rank"],
                   qk_nope_head_dim=cfg["qk_nope_head_dim"], qk_rope_head_dim=cfg["qk_rope_head_dim"],
                   v_head_dim=cfg["v_head_dim"], rope_interleaved=bool(cfg.get("rope_interleave", True)),
                   bias=bool(cfg.get("attention_bias", False)))
    return dict(mla=spec, head_dim=spec.qk_head_dim, num_kv_heads=cfg["num_attention_heads"],
                rotary_dim=spec.qk_rope_head_dim, attn_scale=softmax_scale(cfg, spec.qk_head_dim),
                o_bias=spec.bias)


def softmax_scale(cfg: dict, qk_head_dim: int) -> float:
    """qk_head_dim ** -0.5, times mscale ** 2 where the rope is scaled (any type but the default)
    and its parameters set `mscale_all_dim`: mscale = 0.1 * mscale_all_dim * ln(factor) + 1 for a
    factor above 1 (YaRN's attention factor, applied to the scores as DeepSeek does)."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}  # (transformer.rope_parameters' rule)
    scale = qk_head_dim ** -0.5
    rope_type = params.get("rope_type", params.get("type", "default"))
    mscale_all_dim, factor = params.get("mscale_all_dim") or 0, params.get("factor") or 1.0
    if rope_type != "default" and mscale_all_dim and factor > 1:
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


@dataclass
class MlaLayer:
    spec: MlaSpec
    heads: int  # this rank's
    a_w: torch.Tensor  # [q_a (or this rank's q_proj rows, our order); kv_a (rope rows in our order)], [A, hidden]
    a_b: torch.Tensor | None
    q_norm: torch.Tensor | None  # [q_lora_rank] (None without a query latent)
    q_b_w: torch.Tensor | None  # [heads * qk_head_dim, q_lora_rank], our order
    kv_norm: torch.Tensor  # [kv_lora_rank]
    kv_b_w: torch.Tensor  # [heads * (nope + v), kv_lora_rank], as stored
    k_pe_norm: torch.Tensor | None = None  # [qk_rope_head_dim], rope rows' order (MlaSpec.k_pe_norm; None: none)

    def to_cache(self, x: torch.Tensor, prenorm: kernels.PreNorm | None, cos: torch.Tensor | None,
                 sin: torch.Tensor | None, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> torch.Tensor:
        """The layer's queries `[T, heads, qk_head_dim]` for its input rows x (PreNorm'd by
        `prenorm` where given), its keys and zero-padded values written to the paged cache.
        `cos` / `sin`: the rows' rotary tables `[T, >= rope / 2]` (their first rope / 2 columns
        are the rotary's; None: no rotary). Static shapes, no host syncs: graph-capturable."""
        s = self.spec
        t, heads, d, r = x.shape[0], self.heads, s.qk_head_dim, s.qk_rope_head_dim
        a = kernels.linear_act(x, self.a_w, self.a_b, prenorm=prenorm)
        q_width = a.shape[1] - s.kv_lora_rank - r  # [q latent (or queries); kv latent; k_pe]
        q_latent, kv_latent = kernels.mla_latent_norms(a, q_width, self.q_norm, self.kv_norm, s.norm_eps)
        q = a[:, :q_width].contiguous() if self.q_b_w is None else kernels.linear_act(q_latent, self.q_b_w)
        if self.k_pe_norm is not None:  # (k_pe normalised where it lies, before rotate_and_cache rotates it)
            k_pe = a[:, a.shape[1] - r :]
            k_pe.copy_(kernels.rms_norm(k_pe.contiguous(), self.k_pe_norm, s.norm_eps)[0])
        return self.rotate_and_cache(q.view(t, heads, d), kv_latent, a, cos, sin, k_cache, v_cache, slot_mapping)

    def rotate_and_cache(self, q: torch.Tensor, kv_latent: torch.Tensor, a: torch.Tensor, cos, sin,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        """to_cache's last part: the queries `q` `[T, heads, qk_head_dim]` rotated in place, and the keys and
        zero-padded values from the normed kv latent (and the rotary key at the end of `a`'s rows) written to the
        paged cache; returns q."""
        s = self.spec
        r = s.qk_rope_head_dim
        kv = kernels.linear_act(kv_latent, self.kv_b_w).view(q.shape[0], self.heads, s.qk_nope_head_dim + s.v_head_dim)
        if cos is not None:
            cos, sin = cos[:, : r // 2], sin[:, : r // 2]
            kernels.rotary_in_place(q[:, :, :r], cos, sin)
        kernels.mla_kv_to_cache(kv, a[:, a.shape[1] - r :], cos, sin, k_cache, v_cache, slot_mapping)
        return q

    def values(self, ctx: torch.Tensor) -> torch.Tensor:
        """The attention output's heads `[T, heads, qk_head_dim]` without their zero padding:
        `[T, heads * v_head_dim]`, what o_proj reads."""
        return ctx[:, :, : self.spec.v_head_dim].reshape(ctx.shape[0], -1)

    def params(self) -> int:
        """Weights one token multiplies by (a rank's share)."""
        return sum(w.numel() for w in (self.a_w, self.q_b_w, self.kv_b_w) if w is not None)

    def read_bytes(self, tokens: int | None) -> int:
        """Bytes of weights one step reads, whatever its `tokens`: all of them (the linears' and the norms')."""
        weights = (self.a_w, self.a_b, self.q_norm, self.q_b_w, self.kv_norm, self.kv_b_w, self.k_pe_norm)
        return sum(w.numel() * w.element_size() for w in weights if w is not None)


def load_mla_layer(spec: MlaSpec, read: Callable[..., torch.Tensor], prefix: str, hidden: int, heads: int,
                   part: slice | None = None) -> MlaLayer:
    """Layer `prefix`'s MLA from the checkpoint's tensors, each read by `read(name, shape, index=None)`
    (the decoder's: the shape checked, the `index` part only, on the model's device and dtype);
    `part`: this tensor-parallel rank's heads of the `heads` (None: all)."""
    n, p = spec.names, prefix
    d, r, kv_rank = spec.qk_head_dim, spec.qk_rope_head_dim, spec.kv_lora_rank
    part = part or slice(0, heads)
    local = part.stop - part.start
    q_rows, kv_a_rows = spec.query_rows(local), torch.cat([torch.arange(kv_rank), kv_rank + spec.rope_rows()])

    def ordered(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return t[rows.to(t.device)]

    kv_a = ordered(read(p + n.kv_a + ".weight", (kv_rank + r, hidden)), kv_a_rows)
    kv_a_b = ordered(read(p + n.kv_a + ".bias", (kv_rank + r,)), kv_a_rows) if spec.bias else None
    mine = (slice(part.start * d, part.stop * d),)  # this rank's heads' rows of a query projection
    if spec.q_lora_rank is None:
        q_w = ordered(read(p + n.q + ".weight", (heads * d, hidden), mine), q_rows)
        q_b = q_w.new_zeros(q_w.shape[0]) if spec.bias else None  # (q_proj has no bias)
        q_norm = q_b_w = None
    else:
        q_w = read(p + n.q_a + ".weight", (spec.q_lora_rank, hidden))
        q_b = read(p + n.q_a + ".bias", (spec.q_lora_rank,)) if spec.bias else None
        q_norm = scaled(read(p + n.q_a_norm + ".weight", (spec.q_lora_rank,)), spec.q_scale)
        q_b_w = ordered(read(p + n.q_b + ".weight", (heads * d, spec.q_lora_rank), mine), q_rows)
    kv_width = spec.qk_nope_head_dim + spec.v_head_dim
    kv_b_w = read(p + n.kv_b + ".weight", (heads * kv_width, kv_rank),
                  (slice(part.start * kv_width, part.stop * kv_width),))
    # (an RMSNorm's weight in the order its rows are stored: the norm itself does not depend on the order)
    k_pe_norm = ordered(read(p + n.k_pe_norm + ".weight", (r,)), spec.rope_rows()) if spec.k_pe_norm else None
    return MlaLayer(spec, local, cat_rows([q_w, kv_a]), None if q_b is None else torch.cat([q_b, kv_a_b]),
                    q_norm, q_b_w, scaled(read(p + n.kv_a_norm + ".weight", (kv_rank,)), spec.kv_scale), kv_b_w,
                    k_pe_norm)


def tensor_shapes(spec: MlaSpec, prefix: str, hidden: int, heads: int) -> dict[str, tuple[int, ...]]:
    """The tensors of layer `prefix`'s MLA by name (o_proj's aside: `[hidden, heads * v_head_dim]`)."""
    n, d, kv_rank, r = spec.names, spec.qk_head_dim, spec.kv_lora_rank, spec.qk_rope_head_dim
    shapes = {n.kv_a + ".weight": (kv_rank + r, hidden), n.kv_a_norm + ".weight": (kv_rank,),
              n.kv_b + ".weight": (heads * (spec.qk_nope_head_dim + spec.v_head_dim), kv_rank)}
    if spec.q_lora_rank is None:
        shapes[n.q + ".weight"] = (heads * d, hidden)
    else:
        shapes.update({n.q_a + ".weight": (spec.q_lora_rank, hidden), n.q_a_norm + ".weight": (spec.q_lora_rank,),
                       n.q_b + ".weight": (heads * d, spec.q_lora_rank)})
        if spec.bias:
            shapes[n.q_a + ".bias"] = (spec.q_lora_rank,)
    if spec.bias:
        shapes[n.kv_a + ".bias"] = (kv_rank + r,)
    if spec.k_pe_norm:
        shapes[n.k_pe_norm + ".weight"] = (r,)
    return {prefix + name: shape for name, shape in shapes.items()}
