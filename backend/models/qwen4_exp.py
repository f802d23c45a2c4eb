"""Qwen4-Exp's text model (`qwen4_exp_text`; `qwen4_exp`: the multimodal checkpoint's text model, its vision tower
unread). Qwen3.5-MoE's hybrid (qwen3_5.py: gated DeltaNet layers, gated attention every `full_attention_interval`-th
layer, experts with a gated shared expert in every layer) with three additions:

- Gated residuals (hyper_connections.GatedResidual): `hc_count` streams a token in place of one residual, each
  sub-layer reading a gated mix of the RMS-normalised streams (no norm of its own before attention, the DeltaNet or
  the experts) and writing its output into every stream times a gate; a last one collapses the streams before the
  output head (no final norm).
- Per-layer embeddings (PLE) on the `ple_layer_ids` (one-indexed) DeltaNet layers: the token's n-grams (2 to
  `ngram_size` tokens, none reaching across an `eos_token_id`, tokens before the sequence eos) hashed by
  `heads_per_ngram` multiplicative hashes each (odd SplitMix64 multipliers from `seed` and the PLE layer's index,
  XOR-combined, modulo a distinct prime at or above `ngram_vocab_size_base` per head) into one table; the
  concatenated rows give a value and a key per stream, the key against the normalised stream a signed-sqrt gate
  on the value, and a dilated (`ngram_size`) depthwise convolution of `ple_conv_kernel_size` taps over the
  normalised gated values adds local context. What PLE writes is added to the streams before the layer reads them.
  Its state per sequence beside the DeltaNet's: the last `ngram_size - 1` token ids and the convolution's inputs.
- QSA on the attention layers: an indexer projects `indexer_n_heads` query heads (RMS-normed, rotated as the
  attention's queries) and one raw key per token (its cache layer); a query averages the keys of every complete
  block of `indexer_compress_ratio` keys it sees, normalises and rotates the averages at the block's first
  position, scores each block sum_h relu(q_h . k) / sqrt(indexer_head_dim), and attends to the tokens of its
  `indexer_budget / indexer_compress_ratio` best blocks plus those past the last complete block (itself among
  them).

How it runs: the DeltaNet layers (gated_deltanet.py) and the experts are the shared decoder's; the gated residuals,
PLE and the QSA attention are PyTorch ops (no new GPU kernels): decode rows one batched pass (the indexer over
their whole block tables, keys past a sequence's length masked), prompt chunks looped per sequence on the host.
Decode graphs are off (`decode_graphs`): none of this has been captured in a CUDA graph.

Refused by name: `layer_types` other than "linear_attention" / "indexed_attention" ("full_attention", as the
release writes it, read as "indexed_attention", as transformers reads it), attention layers without the five
`indexer_*` options (transformers builds every one with an indexer), `indexer_kv_heads` other than 1,
`indexer_budget` not a multiple of `indexer_compress_ratio`, `indexer_head_dim` narrower than the rotated dims,
`output_gate_type` / `hidden_act` other than silu, `hc_count` below 2, `ple_layer_ids` outside the DeltaNet layers
or without an `eos_token_id`, `ple_embed_dim` not a multiple of the n-gram heads, attention biases, tensor
parallelism and FP8 linears. The published n-gram tables come in `split_ngram_parts` shards
(`ngram_embedding.shard_{k}.weight`), read as their concatenation, as transformers reads them."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models import qwen3_next
from tritonformer.backend.models.hy_v4 import HyV4Decoder, IndexedKvCache
from tritonformer.backend.models.hyper_connections import (GatedResidual, expand, gated_residual_shapes,
                                                           grouped_rms_norm)
from tritonformer.backend.models.moe import MoeSpec, num_experts
from tritonformer.backend.models.multimodal import mrope_as_rotary, text_part
from tritonformer.backend.models.paged_gather import table_slots
from tritonformer.backend.models.qwen3_next import HybridDecoder, HybridSpec

TEXT_TYPE = "qwen4_exp_text"
# transformers' Qwen4ExpTextConfig defaults, where a config.json leaves them out
DEFAULTS = {"vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
            "num_key_value_heads": 2, "head_dim": 256, "hidden_act": "silu", "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10, "num_experts": 512,
            "norm_topk_prob": True, "hc_count": 4, "hc_lowrank": 320, "ple_conv_kernel_size": 4, "ngram_size": 3,
            "heads_per_ngram": 8, "ngram_vocab_size_base": 20_000_000, "make_ngram_vocab_size_divisible_by": 128,
            "seed": 1234}
QSA = ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")
INDEXER = "self_attn.indexer."
PLE = "ple."


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The multimodal checkpoint's text model (its config and tensors, as qwen3_5's); the rotary as the plain one
    for text (a whole head where the config does not say: transformers' default here, not Qwen3.5's quarter);
    each attention layer's q_proj split into the query and its output gate (qwen3_next.gate_split)."""
    if cfg.get("model_type") == "qwen4_exp":
        tie = bool(cfg.get("tie_word_embeddings")) or bool((cfg.get("text_config") or {}).get("tie_word_embeddings"))
        cfg, state = text_part(cfg, state, TEXT_TYPE)
        cfg = {**cfg, "tie_word_embeddings": tie}
    elif any("language_model." in name for name in state):
        state = text_part({"text_config": cfg}, state, cfg.get("model_type"))[1]
    cfg = {**DEFAULTS, **cfg}
    partial = _partial(cfg)
    cfg = {**mrope_as_rotary(cfg, int(cfg["head_dim"] * partial)), "partial_rotary_factor": partial}
    return cfg, qwen3_next.gate_split(cfg, state)


