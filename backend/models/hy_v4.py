"""HY-V4 (`hy_v4`: Tencent's Hy4-preview): DeepSeek-V3.2's latent attention with DeepSeek Sparse Attention, run
sparse, in a residual of hyper-connections, dense and MoE layers mixed.

The residual is `hc_mult` streams a token (hyper_connections.py): each layer's attention and MLP read a sigmoid-
weighted mix of the streams (HyperConnection.read, fp32) and write their output back to every stream times its
`post` gate; a HyperHead collapses the streams before the final norm. Inside, a layer is DeepSeek-V3.2's:

- Attention: latent attention (mla.py) with a query latent (`q_lora_rank`), the rotary on halves (rotate-half,
  transformers' model has no interleaved form), learnt per-head sinks (`sinks`: a logit in each softmax whose share
  goes nowhere, as gpt-oss's) and an output gate: each head's values times sigmoid(gate_proj(x)) before o_proj.
- Sparse attention: a layer whose `indexer_types` entry is "full" runs an indexer. Its keys k = rope(LayerNorm(wk x))
  (`index_head_dim` wide, the LayerNorm in fp32, the rotary on the last `qk_rope_head_dim` dims) go to a cache layer
  of their own; its queries q_h = rope(wq_b q_latent) per `index_n_heads` head; a query scores each earlier key
  sum_h w_h relu(q_h . k) with w = weights_proj(x) (fp32) / sqrt(heads * index_head_dim), and attends to its
  `index_topk` best causal keys only (all of them while it has no more). A "shared" layer reuses the previous
  layer's choice (transformers' `prev_topk_indices`), and holds no indexer.
- MLP: `mlp_layer_types` "dense" (a SwiGLU MLP of `intermediate_size`) or "sparse": `n_routed_experts` experts
  chosen as DeepSeek-V3 chooses (sigmoid scores from fp32 logits, the top `num_experts_per_tok` by score plus
  `e_score_correction_bias` among the best `topk_group` of `n_group` groups, renormalised, times
  `routed_scaling_factor`), each expert's SwiGLU clamped (the gate to at most `swiglu_limit`, the up half to
  +-swiglu_limit), beside `n_shared_experts` shared experts (one unclamped MLP) added as they are.
- The output head in fp32 (transformers keeps lm_head in fp32 and casts the final norm's rows to it).

How it runs (PyTorch ops where the shared kernels have no form for it, no new GPU kernels): the hyper-connections,
the indexer, the sparse attention and the clamped experts are plain PyTorch; the latent projections, the cache
writes, norms and dense linears the shared kernels. Decode rows (one query a sequence) are one batched pass without a
host sync, as a captured decode graph replays it: the indexer scores the sequence's whole block table (keys past
its length masked), the attention gathers the chosen keys and values only, the experts run over every token and
expert at once (weights zero where not chosen). Prompt chunks loop over their sequences on the host (their iterations
never run in a graph): a chunk's queries against its sequence's keys, the choice a mask; their experts run one
expert at a time over its tokens. The routed experts' weighted outputs are summed in fp32 and rounded once
(transformers rounds each expert's share in turn: one rounding apart in bf16, none in fp32). The index keys take
a cache layer each of one head of index_head_dim (its values half unused).

Refused by name: `layer_types` other than "indexed_attention", `indexer_types` or `mlp_layer_types` not one
known kind per layer (the first indexer "full": transformers fails on a shared one with none before it),
`q_lora_rank` null, `hidden_act` other than silu, `swiglu_limit` at or below zero (transformers' docstring calls
that no clamp, its code clamps to it), `index_head_dim` below `qk_rope_head_dim`, tied embeddings (transformers
keeps an fp32 head beside the table), tensor parallelism and FP8 linears. The multi-token-prediction layers
(`mtp_layers`) are not read."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.deepseek_v32 import INDEXER, DsaSpec
from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.hyper_connections import (HyperConnection, expand, hc_tensor_shapes,
                                                           load_hyper_connection, load_hyper_head)
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.paged_gather import causal_mask, table_slots
from tritonformer.backend.models.transformer import (TransformerDecoder, per_layer_kinds, spec_from_hf,
                                                     tensors_renamed)
from tritonformer.kernels.reference import moe_route

# transformers' HYV4Config defaults, where a config.json leaves them out
DEFAULTS = {"vocab_size": 120832, "hidden_size": 2816, "intermediate_size": 6912, "moe_intermediate_size": 768,
            "num_hidden_layers": 34, "num_attention_heads": 32, "hidden_act": "silu",
            "max_position_embeddings": 262144, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "attention_bias": False, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
            "routed_scaling_factor": 2.827, "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
            "v_head_dim": 256, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 16, "hc_mult": 4,
            "hc_magnitude": 2.0, "hc_eps": 1e-6, "swiglu_limit": 10.0}
# The published checkpoint (and transformers' save_pretrained, which writes its conversion mapping back) names some
# tensors otherwise than transformers' modules: the sinks `learnable_sink_param`, the attention's and the experts'
# gates `linear_gate`, the hyper-connections `hc_pre.hc_attn_layer.hc_fn` and so on. transformers renames them as it
# loads (its conversion mapping for hy_v4); these are the same renames, in its order.
CHECKPOINT_RENAMES = ((re.compile(r"(^|\.)hc_pre\.hc_"), r"\1hc_"),
                      (re.compile(r"\.learnable_sink_param$"), ".sinks"),
                      (re.compile(r"\.linear_gate\."), ".gate_proj."),
                      (re.compile(r"\.hc_attn_layer\.hc_(fn|base|scale)$"), r".attn_hc.\1"),
                      (re.compile(r"\.hc_mlp_layer\.hc_(fn|base|scale)$"), r".ffn_hc.\1"),
                      (re.compile(r"\.hc_head_(fn|base|scale)$"), r".hc_\1"))


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors under the names transformers' model gives them (CHECKPOINT_RENAMES); names
    already in that form pass unchanged."""
    return cfg, tensors_renamed(state, CHECKPOINT_RENAMES)


