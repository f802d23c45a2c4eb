"""Rotary position embeddings: the frequency schedule a checkpoint's config asks for, as tables.

A decoder looks up `[positions, 2, head_dim / 2]` (cos and sin side by side) per token, so
every variant below is only a different table, computed once at load; no kernel changes with it.
So is a partial rotary (fewer rotary dims than head dims: Phi-4-mini), with the Q and K dims
stored in another order at load (`rotary_order`).
The variants are the published ones (Hugging Face's `rope_scaling` / `rope_parameters` types):

- default:  inv_freq[i] = theta^(-2i/d)
- linear:   positions divided by `factor` (inv_freq / factor)
- llama3:   Llama 3.1's smooth per-frequency scaling: wavelengths longer than
            original / low_freq_factor are divided by `factor`, shorter than
            original / high_freq_factor kept, the band between interpolated
- yarn:     per-frequency blend of interpolation (inv_freq / factor) and extrapolation by a
            linear ramp between the correction dims of beta_fast and beta_slow, and cos/sin
            scaled by an attention factor (0.1 ln(factor) + 1 unless given)
- longrope: inv_freq / short_factor[i] for positions inside the original length and
            inv_freq / long_factor[i] past it, cos/sin scaled by
            sqrt(1 + ln(factor) / ln(original length)) unless given; where a family gives
            `short_mscale` / `long_mscale` (Phi-3.5-MoE's), by those inside / past it instead
- dynamic:  NTK-aware: inside the original length the default table; past it, position p uses
            the base theta * (factor * (p + 1) / original - (factor - 1))^(d / (d - 2))
- proportional: a share of the whole head's frequencies (LFM3's full-attention layers): inv_freq[i] =
            theta^(-2i/d) / factor for the first int(partial_rotary_factor * d // 2) pairs (i, i + d/2),
            0 (cos 1, sin 0: not rotated) for the rest; unlike a partial rotary, the pairs and the
            exponents' denominator are the whole head's

Two of them depend on the sequence in Hugging Face's implementation, which recomputes its one
table per forward call from the longest position it sees (`dynamic_rope_update`); a paged,
batched engine keeps one table for every sequence, so they are per position here:
- longrope: HF switches a whole sequence to the long factors once it passes the original
  length (cached keys keep their rotation); here each position inside the original length
  uses the short factors and each one past it the long factors. Identical up to the original
  length (4,096 for Phi-3-mini-128k).
- dynamic: HF rotates a long prompt's tokens with the base of the prompt's length, and each
  later token with the base of its own length; here every position past the original length
  uses the base of its own length. Identical inside the original length.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "proportional")


@dataclass(frozen=True)
class Rope:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    original_max_positions: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: round the correction range outwards
    attention_factor: float | None = None  # yarn, longrope: scales cos and sin
    mscale: float | None = None  # yarn (DeepSeek-style attention factor)
    mscale_all_dim: float | None = None
    short_factor: tuple[float, ...] | None = None  # longrope
    long_factor: tuple[float, ...] | None = None  # longrope
    short_mscale: float | None = None  # longrope (Phi-3.5-MoE): cos and sin scaled by this inside the original length
    long_mscale: float | None = None  # and by this past it (None: cos_sin_scale)
    proportion: float = 1.0  # proportional: the share of the head's frequency pairs that rotate

    @classmethod
    def from_hf(cls, params: dict | None, theta: float, max_positions: int) -> "Rope":
        """The rope of one HF `rope_parameters` / `rope_scaling` dict (None: default). `theta`
        is the config's rope_theta when the dict has none; `max_positions` the config's
        max_position_embeddings (longrope and yarn derive `factor` from it when absent)."""
        p = dict(params or {})
        rope_type = p.get("rope_type", p.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope type {rope_type!r} (supported: {', '.join(ROPE_TYPES)})")
        theta = float(p.get("rope_theta", theta))
        if rope_type == "default":
            return cls(theta)
        if rope_type == "proportional":
            return cls(theta, rope_type, float(p.get("factor", 1.0)),
                       proportion=float(p.get("partial_rotary_factor", 1.0)))
        original = p.get("original_max_position_embeddings")
        factor = p.get("factor")
        if factor is None:
            if rope_type not in ("yarn", "longrope") or not original:
                raise ValueError(f"rope type {rope_type!r} needs a 'factor'")
            factor = max_positions / original
        if rope_type in ("llama3", "yarn", "longrope") and not original:
            raise ValueError(f"rope type {rope_type!r} needs 'original_max_position_embeddings'")
        if rope_type == "dynamic":
            original = max_positions  # HF's dynamic NTK scales past max_position_embeddings
        extra = {}
        if rope_type == "longrope":
            extra = dict(short_factor=tuple(map(float, p["short_factor"])), long_factor=tuple(map(float, p["long_factor"])))
        return cls(
            theta, rope_type, float(factor), int(original) if original else None,
            low_freq_factor=float(p.get("low_freq_factor", 1.0)), high_freq_factor=float(p.get("high_freq_factor", 4.0)),
            beta_fast=float(p.get("beta_fast") or 32.0), beta_slow=float(p.get("beta_slow") or 1.0),
            truncate=bool(p.get("truncate", True)), attention_factor=p.get("attention_factor"),
            mscale=p.get("mscale"), mscale_all_dim=p.get("mscale_all_dim"), **extra,
        )

    def cos_sin(self, positions: int, dim: int, device: torch.device, rotary_dim: int | None = None) -> torch.Tensor:
        """fp32 `[positions, 2, dim // 2]`: cos and sin of every position's angles, times the
        attention factor where the variant has one. With a partial `rotary_dim` (< dim) the
        frequencies are those of `rotary_dim` and the table's last (dim - rotary_dim) / 2
        columns are cos 1, sin 0, which leave their pairs as they are (see rotary_order)."""
        if rotary_dim is not None and rotary_dim < dim:
            table = self.cos_sin(positions, rotary_dim, device)
            rest = torch.zeros(positions, 2, (dim - rotary_dim) // 2, device=device)
            rest[:, 0] = 1.0
            return torch.cat([table, rest], dim=2)
        pos = torch.arange(positions, device=device, dtype=torch.float32)
        base = _inv_freq(self.theta, dim, device)
        if self.rope_type == "longrope":
            inside = pos < self.original_max_positions
            short = base / torch.tensor(self.short_factor, device=device)
            long = base / torch.tensor(self.long_factor, device=device)
            angles = torch.where(inside[:, None], pos[:, None] * short, pos[:, None] * long)
            if self.short_mscale is not None and self.long_mscale is not None:
                scale = torch.where(inside, self.short_mscale, self.long_mscale)[:, None]
                return torch.stack([angles.cos() * scale, angles.sin() * scale], dim=1)
        elif self.rope_type == "dynamic":
            angles = pos[:, None] * base
            past = pos >= self.original_max_positions
            if past.any():
                seq_len = pos[past] + 1
                theta = self.theta * ((self.factor * seq_len / self.original_max_positions) - (self.factor - 1)) ** (
                    dim / (dim - 2))
                exponents = torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim
                angles[past] = pos[past, None] / (theta[:, None] ** exponents[None, :])
        else:
            angles = pos[:, None] * self.inv_freq(dim, device)
        scale = self.cos_sin_scale()
        return torch.stack([angles.cos() * scale, angles.sin() * scale], dim=1)

    def inv_freq(self, dim: int, device: torch.device) -> torch.Tensor:
        """The position-independent frequencies of default, linear, llama3, yarn and proportional."""
        inv = _inv_freq(self.theta, dim, device)
        if self.rope_type == "linear":
            return inv / self.factor
        if self.rope_type == "llama3":
            return _llama3(inv, self.factor, self.low_freq_factor, self.high_freq_factor, self.original_max_positions)
        if self.rope_type == "yarn":
            return _yarn(inv, self.theta, dim, self.factor, self.beta_fast, self.beta_slow, self.original_max_positions,
                         self.truncate)
        if self.rope_type == "proportional":  # (the pairs past the share: frequency 0)
            return torch.cat([inv[: int(self.proportion * dim // 2)], torch.zeros_like(inv)])[: dim // 2] / self.factor
        return inv

    def cos_sin_scale(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.rope_type == "yarn":
            if self.mscale and self.mscale_all_dim:
                return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)
            return _yarn_mscale(self.factor, 1.0)
        if self.rope_type == "longrope" and self.factor > 1.0:
            return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_positions))
        return 1.0


def params_by_layer_type(cfg: dict) -> tuple[dict, dict]:
    """(the global layers' rope parameters, the sliding layers'): transformers >= 5 keys `rope_parameters` by
    layer type; earlier configs hold one `rope_scaling` (or flat `rope_parameters`), the global layers'."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        return params.get("full_attention") or {}, params.get("sliding_attention") or {}
    return cfg.get("rope_scaling") or params, {}


