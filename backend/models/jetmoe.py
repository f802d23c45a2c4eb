"""JetMoE (jetmoe/jetmoe-8b): a pre-norm block (RMSNorms) whose attention and MLP are both mixtures of experts.

Mixture of attention heads (MoA): E attention experts, each a query projection `[H * D, hidden]` and an output
projection `[hidden, H * D]` of its own (H = `num_key_value_heads` heads of D = `kv_channels`); the keys and
values (`kv_proj`, `[2 * H * D, hidden]`: k rows, then v rows) are shared. A router (`experts.router.layer`,
`[E, hidden]`, no bias) scores each token: logits = x_n W_r^T (in the activation dtype, then fp32), the k =
`num_experts_per_tok` largest chosen, their weights g = softmax over those k logits (fp32), rounded to the
activation dtype. Each chosen expert's q (rotary over all D dims, Llama's half split, base `rope_theta`) forms H
query heads, so the token has k * H query heads; query head h of slot s reads KV head h (the keys repeated per
slot). The attention's output of slot s goes through its expert's output projection, times g_s; the slots'
sum plus the block's bias (`experts.bias`, `[hidden]`) is the attention's output. Scores scaled by D^-0.5.

Mixture of MLP experts: E experts, each `input_linear` `[2I, hidden]` ([gate; up]) and `output_linear`
`[hidden, I]`, silu(gate) * up; routed as the attention is (the k largest logits, a softmax over them, rounded
to the activation dtype: moe.py's renormalised top-k), the weighted sum plus the block's bias (`mlp.bias`).
The layers' two norms have eps 1e-6 whatever the config says; the final norm has `rms_norm_eps`. The output head
is tied to the embeddings unless `tie_word_embeddings` is false.

How it runs, one batched pass per layer (no host sync, no per-token loop: a decode step is a CUDA graph's):
every expert's q is computed, one linear of E * H * D + 2 * H * D + E rows (the q projections of all experts,
k, v and the router's rows fused), so the q projection reads E / k times the weights and does E / k times the
FLOPs a token's own experts need (8 / 2 = 4x for jetmoe-8b: 16 MB of bf16 q weights a layer, the same bytes
the grouped expert GEMM reads once a batch touches every expert). The chosen experts' q are gathered per token
(torch.gather), ordered [KV head, slot] so the paged attention's grouped-query layout (query head j reads KV
head j // k) is JetMoE's repetition; the attention runs over k * H heads, the KV cache holds H. Each slot's
output times its weight is scattered into its expert's columns of a zero `[T, E * H * D]` row, and one linear
with every expert's output projection side by side (`[hidden, E * H * D]`) sums them: E / k times the output
projection's weights and FLOPs again. Rounding: Hugging Face rounds each expert's projected output and its
product with the weight before summing; here the weight multiplies the attention's output before one fp32-
accumulated projection (the same sum; the CPU tests, in fp32, are token-identical).

Refused by name: an `activation_function` other than silu, tensor parallelism, FP8 linears.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.moe import MoeNames, MoeSpec
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

MOA = "self_attention.experts."
NAMES = MoeNames(blocks=("mlp",), routers=("router.layer",), stacked=(("input_linear", "output_linear"),))
LAYER_NORM_EPS = 1e-6  # (JetMoeRMSNorm's default, which the layers' norms keep)


@dataclass(frozen=True)
class JetMoeSpec(DecoderSpec):
    """The shared decoder's spec with num_heads = E * H (every attention expert's q rows, as loaded) and the MoA's
    experts and k."""
    attn_experts: int = 8
    attn_top_k: int = 2

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of a published checkpoint, by name (the model prefix stripped)."""
        hidden, e, width, inter = self.hidden_size, self.attn_experts, self.num_kv_heads * self.head_dim, \
            self.moe.intermediate_size
        shapes = {"embed_tokens.weight": (self.vocab_size, hidden), "norm.weight": (hidden,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, hidden)
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attention.kv_proj.weight": (2 * width, hidden),
                p + MOA + "input_linear.weight": (e, width, hidden),
                p + MOA + "output_linear.weight": (e, hidden, width),
                p + MOA + "bias": (hidden,), p + MOA + "router.layer.weight": (e, hidden),
                p + "mlp.input_linear.weight": (self.moe.num_experts, 2 * inter, hidden),
                p + "mlp.output_linear.weight": (self.moe.num_experts, hidden, inter),
                p + "mlp.router.layer.weight": (self.moe.num_experts, hidden), p + "mlp.bias": (hidden,)})
        return shapes

    def check_split(self, tp) -> None:
        raise ValueError("tensor parallelism is not supported for model_type 'jetmoe' (supported: one GPU)")


def from_hf(cfg: dict) -> JetMoeSpec:
    act = cfg.get("activation_function", "silu")
    if act != "silu":
        raise ValueError(f"JetMoE with activation_function {act!r} is not supported (supported: activation_function "
                         "silu)")
    experts, top_k = cfg.get("num_local_experts", 8), cfg.get("num_experts_per_tok", 2)
    heads, head_dim = cfg.get("num_key_value_heads", 16), cfg.get("kv_channels", 128)
    moe = MoeSpec(num_experts=experts, top_k=top_k, intermediate_size=cfg.get("intermediate_size", 5632),
                  normalize=True, round_weights=True, layers=(True,) * cfg["num_hidden_layers"], names=NAMES)
    spec = spec_from_hf({**cfg, "num_attention_heads": experts * heads, "num_key_value_heads": heads,
                         "head_dim": head_dim, "intermediate_size": cfg.get("intermediate_size", 5632)},
                        tie_default=True, norm_eps=LAYER_NORM_EPS, final_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                        o_bias=True, moe=moe)
    return JetMoeSpec(**{f.name: getattr(spec, f.name) for f in fields(spec) if f.init}, attn_experts=experts,
                      attn_top_k=top_k)