@dataclass(frozen=True)
class HyV4Spec(DsaSpec):
    """DsaSpec (latent attention with sinks, experts, the indexers' sizes and layers) plus the hyper-connections and
    the clamp."""

    family: str = "HY-V4"
    hc_mult: int = 4
    hc_magnitude: float = 2.0
    hc_eps: float = 1e-6
    swiglu_limit: float = 10.0

    def check_max_model_len(self, max_model_len: int) -> None:
        """No cap: the sparse attention runs sparse here, any length (DsaSpec caps the dense form at index_topk)."""

    def check_split(self, tp) -> None:
        raise ValueError("tensor parallelism is not supported for model_type 'hy_v4' (supported: one GPU)")

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Beside the shared decoder's (client/model_shapes.tensor_shapes) and the indexers' (DsaSpec's): the
        hyper-connections and the output gates."""
        n, hidden = self.hc_mult, self.hidden_size
        shapes = {**super().extra_tensor_shapes(), **hc_tensor_shapes("hc_head.", n, hidden, head=True)}
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes.update(hc_tensor_shapes(p + "attn_hc.", n, hidden) | hc_tensor_shapes(p + "ffn_hc.", n, hidden))
            shapes[p + "self_attn.gate_proj.weight"] = (self.num_heads * self.mla.v_head_dim, hidden)
        return shapes


def from_hf(cfg: dict) -> HyV4Spec:
    cfg = {**DEFAULTS, **cfg}
    per_layer_kinds(cfg, "layer_types", ("indexed_attention",), lambda n: ["indexed_attention"] * n, "HY-V4")
    mlp = per_layer_kinds(cfg, "mlp_layer_types", ("dense", "sparse"),
                          lambda n: ["dense"] * min(1, n) + ["sparse"] * (n - 1), "HY-V4")
    indexers = per_layer_kinds(cfg, "indexer_types", ("full", "shared"),
                               lambda n: ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(n)],
                               "HY-V4")
    if indexers[0] != "full":
        raise ValueError(f"HY-V4 with indexer_types {indexers} is not supported (supported: indexer_types whose "
                         f"first layer is 'full': a shared layer reuses an earlier full one's choice)")
    if cfg.get("q_lora_rank") is None:
        raise ValueError("HY-V4 with q_lora_rank null is not supported (supported: q_lora_rank, a query latent: "
                         "transformers builds q_a_proj / q_b_proj only)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"HY-V4 with hidden_act {cfg['hidden_act']!r} is not supported (supported: hidden_act silu)")
    if not cfg["swiglu_limit"] > 0:
        raise ValueError(f"HY-V4 with swiglu_limit {cfg['swiglu_limit']} is not supported (supported: swiglu_limit "
                         f"above zero: transformers' docstring reads a limit at or below zero as no clamp, its code "
                         f"clamps to it)")
    if cfg["index_head_dim"] < cfg["qk_rope_head_dim"] or cfg["index_topk"] < 1:
        raise ValueError(f"HY-V4 with index_head_dim {cfg['index_head_dim']} / index_topk {cfg['index_topk']} is not "
                         f"supported (supported: index_head_dim at least qk_rope_head_dim {cfg['qk_rope_head_dim']}, "
                         f"index_topk at least 1)")
    if cfg.get("tie_word_embeddings"):
        raise ValueError("HY-V4 with tie_word_embeddings true is not supported (supported: tie_word_embeddings "
                         "false: transformers keeps the head in fp32 beside the embedding table)")
    moe = replace(sigmoid_moe(cfg, first_moe=1), layers=tuple(t == "sparse" for t in mlp))
    mla_cfg = {**cfg, "rope_interleave": False}  # (transformers' model rotates halves)
    spec = spec_from_hf(mla_cfg, **mla_options(mla_cfg), moe=moe, sinks=True)
    options = {f.name: getattr(spec, f.name) for f in fields(spec)}
    return HyV4Spec(**options, hc_mult=cfg["hc_mult"], hc_magnitude=float(cfg["hc_magnitude"]),
                    hc_eps=float(cfg["hc_eps"]), index_topk=int(cfg["index_topk"]), index_heads=cfg["index_n_heads"],
                    index_head_dim=cfg["index_head_dim"], indexer_layers=tuple(k == "full" for k in indexers),
                    swiglu_limit=float(cfg["swiglu_limit"]))


@dataclass
class _Indexer:
    wq_b: torch.Tensor  # [heads * D, q_lora_rank]
    wk: torch.Tensor  # [D, hidden]
    k_norm: torch.Tensor  # [D] fp32
    k_norm_b: torch.Tensor  # [D] fp32
    weights_proj: torch.Tensor  # [heads, hidden] fp32
    cache_layer: int  # its keys' cache layer (after the attention layers')


@dataclass
class _Extras:
    """A layer's parts beside the shared decoder's _Layer."""

    attn_hc: HyperConnection
    ffn_hc: HyperConnection
    gate_w: torch.Tensor  # [heads * v_head_dim, hidden]: the attention output's gate
    indexer: _Indexer | None  # None: a "shared" layer


@dataclass
class _Choice:
    """Which keys each query row attends to, from the last full indexer: decode rows' positions `[D, k]` (-1:
    none), each prompt chunk's mask `[rows, keys]`."""

    decode: torch.Tensor | None
    chunks: list[torch.Tensor]


