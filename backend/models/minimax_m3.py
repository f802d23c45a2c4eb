"""MiniMax-M3's text model (`minimax_m3_vl_text`: MiniMaxAI's MiniMax-M3, transformers' MiniMaxM3VLForCausalLM).

- Norms: Gemma's RMSNorm (weight applied as 1 + w, in fp32), before attention and the MLP, on the final rows, and
  per head on q and k (and on the indexer's q and k) before the rotary.
- Attention: grouped-query attention; the rotary over what transformers' rope table rotates: `rope_parameters`'
  `partial_rotary_factor` (transformers builds the table from it and does not read the config's `rotary_dim`).
- Sparse attention: a layer whose `layer_types` entry is "minimax_m3_sparse" runs an indexer. Its keys
  k = rope(norm(k_proj x)) (one head of `index_head_dim`, the rotary on the first rotated dims) go to a cache layer
  of their own; its queries q_h = rope(norm(q_proj x)), `index_n_heads` heads. Query h scores every earlier key
  q_h . k (fp32), takes each `index_block_size` block of keys' best score, forces the `index_local_blocks` blocks
  ending at its own, and keeps its `index_topk_blocks` best blocks: attention head j attends to the keys of index
  head j // (heads / index_n_heads)'s blocks only (causally).
- MLP: `mlp_layer_types` "dense" (one [gate; up] projection of `dense_intermediate_size`) or "sparse": experts
  chosen by sigmoid score plus `e_score_correction_bias`, their scores renormalised and times
  `routed_scaling_factor`, beside a shared expert of `shared_intermediate_size`; all of them gpt-oss's clamped
  SwiGLU (`swiglu_alpha` 1.702, `swiglu_limit` 7: the kernels' swiglu_oai).

How it runs: full-attention layers and the MLPs are the shared decoder's; a sparse layer's indexer and attention
are PyTorch ops (no new GPU kernels), as HY-V4's: decode rows one batched pass over their block tables without a
host sync, prompt chunks looped per sequence on the host.

Refused by name: `layer_types` / `mlp_layer_types` not one known kind per layer, `swiglu_alpha` / `swiglu_limit`
other than gpt-oss's, `index_n_heads` not dividing the attention heads, `index_head_dim` narrower than the rotated
dims, `index_local_blocks` above `index_topk_blocks` (transformers' choice among the forced blocks is a tie),
tensor parallelism and FP8 linears. Tensors are read under transformers' names (a text-only save) or the
release's (`minimax_m3_vl`: the multimodal checkpoint's text model, `block_sparse_moe`, `index_q_proj`, per-expert
`w1` / `w2` / `w3`; `adapt`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.hy_v4 import IndexedKvCache
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.paged_gather import causal_mask, table_slots
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames,
                                                     per_layer_kinds, rotary_dims, spec_from_hf)
from tritonformer.kernels import reference

# transformers' MiniMaxM3VLTextConfig defaults, where a config.json leaves them out
DEFAULTS = {"vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 3072, "num_hidden_layers": 60,
            "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 524288,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "num_experts_per_tok": 4, "num_local_experts": 128,
            "dense_intermediate_size": 12288, "shared_intermediate_size": 3072, "routed_scaling_factor": 2.0,
            "index_n_heads": 4, "index_head_dim": 128, "index_block_size": 128, "index_topk_blocks": 16,
            "index_local_blocks": 1}
SWIGLU = {"swiglu_alpha": reference.SWIGLU_OAI_ALPHA, "swiglu_limit": reference.SWIGLU_OAI_LIMIT}
INDEXER = "self_attn.indexer."
TEXT_TYPE = "minimax_m3_vl_text"
SPARSE = "minimax_m3_sparse"


@dataclass(frozen=True)
class MiniMaxM3Spec(DecoderSpec):
    """DecoderSpec plus the indexers."""

    index_heads: int = 4
    index_head_dim: int = 128
    index_block: int = 128
    index_topk_blocks: int = 16
    index_local_blocks: int = 1
    indexer_layers: tuple[bool, ...] = ()  # per layer: a sparse layer, with an indexer
    fp8_refused: bool = True  # (load_decoder: FP8 linears are refused, experts or none)

    def check_split(self, tp) -> None:
        raise ValueError("tensor parallelism is not supported for model_type 'minimax_m3_vl_text' "
                         "(supported: one GPU)")

    def indexer_shapes(self) -> dict[str, tuple[int, ...]]:
        """One layer's indexer tensors by name (after `self_attn.indexer.`)."""
        d = self.index_head_dim
        return {"q_proj.weight": (self.index_heads * d, self.hidden_size), "k_proj.weight": (d, self.hidden_size),
                "q_norm.weight": (d,), "k_norm.weight": (d,)}

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Beside the shared decoder's (client/model_shapes.tensor_shapes): the indexers."""
        return {f"layers.{i}.{INDEXER}{name}": shape for i in range(self.num_layers) if self.indexer_layers[i]
                for name, shape in self.indexer_shapes().items()}


