"""Doge (`doge`: SmallDoge's Doge-20M ... Doge-320M): Llama's block (RMSNorms, gated MLP, rotary, grouped-query
attention) with per-head RMSNorms on q and k before the rotary, learnt per-channel residual weights and dynamic mask
attention, served up to `keep_window_size` tokens a sequence.

- Residuals: x = r_a * x + attn(norm(x)), then x = r_m * x + mlp(norm(x)), r_a / r_m the layer's `input_residual` /
  `post_attention_residual` vectors `[hidden]` (each product rounded to the model dtype before the add, as
  transformers computes it): a loop of PyTorch element-wise ops here, the norms and linears the shared kernels.
- Dynamic mask attention: each key's score from the query gets, per KV head h, a bias
  b = exp(A_h * softplus(dt_proj(v))_h) added after the scaling, v that token's value heads `[Hkv * head_dim]`
  (dt_proj `[Hkv, Hkv * head_dim]`, with a bias where `attention_bias`). b is a function of the key's own value
  alone, so it is computed once, when the key is written, and kept with it: the cache's key heads are
  head_dim + 8 wide, [k; b; b; 0...], the value heads [v; 0...], and the queries [q; hi; lo; 0...] with hi + lo =
  sqrt(head_dim) (hi rounded to the model dtype, lo the rest) under the scale head_dim ** -0.5, so the score is
  q . k * scale + b. A decode step reads every past key's bias where it reads its key, on the paged attention
  kernels unchanged (CUDA-graph capturable, no host sync); the cost is the 8 extra dims a head (the kernel pads a
  head of 136 to 256) and 8 / head_dim more cache. dt_proj and the bias are PyTorch ops (a few rows, Hkv columns).
- transformers keeps, for a query, only the `keep_window_size` keys of largest bias once a sequence's keys outnumber
  it (a top-k over the keys); up to that length every key is kept and the attention is the biased causal attention
  above. So the longest sequence served (the spec's max_position_embeddings) is capped at keep_window_size (DogeConfig's
  2,048 by default, Doge-320M's max_position_embeddings too), and a max_model_len past it is refused by name.
  `sliding_window` (a window on every layer, as transformers' mask) runs on the kernels' windows.

Refused by name: `is_moe` (the cross-domain mixture of experts: transformers' router reshapes its logits `[tokens,
2 * keys]` to `[2, tokens, keys]` by memory order, so with more than one token in a forward a token's experts are
chosen from other tokens' router halves, later ones included: its output for a prompt depends on how the prompt is
batched, which no per-token runtime reproduces), a `hidden_act` other than silu / gelu / gelu_pytorch_tanh, a
head_dim past 504 (the kernels' 512 less the bias dims), tensor parallelism, FP8 linears.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf

# the key heads' extra dims that carry each key's bias (two used: b * hi + b * lo), 16 bytes in bf16 for alignment
BIAS_DIMS = 8
ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class DogeSpec(DecoderSpec):
    keep_window_size: int = 2048
    dt_bias: bool = False  # dt_proj has a bias (attention_bias)
    fp8_refused: bool = True  # (load_decoder: FP8 linears are refused)

    def check_max_model_len(self, max_model_len: int) -> None:
        """decoder.load_decoder's check of a max_model_len asked for: none past keep_window_size."""
        if max_model_len > self.keep_window_size:
            raise ValueError(
                f"Doge with max_model_len {max_model_len} is not supported (supported: max_model_len up to "
                f"keep_window_size, {self.keep_window_size}: past it transformers keeps each query's "
                f"keep_window_size keys of largest dynamic-mask bias only, which is not implemented)")

    def check_split(self, tp) -> None:
        raise ValueError("tensor parallelism is not supported for model_type 'doge' (supported: one GPU)")

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each layer's dynamic-mask tensors and residual weights (client/model_shapes.tensor_shapes)."""
        kv, hidden = self.num_kv_heads, self.hidden_size
        shapes = {}
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes.update({p + "self_attn.A": (kv,), p + "self_attn.dt_proj.weight": (kv, kv * self.head_dim),
                           p + "input_residual": (hidden,), p + "post_attention_residual": (hidden,)})
            if self.dt_bias:
                shapes[p + "self_attn.dt_proj.bias"] = (kv,)
        return shapes


def from_hf(cfg: dict) -> DogeSpec:
    if cfg.get("is_moe", False):
        raise ValueError("Doge with is_moe true is not supported (supported: is_moe false, the dense MLP: "
                         "transformers' cross-domain experts choose a token's experts from other tokens' router "
                         "logits whenever a forward holds more than one token, so its output is not a function of "
                         "each token)")
    act = cfg.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ValueError(f"Doge with hidden_act {act!r} is not supported (supported: hidden_act "
                         f"{', '.join(ACTIVATIONS)})")
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    if head_dim + BIAS_DIMS > 512:
        raise ValueError(f"Doge with head_dim {head_dim} is not supported (supported: head_dim up to "
                         f"{512 - BIAS_DIMS}: each cached key carries its bias in {BIAS_DIMS} dims more)")
    keep = int(cfg.get("keep_window_size", 2048))
    if keep < 2:
        raise ValueError(f"Doge with keep_window_size {keep} is not supported (supported: keep_window_size at least 2)")
    bias = bool(cfg.get("attention_bias", False))
    spec = spec_from_hf(cfg, activation=ACTIVATIONS[act], qkv_bias=bias, o_bias=bias, qk_norm=True,
                        layer_windows=layer_windows(cfg, cfg.get("sliding_window")))
    options = {f.name: getattr(spec, f.name) for f in fields(spec) if f.init}
    options["max_position_embeddings"] = min(spec.max_position_embeddings, keep)  # (the rope built as published)
    return DogeSpec(**options, keep_window_size=keep, dt_bias=bias)