class IndexedKvCache:
    """The KV cache of a decoder whose indexers keep keys of their own (HY-V4's, MiniMax-M3's): after the attention
    layers' cache layers, one per indexer (`index_layers` of them), one head of the config's `index_head_dim`."""

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """The attention layers' (one key and value per head), then one layer per indexer: its keys, one head."""
        c = self.config
        shapes = [(c.num_kv_heads, c.head_dim)] * self.num_kv_layers + [(1, c.index_head_dim)] * self.index_layers
        return PagedKVCache(len(shapes), num_blocks, block_size, c.num_kv_heads, c.head_dim, self.device, self.dtype,
                            layer_shapes=shapes)

    def kv_bytes_per_token(self) -> int:
        c = self.config
        per_layer = self.num_kv_layers * c.num_kv_heads * c.head_dim + self.index_layers * c.index_head_dim
        return 2 * per_layer * self.dtype.itemsize


class HyV4Decoder(IndexedKvCache, TransformerDecoder):
    def __init__(self, config: HyV4Spec, state: dict, device, dtype, tp=None):
        if tp is not None:
            config.check_split(tp)
        super().__init__(config, state, device, dtype)
        c = config
        sizes = (f"hidden {c.hidden_size}, hc_mult {c.hc_mult}, heads {c.num_heads} x v {c.mla.v_head_dim}, "
                 f"index_n_heads {c.index_heads} x {c.index_head_dim}")

        def fp32(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            return state[self.checked(state, name, shape, sizes)].to(device=device, dtype=torch.float32)

        def weight(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            return self.weight(self.checked(state, name, shape, sizes))

        hc = dict(streams=c.hc_mult, hidden=c.hidden_size, eps=c.hc_eps, norm_eps=c.norm_eps)
        self.extras: list[_Extras] = []
        index_layers = 0
        for i in range(c.num_layers):
            p = f"layers.{i}."
            indexer = None
            if c.indexer_layers[i]:
                shapes = c.indexer_shapes()
                q = p + INDEXER
                indexer = _Indexer(weight(q + "wq_b.weight", shapes["wq_b.weight"]),
                                   weight(q + "wk.weight", shapes["wk.weight"]),
                                   fp32(q + "k_norm.weight", shapes["k_norm.weight"]),
                                   fp32(q + "k_norm.bias", shapes["k_norm.bias"]),
                                   fp32(q + "weights_proj.weight", shapes["weights_proj.weight"]),
                                   self.num_kv_layers + index_layers)
                index_layers += 1
            self.extras.append(_Extras(
                load_hyper_connection(fp32, p + "attn_hc.", magnitude=c.hc_magnitude, **hc),
                load_hyper_connection(fp32, p + "ffn_hc.", magnitude=c.hc_magnitude, **hc),
                weight(p + "self_attn.gate_proj.weight", (c.num_heads * c.mla.v_head_dim, c.hidden_size)),
                indexer))
        self.index_layers = index_layers
        self.hc_head = load_hyper_head(fp32, "hc_head.", **hc)
        # transformers keeps the head in fp32 and casts the final norm's rows to it
        self.set_output_head(fp32(c.names.lm_head, (c.vocab_size, c.hidden_size)))

    def logits(self, x: torch.Tensor, fp32: bool = True) -> torch.Tensor:
        """The fp32 head over the rows in fp32 (fp32 logits either way)."""
        return F.linear(x.float(), self.output_head)[:, : self.vocab_size]

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for `batch.logits_index`: the streams through every layer, collapsed."""
        c = self.config
        eps = c.norm_eps
        cos_sin = self.rope_cos_sin[batch.positions]
        cos, sin = cos_sin[:, 0], cos_sin[:, 1]
        s = expand(self._embed(batch.input_ids), c.hc_mult)
        chunks = self._chunks(batch)
        choice = None
        for layer, extra in zip(self.layers, self.extras):
            gates = extra.attn_hc.read(s)
            x = kernels.rms_norm(gates.x, layer.attn_norm, eps)[0]
            out, choice = self._attend_sparse(x, layer, extra, batch, cache, cos, sin, choice, chunks)
            s = extra.attn_hc.write(s, out, gates)
            gates = extra.ffn_hc.read(s)
            x = kernels.rms_norm(gates.x, layer.mlp_norm, eps)[0]
            if layer.moe is None:
                y = kernels.linear_act(kernels.linear_act(x, layer.gate_up_w, None, "silu_mul"), layer.down_w)
            else:
                y = self._experts(x, layer.moe, batch.prefill_cu_q is None)
            s = extra.ffn_hc.write(s, y, gates)
        if not batch.logits_every_row:
            s = s[batch.logits_index]
        return kernels.rms_norm(self.hc_head(s), self.final_norm, eps)[0]

    def _attend_sparse(self, x, layer, extra: _Extras, batch: DecoderBatch, cache: PagedKVCache, cos, sin,
                       choice: _Choice | None, chunks: list) -> tuple[torch.Tensor, _Choice]:
        """The layer's attention output rows (after o_proj), and the keys chosen (its indexer's, else `choice`)."""
        c, mla = self.config, layer.mla
        li, t = layer.kv_index, x.shape[0]
        a = kernels.linear_act(x, mla.a_w, mla.a_b)
        q_width = a.shape[1] - c.mla.kv_lora_rank - c.mla.qk_rope_head_dim
        q_latent, kv_latent = kernels.mla_latent_norms(a, q_width, mla.q_norm, mla.kv_norm, c.mla.norm_eps)
        q = kernels.linear_act(q_latent, mla.q_b_w).view(t, mla.heads, c.head_dim)
        q = mla.rotate_and_cache(q, kv_latent, a, cos, sin, cache.keys(li), cache.values(li), batch.slot_mapping)
        if extra.indexer is not None:
            choice = self._index(x, q_latent, extra.indexer, batch, cache, cos, sin, chunks)
        ctx = self._sparse_attention(q, layer, batch, cache, choice, chunks)
        gate = kernels.linear_act(x, extra.gate_w)
        ctx = mla.values(ctx.view(t, mla.heads, c.head_dim)) * torch.sigmoid(gate)
        return kernels.linear_act(ctx, layer.o_w, layer.o_b), choice

    def _index(self, x, q_latent, ix: _Indexer, batch: DecoderBatch, cache: PagedKVCache, cos, sin,
               chunks: list) -> _Choice:
        """The indexer: its keys written to its cache layer, each query row's choice of keys."""
        c = self.config
        t, d, r, heads = x.shape[0], c.index_head_dim, c.mla.qk_rope_head_dim, c.index_heads
        half_cos, half_sin = cos[:, : r // 2], sin[:, : r // 2]
        q = kernels.linear_act(q_latent, ix.wq_b).view(t, heads, d)
        kernels.rotary_in_place(q[:, :, d - r:], half_cos, half_sin)  # (the rotary on a head's last dims)
        k = F.layer_norm(kernels.linear_act(x, ix.wk).float(), (d,), ix.k_norm, ix.k_norm_b, c.norm_eps).to(x.dtype)
        k = k.view(t, 1, d)
        kernels.rotary_in_place(k[:, :, d - r:], half_cos, half_sin)
        keys = cache.keys(ix.cache_layer).view(-1, d)
        keys[batch.slot_mapping] = k.view(t, d)
        w = F.linear(x.float(), ix.weights_proj) * (heads ** -0.5 * d ** -0.5)  # [T, heads] fp32
        bs, nd = cache.block_size, batch.num_decode
        decode = None
        if nd:
            slots = table_slots(batch.decode_tables, bs)  # [D, width * bs]
            scores = self._index_scores(q[:nd], keys[slots], w[:nd])  # [D, L]
            span = torch.arange(slots.shape[1], device=x.device)
            scores = scores.masked_fill(span[None, :] >= batch.decode_seqlens[:, None].long(), float("-inf"))
            top = scores.topk(min(c.index_topk, slots.shape[1]), dim=-1).indices
            decode = torch.where(top < batch.decode_seqlens[:, None].long(), top, -1)
        masks = []
        for j, (rows, length) in enumerate(chunks):
            slots = table_slots(batch.prefill_tables[j : j + 1], bs)[0, :length]
            scores = self._index_scores(q[rows], keys[slots][None].expand(rows.stop - rows.start, -1, -1), w[rows])
            causal = causal_mask(rows.stop - rows.start, length, x.device)
            scores = scores.masked_fill(~causal, float("-inf"))
            top = scores.topk(min(c.index_topk, length), dim=-1).indices
            masks.append(torch.zeros_like(causal).scatter_(1, top, True) & causal)
        return _Choice(decode, masks)

    @staticmethod
    def _index_scores(q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """sum_h w_h relu(q_h . k) `[R, L]` of queries q `[R, heads, D]` over keys `[R, L, D]` (fp32)."""
        scores = torch.relu(torch.matmul(q.float(), keys.float().transpose(1, 2)))  # [R, heads, L]
        return torch.matmul(w[:, None, :], scores)[:, 0]

    @staticmethod
    def _chunks(batch: DecoderBatch) -> list[tuple[slice, int]]:
        """(rows, sequence length with them) of each prompt chunk, its rows after the decode rows: read on the host
        (chunks never run in a captured graph)."""
        if batch.prefill_cu_q is None:
            return []
        cu, lengths = batch.prefill_cu_q.tolist(), batch.prefill_seqlens.tolist()
        d = batch.num_decode
        return [(slice(d + a, d + b), length) for a, b, length in zip(cu, cu[1:], lengths)]

    def _sparse_attention(self, q: torch.Tensor, layer, batch: DecoderBatch, cache: PagedKVCache, choice: _Choice,
                          chunks: list) -> torch.Tensor:
        """Each query row's attention over its chosen keys, with the layer's sinks: `[T, heads, d]` (fp32 scores)."""
        c = self.config
        li, bs, nd = layer.kv_index, cache.block_size, batch.num_decode
        heads, d = q.shape[1], q.shape[2]
        keys, values = cache.keys(li).view(-1, heads, d), cache.values(li).view(-1, heads, d)
        out = torch.empty_like(q)
        if nd:
            pos = choice.decode.clamp(min=0)
            slots = batch.decode_tables.long().gather(1, pos // bs) * bs + pos % bs  # [D, k]
            scores = torch.einsum("rhd,rkhd->rhk", q[:nd].float(), keys[slots].float()) * c.attn_scale
            scores = scores.masked_fill((choice.decode < 0)[:, None, :], float("-inf"))
            out[:nd] = _with_sinks(scores, values[slots], layer.sinks, "rhk,rkhd->rhd").to(q.dtype)
        for j, (rows, length) in enumerate(chunks):
            slots = table_slots(batch.prefill_tables[j : j + 1], bs)[0, :length]
            scores = torch.einsum("rhd,khd->rhk", q[rows].float(), keys[slots].float()) * c.attn_scale
            scores = scores.masked_fill(~choice.chunks[j][:, None, :], float("-inf"))
            out[rows] = _with_sinks(scores, values[slots], layer.sinks, "rhk,khd->rhd").to(q.dtype)
        return out

    def _experts(self, x: torch.Tensor, moe, decode_only: bool) -> torch.Tensor:
        """The MoE block: routed experts with the clamped SwiGLU, plus the shared experts (unclamped)."""
        limit = self.config.swiglu_limit
        logits = F.linear(x.float(), moe.router.float())
        weights, ids = moe_route(logits, moe.top_k, moe.normalize, None, "sigmoid", moe.score_bias, moe.scale,
                                 moe.groups, moe.kept_groups, moe.group_score)

        def act(gate_up: torch.Tensor) -> torch.Tensor:
            gate, up = gate_up.chunk(2, dim=-1)
            return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)

        experts = moe.gate_up.shape[0]
        if decode_only:  # every expert over every row, weight 0 where not chosen: no host sync (a decode graph)
            h = act(torch.matmul(x[None], moe.gate_up.transpose(1, 2)))  # [E, T, I]
            y = torch.matmul(h, moe.down.transpose(1, 2))  # [E, T, H]
            full = torch.zeros(x.shape[0], experts, device=x.device).scatter_(1, ids, weights)
            out = torch.einsum("te,eth->th", full, y.float())
        else:
            out = torch.zeros(x.shape[0], x.shape[1], device=x.device)
            for e in ids.unique().tolist():
                token, slot = torch.where(ids == e)
                y = F.linear(act(F.linear(x[token], moe.gate_up[e])), moe.down[e])
                out.index_add_(0, token, y.float() * weights[token, slot, None])
        shared = kernels.linear_act(kernels.linear_act(x, moe.shared_gate_up, None, "silu_mul"), moe.shared_down)
        return out.to(x.dtype) + shared


def _with_sinks(scores: torch.Tensor, values: torch.Tensor, sinks: torch.Tensor, spec: str) -> torch.Tensor:
    """softmax over [scores, the head's sink] (fp32; the sink's share dropped) times the values."""
    sink = sinks.float()[None, :, None].expand(scores.shape[0], -1, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum(spec, probs, values.float())


MODEL = HyV4Decoder