def from_hf(cfg: dict) -> MiniMaxM3Spec:
    cfg = {**DEFAULTS, **cfg}
    for key, value in SWIGLU.items():
        if cfg.get(key, value) != value:
            raise ValueError(f"MiniMax-M3 with {key} {cfg[key]} is not supported (supported: {key} {value}, "
                             f"the kernels' swiglu_oai)")
    attention = per_layer_kinds(cfg, "layer_types", ("full_attention", SPARSE), lambda n: ["full_attention"] * n,
                                "MiniMax-M3")
    mlp = per_layer_kinds(cfg, "mlp_layer_types", ("dense", "sparse"), lambda n: ["sparse"] * n, "MiniMax-M3")
    cfg.pop("rotary_dim", None)  # (transformers' rope table does not read it: rope_parameters say what rotates)
    heads, index_heads, d = cfg["num_attention_heads"], cfg["index_n_heads"], cfg["index_head_dim"]
    if index_heads < 1 or heads % index_heads:
        raise ValueError(f"MiniMax-M3 with index_n_heads {index_heads} is not supported (supported: index_n_heads "
                         f"dividing num_attention_heads {heads})")
    rotated = rotary_dims(cfg, cfg["head_dim"]) or cfg["head_dim"]
    if d < rotated:
        raise ValueError(f"MiniMax-M3 with index_head_dim {d} is not supported (supported: index_head_dim at least "
                         f"the {rotated} rotated dims of a head)")
    topk, local = cfg["index_topk_blocks"], cfg["index_local_blocks"]
    if topk < 1 or not 0 <= local <= topk or cfg["index_block_size"] < 1:
        raise ValueError(f"MiniMax-M3 with index_topk_blocks {topk} / index_local_blocks {local} / "
                         f"index_block_size {cfg['index_block_size']} is not supported (supported: index_topk_blocks "
                         f"at least 1, index_local_blocks at most index_topk_blocks, index_block_size at least 1)")
    names = MoeNames(shared="mlp.shared_experts", shared_gate=None, shared_fused=("gate_up_proj", "down_proj"))
    moe = MoeSpec(num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                  intermediate_size=cfg["intermediate_size"], normalize=True, round_weights=False,
                  layers=tuple(t == "sparse" for t in mlp), shared_intermediate_size=cfg["shared_intermediate_size"],
                  names=names, scoring="sigmoid", score_bias=True, scale=float(cfg["routed_scaling_factor"]))
    dense = {**cfg, "intermediate_size": cfg["dense_intermediate_size"]}
    spec = spec_from_hf(dense, default_theta=5e6, qk_norm=True, norm_offset=1.0, activation="swiglu_oai", moe=moe,
                        names=WeightNames(gate_up="mlp.gate_up_proj"))
    options = {f.name: getattr(spec, f.name) for f in fields(spec)}
    return MiniMaxM3Spec(**options, index_heads=index_heads, index_head_dim=d, index_block=cfg["index_block_size"],
                         index_topk_blocks=topk, index_local_blocks=local,
                         indexer_layers=tuple(t == SPARSE for t in attention))


@dataclass
class _Indexer:
    q_w: torch.Tensor  # [heads * D, hidden]
    k_w: torch.Tensor  # [D, hidden]
    q_norm: torch.Tensor  # [D] fp32, 1 + w
    k_norm: torch.Tensor  # [D] fp32, 1 + w
    cache_layer: int  # its keys' cache layer (after the attention layers')