class _View:
    """A lazily read checkpoint tensor seen through `build` (a reshape / slice), read when the loader reads it."""

    def __init__(self, source, shape: tuple[int, ...], build):
        self.source, self.shape, self.build = source, tuple(shape), build
        self.dtype = getattr(source, "dtype", None)

    def _tensor(self) -> torch.Tensor:
        return self.build(self.source.read() if hasattr(self.source, "read") else self.source[:])

    def __getitem__(self, index) -> torch.Tensor:
        return self._tensor()[index]

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self._tensor().to(*args, **kwargs)


def _viewed(source, shape: tuple[int, ...], build):
    return build(source) if isinstance(source, torch.Tensor) else _View(source, shape, build)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """Each layer's MoA under the shared decoder's names: every expert's q rows stacked as `self_attn.q_proj`
    `[E * H * D, hidden]`, kv_proj's halves as k / v, the output projections side by side as `o_proj`
    `[hidden, E * H * D]` with the block's bias (views: nothing is read here)."""
    state = dict(state)
    for i in range(cfg.get("num_hidden_layers", 0)):
        p = f"layers.{i}."
        if p + MOA + "input_linear.weight" not in state or p + "self_attention.kv_proj.weight" not in state:
            continue
        q, o, kv = (state[p + MOA + "input_linear.weight"], state[p + MOA + "output_linear.weight"],
                    state[p + "self_attention.kv_proj.weight"])
        (e, width, hidden), (rows, _) = tuple(q.shape), tuple(kv.shape)
        state[p + "self_attn.q_proj.weight"] = _viewed(q, (e * width, hidden), lambda t: t.reshape(-1, t.shape[-1]))
        half = rows // 2
        state[p + "self_attn.k_proj.weight"] = _viewed(kv, (half, hidden), lambda t, h=half: t[:h])
        state[p + "self_attn.v_proj.weight"] = _viewed(kv, (rows - half, hidden), lambda t, h=half: t[h:])
        state[p + "self_attn.o_proj.weight"] = _viewed(o, (o.shape[1], e * o.shape[2]),
                                                       lambda t: t.permute(1, 0, 2).reshape(t.shape[1], -1))
        if p + MOA + "bias" in state:
            state[p + "self_attn.o_proj.bias"] = state[p + MOA + "bias"]
    return cfg, state


class _BiasedMoe:
    """A MoE block's output plus the block's bias (JetMoE's `mlp.bias`); otherwise the MoeLayer it wraps."""

    def __init__(self, moe, bias: torch.Tensor):
        self.moe, self.bias = moe, bias

    def __call__(self, x: torch.Tensor, activation: str, prenorm: kernels.PreNorm | None = None) -> torch.Tensor:
        return self.moe(x, activation, prenorm) + self.bias

    def __getattr__(self, name: str):
        return getattr(self.moe, name)


class JetMoeDecoder(TransformerDecoder):
    def __init__(self, config: JetMoeSpec, state: dict, device: torch.device, dtype: torch.dtype, tp=None):
        if tp is not None:
            config.check_split(tp)
        super().__init__(config, state, device, dtype)
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}."
            router = self.weight(self.checked(state, p + MOA + "router.layer.weight",
                                              (config.attn_experts, config.hidden_size), "MoA router"))
            layer.qkv_w = torch.cat([layer.qkv_w, router])  # [q of every expert; k; v; router]
            layer.moe = _BiasedMoe(layer.moe, self.weight(self.checked(state, p + "mlp.bias", (config.hidden_size,),
                                                                       "MLP bias")))

    def _attend(self, x: torch.Tensor, li: int, layer, batch: DecoderBatch, cache: PagedKVCache,
                cos_sin: torch.Tensor, local: torch.Tensor | None, pre: kernels.PreNorm | None = None) -> torch.Tensor:
        """The MoA (module docstring) over the rows x (PreNorm'd by `pre` where given)."""
        c = self.config
        e, k, heads, d = c.attn_experts, c.attn_top_k, c.num_kv_heads, c.head_dim
        width, kv_layer = heads * d, layer.kv_index
        y = kernels.linear_act(x, layer.qkv_w, None, prenorm=pre)
        q_all, kv, logits = y.split([e * width, 2 * width, e], dim=-1)
        top, chosen = logits.float().topk(k, dim=-1)
        gates = torch.softmax(top, dim=-1).to(y.dtype)
        index = chosen[:, :, None].expand(-1, -1, width)
        q = q_all.reshape(-1, e, width).gather(1, index)  # [T, k, H * D]: the chosen experts' q, in rank order
        q = q.view(-1, k, heads, d).transpose(1, 2).reshape(-1, heads * k * d)  # heads as [KV head, slot]
        q, keys, values = kernels.qkv_split_rotary(torch.cat([q, kv], dim=-1), None, heads * k, heads, d,
                                                   cos_sin[:, 0], cos_sin[:, 1])
        kernels.write_kv(cache.keys(kv_layer), cache.values(kv_layer), keys, values, batch.slot_mapping)
        ctx = batch.attention(q, cache.keys(kv_layer), cache.values(kv_layer))
        ctx = ctx.reshape(-1, heads, k, d).transpose(1, 2).reshape(-1, k, width) * gates[:, :, None]
        spread = ctx.new_zeros(ctx.shape[0], e, width).scatter_(1, index, ctx)  # each slot in its expert's columns
        return kernels.linear_act(spread.view(-1, e * width), layer.o_w, layer.o_b)


MODEL = JetMoeDecoder
