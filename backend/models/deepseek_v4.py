"""DeepSeek-V4 (`deepseek_v4`): shared-key-value attention over a sliding window plus compressed keys, in a residual
of Sinkhorn hyper-connections, every layer MoE.

- Residual: `hc_mult` streams a token (hyper_connections.SinkhornHyperConnection): each sub-layer reads a
  sigmoid-weighted mix of them, writes its output back times 2 sigmoid(.) per stream, and the streams mix among
  themselves through a doubly stochastic matrix (`hc_sinkhorn_iters` Sinkhorn steps); a HyperHead collapses them
  before the final norm.
- Attention: queries from a latent (q_a_proj, RMSNorm q_a_norm, q_b_proj), each head then RMS-normalised without a
  weight; one key-value head (kv_proj, RMSNorm kv_norm) read as both key and value. The rotary is interleaved (pairs
  of neighbouring dims) on the last `qk_rope_head_dim` = head_dim * partial_rotary_factor dims; the values carry it
  too, so each head's output is rotated back (sin negated) at the query's position. Learnt per-head sinks. The
  output: heads in `o_groups` groups, each projected to `o_lora_rank` (o_a_proj, block-diagonal), then o_b_proj.
- Keys: the last `sliding_window` tokens' (the query's own included), and in a compressed layer entries of m
  tokens each. An entry of window w (tokens w m .. w m + m - 1) is sum_j softmax_j(gate_j + position_bias_j) kv_j
  (the compressor's own kv_proj / gate_proj, softmax in fp32), RMS-normed (its kv_norm) and rotated at position w m
  with the compressed layers' rotary; a query at p sees the entries of windows that end at or before p.
  "heavily_compressed_attention" (HCA, m = compress_rates' 128): every such entry. "compressed_sparse_attention"
  (CSA, m = 4): kv / gate twice head_dim wide, entry w mixing the first halves of window w - 1 with the second
  halves of window w (2m slots); an indexer (the same compression at `index_head_dim`, with its own weights) keeps
  the `index_topk` entries of highest sum_h w_h relu(q_h . k) (q_h from q_b_proj of the query latent, rotated;
  w = weights_proj(x) / sqrt(index_n_heads); scores / sqrt(index_head_dim)). "sliding_attention": the window only,
  with the main rotary (rope_theta) where compressed layers use compress_rope_theta.
- MLP: `n_routed_experts` experts, each a SwiGLU clamped at `swiglu_limit` (the gate at most it, the up half within
  +-it), scored sqrt(softplus(logit)) (`scoring_func` sqrtsoftplus, or sigmoid); "hash_moe" layers take the experts
  `tid2eid[token id]` (a table in the checkpoint), "moe" layers the top `num_experts_per_tok` of score +
  e_score_correction_bias; the chosen scores renormalised (transformers always renormalises) times
  `routed_scaling_factor`; plus one shared expert, clamped alike.

How it runs: the attention, compressors, indexer, hyper-connections and experts in PyTorch ops (no new kernels),
each sequence's rows on the host in turn: no decode graphs (`decode_graphs`). The paged cache holds, at each
token's own slot: the window's key (keys of the layer's first cache layer), the compressor's kv and gate (a second
layer's keys and values) and, for CSA, the indexer's (a third); an entry of window w is written, once its last
token (w m + m - 1) runs, at that token's slot (values of the first layer; the indexer's keys of a fourth): so every
slot depends on its prefix only, and prefix caching and recompute after preemption hold.

Refused by name: `layer_types` / `mlp_layer_types` of other kinds, `scoring_func` other than sqrtsoftplus or sigmoid,
`hidden_act` other than silu, `n_shared_experts` other than 1, a compress rate below 1, `swiglu_limit` at or below
zero, `o_groups` not dividing the heads, rope types that vary by position (dynamic, longrope), tensor parallelism and
FP8 (decoder.py: not the shared decoder's spec). The multi-token-prediction layers (`mtp.`) are not read; tensors
under the published names are renamed as transformers renames them (`adapt`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel, eos_ids
from tritonformer.backend.models.hyper_connections import (SinkhornHyperConnection, expand, hc_tensor_shapes,
                                                           load_hyper_head, load_sinkhorn_hyper_connection)
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import tensors_renamed

# transformers' DeepseekV4Config defaults, where a config.json leaves them out
DEFAULTS = {"vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
            "num_attention_heads": 64, "head_dim": 512, "q_lora_rank": 1024, "num_experts_per_tok": 6,
            "n_routed_experts": 256, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus",
            "routed_scaling_factor": 1.5, "max_position_embeddings": 1048576, "rope_theta": 10000.0,
            "compress_rope_theta": 160000.0, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
            "swiglu_limit": 10.0, "sliding_window": 128, "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64,
            "index_head_dim": 128, "index_topk": 512, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False}
COMPRESS_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
KINDS = {"sliding_attention": "sliding", "compressed_sparse_attention": "csa", "heavily_compressed_attention": "hca"}
LEGACY_RATIOS = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
HC_MAGNITUDE = 2.0  # (post = 2 sigmoid(.): transformers' constant)
# The published checkpoint (and transformers' save_pretrained, which writes its conversion mapping back) names the
# tensors otherwise than transformers' modules (`attn.wq_a`, `ffn.experts.E.w1`, `hc_attn_fn`, `ape`, ...);
# transformers renames them as it loads (its conversion mapping for deepseek_v4): these are the same renames, in its
# order, and the experts stacked as it stacks them (`_stack_experts`). Names already in its form pass unchanged.
CHECKPOINT_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"\.attn\.", ".self_attn."), (r"\.ffn\.", ".mlp."), (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"^embed\.weight", "embed_tokens.weight"), (r"^head\.weight", "lm_head.weight"),
    (r"^hc_head_(fn|base|scale)$", r"hc_head.hc_\1"), (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.ffn_norm\.", ".post_attention_layernorm."), (r"\.hc_attn_(fn|base|scale)$", r".attn_hc.\1"),
    (r"\.hc_ffn_(fn|base|scale)$", r".ffn_hc.\1"), (r"\.attn_sink", ".sinks"),
    (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."), (r"\.norm\.", ".kv_norm."),
    (r"\.ape$", ".position_bias"), (r"\.wq_a\.", ".q_a_proj."), (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."),
    (r"\.wkv\.", ".kv_proj."), (r"\.wgate\.", ".gate_proj."), (r"\.wo_a\.", ".o_a_proj."),
    (r"\.wo_b\.", ".o_b_proj."), (r"\.q_norm\.", ".q_a_norm."), (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."),
    (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj.")))
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(w1|w2|w3)\.weight$")


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors under transformers' names (CHECKPOINT_RENAMES), the multi-token-prediction layers
    (`mtp.`) left out, each layer's per-expert w1 / w3 / w2 stacked into gate_up_proj `[E, 2 I, hidden]` (w1's
    rows, then w3's) and down_proj `[E, hidden, I]`."""
    state = tensors_renamed({k: v for k, v in state.items() if not re.match(r"(^|.*\.)mtp\.", k)},
                            CHECKPOINT_RENAMES)
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name in [k for k in state if _EXPERT.match(k)]:
        prefix, e, w = _EXPERT.match(name).groups()
        experts.setdefault(prefix, {}).setdefault(int(e), {})[w] = state.pop(name)
    for prefix, by_expert in experts.items():
        order = sorted(by_expert)
        if order != list(range(len(order))) or any(set(by_expert[e]) != {"w1", "w2", "w3"} for e in order):
            raise ValueError(f"{prefix}: experts {order} without each one's w1, w2 and w3")
        state[prefix + ".gate_up_proj"] = torch.stack([torch.cat([by_expert[e]["w1"], by_expert[e]["w3"]])
                                                       for e in order])
        state[prefix + ".down_proj"] = torch.stack([by_expert[e]["w2"] for e in order])
    return cfg, state


