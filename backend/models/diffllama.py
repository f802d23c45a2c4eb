"""DiffLlama (`diffllama`, kajuma/DiffLlama-0.3B-handcut): Llama's block (RMSNorms, SwiGLU, rotary, grouped-query
attention, biases on the attention's projections where `attention_bias`) with differential attention.

The math, per layer with H query heads, K KV heads (K even) of head_dim d, r = H / K query heads a KV head, and
scale d ** -0.5: A_h = softmax(q_h . k_{g(h)}) with g(h) = h // r the head's KV head. V's heads are split in two
halves, v_j and v_{j + K/2} (j < K/2), and both halves are read with every map, so a query head's output is
A_h [v_{g(h) mod K/2}; v_{K/2 + g(h) mod K/2}], 2d wide. The two maps of pair i (i < H/2) are head i's and head
i + H/2's (whose KV heads are g(i) and g(i) + K/2: the same value pair); the pair's output is
o_i = A_i V'_{g(i)} - lambda A_{i + H/2} V'_{g(i)} with V'_j = [v_j; v_{j + K/2}], and lambda = exp(lambda_q1 .
lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 layer) (each exp in fp32
rounded to the model dtype, as transformers computes it). Then o_i is RMS-normalised over its 2d dims (no weight,
`rms_norm_eps`) and times (1 - lambda_init); the H / 2 pairs' outputs, H * d wide, go to o_proj.

Served on the paged attention kernels unchanged, without duplicating the cache: the cache holds K heads of d
(Llama's bytes), stored in the order [k_0, k_{K/2}, k_1, k_{K/2+1}, ...] (k_proj's and v_proj's rows permuted at
load), so that viewed as K / 2 heads of 2d its head j is [k_j; k_{j + K/2}] for keys and V'_j for values. The
attention runs once over that view with H query heads of 2d: head i's query [q_i; 0] and head i + H/2's
[0; q_{i + H/2}] (zeros beside them: each reads its own key half), ordered so the 2r query heads of KV head j
are pair members, scale d ** -0.5. The output heads are the pairs' two maps times V'_j, 2d each: o_i is one
element-wise combination. The cost is the scores' dot products over 2d dims where d would do (half are
zeros); one batched pass a layer, no host sync (CUDA-graph capturable).

Refused by name: `attention_dropout` above 0 (as transformers refuses it), an odd `num_key_value_heads`, tensor
parallelism (a pair's two heads and its two KV heads lie half the model apart: a rank's share is not contiguous),
FP8 linears.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf
from tritonformer.kernels.fp8 import take_rows

LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


@dataclass(frozen=True)
class DiffLlamaSpec(DecoderSpec):
    fp8_refused: bool = True  # (load_decoder: FP8 linears are refused)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of a checkpoint, by name: Llama's and each layer's four lambda vectors `[head_dim]`."""
        from tritonformer.client.model_shapes import tensor_shapes

        shapes = tensor_shapes(DecoderSpec(**{f.name: getattr(self, f.name) for f in fields(DecoderSpec) if f.init}))
        for i in range(self.num_layers):
            shapes.update({f"layers.{i}.self_attn.{name}": (self.head_dim,) for name in LAMBDAS})
        return shapes

    def check_split(self, tp) -> None:
        raise ValueError("tensor parallelism is not supported for model_type 'diffllama' (supported: one GPU)")


