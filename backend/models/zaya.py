"""ZAYA (`zaya`: Zyphra's ZAYA1-8B; transformers builds it on AFMoE): a pre-norm block of attention fed by
compressed convolutional attention (CCA) projections, L2 q / k norms, learnt residual scalings, and one expert a
token chosen by a router that is an MLP whose hidden state runs from layer to layer. Per layer, x the residual
stream (kept in fp32, as transformers' `residual_in_fp32` path keeps it), n = RMSNorm(x) (`input_layernorm`, w * x):

    q = W_q n, k = W_k n                         (H heads of D, Hkv of D)
    r_q = (q + repeat(k)) / 2, r_k = mean of r_q over each KV head's group of query heads
    [q'; k'] = grouped_conv(depthwise_conv([q; k]))   causal over time: a depthwise convolution of cca_time0
               taps, then one of cca_time1 taps whose groups are heads (each of its D outputs reads the head's D
               inputs); both with biases; the convolutions' first output rounded to the activation dtype
    q = q' + r_q, k = k' + r_k
    v = [W_vc n ; W_vd n of the token before]   (the first half of the value rows the current token's, the second
               half the previous token's delayed projection; before a sequence's first token, W_vd 0 = its bias)
    q = sqrt(D) q / max(|q|, eps), k = sqrt(D) temp_h k / max(|k|, eps)   (per head, eps the dtype's; temp per KV
               head, `qk_norm.temp`)
    q, k rotated on the first partial_rotary_factor of each head's dims (rotate-half within them), attention
               scaled by D ** -0.5 (a sliding window on `hybrid_sliding` layers), the output projection o
    x = (o + b_1) s_1 + (x + c_1) t_1            (`post_attention_residual_scale`: per channel)
    m = RMSNorm(x) (`post_attention_layernorm`)
    router: r = W_d m + b_d (+ r_prev * `router_states_scale` after the first layer), carried to the next layer;
            logits = W_out gelu(fc2 gelu(fc1 RMSNorm(r)))  over num_experts + 1 classes (the last: skip, no
            compute); p = softmax(logits); the class of the largest p + `balancing_biases`, weighted by its p
    x = (e + b_2) s_2 + (x + c_2) t_2            (e the chosen expert's SwiGLU output times p; zero for skip)

before the layers x = (embed + `input_hidden_states_bias`) * `input_hidden_states_scale`; after them the final
RMSNorm and the head (tied by default; a bias where `lm_head_bias`).

A sequence carries per layer the convolution's last (cca_time0 - 1) + (cca_time1 - 1) inputs [q; k] and the
last token's delayed value projection (without its bias, added when it is read: a zeroed state is W_vd 0), a
recurrent state (decoder/state_cache.py) beside its keys and values. Decode rows run the convolution's step
as one launch (kernels.cca_conv_decode); prompt chunks loop over their sequences on the host. The skip class
is an expert of zero weights (one more expert a layer), so the routing is kernels.moe_mlp's softmax top-1 with
a score bias, unnormalised: it chooses on fp32 probabilities where transformers rounds them to the activation dtype
first (in bf16 a near tie apart; the GPU check runs fp32). The residual stream's element-wise ops are PyTorch's;
the linears, norms, rotary, attention and experts are the shared kernels.

Refused by name: tensor parallelism and FP8 linears (a model class of its own), more than one expert a token
(transformers' own limit), layer types other than hybrid / hybrid_sliding, rope types other than default, an
activation other than silu, a convolution without taps to carry (cca_time0 = cca_time1 = 1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.decoder.state_cache import StateCache
from tritonformer.backend.models.decoder import DecoderModel, eos_ids
from tritonformer.backend.models.rope import Rope

LAYER_TYPES = ("hybrid", "hybrid_sliding")
DEFAULT_THETA = {"hybrid": 5_000_000.0, "hybrid_sliding": 10_000.0}  # (transformers' ZayaConfig's defaults)


@dataclass(frozen=True)
class ZayaSpec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    norm_eps: float
    rope: Rope  # the hybrid layers'
    local_rope: Rope  # the hybrid_sliding layers'
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    layer_windows: tuple[int | None, ...]  # per layer: the sliding window, or None
    num_experts: int
    moe_intermediate_size: int
    router_hidden_size: int
    conv_taps: tuple[int, int]  # (cca_time0, cca_time1)
    attention_bias: bool = False
    head_bias: bool = False
    norm_offset: ClassVar[float] = 0.0  # (norm weights applied as they are)
    attends: ClassVar[bool] = True
    top_k: ClassVar[int] = 1  # one expert a token, or the skip class (what the benchmarks' floors count)

    @property
    def conv_state(self) -> int:
        """The convolution's inputs a sequence carries: (cca_time0 - 1) + (cca_time1 - 1)."""
        return self.conv_taps[0] + self.conv_taps[1] - 2

    @property
    def conv_channels(self) -> int:
        return (self.num_heads + self.num_kv_heads) * self.head_dim

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint holds, by name (the model prefix stripped): client/model_shapes.tensor_shapes."""
        h, d, r, e = self.hidden_size, self.head_dim, self.router_hidden_size, self.num_experts
        q, kv, c, inter = self.num_heads * d, self.num_kv_heads * d, self.conv_channels, self.moe_intermediate_size
        shapes = {"embed_tokens.weight": (self.vocab_size, h), "norm.weight": (h,),
                  "input_hidden_states_scale": (h,), "input_hidden_states_bias": (h,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        if self.head_bias:
            shapes["lm_head.bias"] = (self.vocab_size,)
        for i in range(self.num_layers):
            p, a = f"layers.{i}.", f"layers.{i}.self_attn.qkv_proj."
            layer = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                     a + "q_proj.weight": (q, h), a + "k_proj.weight": (kv, h),
                     a + "v_proj_current.weight": (kv // 2, h), a + "v_proj_delayed.weight": (kv // 2, h),
                     a + "conv_qk_depthwise.weight": (c, 1, self.conv_taps[0]), a + "conv_qk_depthwise.bias": (c,),
                     a + "conv_qk_grouped.weight": (c, d, self.conv_taps[1]), a + "conv_qk_grouped.bias": (c,),
                     p + "self_attn.qk_norm.temp": (self.num_kv_heads,), p + "self_attn.o_proj.weight": (h, q),
                     p + "mlp.gate.balancing_biases": (e + 1,), p + "mlp.gate.down_proj.weight": (r, h),
                     p + "mlp.gate.down_proj.bias": (r,), p + "mlp.gate.router_mlp.norm.weight": (r,),
                     p + "mlp.gate.router_mlp.fc1.weight": (r, r), p + "mlp.gate.router_mlp.fc1.bias": (r,),
                     p + "mlp.gate.router_mlp.fc2.weight": (r, r), p + "mlp.gate.router_mlp.fc2.bias": (r,),
                     p + "mlp.gate.router_mlp.out_proj.weight": (e + 1, r),
                     p + "mlp.experts.gate_up_proj": (e, 2 * inter, h), p + "mlp.experts.down_proj": (e, h, inter)}
            if i:
                layer[p + "mlp.gate.router_states_scale"] = (r,)
            if self.attention_bias:
                layer.update({a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj_current.bias": (kv // 2,),
                              a + "v_proj_delayed.bias": (kv // 2,), p + "self_attn.o_proj.bias": (h,)})
            for block in ("post_attention_residual_scale", "post_mlp_residual_scale"):
                for name in ("hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias"):
                    layer[f"{p}{block}.{name}"] = (h,)
            shapes.update(layer)
        return shapes


def _rope(params: dict | None, kind: str, max_positions: int) -> tuple[Rope, float]:
    """(a layer type's rope, its partial_rotary_factor) from its entry of `rope_parameters`."""
    p = dict(params or {})
    rope_type = p.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"ZAYA {kind} rope_type {rope_type!r} is not supported (supported: rope_type default)")
    return Rope.from_hf(None, float(p.get("rope_theta", DEFAULT_THETA[kind])), max_positions), \
        float(p.get("partial_rotary_factor", 0.5))