def _partial(cfg: dict) -> float:
    """The share of each head that rotates: the whole head where the config does not say (transformers' default
    for this config, where Qwen3.5's is a quarter)."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    return params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))


@dataclass(frozen=True)
class Qwen4ExpSpec(HybridSpec):
    """HybridSpec plus the gated residuals, PLE and the QSA indexers."""

    hc_count: int = 4
    hc_lowrank: int = 320
    index_heads: int = 0
    index_head_dim: int = 0
    index_budget: int = 0
    index_block: int = 1  # indexer_compress_ratio
    ple_layers: tuple[int, ...] = ()  # per layer its PLE index (0, 1, ... in layer order), -1: none
    ple_embed_dim: int = 0
    ple_kernel: int = 4
    ngram_size: int = 3
    heads_per_ngram: int = 8
    ngram_base: int = 20_000_000
    ngram_divisor: int = 128
    seed: int = 1234
    eos: int = 0
    fp8_refused: bool = True

    def layer_pre_norms(self, layer: int) -> bool:
        return False  # (the gated residuals normalise the streams: no norm before attention or the experts)

    def check_split(self, tp) -> None:
        raise ValueError(f"tensor parallelism is not supported for model_type {TEXT_TYPE!r} (supported: one GPU)")

    @property
    def ngram_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    def ngram_rows(self, ple_index: int) -> int:
        """Rows of PLE layer `ple_index`'s table: its heads' primes summed, padded to ngram_divisor."""
        total = sum(ngram_primes(self.ngram_base, (ple_index + 1) * self.ngram_heads)[-self.ngram_heads:])
        return -(-total // self.ngram_divisor) * self.ngram_divisor

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...] | None]:
        """Beside the shared decoder's (client/model_shapes.tensor_shapes): the gated residuals, PLE and the
        indexers; no final norm."""
        n, h, rank = self.hc_count, self.hidden_size, self.hc_lowrank
        shapes: dict = {self.names.final_norm: None, **gated_residual_shapes("hyper_connection_mixer.", n, h, rank,
                                                                             final=True)}
        d, e = self.index_head_dim, self.ple_embed_dim
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes.update(gated_residual_shapes(p + "attn_hyper_connection.", n, h, rank)
                          | gated_residual_shapes(p + "mlp_hyper_connection.", n, h, rank))
            if self.mixer(i) is None:
                shapes.update({p + INDEXER + "index_qk_proj.weight": ((self.index_heads + 1) * d, h),
                               p + INDEXER + "q_layernorm.weight": (d,), p + INDEXER + "k_layernorm.weight": (d,)})
            if self.ple_layers[i] >= 0:
                q = p + PLE
                shapes.update({q + "ple_embedding.ngram_embedding.weight": (self.ngram_rows(self.ple_layers[i]),
                                                                            e // self.ngram_heads),
                               q + "key_proj.weight": (n * h, e), q + "value_proj.weight": (h, e),
                               q + "norm_key.weight": (n * h,), q + "norm_query.weight": (n * h,),
                               q + "norm_conv.weight": (n * h,), q + "conv1d.weight": (n * h, 1, self.ple_kernel)})
        return shapes


def from_hf(cfg: dict) -> Qwen4ExpSpec:
    if cfg.get("model_type") != TEXT_TYPE:
        raise ValueError(f"unsupported Qwen4-Exp text model_type {cfg.get('model_type')!r} (supported: {TEXT_TYPE})")
    cfg = {**DEFAULTS, **cfg}
    cfg["partial_rotary_factor"] = _partial(cfg)
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        every = cfg.get("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % every else "indexed_attention" for i in range(layers)]
    types = ["indexed_attention" if t == "full_attention" else t for t in types]
    if len(types) != layers or not set(types) <= {"linear_attention", "indexed_attention"}:
        raise ValueError(f"Qwen4-Exp with layer_types {types} is not supported (supported: layer_types, "
                         f"'linear_attention' or 'indexed_attention' for each of {layers} layers)")
    gate = cfg.get("output_gate_type") or cfg["hidden_act"]
    if gate != "silu":
        raise ValueError(f"Qwen4-Exp with output_gate_type {gate!r} is not supported (supported: output_gate_type "
                         f"silu, the DeltaNet's gated norm)")
    if cfg["hc_count"] < 2:
        raise ValueError(f"Qwen4-Exp with hc_count {cfg['hc_count']} is not supported (supported: hc_count 2 or more)")
    index = {}
    if "indexed_attention" in types:
        missing = [k for k in QSA if cfg.get(k) is None]
        if missing:
            raise ValueError(f"Qwen4-Exp with attention layers and {', '.join(missing)} unset is not supported "
                             f"(supported: {', '.join(missing)} set, as the other QSA options: transformers gives "
                             f"every attention layer a QSA indexer)")
        index = {k: int(cfg[k]) for k in QSA}
        for key, value in index.items():
            if value < 1:
                raise ValueError(f"Qwen4-Exp with {key} {value} is not supported (supported: {key} at least 1)")
        if index["indexer_kv_heads"] != 1:
            raise ValueError(f"Qwen4-Exp with indexer_kv_heads {index['indexer_kv_heads']} is not supported "
                             f"(supported: indexer_kv_heads 1)")
        if index["indexer_budget"] % index["indexer_compress_ratio"]:
            raise ValueError(f"Qwen4-Exp with indexer_budget {index['indexer_budget']} is not supported (supported: "
                             f"indexer_budget a multiple of indexer_compress_ratio {index['indexer_compress_ratio']})")
        rotated = int(cfg["head_dim"] * cfg.get("partial_rotary_factor", 1.0))
        if index["indexer_head_dim"] < rotated:
            raise ValueError(f"Qwen4-Exp with indexer_head_dim {index['indexer_head_dim']} is not supported "
                             f"(supported: indexer_head_dim at least the {rotated} rotated dims of a head)")
    ple_ids = sorted(set(cfg.get("ple_layer_ids") or []))
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    ngram_heads = (cfg["ngram_size"] - 1) * cfg["heads_per_ngram"]
    ple_dim = cfg.get("ple_embed_dim") or cfg["hidden_size"]
    if ple_ids:
        if any(not 1 <= i <= layers or types[i - 1] != "linear_attention" for i in ple_ids):
            raise ValueError(f"Qwen4-Exp with ple_layer_ids {ple_ids} is not supported (supported: ple_layer_ids "
                             f"of linear_attention layers, counted from 1)")
        if eos is None or isinstance(eos, list):
            raise ValueError("Qwen4-Exp with ple_layer_ids and eos_token_id unset is not supported (supported: "
                             "eos_token_id set: PLE's n-grams stop at it)")
        if ngram_heads < 1 or ple_dim % ngram_heads:
            raise ValueError(f"Qwen4-Exp with ple_embed_dim {ple_dim} is not supported (supported: ple_embed_dim a "
                             f"multiple of the {ngram_heads} n-gram heads, (ngram_size - 1) x heads_per_ngram)")
    moe = MoeSpec(num_experts=num_experts(cfg, 512), top_k=cfg["num_experts_per_tok"],
                  intermediate_size=cfg["moe_intermediate_size"], normalize=bool(cfg["norm_topk_prob"]),
                  round_weights=True, layers=(True,) * layers,
                  shared_intermediate_size=cfg["shared_expert_intermediate_size"])
    hybrid = {**cfg, "intermediate_size": cfg["moe_intermediate_size"],
              "layer_types": ["full_attention" if t == "indexed_attention" else t for t in types]}
    spec = qwen3_next.hybrid_spec(hybrid, "Qwen4-Exp", grouped_in_proj=False, moe=moe)
    return Qwen4ExpSpec(**{f.name: getattr(spec, f.name) for f in fields(HybridSpec)},
                        hc_count=cfg["hc_count"], hc_lowrank=cfg["hc_lowrank"],
                        index_heads=index.get("indexer_n_heads", 0), index_head_dim=index.get("indexer_head_dim", 0),
                        index_budget=index.get("indexer_budget", 0),
                        index_block=index.get("indexer_compress_ratio", 1),
                        ple_layers=tuple(ple_ids.index(i + 1) if i + 1 in ple_ids else -1 for i in range(layers)),
                        ple_embed_dim=ple_dim, ple_kernel=cfg["ple_conv_kernel_size"], ngram_size=cfg["ngram_size"],
                        heads_per_ngram=cfg["heads_per_ngram"], ngram_base=cfg["ngram_vocab_size_base"],
                        ngram_divisor=cfg["make_ngram_vocab_size_divisible_by"], seed=cfg["seed"],
                        eos=eos if eos is not None else 0)


# N-gram hashing (PLE): SplitMix64 (Steele, Lea and Flood) draws each PLE layer's odd multipliers
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix64(x: int) -> int:
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def ngram_multipliers(vocab: int, n: int, ple_index: int, seed: int) -> list[int]:
    """PLE layer `ple_index`'s n odd multipliers, small enough that id x multiplier fits in an int64."""
    half = max(1, ((1 << 63) - 1) // max(vocab, 1) // 2)
    start = seed + 10007 * ple_index
    return [2 * (_splitmix64((start + _GOLDEN * (j + 1)) & _MASK64) % half) + 1 for j in range(n)]


def _is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def ngram_primes(base: int, count: int) -> list[int]:
    """The first `count` primes at or above `base`: global n-gram head g's table size is the g-th (from 0)."""
    primes, n = [], base
    while len(primes) < count:
        if _is_prime(n):
            primes.append(n)
        n += 1
    return primes


def ngram_ids(history: torch.Tensor, new: int, eos: int, multipliers: torch.Tensor, sizes: torch.Tensor,
              offsets: torch.Tensor, per: int) -> torch.Tensor:
    """The table rows `[R, new, heads]` of the last `new` tokens of each row of `history` `[R, L]` (int64, the
    first L - new of it the ngram_size - 1 tokens before them). The token k back is eos where an eos lies
    between (from it to the token before this one); n-gram g of a token XORs its g tokens' products with the
    multipliers, hashed by its `per` heads' primes `sizes`, at their `offsets` in the one table."""
    length = history.shape[1]
    here = torch.arange(length - new, length, device=history.device)
    seen = F.pad((history == eos).long().cumsum(1), (1, 0))  # seen[:, p]: the eos among positions before p
    mixed, heads = None, []
    for k in range(multipliers.shape[0]):
        back = here - k
        blocked = seen[:, here] - seen[:, back] > 0
        token = torch.where(blocked, torch.full_like(history[:, back], eos), history[:, back])
        term = token * multipliers[k]
        mixed = term if mixed is None else torch.bitwise_xor(mixed, term)
        if k:  # the (k + 1)-gram's heads
            part = slice((k - 1) * per, k * per)
            heads.append(torch.remainder(mixed[..., None], sizes[part]) + offsets[part])
    return torch.cat(heads, dim=-1)


@dataclass
class _Ple:
    table: torch.Tensor  # [rows, ple_embed_dim / ngram heads]
    sizes: torch.Tensor  # [ngram heads] int64: each head's prime
    offsets: torch.Tensor  # [ngram heads] int64
    multipliers: torch.Tensor  # [ngram_size] int64
    key_w: torch.Tensor  # [N H, ple_embed_dim]
    value_w: torch.Tensor  # [H, ple_embed_dim]
    norm_key: torch.Tensor  # [N H] fp32, 1 + w (and the two below)
    norm_query: torch.Tensor
    norm_conv: torch.Tensor
    conv: torch.Tensor  # [N H, taps] fp32


@dataclass
class _Indexer:
    qk_w: torch.Tensor  # [(heads + 1) D, hidden]: the query heads, then the one key
    q_norm: torch.Tensor  # [D] fp32, 1 + w
    k_norm: torch.Tensor  # [D] fp32, 1 + w
    cache_layer: int  # its raw keys' cache layer (after the attention layers')


@dataclass
class _Extras:
    attn: GatedResidual
    mlp: GatedResidual
    indexer: _Indexer | None
    ple: _Ple | None


class Qwen4ExpDecoder(IndexedKvCache, HybridDecoder):
    decode_graphs = False  # (the PyTorch parts above have not been captured in a CUDA graph)

    def __init__(self, config: Qwen4ExpSpec, state: dict, device, dtype, tp=None):
        if tp is not None:
            config.check_split(tp)
        c = config
        # (no final norm: the shared decoder's loader reads one, never used here; an identity 1 + 0)
        state = {c.names.final_norm: torch.zeros(c.hidden_size), **_whole_tables(state)}
        super().__init__(config, state, device, dtype)
        n, h, rank = c.hc_count, c.hidden_size, c.hc_lowrank
        sizes = (f"hidden {h}, hc_count {n}, hc_lowrank {rank}, indexer {c.index_heads} x {c.index_head_dim}, "
                 f"ple_embed_dim {c.ple_embed_dim}")

        def weight(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            return self.weight(self.checked(state, name, shape, sizes))

        def offset(name: str, shape: tuple[int, ...]) -> torch.Tensor:  # a (1 + w) norm's weight as applied, fp32
            return state[self.checked(state, name, shape, sizes)].to(device=device, dtype=torch.float32) + 1.0

        def residual(prefix: str, final: bool = False) -> GatedResidual:
            shapes = list(gated_residual_shapes(prefix, n, h, rank, final).items())
            return GatedResidual(offset(*shapes[0]), weight(*shapes[1]), weight(*shapes[2]),
                                 None if final else weight(*shapes[3]), c.norm_eps)

        self.extras: list[_Extras] = []
        index_layers = 0
        shapes = c.extra_tensor_shapes()
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}."
            indexer = ple = None
            if layer.mixer is None:
                q = p + INDEXER
                indexer = _Indexer(weight(q + "index_qk_proj.weight", shapes[q + "index_qk_proj.weight"]),
                                   offset(q + "q_layernorm.weight", (c.index_head_dim,)),
                                   offset(q + "k_layernorm.weight", (c.index_head_dim,)),
                                   self.num_kv_layers + index_layers)
                index_layers += 1
            if c.ple_layers[i] >= 0:
                ple = self._load_ple(c.ple_layers[i], p + PLE, shapes, weight, offset)
            self.extras.append(_Extras(residual(p + "attn_hyper_connection."), residual(p + "mlp_hyper_connection."),
                                       indexer, ple))
        self.index_layers = index_layers
        self.final_mix = residual("hyper_connection_mixer.", final=True)

    def _load_ple(self, index: int, prefix: str, shapes: dict, weight, offset) -> _Ple:
        c = self.config
        heads = c.ngram_heads
        primes = ngram_primes(c.ngram_base, (index + 1) * heads)[-heads:]
        offsets = [sum(primes[:j]) for j in range(heads)]
        as_long = dict(dtype=torch.long, device=self.device)
        mult = ngram_multipliers(c.vocab_size, c.ngram_size, index, c.seed)
        names = ("ple_embedding.ngram_embedding.weight", "key_proj.weight", "value_proj.weight")
        table, key_w, value_w = (weight(prefix + name, shapes[prefix + name]) for name in names)
        norms = (offset(prefix + name, shapes[prefix + name]) for name in ("norm_key.weight", "norm_query.weight",
                                                                           "norm_conv.weight"))
        conv = weight(prefix + "conv1d.weight", shapes[prefix + "conv1d.weight"]).float()
        return _Ple(table, torch.tensor(primes, **as_long), torch.tensor(offsets, **as_long),
                    torch.tensor(mult, **as_long), key_w, value_w, *norms, conv.view(conv.shape[0], -1))

    def load_mixer(self, i: int, prefix: str, weight, read):
        """The DeltaNet (qwen3_next's), with PLE's state beside its own on a PLE layer: the last ngram_size - 1
        token ids (+ 1: a fresh slot's zeros read as eos) and the convolution's last (taps - 1) x ngram_size
        inputs."""
        mixer = super().load_mixer(i, prefix, weight, read)
        c = self.config
        if c.ple_layers[i] >= 0:
            mixer.state_shapes = {**mixer.state_shapes, "ple_tokens": (c.ngram_size - 1,),
                                  "ple_conv": ((c.ple_kernel - 1) * c.ngram_size, c.hc_count * c.hidden_size)}
        return mixer

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The collapsed streams' rows `[S, hidden]` for `batch.logits_index` (what the output head reads)."""
        c = self.config
        cos_sin = self.rope_cos_sin[batch.positions]
        cos, sin = cos_sin[:, 0], cos_sin[:, 1]
        s = expand(self._embed(batch.input_ids), c.hc_count)
        chunks = HyV4Decoder._chunks(batch)
        for layer, extra in zip(self.layers, self.extras):
            state = cache.state.layer(layer.state_index) if layer.mixer is not None else None
            if extra.ple is not None:
                s = s + self._ple(s, extra.ple, batch, state, chunks)
            x, inject = extra.attn.read(s)
            if layer.mixer is not None:
                out = layer.mixer(x, None, batch, state)
            else:
                out = self._indexed_attention(x, layer, extra.indexer, batch, cache, cos, sin, chunks)
            s = GatedResidual.write(s, out, inject)
            x, inject = extra.mlp.read(s)
            s = GatedResidual.write(s, layer.moe(x, self.activation), inject)
        if not batch.logits_every_row:
            s = s[batch.logits_index]
        return self.final_mix.read(s)[0]

    def _ple(self, s: torch.Tensor, ple: _Ple, batch: DecoderBatch, state: dict, chunks: list) -> torch.Tensor:
        """What PLE adds to the streams s `[T, N, H]`; its state (token ids, convolution inputs) moved on."""
        c = self.config
        t, n, h = s.shape
        ids = batch.input_ids.long()
        context = c.ngram_size - 1
        tokens, held = state["ple_tokens"], state["ple_conv"]
        rows = torch.empty(t, c.ngram_heads, dtype=torch.long, device=s.device)
        groups = []  # (rows, their slots, one sequence's chunk or decode rows one a sequence)
        d = batch.num_decode
        if d:
            groups.append((slice(0, d), batch.state_slots[:d], False))
        groups += [(rows_j, batch.state_slots[d + j : d + j + 1], True) for j, (rows_j, _) in enumerate(chunks)]
        for part, slots, chunk in groups:
            before = tokens[slots].long() - 1  # [R, context]; -1: before the sequence
            before = torch.where(before < 0, torch.full_like(before, c.eos), before)
            new = ids[part].view(1, -1) if chunk else ids[part].view(-1, 1)
            history = torch.cat([before, new], dim=1)
            rows[part] = ngram_ids(history, new.shape[1], c.eos, ple.multipliers, ple.sizes, ple.offsets,
                                   c.heads_per_ngram).view(-1, c.ngram_heads)
            tokens[slots] = (history[:, history.shape[1] - context:] + 1).to(tokens.dtype)
        e = F.embedding(rows, ple.table).flatten(1)  # [T, ple_embed_dim]
        key = grouped_rms_norm(F.linear(e, ple.key_w).view(t, n, h), ple.norm_key, c.norm_eps)
        value = F.linear(e, ple.value_w)
        query = grouped_rms_norm(s, ple.norm_query, c.norm_eps)
        gate = (key * query).sum(-1, keepdim=True) / math.sqrt(h)
        gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
        gated = torch.sigmoid(gate) * value[:, None, :]  # [T, N, H]
        normed = grouped_rms_norm(gated, ple.norm_conv, c.norm_eps).flatten(1)
        conv = torch.empty_like(normed)
        taps, stride, back = ple.conv.shape[1], c.ngram_size, held.shape[1]
        for part, slots, chunk in groups:
            x = normed[part].float()
            buf = torch.cat([held[slots[0]], x]) if chunk else torch.cat([held[slots], x[:, None]], dim=1)
            rows_n = x.shape[0] if chunk else 1
            out = 0
            for j in range(taps):  # tap j reads the input (taps - 1 - j) x ngram_size rows back
                start = back - (taps - 1 - j) * stride
                window = buf[start : start + rows_n] if chunk else buf[:, start]
                out = out + window * ple.conv[:, j]
            conv[part] = F.silu(out.to(s.dtype)).view(-1, n * h) if chunk else F.silu(out.to(s.dtype))
            if chunk:
                held[slots[0]] = buf[buf.shape[0] - back:]
            else:
                held[slots] = buf[:, 1:]
        return (gated.flatten(1) + conv).view(t, n, h)

    def _indexed_attention(self, x, layer, ix: _Indexer, batch: DecoderBatch, cache: PagedKVCache, cos, sin,
                           chunks: list) -> torch.Tensor:
        """Gated attention over the keys QSA chooses (PyTorch ops): q, k, v and the cache write as the shared
        decoder's, the indexer's raw keys to its cache layer, each query row's choice, the output gate and
        o_proj."""
        c, kv = self.config, layer.kv_index
        t, d, heads = x.shape[0], c.index_head_dim, c.index_heads
        gate = kernels.linear_act(x, layer.attn_gate_w)
        q = kernels.prenorm_qkv_to_cache(x, None, layer.qkv_w, layer.qkv_b, c.num_heads, c.num_kv_heads, c.head_dim,
                                         cos, sin, cache.keys(kv), cache.values(kv), batch.slot_mapping,
                                         q_norm=layer.q_norm, k_norm=layer.k_norm, norm_eps=c.norm_eps)
        qk = kernels.linear_act(x, ix.qk_w)
        iq = _head_norm(qk[:, : heads * d].reshape(t, heads, d), ix.q_norm, c.norm_eps)
        r = c.rotary_dim or c.head_dim  # (the table's first r / 2 columns; the rest leave their pairs alone)
        kernels.rotary_in_place(iq[:, :, :r], cos[:, : r // 2], sin[:, : r // 2])
        index_keys = cache.keys(ix.cache_layer).view(-1, d)
        index_keys[batch.slot_mapping] = qk[:, heads * d :]
        keys = cache.keys(kv).view(-1, c.num_kv_heads, c.head_dim)
        values = cache.values(kv).view(-1, c.num_kv_heads, c.head_dim)
        bs, nd = cache.block_size, batch.num_decode
        scale = c.attn_scale if c.attn_scale is not None else c.head_dim ** -0.5
        out = torch.empty_like(q)
        if nd:  # every slot of each row's block table (past its length masked): no host sync
            slots = table_slots(batch.decode_tables, bs)
            keep = self._choice(iq[:nd], index_keys[slots], batch.decode_seqlens.long() - 1, ix)
            out[:nd] = _attention(q[:nd], keys[slots], values[slots], keep, scale)
        for j, (rows, length) in enumerate(chunks):
            slots = table_slots(batch.prefill_tables[j : j + 1], bs)[0, :length]
            count = rows.stop - rows.start
            positions = torch.arange(length - count, length, device=x.device)
            keep = self._choice(iq[rows], index_keys[slots][None], positions, ix)
            out[rows] = _attention(q[rows], keys[slots][None].expand(count, -1, -1, -1),
                                   values[slots][None].expand(count, -1, -1, -1), keep, scale)
        ctx = out.reshape(t, -1) * torch.sigmoid(gate)
        return kernels.linear_act(ctx, layer.o_w, layer.o_b)

    def _choice(self, iq: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, ix: _Indexer) -> torch.Tensor:
        """Which keys `[R, L]` query rows iq `[R, heads, D]` at `positions` `[R]` attend to, over raw index keys
        `[B, L, D]` (B: R, or 1 shared): each complete block's mean key, normed and rotated at its first position,
        scored sum_h relu(q_h . k) / sqrt(D); the best blocks' tokens and those past the last complete block."""
        c = self.config
        size, (b, length, d) = c.index_block, keys.shape
        count = length // size
        at = torch.arange(length, device=iq.device)
        seen = (positions + 1) // size * size  # [R]: the tokens of complete blocks
        tail = (at[None, :] >= seen[:, None]) & (at[None, :] <= positions[:, None])
        if count == 0:
            return tail
        blocks = keys[:, : count * size].float().view(b, count, size, d).mean(2).to(keys.dtype)
        blocks = _head_norm(blocks, ix.k_norm, c.norm_eps).reshape(b * count, 1, d)
        starts = (torch.arange(count, device=iq.device) * size).clamp(max=self.rope_cos_sin.shape[0] - 1)
        r = c.rotary_dim or c.head_dim
        table = self.rope_cos_sin[starts, :, : r // 2].repeat(b, 1, 1)
        kernels.rotary_in_place(blocks[:, :, :r], table[:, 0], table[:, 1])
        blocks = blocks.view(b, count, d).float()
        scores = torch.relu(torch.einsum("rhd,rnd->rhn", iq.float(), blocks.expand(iq.shape[0], -1, -1)))
        scores = scores.sum(1) / math.sqrt(d)  # [R, blocks]
        complete = (torch.arange(count, device=iq.device) * size + size)[None, :] <= positions[:, None] + 1
        scores = scores.masked_fill(~complete, float("-inf"))
        top, index = scores.topk(min(c.index_budget // size, count), dim=-1)
        chosen = torch.zeros_like(complete).scatter_(1, index, top > float("-inf"))
        in_block = F.pad(chosen.repeat_interleave(size, dim=1), (0, length - count * size), value=False)
        return in_block | tail


def _head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """An RMSNorm over each head's last dim (fp32, times the 1 + w weight), rounded back to x's dtype."""
    h = x.float()
    return (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


def _attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, keep: torch.Tensor,
               scale: float) -> torch.Tensor:
    """Queries `[R, H, d]` over keys / values `[R, L, kv, d]` where `keep` `[R, L]`, fp32, rounded to q's dtype."""
    group = q.shape[1] // keys.shape[2]
    k = keys.float().repeat_interleave(group, dim=2)
    v = values.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("rhd,rkhd->rhk", q.float(), k) * scale
    probs = torch.softmax(scores.masked_fill(~keep[:, None, :], float("-inf")), dim=-1)
    # (slots past a sequence's keys were never written: whatever they hold, NaN included, must not reach the sum)
    v = v.masked_fill(~keep[:, :, None, None], 0.0)
    return torch.einsum("rhk,rkhd->rhd", probs, v).to(q.dtype)


def _whole_tables(state: dict) -> dict:
    """The checkpoint's tensors with each PLE table given in shards (`ngram_embedding.shard_{k}.weight`, the
    release's `split_ngram_parts`) as the one table they are pieces of (rows in shard order)."""
    shards: dict[str, list[tuple[int, str]]] = {}
    for name in state:
        head, sep, rest = name.partition("ngram_embedding.shard_")
        if sep and rest.endswith(".weight") and rest[: -len(".weight")].isdigit():
            shards.setdefault(head + "ngram_embedding.weight", []).append((int(rest[: -len(".weight")]), name))
    if not shards:
        return state
    out = {name: t for name, t in state.items() if "ngram_embedding.shard_" not in name}
    for whole, parts in shards.items():
        out[whole] = torch.cat([_read(state[name]) for _, name in sorted(parts)])
    return out


def _read(t) -> torch.Tensor:
    return t if isinstance(t, torch.Tensor) else t[:]


MODEL = Qwen4ExpDecoder