def rotary_order(head_dim: int, rotary_dim: int, interleaved: bool = False) -> torch.Tensor:
    """Partial rotary (Phi-4-mini rotates 96 of its 128 head dims) on kernels that rotate whole
    heads: the order to store each query and key head's dims in, as indices into Hugging
    Face's order.

    Hugging Face rotates dims i and i + r/2 of the first r = rotary_dim together (frequency i)
    and passes dims r.. through; the kernels rotate dims j and j + d/2 (d = head_dim) with
    table column j. Storing HF dim i at j = i and HF dim i + r/2 at j = i + d/2 (i < r/2)
    makes the kernels' pairs HF's pairs, and the pass-through dims fill the columns r/2 .. d/2
    of both halves, whose table entries are cos 1, sin 0 (Rope.cos_sin with rotary_dim). A
    query and a key stored in one order give the same dot products, so only the Q and K rows
    of the QKV projection (and their biases and head norms) are reordered at load; V, the
    cache's values and the output projection keep HF's order.

    `interleaved` (GLM's rotary, GPT-J's layout): HF rotates dims 2i and 2i + 1 together
    (frequency i); they go to j = i and j = i + d/2 the same way."""
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim or head_dim % 2:
        raise ValueError(f"rotary dims {rotary_dim} of head dim {head_dim}: both must be even, 0 < rotary <= head")
    half, rot, rest = head_dim // 2, rotary_dim // 2, (head_dim - rotary_dim) // 2
    pairs = [(2 * i, 2 * i + 1) for i in range(rot)] if interleaved else [(i, rot + i) for i in range(rot)]
    first = [a for a, _ in pairs] + [rotary_dim + k for k in range(rest)]
    second = [b for _, b in pairs] + [rotary_dim + rest + k for k in range(rest)]
    assert len(first) == len(second) == half
    return torch.tensor(first + second)


def _inv_freq(theta: float, dim: int, device) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.int64).float() / dim))


def _llama3(inv: torch.Tensor, factor: float, low: float, high: float, original: int) -> torch.Tensor:
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = original / low, original / high
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(between, blended, scaled)


def _yarn(inv: torch.Tensor, theta: float, dim: int, factor: float, beta_fast: float, beta_slow: float,
          original: int, truncate: bool) -> torch.Tensor:
    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp
    ramp = ((torch.arange(dim // 2, device=inv.device, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp  # share of the unscaled frequency
    return (inv / factor) * (1 - extrapolated) + inv * extrapolated


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