def from_hf(cfg: dict) -> ZayaSpec:
    layers = cfg.get("num_hidden_layers", 40)
    top_k = cfg.get("num_experts_per_tok", 1)
    if top_k != 1:
        raise ValueError(f"ZAYA with num_experts_per_tok {top_k} is not supported (supported: num_experts_per_tok 1, "
                         f"as transformers' ZayaConfig)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported ZAYA hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    types = list(cfg.get("layer_types") or ["hybrid"] * layers)
    if len(types) != layers or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"unsupported ZAYA layer_types {types!r} (supported: layer_types 'hybrid' or 'hybrid_sliding' "
                         f"for each of the {layers} layers)")
    window = cfg.get("sliding_window")
    if "hybrid_sliding" in types and not window:
        raise ValueError("ZAYA hybrid_sliding layers need a sliding_window (supported: sliding_window set)")
    taps = (cfg.get("cca_time0", 2), cfg.get("cca_time1", 2))
    if min(taps) < 1 or sum(taps) < 3:
        raise ValueError(f"ZAYA cca_time0 / cca_time1 {taps} are not supported (supported: cca_time0 and cca_time1 1 "
                         f"or more, one of them 2 or more: a convolution that carries inputs from token to token)")
    heads, kv_heads = cfg.get("num_attention_heads", 8), cfg.get("num_key_value_heads", 2)
    head_dim = cfg.get("head_dim") or 128
    if (kv_heads * head_dim) % 2:
        raise ValueError(f"ZAYA value rows {kv_heads * head_dim} are odd (supported: an even num_key_value_heads * "
                         f"head_dim, half of them current, half delayed)")
    max_positions = cfg.get("max_position_embeddings", 131072)
    params = {k: v for k, v in (cfg.get("rope_parameters") or {}).items() if k in LAYER_TYPES}
    rope, partial = _rope(params.get("hybrid"), "hybrid", max_positions)
    local_rope, local_partial = _rope(params.get("hybrid_sliding"), "hybrid_sliding", max_positions)
    if "hybrid_sliding" in types and local_partial != partial:
        raise ValueError(f"ZAYA partial_rotary_factor {local_partial} on hybrid_sliding layers beside {partial} on "
                         f"hybrid ones is not supported (supported: one partial_rotary_factor for both)")
    rotary_dim = int(head_dim * partial)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(f"ZAYA partial_rotary_factor {partial} of head_dim {head_dim} is not supported (supported: "
                         f"partial_rotary_factor rotating an even, non-zero number of dims)")
    return ZayaSpec(
        vocab_size=cfg.get("vocab_size", 262272), hidden_size=cfg.get("hidden_size", 2048), num_layers=layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rotary_dim=rotary_dim,
        norm_eps=cfg.get("rms_norm_eps", 1e-5), rope=rope, local_rope=local_rope, max_position_embeddings=max_positions,
        tie_word_embeddings=cfg.get("tie_word_embeddings", True), bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids(cfg), layer_windows=tuple(window if t == "hybrid_sliding" else None for t in types),
        num_experts=cfg.get("num_experts", 16), moe_intermediate_size=cfg.get("moe_intermediate_size", 2048),
        router_hidden_size=cfg.get("router_hidden_size", 256), conv_taps=taps,
        attention_bias=bool(cfg.get("attention_bias", False)), head_bias=bool(cfg.get("lm_head_bias", False)))


