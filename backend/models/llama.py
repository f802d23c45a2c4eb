"""Llama-family decoder with a per-sequence KV cache, run one iteration at a time.

One `forward` call is one model iteration over every scheduled sequence (Orca's shape): new
prompt tokens of joining sequences and one decode token of each running sequence are packed
into a single `[total_tokens, hidden]` activation, so every non-attention op runs once over
all of them (selective batching); attention is per sequence against its own KV cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.weights import weight_getter


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_hf(cls, cfg: dict) -> "LlamaConfig":
        if cfg.get("model_type", "llama") != "llama":
            raise ValueError(f"unsupported decoder model_type {cfg.get('model_type')!r} (expected llama)")
        # transformers < 5 writes rope_theta / rope_scaling; >= 5 writes rope_parameters.
        rope = cfg.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", "default")
        if cfg.get("rope_scaling") or rope_type != "default":
            raise ValueError(f"rope_scaling / rope_type {rope_type!r} is not supported yet")
        rope_theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


class KVCache:
    """Keys and values of one sequence for every layer: `[layers, 2, capacity, kv_heads, head_dim]`.

    Capacity grows by doubling, so appending one token is amortised O(1). (A paged cache
    shared by all sequences is its own piece of work; this is the simple contiguous one.)
    """

    def __init__(self, config: LlamaConfig, device: torch.device, dtype: torch.dtype, capacity: int = 64):
        self._shape = (config.num_layers, 2, capacity, config.num_kv_heads, config.head_dim)
        self.data = torch.empty(self._shape, device=device, dtype=dtype)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.data.shape[2]

    def reserve(self, total: int) -> None:
        if total <= self.capacity:
            return
        new_cap = max(total, 2 * self.capacity)
        grown = torch.empty(
            (self._shape[0], 2, new_cap, *self._shape[3:]), device=self.data.device, dtype=self.data.dtype
        )
        grown[:, :, : self.length] = self.data[:, :, : self.length]
        self.data = grown

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


class LlamaModel:
    def __init__(self, config: LlamaConfig, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype):
        self.config = config
        self.device = device
        self.dtype = dtype
        w = weight_getter(state, device, dtype)

        self.embed = w("embed_tokens.weight")
        self.lm_head = self.embed if config.tie_word_embeddings or "lm_head.weight" not in state else w("lm_head.weight")
        self.final_norm = w("norm.weight")
        self.layers = []
        for i in range(config.num_layers):
            p = f"layers.{i}."
            self.layers.append(
                {
                    "in_norm": w(p + "input_layernorm.weight"),
                    "qkv_w": torch.cat(
                        [w(p + "self_attn.q_proj.weight"), w(p + "self_attn.k_proj.weight"), w(p + "self_attn.v_proj.weight")]
                    ),
                    "o_w": w(p + "self_attn.o_proj.weight"),
                    "post_norm": w(p + "post_attention_layernorm.weight"),
                    "gate_up_w": torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]),
                    "down_w": w(p + "mlp.down_proj.weight"),
                }
            )

    def new_cache(self) -> KVCache:
        return KVCache(self.config, self.device, self.dtype)

    @torch.inference_mode()
    def forward(self, token_lists: list[list[int]], caches: list[KVCache]) -> torch.Tensor:
        """Run one iteration. `token_lists[i]` are the new tokens of sequence i (a prompt, a
        prompt chunk or one decoded token), appended after `caches[i].length` cached tokens.
        Updates the caches and returns the logits of each sequence's last new token `[B, vocab]` (fp32)."""
        cfg = self.config
        dev = self.device
        new_lens = [len(t) for t in token_lists]
        past = [c.length for c in caches]
        for c, n in zip(caches, new_lens):
            c.reserve(c.length + n)

        ids = torch.tensor([t for seq in token_lists for t in seq], device=dev, dtype=torch.long)
        positions = torch.tensor([p + j for p, n in zip(past, new_lens) for j in range(n)], device=dev)
        cu_q = _cumsum(new_lens, dev)
        max_q = max(new_lens)
        cu_k = _cumsum([p + n for p, n in zip(past, new_lens)], dev)
        cos, sin = kernels.rotary_cos_sin(positions, cfg.head_dim, cfg.rope_theta)

        h = self.embed[ids]
        residual = None
        for li, layer in enumerate(self.layers):
            x, residual = kernels.rms_norm(h, layer["in_norm"], cfg.rms_norm_eps, residual)
            q, k, v = kernels.qkv_split_rotary(
                F.linear(x, layer["qkv_w"]), None, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cos, sin
            )
            keys, values = self._append_and_gather(li, k, v, caches, past, new_lens)
            ctx = kernels.varlen_attention(q, keys, values, cu_q, cu_k, causal=True, max_seqlen_q=max_q)
            h = F.linear(ctx.reshape(ctx.shape[0], -1), layer["o_w"])
            x, residual = kernels.rms_norm(h, layer["post_norm"], cfg.rms_norm_eps, residual)
            h = F.linear(kernels.silu_and_mul(F.linear(x, layer["gate_up_w"])), layer["down_w"])
        for c, n in zip(caches, new_lens):
            c.length += n

        last = cu_q[1:].long() - 1
        x, _ = kernels.rms_norm(h[last], self.final_norm, cfg.rms_norm_eps, residual[last])
        return F.linear(x, self.lm_head).float()

    @staticmethod
    def _append_and_gather(layer, k, v, caches, past, new_lens):
        """Write this iteration's k/v into each sequence's cache, return all keys/values packed."""
        keys, values = [], []
        offset = 0
        for c, p, n in zip(caches, past, new_lens):
            c.data[layer, 0, p : p + n] = k[offset : offset + n]
            c.data[layer, 1, p : p + n] = v[offset : offset + n]
            keys.append(c.data[layer, 0, : p + n])
            values.append(c.data[layer, 1, : p + n])
            offset += n
        if len(keys) == 1:
            return keys[0], values[0]
        return torch.cat(keys), torch.cat(values)


def _cumsum(lengths: list[int], device: torch.device) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, device=device, dtype=torch.int32)