class MiniMaxM3Decoder(IndexedKvCache, TransformerDecoder):
    def __init__(self, config: MiniMaxM3Spec, state: dict, device, dtype, tp=None):
        if tp is not None:
            config.check_split(tp)
        super().__init__(config, state, device, dtype)
        c = config
        sizes = f"hidden {c.hidden_size}, index_n_heads {c.index_heads} x {c.index_head_dim}"
        shapes = c.indexer_shapes()

        def checked(name: str) -> str:
            return self.checked(state, name, shapes[name.removeprefix(p)], sizes)

        self.indexers: list[_Indexer | None] = []
        for i in range(c.num_layers):
            p = f"layers.{i}.{INDEXER}"
            if not c.indexer_layers[i]:
                self.indexers.append(None)
                continue
            # (the norms' 1 + w once, in fp32, as the shared decoder's norm_offset)
            norm = [state[checked(p + n)].to(device=device, dtype=torch.float32) + 1.0 for n in ("q_norm.weight",
                                                                                                "k_norm.weight")]
            self.indexers.append(_Indexer(self.weight(checked(p + "q_proj.weight")),
                                          self.weight(checked(p + "k_proj.weight")),
                                          *norm, self.num_kv_layers + sum(x is not None for x in self.indexers)))
        self.index_layers = sum(x is not None for x in self.indexers)

    def _attend(self, x: torch.Tensor, li: int, layer, batch: DecoderBatch, cache: PagedKVCache,
                cos_sin: torch.Tensor, local: torch.Tensor | None, pre: kernels.PreNorm | None = None) -> torch.Tensor:
        """A full-attention layer: the shared decoder's. A sparse one: q, k, v as there (k and v to the cache), its
        indexer's choice of key blocks, attention over those keys (PyTorch ops)."""
        ix = self.indexers[li]
        if ix is None:
            return super()._attend(x, li, layer, batch, cache, cos_sin, local, pre)
        if pre is not None:
            x = kernels.prenormed(x, pre)
        c, kv = self.config, layer.kv_index
        cos, sin = cos_sin[:, 0], cos_sin[:, 1]
        q = kernels.prenorm_qkv_to_cache(x, None, layer.qkv_w, layer.qkv_b, c.num_heads, c.num_kv_heads, c.head_dim,
                                         cos, sin, cache.keys(kv), cache.values(kv), batch.slot_mapping,
                                         q_norm=layer.q_norm, k_norm=layer.k_norm, norm_eps=c.norm_eps)
        ctx = self._sparse(x, q, ix, kv, batch, cache, cos, sin)
        return kernels.linear_act(ctx.reshape(ctx.shape[0], -1), layer.o_w, layer.o_b)

    def _sparse(self, x, q, ix: _Indexer, kv: int, batch: DecoderBatch, cache: PagedKVCache, cos, sin):
        """The indexer's keys written to its cache layer; each query row's attention over its chosen blocks' keys
        `[T, heads, head_dim]` (fp32 scores)."""
        c = self.config
        t, d, heads = x.shape[0], c.index_head_dim, c.index_heads
        r = 2 * cos.shape[1]  # the rotated dims (the tables hold one value per pair)
        iq = self._head_norm(kernels.linear_act(x, ix.q_w).view(t, heads, d), ix.q_norm)
        ik = self._head_norm(kernels.linear_act(x, ix.k_w).view(t, 1, d), ix.k_norm)
        kernels.rotary_in_place(iq[:, :, :r], cos, sin)
        kernels.rotary_in_place(ik[:, :, :r], cos, sin)
        index_keys = cache.keys(ix.cache_layer).view(-1, d)
        index_keys[batch.slot_mapping] = ik.view(t, d)
        keys = cache.keys(kv).view(-1, c.num_kv_heads, c.head_dim)
        values = cache.values(kv).view(-1, c.num_kv_heads, c.head_dim)
        bs, nd = cache.block_size, batch.num_decode
        out = torch.empty_like(q)
        if nd:  # every slot of each row's block table, those past its length masked: no host sync
            slots = table_slots(batch.decode_tables, bs)  # [D, L]
            span = torch.arange(slots.shape[1], device=x.device)
            lengths = batch.decode_seqlens.long()
            valid = (span[None, :] < lengths[:, None])[:, None, :]  # [D, 1, L]
            scores = torch.matmul(iq[:nd].float(), index_keys[slots].float().transpose(1, 2))  # [D, heads, L]
            keep = self._blocks(scores.masked_fill(~valid, float("-inf")), lengths - 1) & valid
            out[:nd] = self._attention(q[:nd], keys[slots], values[slots], keep)
        starts, rows_cu = batch.prefill_cu_q, batch.num_decode
        if starts is not None:
            cu, lengths = starts.tolist(), batch.prefill_seqlens.tolist()
            for j, (a, b, length) in enumerate(zip(cu, cu[1:], lengths)):
                rows = slice(rows_cu + a, rows_cu + b)
                slots = table_slots(batch.prefill_tables[j : j + 1], bs)[0, :length]
                causal = causal_mask(b - a, length, x.device)[:, None, :]  # [R, 1, L]
                scores = torch.matmul(iq[rows].float(), index_keys[slots].float().T)  # [R, heads, L]
                positions = torch.arange(length - (b - a), length, device=x.device)
                keep = self._blocks(scores.masked_fill(~causal, float("-inf")), positions) & causal
                out[rows] = self._attention(q[rows], keys[slots][None].expand(b - a, -1, -1, -1),
                                            values[slots][None].expand(b - a, -1, -1, -1), keep)
        return out

    def _head_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Gemma's RMSNorm over each head (fp32, times the 1 + w weight), rounded back to x's dtype."""
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.config.norm_eps) * weight).to(x.dtype)

    def _blocks(self, scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Which keys each query row's index heads keep `[R, heads, L]`, from its scores `[R, heads, L]` (-inf at
        keys it may not see) at its positions `[R]`: each block's best score, the local blocks forced, the top
        index_topk_blocks blocks (a block with no visible key never)."""
        c = self.config
        rows, heads, length = scores.shape
        size = c.index_block
        count = -(-length // size)
        scores = F.pad(scores, (0, count * size - length), value=float("-inf"))
        best = scores.view(rows, heads, count, size).amax(-1)  # [R, heads, blocks]
        if c.index_local_blocks:
            back = torch.arange(c.index_local_blocks, device=scores.device)
            local = ((positions // size)[:, None] - back[None, :]).clamp(min=0)  # [R, local]
            best.scatter_(-1, local[:, None, :].expand(-1, heads, -1), float("inf"))
        top, index = best.topk(min(c.index_topk_blocks, count), dim=-1)
        chosen = torch.zeros_like(best, dtype=torch.bool).scatter_(-1, index, top > float("-inf"))
        return chosen.repeat_interleave(size, dim=-1)[..., :length]

    def _attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, keep: torch.Tensor):
        """Queries `[R, H, d]` over keys / values `[R, L, kv, d]` where `keep` `[R, index heads, L]` (each attention
        head its index head's), fp32, rounded to q's dtype."""
        c = self.config
        group = c.num_heads // c.num_kv_heads
        k = keys.float().repeat_interleave(group, dim=2)
        v = values.float().repeat_interleave(group, dim=2)
        scale = c.attn_scale if c.attn_scale is not None else c.head_dim ** -0.5
        scores = torch.einsum("rhd,rkhd->rhk", q.float(), k) * scale
        keep = keep.repeat_interleave(c.num_heads // c.index_heads, dim=1)
        probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
        # (the table's slots past a sequence's keys were never written: whatever they hold, NaN included, must not
        # reach the sum, where a probability of 0 times NaN would)
        v = v.masked_fill(~keep.any(dim=1)[:, :, None, None], 0.0)
        return torch.einsum("rhk,rkhd->rhd", probs, v).to(q.dtype)


# The release's tensor names (the multimodal checkpoint's text model, as transformers' save_pretrained writes it too)
# as transformers' module names, in order: (pattern, replacement). The experts one by one as moe.py reads them.
RELEASE_NAMES = tuple((re.compile(p), r) for p, r in (
    (r"\.block_sparse_moe\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias"),
    (r"\.block_sparse_moe\.", ".mlp."),
    (r"\.self_attn\.index_(q|k)_(proj|norm)\.", r".self_attn.indexer.\1_\2."),
    (r"\.experts\.(\d+)\.w1\.", r".experts.\1.gate_proj."), (r"\.experts\.(\d+)\.w3\.", r".experts.\1.up_proj."),
    (r"\.experts\.(\d+)\.w2\.", r".experts.\1.down_proj.")))


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The multimodal checkpoint (model_type minimax_m3_vl): its text model's config and tensors, the head tied as
    the outer config says (the towers and projectors unread); tensors under the release's names (`block_sparse_moe`,
    experts one by one as `w1` / `w3` / `w2`, `index_q_proj`, the dense and shared MLPs' gate and up apart) renamed
    as transformers converts them, those gate and up projections stacked as their one [gate; up] projection."""
    if cfg.get("model_type") == "minimax_m3_vl":
        tie = bool(cfg.get("tie_word_embeddings", False))
        text, state = text_part(cfg, state, TEXT_TYPE)
        cfg = {**text, "tie_word_embeddings": tie}
    if not any(".block_sparse_moe." in name or ".self_attn.index_" in name for name in state):
        return cfg, state
    out = {}
    for name, tensor in state.items():
        for pattern, replacement in RELEASE_NAMES:
            name = pattern.sub(replacement, name)
        out[name] = tensor
    stacked = (".mlp.gate_proj.weight", ".mlp.shared_experts.gate_proj.weight")  # (not the experts' one by one)
    for gate in [name for name in out if name.endswith(stacked)]:
        up = out.pop(gate.replace("gate_proj", "up_proj"))
        out[gate.replace("gate_proj", "gate_up_proj")] = torch.cat([_whole(out.pop(gate)), _whole(up)])
    return cfg, out


def _whole(t) -> torch.Tensor:
    return t if isinstance(t, torch.Tensor) else t[:]


MODEL = MiniMaxM3Decoder