@dataclass(frozen=True)
class DeepseekV4Spec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rope_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    intermediate_size: int
    experts: int
    top_k: int
    scoring: str
    routed_scale: float
    swiglu_limit: float
    kinds: tuple[str, ...]  # per layer: "sliding", "csa" or "hca"
    hashed: tuple[bool, ...]  # per layer: hash routing (tid2eid) or top-k
    csa_rate: int
    hca_rate: int
    window: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_iters: int
    hc_eps: float
    eps: float
    main_rope: Rope
    compress_rope: Rope
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...] = field(default=())

    family = "DeepSeek-V4"
    norm_offset = 0.0

    @property
    def num_kv_heads(self) -> int:
        return 1

    def rate(self, layer: int) -> int:
        return {"csa": self.csa_rate, "hca": self.hca_rate}.get(self.kinds[layer], 0)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint holds, under transformers' names (model_shapes.random_decoder)."""
        h, hd, n, e, inter = self.hidden_size, self.head_dim, self.hc_mult, self.experts, self.intermediate_size
        shapes = {"embed_tokens.weight": (self.vocab_size, h), "norm.weight": (h,),
                  **hc_tensor_shapes("hc_head.", n, h, head=True)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        for i, kind in enumerate(self.kinds):
            p, a = f"layers.{i}.", f"layers.{i}.self_attn."
            shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                           **hc_tensor_shapes(p + "attn_hc.", n, h, sinkhorn=True),
                           **hc_tensor_shapes(p + "ffn_hc.", n, h, sinkhorn=True),
                           a + "q_a_proj.weight": (self.q_lora_rank, h), a + "q_a_norm.weight": (self.q_lora_rank,),
                           a + "q_b_proj.weight": (self.num_heads * hd, self.q_lora_rank),
                           a + "kv_proj.weight": (hd, h), a + "kv_norm.weight": (hd,),
                           a + "o_a_proj.weight": (self.o_groups * self.o_lora_rank,
                                                   self.num_heads * hd // self.o_groups),
                           a + "o_b_proj.weight": (h, self.o_groups * self.o_lora_rank),
                           a + "sinks": (self.num_heads,)})
            if kind != "sliding":
                shapes.update(_compressor_shapes(a + "compressor.", h, hd, self.rate(i), kind == "csa"))
            if kind == "csa":
                ix = a + "compressor.indexer."
                shapes.update({**_compressor_shapes(ix, h, self.index_head_dim, self.csa_rate, True),
                               ix + "q_b_proj.weight": (self.index_heads * self.index_head_dim, self.q_lora_rank),
                               ix + "scorer.weights_proj.weight": (self.index_heads, h)})
            m = p + "mlp."
            shapes.update({m + "gate.weight": (e, h), m + "experts.gate_up_proj": (e, 2 * inter, h),
                           m + "experts.down_proj": (e, h, inter),
                           **{m + f"shared_experts.{k}_proj.weight": (inter, h) for k in ("gate", "up")},
                           m + "shared_experts.down_proj.weight": (h, inter)})
            shapes[m + ("gate.tid2eid" if self.hashed[i] else "gate.e_score_correction_bias")] = (
                (self.vocab_size, self.top_k) if self.hashed[i] else (e,))
        return shapes


