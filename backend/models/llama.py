"""Llama-family decoder (SmolLM2, Llama 3 shapes) over a paged KV cache.

One `forward` call is one model iteration over every scheduled sequence (Orca's shape): prompt
chunks of joining sequences and one decode token of each running sequence are packed into a
single `[total_tokens, hidden]` activation, so every non-attention op runs once over all of
them (selective batching); attention reads each sequence's keys from the paged cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel


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


class LlamaModel(DecoderModel):
    def __init__(self, config: LlamaConfig, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype):
        super().__init__(config, state, device, dtype)
        w = self.weight

        self.embed = w("embed_tokens.weight")
        tied = config.tie_word_embeddings or "lm_head.weight" not in state
        self.set_output_head(self.embed if tied else w("lm_head.weight"))
        self.final_norm = w("norm.weight")
        # Rotary tables for every position, looked up per token: no per-iteration trigonometry,
        # and a lookup is all a captured CUDA graph needs to replay. cos and sin side by side,
        # [positions, 2, head_dim // 2], so that one gather fetches both.
        positions = torch.arange(config.max_position_embeddings, device=device)
        self.rope_cos_sin = torch.stack(kernels.rotary_cos_sin(positions, config.head_dim, config.rope_theta), dim=1)
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

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        """One iteration over the batch's packed tokens; returns `[S, vocab]` fp32 logits of the
        rows in `batch.logits_index`."""
        cfg = self.config
        cos_sin = self.rope_cos_sin[batch.positions]  # one gather for both tables
        cos, sin = cos_sin[:, 0], cos_sin[:, 1]
        # The token embeddings (the first residual) and the first RMSNorm in one launch. Each
        # layer's residual adds and RMSNorms before its QKV projection and its MLP are those
        # linears' PreNorms: for a decode row or two one kernel with the GEMM (and rotary and the
        # cache write: kernels.prenorm_qkv_to_cache); for more rows a kernel of their own.
        x, residual = kernels.embedding_rms_norm(batch.input_ids, self.embed, self.layers[0]["in_norm"],
                                                 cfg.rms_norm_eps)
        pre = None  # the first layer's input comes normalised from the embedding kernel
        for li, layer in enumerate(self.layers):
            q = kernels.prenorm_qkv_to_cache(
                x, pre, layer["qkv_w"], None, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cos, sin,
                cache.keys(li), cache.values(li), batch.slot_mapping,
            )
            if pre is not None:
                residual = pre.sum_out
            ctx = batch.attention(q, cache.keys(li), cache.values(li))
            h = kernels.linear_act(ctx.reshape(ctx.shape[0], -1), layer["o_w"])
            mlp_pre = kernels.PreNorm(layer["post_norm"], None, cfg.rms_norm_eps, residual=residual,
                                      sum_out=torch.empty_like(residual))
            x = kernels.linear_act(kernels.linear_act(h, layer["gate_up_w"], None, "silu_mul", prenorm=mlp_pre),
                                   layer["down_w"])
            residual = mlp_pre.sum_out
            if li + 1 < len(self.layers):
                pre = kernels.PreNorm(self.layers[li + 1]["in_norm"], None, cfg.rms_norm_eps, residual=residual,
                                      sum_out=torch.empty_like(residual))
        if not batch.logits_every_row:
            x, residual = x[batch.logits_index], residual[batch.logits_index]
        x, _ = kernels.rms_norm(x, self.final_norm, cfg.rms_norm_eps, residual)
        return self.logits(x, fp32_logits)