class DogeDecoder(TransformerDecoder):
    def __init__(self, config: DogeSpec, state: dict, device: torch.device, dtype: torch.dtype, tp=None):
        if tp is not None:
            config.check_split(tp)
        super().__init__(config, state, device, dtype)
        c = config
        kv, d, hidden = c.num_kv_heads, c.head_dim, c.hidden_size
        sizes = f"hidden {hidden}, KV heads {kv} x {d}"

        def w(name: str, *shape: int) -> torch.Tensor:
            return self.weight(self.checked(state, name, shape, sizes))

        self.A, self.dt_w, self.dt_b, self.attn_residual, self.mlp_residual = [], [], [], [], []
        for i in range(c.num_layers):
            p = f"layers.{i}."
            self.A.append(w(p + "self_attn.A", kv))
            self.dt_w.append(w(p + "self_attn.dt_proj.weight", kv, kv * d))
            self.dt_b.append(w(p + "self_attn.dt_proj.bias", kv) if c.dt_bias else None)
            self.attn_residual.append(w(p + "input_residual", hidden))
            self.mlp_residual.append(w(p + "post_attention_residual", hidden))
        # Every cache layer's key and value heads BIAS_DIMS wider (the module's docstring)
        self.kv_shapes = [(kv, d + BIAS_DIMS)] * self.num_kv_layers
        # The queries' bias dims: sqrt(head_dim) as hi + lo, each in the model dtype, zeros after them
        root = math.sqrt(d)
        hi = torch.tensor(root, dtype=dtype)
        lo = torch.tensor(root - hi.double().item(), dtype=dtype)
        self.query_tail = torch.zeros(BIAS_DIMS, device=device, dtype=dtype)
        self.query_tail[0], self.query_tail[1] = hi, lo

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for the rows in `batch.logits_index`: each layer's residual adds
        weighted per channel (the module's docstring)."""
        c = self.config
        eps = c.norm_eps
        cos_sin = self.rope_cos_sin[batch.positions]
        x = self._embed(batch.input_ids)
        for li, layer in enumerate(self.layers):
            h = self._attend(kernels.rms_norm(x, layer.attn_norm, eps)[0], li, layer, batch, cache, cos_sin, None)
            x = self.attn_residual[li] * x + h
            m = self._mlp(kernels.rms_norm(x, layer.mlp_norm, eps)[0], layer)
            x = self.mlp_residual[li] * x + m
        if not batch.logits_every_row:
            x = x[batch.logits_index]
        return kernels.rms_norm(x, self.final_norm, eps)[0]

    def _attend(self, x: torch.Tensor, li: int, layer, batch: DecoderBatch, cache: PagedKVCache,
                cos_sin: torch.Tensor, local: torch.Tensor | None, pre: kernels.PreNorm | None = None) -> torch.Tensor:
        """Layer `li`'s dynamic mask attention over its normalised input rows x, to the output projection's rows:
        q / k normed per head and rotated, each new key's bias from its values written with it (the module's
        docstring)."""
        c = self.config
        h, kv, d = c.num_heads, c.num_kv_heads, c.head_dim
        t = x.shape[0]
        qkv = kernels.linear_act(x, layer.qkv_w, layer.qkv_b, prenorm=pre)
        q, k, v = kernels.qkv_split(qkv, None, h, kv, d)
        q = kernels.rms_norm(q.reshape(-1, d), layer.q_norm, c.norm_eps)[0].view(t, h, d)
        k = kernels.rms_norm(k.reshape(-1, d), layer.k_norm, c.norm_eps)[0].view(t, kv, d)
        q, k = kernels.apply_rotary(q, cos_sin[:, 0], cos_sin[:, 1]), kernels.apply_rotary(k, cos_sin[:, 0],
                                                                                            cos_sin[:, 1])
        # (in the model dtype op by op, as transformers rounds it)
        dt = F.linear(v.reshape(t, kv * d), self.dt_w[li], self.dt_b[li])
        bias = torch.exp(self.A[li] * F.softplus(dt))  # [T, Hkv]
        pad = k.new_zeros(t, kv, BIAS_DIMS - 2)
        keys = torch.cat([k, bias[:, :, None], bias[:, :, None], pad], dim=-1)
        values = torch.cat([v, v.new_zeros(t, kv, BIAS_DIMS)], dim=-1)
        kernels.write_kv(cache.keys(layer.kv_index), cache.values(layer.kv_index), keys, values, batch.slot_mapping)
        queries = torch.cat([q, self.query_tail.expand(t, h, BIAS_DIMS)], dim=-1)
        ctx = batch.attention(queries, cache.keys(layer.kv_index), cache.values(layer.kv_index), scale=d ** -0.5,
                              window=layer.window)
        return kernels.linear_act(ctx[:, :, :d].reshape(t, h * d), layer.o_w, layer.o_b)


MODEL = DogeDecoder