def _compressor_shapes(prefix: str, hidden: int, width: int, rate: int, overlap: bool) -> dict:
    wide = 2 * width if overlap else width
    return {prefix + "kv_proj.weight": (wide, hidden), prefix + "gate_proj.weight": (wide, hidden),
            prefix + "position_bias": (rate, wide), prefix + "kv_norm.weight": (width,)}


def _refuse(what: str, supported: str) -> ValueError:
    return ValueError(f"DeepSeek-V4 with {what} is not supported (supported: {supported})")


def _ropes(cfg: dict) -> tuple[Rope, Rope]:
    """The main (sliding layers') and compressed layers' ropes, as transformers' config nests them: `main` at
    rope_theta, `compress` at compress_rope_theta with the checkpoint's scaling (YaRN's attention factor 1)."""
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
        main, compress = rp["main"], rp["compress"]
    else:
        scaling = {k: v for k, v in rp.items() if k not in ("main", "compress", "rope_theta")}
        main = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
        compress = {"rope_type": "default", **scaling, "rope_theta": cfg["compress_rope_theta"]}
        if compress.get("rope_type", compress.get("type")) == "yarn":
            compress.setdefault("attention_factor", 1.0)
    ropes = []
    for label, params in (("main", main), ("compress", compress)):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in ("default", "linear", "llama3", "yarn"):
            raise _refuse(f"rope_parameters {label} rope_type {kind!r}",
                          "rope_type default, linear, llama3 or yarn: one table for every position")
        ropes.append(Rope.from_hf(params, float(params.get("rope_theta", cfg["rope_theta"])),
                                  cfg["max_position_embeddings"]))
    return ropes[0], ropes[1]