def cca_conv_chunk(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                   conv_state: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """kernels.cca_conv_decode over one sequence's T prompt rows x `[T, C]` at once, continuing from its saved
    inputs (`conv_state[slot]` `[C, K]`, `slot` a 1-element long tensor), which it leaves as the last K."""
    k, d = conv_state.shape[2], w2.shape[1]
    padded = torch.cat([conv_state.index_select(0, slot), x.float().t()[None]], dim=2)  # [1, C, K + T]
    dw = F.conv1d(padded, w1.float()[:, None, :], b1.float(), groups=w1.shape[0]).to(x.dtype).float()
    y = F.conv1d(dw, w2.float(), b2.float(), groups=w2.shape[0] // d)[0].t()
    conv_state.index_copy_(0, slot, padded[:, :, padded.shape[2] - k:])
    return y.to(x.dtype)


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    qk_w: torch.Tensor  # [(H + Hkv) D, hidden]: q's rows, k's
    qk_b: torch.Tensor | None
    v_w: torch.Tensor  # [Hkv D, hidden]: the current half's rows, the delayed half's
    v_cur_b: torch.Tensor | None
    v_del_b: torch.Tensor | None  # (added when the delayed rows are read: the state holds them without it)
    conv1_w: torch.Tensor  # [C, cca_time0] fp32
    conv1_b: torch.Tensor  # [C] fp32
    conv2_w: torch.Tensor  # [C, D, cca_time1] fp32
    conv2_b: torch.Tensor  # [C] fp32
    temp: torch.Tensor  # [Hkv]
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    attn_scales: tuple[torch.Tensor, ...]  # (b_1, s_1, c_1, t_1)
    mlp_norm: torch.Tensor
    router_down_w: torch.Tensor
    router_down_b: torch.Tensor
    router_states_scale: torch.Tensor | None  # None on the first layer
    router_norm: torch.Tensor
    fc1_w: torch.Tensor
    fc1_b: torch.Tensor
    fc2_w: torch.Tensor
    fc2_b: torch.Tensor
    router_out_w: torch.Tensor  # [E + 1, R]
    balancing: torch.Tensor  # [E + 1] fp32
    experts_gate_up: torch.Tensor  # [E + 1, 2I, hidden]: the last expert zeros (the skip class)
    experts_down: torch.Tensor  # [E + 1, hidden, I]
    mlp_scales: tuple[torch.Tensor, ...]  # (b_2, s_2, c_2, t_2)
    window: int | None


class ZayaDecoder(DecoderModel):
    def __init__(self, config: ZayaSpec, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 tp=None):
        if tp is not None:  # (decoder._check_split refuses it first: the spec has no shared decoder's names)
            raise ValueError("tensor parallelism is not supported for model_type 'zaya'")
        super().__init__(config, state, device, dtype)
        c = config
        shapes = c.tensor_shapes()
        sizes = (f"hidden {c.hidden_size}, heads {c.num_heads}/{c.num_kv_heads} x {c.head_dim}, {c.num_experts} "
                 f"experts of {c.moe_intermediate_size}, router {c.router_hidden_size}, vocab {c.vocab_size}")

        def read(name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"checkpoint is missing weight {name!r}")
            if tuple(state[name].shape) != shapes[name]:
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(state[name].shape)}, but the config "
                                 f"({sizes}) needs {shapes[name]}")
            return state[name].to(device=device, dtype=dtype or self.dtype).contiguous()

        def optional(name: str) -> torch.Tensor | None:
            return read(name) if name in shapes else None

        self.embed = read("embed_tokens.weight")
        self.input_scale, self.input_bias = read("input_hidden_states_scale"), read("input_hidden_states_bias")
        self.set_output_head(self.embed if c.tie_word_embeddings else read("lm_head.weight"), optional("lm_head.bias"))
        self.final_norm = read("norm.weight")
        self.tables = {False: c.rope.cos_sin(c.max_position_embeddings, c.rotary_dim, device),
                       True: c.local_rope.cos_sin(c.max_position_embeddings, c.rotary_dim, device)}
        self.layers: list[_Layer] = []
        for i in range(c.num_layers):
            p, a, g = f"layers.{i}.", f"layers.{i}.self_attn.qkv_proj.", f"layers.{i}.mlp.gate."
            v_cur, v_del = a + "v_proj_current.", a + "v_proj_delayed."
            qk_b = None
            if c.attention_bias:
                qk_b = torch.cat([read(a + "q_proj.bias"), read(a + "k_proj.bias")])
            gate_up, down = read(p + "mlp.experts.gate_up_proj"), read(p + "mlp.experts.down_proj")
            self.layers.append(_Layer(
                attn_norm=read(p + "input_layernorm.weight"),
                qk_w=torch.cat([read(a + "q_proj.weight"), read(a + "k_proj.weight")]), qk_b=qk_b,
                v_w=torch.cat([read(v_cur + "weight"), read(v_del + "weight")]),
                v_cur_b=optional(v_cur + "bias"), v_del_b=optional(v_del + "bias"),
                conv1_w=read(a + "conv_qk_depthwise.weight", torch.float32)[:, 0].contiguous(),
                conv1_b=read(a + "conv_qk_depthwise.bias", torch.float32),
                conv2_w=read(a + "conv_qk_grouped.weight", torch.float32),
                conv2_b=read(a + "conv_qk_grouped.bias", torch.float32),
                temp=read(p + "self_attn.qk_norm.temp"),
                o_w=read(p + "self_attn.o_proj.weight"), o_b=optional(p + "self_attn.o_proj.bias"),
                attn_scales=self._scales(read, p + "post_attention_residual_scale."),
                mlp_norm=read(p + "post_attention_layernorm.weight"),
                router_down_w=read(g + "down_proj.weight"), router_down_b=read(g + "down_proj.bias"),
                router_states_scale=optional(g + "router_states_scale"),
                router_norm=read(g + "router_mlp.norm.weight"),
                fc1_w=read(g + "router_mlp.fc1.weight"), fc1_b=read(g + "router_mlp.fc1.bias"),
                fc2_w=read(g + "router_mlp.fc2.weight"), fc2_b=read(g + "router_mlp.fc2.bias"),
                router_out_w=read(g + "router_mlp.out_proj.weight"),
                balancing=read(g + "balancing_biases", torch.float32),
                experts_gate_up=torch.cat([gate_up, gate_up.new_zeros(1, *gate_up.shape[1:])]),
                experts_down=torch.cat([down, down.new_zeros(1, *down.shape[1:])]),
                mlp_scales=self._scales(read, p + "post_mlp_residual_scale."),
                window=c.layer_windows[i]))
        self.state_layouts = [{"conv": (c.conv_channels, c.conv_state), "value": (c.num_kv_heads * c.head_dim // 2,)}
                              for _ in range(c.num_layers)]

    @staticmethod
    def _scales(read, prefix: str) -> tuple[torch.Tensor, ...]:
        return tuple(read(prefix + name) for name in ("hidden_states_bias", "hidden_states_scale", "residual_bias",
                                                      "residual_scale"))

    def new_state_cache(self, num_slots: int) -> StateCache:
        return StateCache(self.state_layouts, num_slots, self.device)

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        return self.logits(self.hidden_states(batch, cache), fp32_logits)

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for the rows in `batch.logits_index` (see the module's docstring)."""
        if batch.state_slots is None:
            raise ValueError("ZAYA's convolutions need each sequence's state slot (DecoderBatch.state_slots)")
        c = self.config
        e = kernels.embedding_part(batch.input_ids, self.embed, 0)
        x = ((e + self.input_bias) * self.input_scale).float()  # the residual stream, fp32
        cos_sin = {local: table[batch.positions] for local, table in self.tables.items()}
        router = None
        for i, layer in enumerate(self.layers):
            n = kernels.rms_norm(x.to(self.dtype), layer.attn_norm, c.norm_eps)[0]
            o = self._attend(n, i, layer, batch, cache, cos_sin[layer.window is not None])
            x = self._scaled_sum(o, x, layer.attn_scales)
            m = kernels.rms_norm(x.to(self.dtype), layer.mlp_norm, c.norm_eps)[0]
            f, router = self._experts(m, layer, router)
            x = self._scaled_sum(f, x, layer.mlp_scales)
        if not batch.logits_every_row:
            x = x[batch.logits_index]
        return kernels.rms_norm(x.to(self.dtype), self.final_norm, c.norm_eps)[0]

    @staticmethod
    def _scaled_sum(h: torch.Tensor, x: torch.Tensor, scales: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(h + b) s in the activation dtype plus (x + c) t in fp32: the block's output joins the residual."""
        b, s, rb, rs = scales
        return ((h + b) * s).float() + (x + rb.float()) * rs.float()

    def _attend(self, n: torch.Tensor, i: int, layer: _Layer, batch: DecoderBatch, cache: PagedKVCache,
                cos_sin: torch.Tensor) -> torch.Tensor:
        c = self.config
        rows, heads, kv_heads, d = n.shape[0], c.num_heads, c.num_kv_heads, c.head_dim
        state = cache.state.layer(i)
        qk = kernels.linear_act(n, layer.qk_w, layer.qk_b)
        q_res = qk[:, : heads * d].view(rows, heads, d)
        k_rep = qk[:, heads * d:].view(rows, kv_heads, 1, d).expand(rows, kv_heads, heads // kv_heads, d)
        q_res = (q_res + k_rep.reshape(rows, heads, d)) * 0.5
        k_res = q_res.view(rows, kv_heads, heads // kv_heads, d).mean(dim=2)
        conv = self._conv(qk, layer, batch, state["conv"])
        q = conv[:, : heads * d].view(rows, heads, d) + q_res
        k = conv[:, heads * d:].view(rows, kv_heads, d) + k_res
        v = kernels.linear_act(n, layer.v_w)
        half = v.shape[1] // 2
        current, delayed = v[:, :half], self._delayed(v[:, half:], batch, state["value"])
        if layer.v_cur_b is not None:
            current, delayed = current + layer.v_cur_b, delayed + layer.v_del_b
        v = torch.cat([current, delayed], dim=1).view(rows, kv_heads, d)
        eps = torch.finfo(q.dtype).eps
        q = q * (d ** 0.5 / q.norm(p=2, dim=-1, keepdim=True).clamp_min(eps))
        k = k * (d ** 0.5 / k.norm(p=2, dim=-1, keepdim=True).clamp_min(eps)) * layer.temp[None, :, None]
        r = c.rotary_dim
        cos, sin = cos_sin[:, 0], cos_sin[:, 1]
        q = torch.cat([kernels.apply_rotary(q[..., :r].contiguous(), cos, sin), q[..., r:]], dim=-1)
        k = torch.cat([kernels.apply_rotary(k[..., :r].contiguous(), cos, sin), k[..., r:]], dim=-1)
        kernels.write_kv(cache.keys(i), cache.values(i), k, v.contiguous(), batch.slot_mapping)
        ctx = batch.attention(q, cache.keys(i), cache.values(i), scale=d ** -0.5, window=layer.window)
        return kernels.linear_act(ctx.reshape(rows, -1), layer.o_w, layer.o_b)

    @staticmethod
    def _conv(qk: torch.Tensor, layer: _Layer, batch: DecoderBatch, conv_state: torch.Tensor) -> torch.Tensor:
        """The CCA convolutions over each sequence's rows of [q; k], continuing from its saved inputs."""
        d, slots = batch.num_decode, batch.state_slots
        weights = (layer.conv1_w, layer.conv1_b, layer.conv2_w, layer.conv2_b)
        if d and d == qk.shape[0]:  # decode rows only (a decode graph's step): one launch
            return kernels.cca_conv_decode(qk, *weights, conv_state, slots[:d])
        out = torch.empty_like(qk)
        if d:
            out[:d] = kernels.cca_conv_decode(qk[:d], *weights, conv_state, slots[:d])
        row = d
        for j, count in enumerate(batch.prefill_lens):
            out[row: row + count] = cca_conv_chunk(qk[row: row + count], *weights, conv_state,
                                                   slots[d + j: d + j + 1])
            row += count
        return out

    @staticmethod
    def _delayed(v: torch.Tensor, batch: DecoderBatch, value_state: torch.Tensor) -> torch.Tensor:
        """Each row's previous token's delayed projection (a sequence's first: its saved one, zeros at its start),
        each sequence's last row saved in its place (without the bias)."""
        d, slots = batch.num_decode, batch.state_slots
        out = torch.empty_like(v)
        if d:  # (gather, then scatter: the decode graphs replay both)
            out[:d] = value_state.index_select(0, slots[:d]).to(v.dtype)
            value_state.index_copy_(0, slots[:d], v[:d].float())
        row = d
        for j, count in enumerate(batch.prefill_lens):
            slot = slots[d + j: d + j + 1]
            out[row] = value_state.index_select(0, slot)[0].to(v.dtype)
            out[row + 1: row + count] = v[row: row + count - 1]
            value_state.index_copy_(0, slot, v[row + count - 1: row + count].float())
            row += count
        return out

    def _experts(self, m: torch.Tensor, layer: _Layer, router: torch.Tensor | None):
        """The routed expert's output for each row of m, and the router's hidden rows for the next layer."""
        r = kernels.linear_act(m, layer.router_down_w, layer.router_down_b)
        if layer.router_states_scale is not None and router is not None:
            r = r + router * layer.router_states_scale
        h = kernels.rms_norm(r, layer.router_norm, self.config.norm_eps)[0]
        h = kernels.linear_act(kernels.linear_act(h, layer.fc1_w, layer.fc1_b, "gelu"), layer.fc2_w, layer.fc2_b,
                               "gelu")
        logits = kernels.linear_act(h, layer.router_out_w)
        out = kernels.moe_mlp(m, logits, layer.experts_gate_up, layer.experts_down, 1, False,
                              weights_dtype=m.dtype, scoring="softmax", score_bias=layer.balancing)
        return out, r


MODEL = ZayaDecoder