def lambda_init(layer: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def from_hf(cfg: dict) -> DiffLlamaSpec:
    if (cfg.get("attention_dropout") or 0.0) > 0.0:
        raise ValueError(f"DiffLlama with attention_dropout {cfg['attention_dropout']} is not supported "
                         f"(supported: attention_dropout 0)")
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    if kv % 2:
        raise ValueError(f"DiffLlama with num_key_value_heads {kv} is not supported (supported: num_key_value_heads "
                         f"even: V's heads are split in two halves)")
    bias = bool(cfg.get("attention_bias", False))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    # (the scale is d ** -0.5 given explicitly: the attention runs over 2d-wide padded heads)
    spec = spec_from_hf({**cfg, "num_key_value_heads": kv}, qkv_bias=bias, o_bias=bias,
                        norm_eps=cfg.get("rms_norm_eps", 1e-5), attn_scale=head_dim ** -0.5)
    return DiffLlamaSpec(**{f.name: getattr(spec, f.name) for f in fields(spec) if f.init})


class DiffLlamaDecoder(TransformerDecoder):
    def __init__(self, config: DiffLlamaSpec, state: dict, device: torch.device, dtype: torch.dtype, tp=None):
        if tp is not None:
            config.check_split(tp)
        super().__init__(config, state, device, dtype)
        c = config
        h, k, d = c.num_heads, c.num_kv_heads, c.head_dim
        r = h // k
        # The cache's KV head order [0, K/2, 1, K/2 + 1, ...]: k_proj's and v_proj's rows (and biases) so permuted.
        old = torch.tensor([m // 2 + (m % 2) * (k // 2) for m in range(k)])
        kv_rows = (old[:, None] * d + torch.arange(d)[None, :]).reshape(-1)
        rows = torch.cat([torch.arange(h * d), h * d + kv_rows, (h + k) * d + kv_rows]).to(device)
        # Where query head h's d dims go among the 2H half heads of the padded queries (module docstring).
        first = [2 * ((i // r) * 2 * r + i % r) for i in range(h // 2)]
        self.q_slots = torch.tensor(first + [s + 2 * r + 1 for s in first], device=device)
        self.lambdas, self.scales = [], []
        for i, layer in enumerate(self.layers):
            layer.qkv_w = take_rows(layer.qkv_w, rows)
            if layer.qkv_b is not None:
                layer.qkv_b = layer.qkv_b[rows]
            q1, k1, q2, k2 = (self.weight(f"layers.{i}.self_attn.{name}") for name in LAMBDAS)
            l1 = torch.exp(torch.sum(q1.float() * k1.float(), dim=-1)).to(dtype)
            l2 = torch.exp(torch.sum(q2.float() * k2.float(), dim=-1)).to(dtype)
            self.lambdas.append(l1 - l2 + lambda_init(i))
            self.scales.append(1.0 - lambda_init(i))
        self.ones = torch.ones(2 * d, device=device, dtype=dtype)

    def _attend(self, x: torch.Tensor, li: int, layer, batch: DecoderBatch, cache: PagedKVCache,
                cos_sin: torch.Tensor, local: torch.Tensor | None, pre: kernels.PreNorm | None = None) -> torch.Tensor:
        """Layer `li`'s differential attention over its input rows x (PreNorm'd by `pre` where given), to the
        output projection's rows (module docstring)."""
        c = self.config
        h, k, d = c.num_heads, c.num_kv_heads, c.head_dim
        t = x.shape[0]
        keys, values = cache.keys(layer.kv_index), cache.values(layer.kv_index)
        q = kernels.prenorm_qkv_to_cache(x, pre, layer.qkv_w, layer.qkv_b, h, k, d, cos_sin[:, 0], cos_sin[:, 1],
                                         keys, values, batch.slot_mapping)
        padded = q.new_zeros(t, 2 * h, d).index_copy_(1, self.q_slots, q.reshape(t, h, d))
        pairs = (*keys.shape[:-2], k // 2, 2 * d)
        ctx = batch.attention(padded.view(t, h, 2 * d), keys.view(pairs), values.view(pairs), scale=c.attn_scale)
        ctx = ctx.view(t, k // 2, 2, h // k, 2 * d)
        diff = ctx[:, :, 0] - self.lambdas[li] * ctx[:, :, 1]
        normed, _ = kernels.rms_norm(diff.reshape(-1, 2 * d), self.ones, c.norm_eps)
        out = self.scales[li] * normed
        return kernels.linear_act(out.reshape(t, h * d), layer.o_w, layer.o_b)


MODEL = DiffLlamaDecoder