def from_hf(cfg: dict) -> DeepseekV4Spec:
    cfg = {**DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    layers = cfg["num_hidden_layers"]
    rates = {**COMPRESS_RATES, **(cfg.get("compress_rates") or {})}
    if cfg.get("compress_rate_csa") is not None:
        rates["compressed_sparse_attention"] = cfg["compress_rate_csa"]
    if cfg.get("compress_rate_hca") is not None:
        rates["heavily_compressed_attention"] = cfg["compress_rate_hca"]
    types = cfg.get("layer_types")
    if types is None and cfg.get("compress_ratios") is not None:
        types = [LEGACY_RATIOS.get(r, r) for r in cfg["compress_ratios"]]
    if types is None:
        types = (["heavily_compressed_attention"] * min(layers, 2)
                 + ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
                    for i in range(max(layers - 2, 0))])
    types = list(types)[:layers]
    if len(types) != layers or not set(types) <= set(KINDS):
        raise _refuse(f"layer_types {types}", f"layer_types, one of {', '.join(map(repr, KINDS))} for each of "
                                               f"{layers} layers")
    mlp = cfg.get("mlp_layer_types")
    if mlp is None:
        hashed = cfg.get("num_hash_layers", 3)
        mlp = ["hash_moe"] * min(layers, hashed) + ["moe"] * max(0, layers - hashed)
    mlp = list(mlp)[:layers]
    if len(mlp) != layers or not set(mlp) <= {"hash_moe", "moe"}:
        raise _refuse(f"mlp_layer_types {mlp}", f"mlp_layer_types 'hash_moe' or 'moe' for each of {layers} layers")
    for kind in set(types) - {"sliding_attention"}:
        if int(rates[kind]) < 1:
            raise _refuse(f"compress_rates {kind} {rates[kind]}", "compress_rates of at least 1")
    if cfg["scoring_func"] not in ("sqrtsoftplus", "sigmoid"):
        raise _refuse(f"scoring_func {cfg['scoring_func']!r}", "scoring_func sqrtsoftplus or sigmoid")
    if cfg["hidden_act"] != "silu":
        raise _refuse(f"hidden_act {cfg['hidden_act']!r}", "hidden_act silu")
    if cfg["n_shared_experts"] != 1:
        raise _refuse(f"n_shared_experts {cfg['n_shared_experts']}",
                      "n_shared_experts 1: transformers builds one shared expert of moe_intermediate_size")
    if not cfg["swiglu_limit"] > 0:
        raise _refuse(f"swiglu_limit {cfg['swiglu_limit']}", "swiglu_limit above zero (the experts' clamp)")
    if cfg["num_attention_heads"] % cfg["o_groups"]:
        raise _refuse(f"o_groups {cfg['o_groups']}", f"o_groups dividing num_attention_heads "
                                                     f"{cfg['num_attention_heads']}")
    head_dim = cfg["head_dim"]
    factor = cfg.get("partial_rotary_factor")
    if factor is None:
        factor = cfg["qk_rope_head_dim"] / head_dim if cfg.get("qk_rope_head_dim") else 64 / 512
    rope_dim = int(head_dim * factor)
    if rope_dim % 2 or rope_dim > min(head_dim, cfg["index_head_dim"]):
        raise _refuse(f"a rotary of {rope_dim} dims", f"an even rotary of at most head_dim {head_dim} and "
                                                       f"index_head_dim {cfg['index_head_dim']} dims")
    main, compress = _ropes(cfg)
    return DeepseekV4Spec(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], num_layers=layers,
        num_heads=cfg["num_attention_heads"], head_dim=head_dim, rope_dim=rope_dim, q_lora_rank=cfg["q_lora_rank"],
        o_groups=cfg["o_groups"], o_lora_rank=cfg["o_lora_rank"], intermediate_size=cfg["moe_intermediate_size"],
        experts=cfg["n_routed_experts"], top_k=cfg["num_experts_per_tok"], scoring=cfg["scoring_func"],
        routed_scale=float(cfg["routed_scaling_factor"]), swiglu_limit=float(cfg["swiglu_limit"]),
        kinds=tuple(KINDS[t] for t in types), hashed=tuple(t == "hash_moe" for t in mlp),
        csa_rate=int(rates["compressed_sparse_attention"]), hca_rate=int(rates["heavily_compressed_attention"]),
        window=int(cfg["sliding_window"]), index_heads=cfg["index_n_heads"], index_head_dim=cfg["index_head_dim"],
        index_topk=int(cfg["index_topk"]), hc_mult=cfg["hc_mult"], hc_iters=int(cfg["hc_sinkhorn_iters"]),
        hc_eps=float(cfg["hc_eps"]), eps=float(cfg["rms_norm_eps"]), main_rope=main, compress_rope=compress,
        tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
        max_position_embeddings=cfg["max_position_embeddings"], eos_token_ids=eos_ids(cfg))


@dataclass
class _Compressor:
    kv_w: torch.Tensor  # [width or 2 width, hidden]
    gate_w: torch.Tensor
    position_bias: torch.Tensor  # [rate, kv_w rows] fp32
    norm: torch.Tensor  # [width] fp32
    rate: int
    overlap: bool  # CSA's two halves (window w - 1's first, window w's second)
    tokens_layer: int  # cache layer of each token's kv (keys) and gate (values)
    entries_layer: int  # cache layer whose `entries_in` part holds the entries
    entries_in: str  # "keys" or "values"


@dataclass
class _Layer:
    attn_hc: SinkhornHyperConnection
    ffn_hc: SinkhornHyperConnection
    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    q_a: torch.Tensor
    q_a_norm: torch.Tensor
    q_b: torch.Tensor
    kv_w: torch.Tensor
    kv_norm: torch.Tensor
    o_a: torch.Tensor  # [groups, o_lora_rank, heads * head_dim / groups]
    o_b: torch.Tensor
    sinks: torch.Tensor  # fp32
    kv_layer: int  # the window's keys (keys); HCA / CSA entries (values)
    compressor: _Compressor | None
    indexer: _Compressor | None
    index_q: torch.Tensor | None
    index_w: torch.Tensor | None
    router: torch.Tensor
    score_bias: torch.Tensor | None  # fp32
    tid2eid: torch.Tensor | None
    gate_up: torch.Tensor  # [E, 2 I, hidden]
    down: torch.Tensor  # [E, hidden, I]
    shared_gate: torch.Tensor
    shared_up: torch.Tensor
    shared_down: torch.Tensor


class DeepseekV4(DecoderModel):
    decode_graphs = False  # (each sequence's attention and the experts' ids read on the host)

    def __init__(self, config: DeepseekV4Spec, state: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, tp=None):
        if tp is not None:
            raise ValueError("tensor parallelism is not supported for model_type 'deepseek_v4' (supported: one GPU)")
        super().__init__(config, state, device, dtype)
        c = config
        shapes = c.tensor_shapes()

        def read(name: str, shape=None, dt=None) -> torch.Tensor:
            want = shapes[name] if shape is None else shape
            if name not in state:
                raise KeyError(f"checkpoint is missing weight {name!r}")
            if tuple(state[name].shape) != tuple(want):
                raise ValueError(f"{name} is {list(state[name].shape)}, the config says {list(want)} (hidden "
                                 f"{c.hidden_size}, heads {c.num_heads} x {c.head_dim}, hc_mult {c.hc_mult})")
            return state[name].to(device=device, dtype=dt or dtype).contiguous()

        def fp32(name: str, shape=None) -> torch.Tensor:
            return read(name, shape, torch.float32)

        hc = dict(streams=c.hc_mult, hidden=c.hidden_size, eps=c.hc_eps, norm_eps=c.eps)
        self.embed = read("embed_tokens.weight")
        layer_shapes: list[tuple[int, int]] = []

        def cache_layer(width: int) -> int:
            layer_shapes.append((1, width))
            return len(layer_shapes) - 1

        def compressor(prefix: str, width: int, rate: int, overlap: bool, entries_layer: int,
                       entries_in: str) -> _Compressor:
            tokens = cache_layer(2 * width if overlap else width)
            return _Compressor(read(prefix + "kv_proj.weight"), read(prefix + "gate_proj.weight"),
                               fp32(prefix + "position_bias"), fp32(prefix + "kv_norm.weight"), rate, overlap,
                               tokens, entries_layer, entries_in)

        self.layers: list[_Layer] = []
        for i, kind in enumerate(c.kinds):
            p, a, m = f"layers.{i}.", f"layers.{i}.self_attn.", f"layers.{i}.mlp."
            kv_layer = cache_layer(c.head_dim)
            comp = ix = index_q = index_w = None
            if kind != "sliding":
                comp = compressor(a + "compressor.", c.head_dim, c.rate(i), kind == "csa", kv_layer, "values")
            if kind == "csa":
                q = a + "compressor.indexer."
                ix = compressor(q, c.index_head_dim, c.csa_rate, True, cache_layer(c.index_head_dim), "keys")
                index_q, index_w = read(q + "q_b_proj.weight"), read(q + "scorer.weights_proj.weight")
            hashed = c.hashed[i]
            self.layers.append(_Layer(
                load_sinkhorn_hyper_connection(fp32, p + "attn_hc.", magnitude=HC_MAGNITUDE,
                                               sinkhorn_iters=c.hc_iters, **hc),
                load_sinkhorn_hyper_connection(fp32, p + "ffn_hc.", magnitude=HC_MAGNITUDE,
                                               sinkhorn_iters=c.hc_iters, **hc),
                fp32(p + "input_layernorm.weight"), fp32(p + "post_attention_layernorm.weight"),
                read(a + "q_a_proj.weight"), fp32(a + "q_a_norm.weight"), read(a + "q_b_proj.weight"),
                read(a + "kv_proj.weight"), fp32(a + "kv_norm.weight"),
                read(a + "o_a_proj.weight").view(c.o_groups, c.o_lora_rank, -1), read(a + "o_b_proj.weight"),
                fp32(a + "sinks"), kv_layer, comp, ix, index_q, index_w,
                read(m + "gate.weight"), None if hashed else fp32(m + "gate.e_score_correction_bias"),
                read(m + "gate.tid2eid", dt=torch.long) if hashed else None,
                read(m + "experts.gate_up_proj"), read(m + "experts.down_proj"),
                read(m + "shared_experts.gate_proj.weight"), read(m + "shared_experts.up_proj.weight"),
                read(m + "shared_experts.down_proj.weight")))
        self.layer_shapes = layer_shapes
        self.num_kv_layers = len(layer_shapes)
        self.hc_head = load_hyper_head(fp32, "hc_head.", norm_first=True, **hc)
        self.final_norm = fp32("norm.weight")
        self.set_output_head(self.embed if c.tie_word_embeddings else read("lm_head.weight"))

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        c = self.config
        return PagedKVCache(len(self.layer_shapes), num_blocks, block_size, 1, c.head_dim, self.device, self.dtype,
                            layer_shapes=self.layer_shapes)

    def kv_bytes_per_token(self) -> int:
        return 2 * sum(w for _, w in self.layer_shapes) * self.dtype.itemsize

    def _rms(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """RMSNorm in fp32 (the weight fp32 too, as transformers keeps it), rounded once."""
        xf = x.float()
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.config.eps)
        return (y if weight is None else weight * y).to(x.dtype)

    @staticmethod
    def _cos_sin(rope: Rope, positions: torch.Tensor, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None] * rope.inv_freq(dims, positions.device)
        scale = rope.cos_sin_scale()
        return angles.cos() * scale, angles.sin() * scale

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The interleaved rotary on the last 2 cos.shape[-1] dims of x `[T, heads, D]` (cos / sin `[T, r/2]`, in
        x's dtype as transformers casts them), in fp32, rounded once."""
        r = 2 * cos.shape[-1]
        cos, sin = cos.to(x.dtype).float()[:, None, :], sin.to(x.dtype).float()[:, None, :]
        rope = x[..., x.shape[-1] - r:].float()
        even, odd = rope[..., 0::2], rope[..., 1::2]
        rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
        return torch.cat([x[..., : x.shape[-1] - r], rotated.to(x.dtype)], dim=-1)

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        c = self.config
        seqs = _sequences(batch, cache.block_size)
        s = expand(self.embed[batch.input_ids], c.hc_mult)
        for layer in self.layers:
            gates = layer.attn_hc.read(s)
            out = self._attention(self._rms(gates.x, layer.attn_norm), layer, batch, cache, seqs)
            s = layer.attn_hc.write(s, out, gates)
            gates = layer.ffn_hc.read(s)
            s = layer.ffn_hc.write(s, self._moe(self._rms(gates.x, layer.mlp_norm), layer, batch.input_ids), gates)
        if not batch.logits_every_row:
            s = s[batch.logits_index]
        return self.logits(self._rms(self.hc_head(s), self.final_norm), fp32_logits)

    def _attention(self, x: torch.Tensor, layer: _Layer, batch: DecoderBatch, cache: PagedKVCache,
                   seqs: list) -> torch.Tensor:
        c = self.config
        t, heads, hd = x.shape[0], c.num_heads, c.head_dim
        rope = c.main_rope if layer.compressor is None else c.compress_rope
        cos, sin = self._cos_sin(rope, batch.positions, c.rope_dim)
        q_res = self._rms(F.linear(x, layer.q_a), layer.q_a_norm)
        q = F.linear(q_res, layer.q_b).view(t, heads, hd)
        q = q * torch.rsqrt(q.float().square().mean(-1, keepdim=True) + c.eps).to(q.dtype)
        q = self._rotate(q, cos, sin)
        kv = self._rotate(self._rms(F.linear(x, layer.kv_w), layer.kv_norm)[:, None], cos, sin)[:, 0]
        window_keys = cache.keys(layer.kv_layer).view(-1, hd)
        window_keys[batch.slot_mapping] = kv
        for comp in (layer.compressor, layer.indexer):
            if comp is not None:
                tokens_kv = cache.keys(comp.tokens_layer)
                tokens_kv.view(-1, tokens_kv.shape[-1])[batch.slot_mapping] = F.linear(x, comp.kv_w)
                cache.values(comp.tokens_layer).view(-1, tokens_kv.shape[-1])[batch.slot_mapping] = F.linear(
                    x, comp.gate_w)
        index_q = index_w = None
        if layer.indexer is not None:
            index_q = self._rotate(F.linear(q_res, layer.index_q).view(t, c.index_heads, c.index_head_dim), cos, sin)
            index_w = F.linear(x, layer.index_w).float() * c.index_heads ** -0.5
        out = torch.empty_like(q)
        for rows, length, slots in seqs:
            pos = batch.positions[rows]
            for comp in (layer.compressor, layer.indexer):
                if comp is not None:
                    self._compress(comp, cache, pos, slots, batch.slot_mapping[rows])
            keys = window_keys[slots]  # [L, hd]
            kpos = torch.arange(length, device=x.device)
            seen = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - c.window)
            if layer.compressor is not None:
                m = layer.compressor.rate
                entries = cache.values(layer.kv_layer).view(-1, hd)[slots[m - 1:: m]]  # [E, hd]
                ends = kpos[m - 1:: m]
                sees = ends[None, :] <= pos[:, None]
                if layer.indexer is not None and entries.shape[0]:
                    sees = sees & self._chosen(layer, cache, index_q[rows], index_w[rows], slots, sees)
                keys, seen = torch.cat([keys, entries]), torch.cat([seen, sees], dim=1)
            scores = torch.einsum("rhd,kd->rhk", q[rows], keys) * hd ** -0.5
            scores = scores.masked_fill(~seen[:, None, :], float("-inf"))
            sink = layer.sinks[None, :, None].expand(scores.shape[0], -1, 1)  # (fp32: the softmax runs in fp32)
            logits = torch.cat([scores.float(), sink], dim=-1)
            probs = torch.softmax(logits - logits.amax(-1, keepdim=True), dim=-1)[..., :-1]
            out[rows] = torch.einsum("rhk,kd->rhd", probs.to(keys.dtype), keys)
        out = self._rotate(out, cos, -sin).view(t, c.o_groups, -1)
        grouped = torch.einsum("tgi,goi->tgo", out, layer.o_a).reshape(t, -1)
        return F.linear(grouped, layer.o_b)

    def _compress(self, comp: _Compressor, cache: PagedKVCache, pos: torch.Tensor, slots: torch.Tensor,
                  row_slots: torch.Tensor) -> None:
        """The entries of the windows these rows (positions `pos`) close, each at its last token's slot."""
        m = comp.rate
        closing = (pos + 1) % m == 0
        if not bool(closing.any()):
            return
        ends, at = pos[closing], row_slots[closing]
        width = comp.norm.shape[0]
        tokens_kv, tokens_gate = cache.keys(comp.tokens_layer), cache.values(comp.tokens_layer)
        tokens_kv, tokens_gate = tokens_kv.view(-1, tokens_kv.shape[-1]), tokens_gate.view(-1, tokens_kv.shape[-1])
        offsets = torch.arange(m, device=pos.device)
        start = ends + 1 - m  # [W] first token of each window
        cur = slots[start[:, None] + offsets]  # [W, m]
        kv, gate = tokens_kv[cur], tokens_gate[cur].float() + comp.position_bias
        if comp.overlap:  # (window w - 1's first halves beside window w's second halves; none before window 0)
            prev = slots[(start[:, None] - m + offsets).clamp(min=0)]
            prev_gate = tokens_gate[prev][..., :width].float() + comp.position_bias[:, :width]
            prev_gate = prev_gate.masked_fill((start < m)[:, None, None], float("-inf"))
            kv = torch.cat([tokens_kv[prev][..., :width], kv[..., width:]], dim=1)
            gate = torch.cat([prev_gate, gate[..., width:]], dim=1)
        mixed = (kv * torch.softmax(gate, dim=1).to(kv.dtype)).sum(dim=1)
        cos, sin = self._cos_sin(self.config.compress_rope, start, self.config.rope_dim)
        entry = self._rotate(self._rms(mixed, comp.norm)[:, None], cos, sin)[:, 0]
        target = cache.keys(comp.entries_layer) if comp.entries_in == "keys" else cache.values(comp.entries_layer)
        target.view(-1, width)[at] = entry

    def _chosen(self, layer: _Layer, cache: PagedKVCache, q: torch.Tensor, w: torch.Tensor, slots: torch.Tensor,
                causal: torch.Tensor) -> torch.Tensor:
        """Which entries the indexer keeps for each row `[rows, E]`: the index_topk best of the causal ones."""
        c, ix = self.config, layer.indexer
        keys = cache.keys(ix.entries_layer).view(-1, c.index_head_dim)[slots[ix.rate - 1:: ix.rate]]  # [E, d]
        scores = torch.relu(torch.einsum("rhd,ed->rhe", q.float(), keys.float())) * c.index_head_dim ** -0.5
        scores = (scores * w[:, :, None]).sum(dim=1).masked_fill(~causal, float("-inf"))  # [rows, E]
        top = scores.topk(min(c.index_topk, scores.shape[1]), dim=-1).indices
        return torch.zeros_like(causal).scatter_(1, top, True)

    def _moe(self, x: torch.Tensor, layer: _Layer, ids: torch.Tensor) -> torch.Tensor:
        c = self.config
        logits = F.linear(x, layer.router)
        scores = F.softplus(logits).sqrt() if c.scoring == "sqrtsoftplus" else torch.sigmoid(logits)
        if layer.tid2eid is not None:
            chosen = layer.tid2eid[ids]
        else:
            chosen = torch.topk(scores + layer.score_bias, c.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, chosen)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * c.routed_scale
        limit = c.swiglu_limit

        def act(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
            return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)

        out = torch.zeros_like(x)
        for e in chosen.unique().tolist():  # (in expert order, each expert's share added in x's dtype)
            token, slot = torch.where(chosen == e)
            gate, up = F.linear(x[token], layer.gate_up[e]).chunk(2, dim=-1)
            y = F.linear(act(gate, up), layer.down[e]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        shared = F.linear(act(F.linear(x, layer.shared_gate), F.linear(x, layer.shared_up)), layer.shared_down)
        return out + shared


def _sequences(batch: DecoderBatch, block_size: int) -> list[tuple[slice, int, torch.Tensor]]:
    """(rows, keys with them, the slot of each position 0 .. keys - 1) of each sequence: decode rows, then prompt
    chunks (read on the host: no decode graphs)."""
    out = []
    offsets = torch.arange(block_size, device=batch.positions.device)

    def slots(table: torch.Tensor, length: int) -> torch.Tensor:
        return (table.long()[:, None] * block_size + offsets).flatten()[:length]

    d = batch.num_decode
    if d:
        for i, length in enumerate(batch.decode_seqlens.tolist()):
            out.append((slice(i, i + 1), length, slots(batch.decode_tables[i], length)))
    if batch.prefill_cu_q is not None:
        cu, lengths = batch.prefill_cu_q.tolist(), batch.prefill_seqlens.tolist()
        for j, (a, b, length) in enumerate(zip(cu, cu[1:], lengths)):
            out.append((slice(d + a, d + b), length, slots(batch.prefill_tables[j], length)))
    return out


MODEL = DeepseekV4
