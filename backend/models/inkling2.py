"""Inkling 2's text model (`inkling2_text`: transformers' Inkling2ForCausalLM), Inkling (inkling.py) reworked.

Inkling's relative-bias attention without rotary and its short convolutions stay; what changes, per layer i of
blocks of `n_layers_per_attn_res_block`, x the stream entering it:

    inputs = attnres(B, x)                  (an attention residual over the blocks B and x, below; layer 0: x itself)
    a = conv2(Attn(inputs))                 (`post_attention_convolution`)
    layer i first of a block: B = B + [x], r = a   (the stream restarts: a block's partial sum)
    else: r = x + a
    x' = r + conv2(Experts(RMSNorm(attnres_mlp(B, r))))   (`post_attention_layernorm`, `post_mlp_convolution`)

attnres(B, p) = softmax over s in B + [p] of w . N(s) / sqrt(hidden), the N(s) so weighted summed, N an unweighted
RMSNorm (eps 1e-6) and w a learnt query (`query`: one, or three on the full layers, whose q, k and v inputs each
have their own). The final rows are attnres(B, x) (`final_input`) through the final norm; then the untied head,
logits softcapped at `final_logit_softcapping` (fp32) and those past `unpadded_vocab_size` dropped.

Attention, sliding (`hybrid_sliding`: the swa_ sizes, a window) or full (`hybrid`):
    sliding: n = RMSNorm(inputs), q, k, v, r, g, s all of n; k, v through static convolutions
    full: q, r, g, s of RMSNorm_q(q input), k of RMSNorm_k(k input), v of RMSNorm_v(v input), k and v through
          dynamic convolutions whose taps are `static_weight` plus per-token taps per KV head (`weight_proj` of
          the k or v input)
    q = clip(q * scale_q, qk_l2_clip_threshold), k = clip(k, same), r = clip(r * scale_r, rel_l2_clip_threshold),
    clip(y, t) = y * min(t / (|y| + 1e-6), 1) per head, v an unweighted RMSNorm (rms_norm_eps) per head
    full layers: q and r times tau = 1 + log_scaling_alpha * log(max((p + 1) / log_scaling_n_floor, 1))
    score(i, j) = q_i . k_j / sqrt(D) + rel bias (as Inkling's), and per head one more logit s_i (`sink_proj`)
    whose value is zero; out = W_o (softmax(score) v * sigmoid(g))

conv2(y) = (y + depthwise_causal_conv(y)) / sqrt(K + 1), the dynamic one over sqrt(2K + 1), K taps, fp32.

Experts: routed only; top `num_experts_per_tok` of sigmoid(z) + `e_score_correction_bias` (z fp32), weighted by
their sigmoids over those sigmoids' sum times `route_scale`; each expert W_d (tanh(g / 4) 4 sigmoid(g) *
tanh(u / 25) 25) (the `mlp_gate_softcap` and `mlp_up_softcap`), in fp32, summed in fp32.

How it runs: linears and norms on the shared kernels; the static convolutions mixers.causal_conv1d (each layer's
recurrent state: k and v together, the attention's output, the MLP's); the dynamic ones PyTorch ops over the same
state; the attention Inkling's PyTorch ops over the paged cache (with the sinks); the block residuals PyTorch ops;
the experts PyTorch ops looped over the experts chosen, which reads their ids on the host: no decode graphs. Keys
and values cached after their clip and norm, each layer type in its own shape.

Refused by name: layer kinds other than those above, a router score other than sigmoid, no `log_scaling_n_floor`,
a convolution of fewer than 2 taps, a `quantization_config` (the published MXFP8 experts), tensor parallelism and
FP8 linears. `hidden_act` is not read, as transformers does not."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel, eos_ids
from tritonformer.backend.models.inkling import (FULL, SLIDING, InklingDecoder, InklingFamily, InklingSpec, _paired,
                                                 config_aliased)
from tritonformer.backend.models.mixers import causal_conv1d
from tritonformer.backend.models.paged_gather import table_slots

TEXT_TYPE = "inkling2_text"
# transformers' Inkling2TextConfig defaults, where a config.json leaves a key out
DEFAULTS = {"vocab_size": 201024, "unpadded_vocab_size": 200058, "hidden_size": 4608, "num_hidden_layers": 48,
            "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "swa_num_attention_heads": 48,
            "swa_num_key_value_heads": 8, "swa_head_dim": 128, "sliding_window_size": 1024, "d_rel": 16,
            "rel_extent": 1024, "log_scaling_n_floor": 128000, "log_scaling_alpha": 0.1,
            "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6, "conv_kernel_size": 4,
            "moe_intermediate_size": 2304, "n_routed_experts": 384, "num_experts_per_tok": 8, "route_scale": 8.0,
            "bos_token_id": None, "eos_token_id": 200006, "qk_l2_clip_threshold": 22.627416997969522,
            "rel_l2_clip_threshold": 8.0, "n_layers_per_attn_res_block": 6, "mlp_gate_softcap": 4.0,
            "mlp_up_softcap": 25.0, "final_logit_softcapping": 30.0, "scoring_func": "sigmoid"}
# (config.json's names for transformers' attributes: Inkling2TextConfig.attribute_map)
ALIASES = (("sconv_kernel_size", "conv_kernel_size"), ("sliding_window", "sliding_window_size"),
           ("num_local_experts", "n_routed_experts"), ("model_max_length", "max_position_embeddings"),
           ("intermediate_size", "moe_intermediate_size"), ("routed_scaling_factor", "route_scale"))


@dataclass(frozen=True)
class Inkling2Spec(InklingSpec):
    qk_clip: float
    rel_clip: float
    block_layers: int  # n_layers_per_attn_res_block
    gate_softcap: float
    up_softcap: float
    final_softcap: float
    final_softcap_fp32: ClassVar[bool] = True  # (transformers caps the head's output in fp32)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint holds, by name (the model prefix stripped): client/model_shapes.tensor_shapes."""
        h, k, e, moe = self.hidden_size, self.conv_kernel, self.num_experts, self.moe_intermediate_size
        shapes = {"embed_tokens.weight": (self.vocab_size, h), "embed_tokens.embed_norm.weight": (h,),
                  "norm.weight": (h,), "final_input.query": (h,), "lm_head.weight": (self.vocab_size, h)}
        for i in range(self.num_layers):
            p, a = f"layers.{i}.", f"layers.{i}.self_attn."
            heads, kv_heads, d, extent = self.shape(i)
            shapes.update({p + "post_attention_layernorm.weight": (h,), p + "mlp_input.query": (h,),
                           a + "q_proj.weight": (heads * d, h), a + "k_proj.weight": (kv_heads * d, h),
                           a + "v_proj.weight": (kv_heads * d, h), a + "r_proj.weight": (heads * self.d_rel, h),
                           a + "gate_proj.weight": (heads * d, h), a + "sink_proj.weight": (heads, h),
                           a + "o_proj.weight": (h, heads * d), a + "q_l2_clip.scale": (heads, d),
                           a + "rel_l2_clip.scale": (heads, self.d_rel),
                           a + "rel_logits_proj.proj": (self.d_rel, extent),
                           p + "post_attention_convolution.conv1d.weight": (h, 1, k),
                           p + "post_mlp_convolution.conv1d.weight": (h, 1, k),
                           p + "mlp.gate.weight": (e, h), p + "mlp.gate.e_score_correction_bias": (e,),
                           p + "mlp.experts.gate_up_proj": (e, 2 * moe, h), p + "mlp.experts.down_proj": (e, h, moe)})
            if self.sliding[i]:
                shapes.update({p + "input_layernorm.weight": (h,), a + "k_sconv.conv1d.weight": (kv_heads * d, 1, k),
                               a + "v_sconv.conv1d.weight": (kv_heads * d, 1, k)})
            else:
                shapes.update({p + f"{n}_input_layernorm.weight": (h,) for n in "qkv"})
                shapes.update({a + f"{n}_sconv.{w}": s for n in "kv" for w, s in
                               (("static_weight", (k, kv_heads * d)), ("weight_proj.weight", (kv_heads * k, h)))})
            if i:
                shapes[p + "attention_input.query"] = (h,) if self.sliding[i] else (3, h)
        return shapes


def _config(cfg: dict) -> dict:
    """`cfg` with transformers' defaults and its config.json names read as Inkling2TextConfig reads them."""
    return {**DEFAULTS, **config_aliased(cfg, ALIASES)}


def from_hf(cfg: dict) -> Inkling2Spec:
    if cfg.get("quantization_config"):
        quant = cfg["quantization_config"]
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        raise ValueError(f"{TEXT_TYPE} with a quantization_config ({method!r}: the published MXFP8 experts) is not "
                         f"supported (supported: quantization_config none, the weights unquantised)")
    cfg = _config(cfg)
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(layers)]
    if len(types) != layers or not set(types) <= {FULL, SLIDING}:
        raise ValueError(f"unsupported {TEXT_TYPE} layer_types {types!r} (supported: layer_types {FULL!r} or "
                         f"{SLIDING!r} for each of the {layers} layers)")
    if cfg["scoring_func"] != "sigmoid":
        raise ValueError(f"unsupported {TEXT_TYPE} scoring_func {cfg['scoring_func']!r} (supported: scoring_func "
                         f"sigmoid)")
    if cfg["conv_kernel_size"] < 2:
        raise ValueError(f"{TEXT_TYPE} conv_kernel_size {cfg['conv_kernel_size']} is not supported (supported: "
                         f"conv_kernel_size 2 or more)")
    if cfg["log_scaling_n_floor"] is None:
        raise ValueError(f"{TEXT_TYPE} without log_scaling_n_floor is not supported (supported: log_scaling_n_floor "
                         f"a position, as transformers needs)")
    if cfg["n_layers_per_attn_res_block"] < 1:
        raise ValueError(f"{TEXT_TYPE} n_layers_per_attn_res_block {cfg['n_layers_per_attn_res_block']} is not "
                         f"supported (supported: n_layers_per_attn_res_block 1 or more)")
    unpadded = cfg.get("unpadded_vocab_size")
    moe = cfg["moe_intermediate_size"]
    return Inkling2Spec(
        vocab_size=cfg["vocab_size"],
        unpadded_vocab_size=unpadded if unpadded is not None and unpadded < cfg["vocab_size"] else None,
        hidden_size=cfg["hidden_size"], num_layers=layers,
        heads=(cfg["num_attention_heads"], cfg["swa_num_attention_heads"]),
        kv_heads=(cfg["num_key_value_heads"], cfg["swa_num_key_value_heads"]),
        head_dims=(cfg["head_dim"], cfg["swa_head_dim"]), window=cfg["sliding_window_size"], d_rel=cfg["d_rel"],
        rel_extent=cfg["rel_extent"], log_scaling=(cfg["log_scaling_n_floor"], float(cfg["log_scaling_alpha"])),
        sliding=tuple(t == SLIDING for t in types), sparse=(True,) * layers, conv_kernel=cfg["conv_kernel_size"],
        intermediate_size=moe, moe_intermediate_size=moe, num_experts=cfg["n_routed_experts"],
        top_k=cfg["num_experts_per_tok"], shared_experts=0, route_scale=float(cfg["route_scale"]), mup=1.0,
        norm_eps=cfg["rms_norm_eps"], max_position_embeddings=cfg["max_position_embeddings"],
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids(cfg), qk_clip=float(cfg["qk_l2_clip_threshold"]),
        rel_clip=float(cfg["rel_l2_clip_threshold"]), block_layers=cfg["n_layers_per_attn_res_block"],
        gate_softcap=float(cfg["mlp_gate_softcap"]), up_softcap=float(cfg["mlp_up_softcap"]),
        final_softcap=float(cfg["final_logit_softcapping"]))


def l2_clip(y: torch.Tensor, threshold: float, scale: torch.Tensor | None = None) -> torch.Tensor:
    """y (times `scale`) per last-dim vector scaled down to L2 norm `threshold` where longer, in fp32, in y's dtype."""
    f = y.float() if scale is None else y.float() * scale
    return (f * (threshold / (torch.linalg.vector_norm(f, dim=-1, keepdim=True) + 1e-6)).clamp(max=1.0)).to(y.dtype)


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


def block_residual(blocks: list[torch.Tensor], partial: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Depth-wise attention over the blocks' sums and the partial one `[T, hidden]` each, every source RMS-normalised
    (unweighted): for each of the queries `[Q, hidden]`, the sources' softmax-weighted sum, fp32 `[Q, T, hidden]`."""
    sources = unweighted_rms_norm(torch.stack([*blocks, partial], dim=1).float(), 1e-6)  # [T, N, hidden]
    scores = torch.einsum("qh,tnh->qtn", query.float().view(-1, sources.shape[-1]), sources)
    probs = torch.softmax(scores / math.sqrt(sources.shape[-1]), dim=-1)
    return torch.einsum("qtn,tnh->qth", probs, sources)


def dynamic_causal_conv1d(x: torch.Tensor, static: torch.Tensor, taps: torch.Tensor, batch: DecoderBatch,
                          conv_state: torch.Tensor) -> torch.Tensor:
    """A causal depthwise convolution whose taps differ per token: x `[T, C]` over its sequence's last K inputs, tap
    `lag` (0 the token's own) `static[:, lag]` `[C, K]` plus `taps[t, head, lag]` `[T, heads, K]`, shared by each
    head's C / heads channels. Continues from each sequence's last K - 1 inputs (`conv_state` `[slots + 1, C, K - 1]`,
    oldest first, updated in place); fp32."""
    if batch.state_slots is None:
        raise ValueError("a recurrent layer needs its sequences' state slots (DecoderBatch.state_slots)")
    t, c = x.shape
    k = static.shape[1]
    x = x.float()
    windows = torch.empty(t, c, k, device=x.device, dtype=torch.float32)  # [T, C, lag]
    d, slots = batch.num_decode, batch.state_slots
    if d:
        ctx = torch.cat([conv_state[slots[:d]], x[:d, :, None]], dim=2)  # [D, C, K], the token's own last
        windows[:d] = ctx.flip(-1)
        conv_state[slots[:d]] = ctx[:, :, 1:]
    row = d
    for j, n in enumerate(batch.prefill_lens):
        slot = slots[d + j]
        ctx = torch.cat([conv_state[slot], x[row: row + n].t()], dim=1)  # [C, K - 1 + n]
        windows[row: row + n] = ctx.unfold(1, k, 1).flip(-1).transpose(0, 1)
        conv_state[slot] = ctx[:, -(k - 1):]
        row += n
    heads = taps.shape[1]
    weights = static.view(heads, c // heads, k) + taps.float()[:, :, None, :]  # [T, heads, C / heads, K]
    return (windows.view(t, heads, c // heads, k) * weights).sum(-1).view(t, c)


@dataclass
class _Layer:
    attn_query: torch.Tensor | None  # [Q, hidden] fp32 (None: layer 0, which reads the stream itself)
    norms: list[torch.Tensor]  # the attention's input norms: one (sliding), or q's, k's and v's (full)
    proj_w: torch.Tensor  # [q; r; g; s] rows (full), or [q; r; g; s; k; v] (sliding)
    k_w: torch.Tensor | None  # full: [k rows; k's per-token taps], of the k input
    v_w: torch.Tensor | None  # full: [v rows; v's per-token taps], of the v input
    kv_conv: torch.Tensor  # [2 Hkv D, K] fp32: k's taps, then v's (full: the static ones, by lag)
    q_scale: torch.Tensor  # [H, D] fp32
    rel_scale: torch.Tensor  # [H, d_rel] fp32
    rel: torch.Tensor  # [d_rel, extent]
    o_w: torch.Tensor
    attn_conv: torch.Tensor  # [hidden, K] fp32
    mlp_query: torch.Tensor  # [1, hidden] fp32
    mlp_norm: torch.Tensor
    mlp_conv: torch.Tensor  # [hidden, K] fp32
    router_w: torch.Tensor  # [E, hidden] fp32
    score_bias: torch.Tensor  # [E] fp32
    experts_gate_up: torch.Tensor  # [E, 2I, hidden]
    experts_down: torch.Tensor  # [E, hidden, I]


class Inkling2Decoder(InklingFamily, DecoderModel):
    decode_graphs = False  # (the experts loop over the ids chosen, read on the host)

    def __init__(self, config: Inkling2Spec, state: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, tp=None):
        if tp is not None:  # (decoder._check_split refuses it first: the spec has no shared decoder's names)
            raise ValueError(f"tensor parallelism is not supported for model_type {TEXT_TYPE!r}")
        super().__init__(config, state, device, dtype)
        c = config
        read, taps = self._readers(state)

        f32 = torch.float32
        self.embed = read("embed_tokens.weight")
        self.embed_norm = read("embed_tokens.embed_norm.weight")
        self.final_norm = read("norm.weight")
        self.final_query = read("final_input.query", f32).view(1, -1)
        head = read("lm_head.weight")
        self.set_output_head(head[: c.unpadded_vocab_size] if c.unpadded_vocab_size else head)
        self.layers: list[_Layer] = []
        for i in range(c.num_layers):
            p, a, m = f"layers.{i}.", f"layers.{i}.self_attn.", f"layers.{i}.mlp."
            qrgs = [read(a + n + "_proj.weight") for n in ("q", "r", "gate", "sink")]
            if c.sliding[i]:
                norms = [read(p + "input_layernorm.weight")]
                proj_w = torch.cat(qrgs + [read(a + "k_proj.weight"), read(a + "v_proj.weight")])
                k_w = v_w = None
                kv_conv = torch.cat([taps(a + "k_sconv"), taps(a + "v_sconv")])
            else:
                norms = [read(p + f"{n}_input_layernorm.weight") for n in "qkv"]
                proj_w = torch.cat(qrgs)
                k_w, v_w = (torch.cat([read(a + f"{n}_proj.weight"), read(a + f"{n}_sconv.weight_proj.weight")])
                            for n in "kv")
                kv_conv = torch.cat([read(a + f"{n}_sconv.static_weight", f32).t() for n in "kv"]).contiguous()
            self.layers.append(_Layer(
                attn_query=read(p + "attention_input.query", f32).view(-1, c.hidden_size) if i else None,
                norms=norms, proj_w=proj_w, k_w=k_w, v_w=v_w, kv_conv=kv_conv,
                q_scale=read(a + "q_l2_clip.scale", f32), rel_scale=read(a + "rel_l2_clip.scale", f32),
                rel=read(a + "rel_logits_proj.proj"), o_w=read(a + "o_proj.weight"),
                attn_conv=taps(p + "post_attention_convolution"),
                mlp_query=read(p + "mlp_input.query", f32).view(1, -1),
                mlp_norm=read(p + "post_attention_layernorm.weight"), mlp_conv=taps(p + "post_mlp_convolution"),
                router_w=read(m + "gate.weight", f32), score_bias=read(m + "gate.e_score_correction_bias", f32),
                experts_gate_up=read(m + "experts.gate_up_proj"), experts_down=read(m + "experts.down_proj")))
        self._init_caches()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm of fp32 rows (a block residual's) with a weight in the model's dtype, in fp32, rounded once."""
        x = x.float()
        x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.config.norm_eps)
        return (weight.float() * x).to(self.dtype)

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for the rows in `batch.logits_index`."""
        if batch.state_slots is None:
            raise ValueError("Inkling 2's short convolutions need each sequence's state slot "
                             "(DecoderBatch.state_slots)")
        c = self.config
        e = kernels.embedding_part(batch.input_ids, self.embed, 0)
        x = kernels.rms_norm(e, self.embed_norm, c.norm_eps)[0]
        blocks: list[torch.Tensor] = []  # each finished block's sum, [T, hidden]
        for i, layer in enumerate(self.layers):
            state = cache.state.layer(i)
            inputs = ([x] * len(layer.norms) if layer.attn_query is None
                      else list(block_residual(blocks, x, layer.attn_query)))
            a = self._attend(inputs, i, layer, batch, cache, state["kv"])
            a = self._conv(a, layer.attn_conv, batch, state["attn"]).float()
            if i % c.block_layers == 0:  # a block starts: the stream so far joins the blocks, the sum restarts
                blocks.append(x)
                r = a
            else:
                r = x.float() + a
            m = self._norm(block_residual(blocks, r, layer.mlp_query)[0], layer.mlp_norm)
            f = self._conv(self._experts(m, layer), layer.mlp_conv, batch, state["mlp"])
            x = (r + f.float()).to(self.dtype)
        if not batch.logits_every_row:
            x, blocks = x[batch.logits_index], [b[batch.logits_index] for b in blocks]
        return self._norm(block_residual(blocks, x, self.final_query)[0], self.final_norm)

    def _conv(self, y: torch.Tensor, weight: torch.Tensor, batch: DecoderBatch, conv_state: torch.Tensor,
              ) -> torch.Tensor:
        """(y + its depthwise causal convolution) / sqrt(K + 1), in fp32, rounded once to y's dtype."""
        f = y.float()
        return ((causal_conv1d(f, weight, None, batch, conv_state) + f) / math.sqrt(weight.shape[1] + 1)).to(y.dtype)

    def _experts(self, m: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """The routed experts' weighted sum, each expert's softcapped SwiGLU in fp32 (see the module's docstring)."""
        c = self.config
        scores = torch.sigmoid(m.float() @ layer.router_w.t())  # [T, E]
        chosen = torch.topk(scores + layer.score_bias, c.top_k, dim=-1).indices
        weights = scores.gather(1, chosen)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * c.route_scale
        out = torch.zeros(m.shape, device=m.device, dtype=torch.float32)
        for expert in torch.unique(chosen).tolist():  # (the host sync: no decode graphs)
            rows, pos = torch.where(chosen == expert)
            gate, up = (m[rows] @ layer.experts_gate_up[expert].t()).float().chunk(2, dim=-1)
            h = (torch.tanh(gate / c.gate_softcap) * c.gate_softcap * torch.sigmoid(gate)
                 * torch.tanh(up / c.up_softcap) * c.up_softcap).to(m.dtype)
            out.index_add_(0, rows, (h @ layer.experts_down[expert].t()) * weights[rows, pos, None])
        return out.to(m.dtype)

    def _attend(self, inputs: list[torch.Tensor], i: int, layer: _Layer, batch: DecoderBatch, cache: PagedKVCache,
                conv_state: torch.Tensor) -> torch.Tensor:
        c = self.config
        heads, kv_heads, d, extent = c.shape(i)
        k_taps = c.conv_kernel
        n = [self._norm(x, w) for x, w in zip(inputs, layer.norms)]
        t = n[0].shape[0]
        proj = kernels.linear_act(n[0], layer.proj_w)
        ends = torch.tensor([heads * d, heads * c.d_rel, heads * d, heads]).cumsum(0).tolist()
        q, r, g, s = proj[:, : ends[0]], proj[:, ends[0]: ends[1]], proj[:, ends[1]: ends[2]], proj[:, ends[2]: ends[3]]
        if c.sliding[i]:
            kv = self._conv(proj[:, ends[3]:], layer.kv_conv, batch, conv_state)
        else:  # the dynamic convolutions: static taps plus each KV head's own per token
            kw, vw = kernels.linear_act(n[1], layer.k_w), kernels.linear_act(n[2], layer.v_w)
            width = kv_heads * d
            x = torch.cat([kw[:, :width], vw[:, :width]], dim=1)
            per_token = torch.cat([kw[:, width:], vw[:, width:]], dim=1).view(t, 2 * kv_heads, k_taps)
            kv = dynamic_causal_conv1d(x, layer.kv_conv, per_token, batch, conv_state)
            kv = ((kv + x.float()) / math.sqrt(2 * k_taps + 1)).to(self.dtype)
        q = l2_clip(q.reshape(t, heads, d), c.qk_clip, layer.q_scale)
        k = l2_clip(kv[:, : kv_heads * d].reshape(t, kv_heads, d), c.qk_clip)
        v = unweighted_rms_norm(kv[:, kv_heads * d:].reshape(t, kv_heads, d).float(), c.norm_eps).to(self.dtype)
        r = l2_clip(r.reshape(t, heads, c.d_rel), c.rel_clip, layer.rel_scale)
        positions = batch.positions
        if not c.sliding[i]:
            floor, alpha = c.log_scaling
            tau = 1.0 + alpha * torch.log(((positions + 1).float() / floor).clamp(min=1.0))  # [T]
            q = (q.float() * tau[:, None, None]).to(q.dtype)
            r = (r.float() * tau[:, None, None]).to(r.dtype)
        kernels.write_kv(cache.keys(i), cache.values(i), k.contiguous(), v.contiguous(), batch.slot_mapping)
        rel = (r @ layer.rel).float()  # [T, H, extent]
        sinks = s.float()
        scale = d ** -0.5
        window = c.window if c.sliding[i] else None
        keys = cache.keys(i).view(-1, kv_heads, d)
        values = cache.values(i).view(-1, kv_heads, d)
        out = torch.empty_like(q)
        nd = batch.num_decode
        attention = InklingDecoder._attention
        if nd:  # every slot of each row's block table, those past its position masked: no host sync
            slots = table_slots(batch.decode_tables, cache.block_size)  # [D, L]
            out[:nd] = attention(q[:nd], keys[slots], values[slots], rel[:nd], positions[:nd], None, extent, window,
                                 sinks=sinks[:nd], scale=scale)
        if batch.prefill_cu_q is not None:
            cu, lengths = batch.prefill_cu_q.tolist(), batch.prefill_seqlens.tolist()
            for j, (start, end, length) in enumerate(zip(cu, cu[1:], lengths)):
                rows = slice(nd + start, nd + end)
                slots = table_slots(batch.prefill_tables[j: j + 1], cache.block_size)[0, :length]
                out[rows] = attention(q[rows], keys[slots], values[slots], rel[rows], positions[rows], None, extent,
                                      window, sinks=sinks[rows], scale=scale)
        gated = (out.reshape(t, -1).float() * torch.sigmoid(g.float())).to(self.dtype)
        return kernels.linear_act(gated, layer.o_w)


# The release's tensor names (`llm.` dropped) as transformers' module names, in order: (pattern, replacement).
RELEASE_NAMES = tuple((re.compile(p), r) for p, r in (
    (r"^unembed\.weight$", "lm_head.weight"), (r"^embed\.weight$", "embed_tokens.weight"),
    (r"^embed_norm\.", "embed_tokens.embed_norm."),
    (r"mlp\.experts\.w2_weight$", "mlp.experts.down_proj"), (r"mlp\.gate\.bias$", "mlp.gate.e_score_correction_bias"),
    (r"attn\.wq_du\.", "self_attn.q_proj."), (r"attn\.wk_dv\.", "self_attn.k_proj."),
    (r"attn\.wv_dv\.", "self_attn.v_proj."), (r"attn\.wr_du\.", "self_attn.r_proj."),
    (r"attn\.wo_ud\.", "self_attn.o_proj."), (r"attn\.gate_attn\.", "self_attn.gate_proj."),
    (r"attn\.attn_sink_proj\.", "self_attn.sink_proj."),
    (r"\.attn\.(q_l2_clip|k_l2_clip|rel_l2_clip|k_sconv|v_sconv|rel_logits_proj)\.", r".self_attn.\1."),
    (r"attn_sconv\.", "post_attention_convolution."), (r"mlp_sconv\.", "post_mlp_convolution."),
    (r"(convolution|sconv)\.weight$", r"\1.conv1d.weight"), (r"(convolution|sconv)\.static_w$", r"\1.static_weight"),
    (r"(convolution|sconv)\.weight_proj$", r"\1.weight_proj.weight"),
    (r"mlp_norm\.", "post_attention_layernorm."), (r"attn_norm\.", "input_layernorm."),
    (r"(q|k|v)_input_norm\.", r"\1_input_layernorm."),
    (r"^attn_res\.mlp_queries\.(\d+)$", r"layers.\1.mlp_input.query"),
    (r"^attn_res\.output_query$", "final_input.query")))
_ATTN_QUERY = re.compile(r"^attn_res\.attn_queries\.(\d+)$")  # (query j is layer j + 1's: layer 0 has none)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """Transformers' module names load as they are; the release's layout (`llm.` tensors: `llm.embed`,
    `attn.wq_du`, `attn_res.*`, which transformers' save_pretrained writes too) is renamed to them, the routed
    experts' `w13_weight` (gate and up rows paired row by row) stacked as [gate; up], the MTP layers left out."""
    if not any(name.startswith("llm.") for name in state):
        return cfg, state
    out = {}
    for full, tensor in state.items():
        if not full.startswith("llm.") or full.startswith("llm.mtp"):
            continue
        name = full.removeprefix("llm.")
        if match := _ATTN_QUERY.match(name):
            out[f"layers.{int(match.group(1)) + 1}.attention_input.query"] = tensor
            continue
        if name.endswith("mlp.experts.w13_weight"):
            out[name.replace("w13_weight", "gate_up_proj")] = _paired(tensor, 1)
            continue
        for pattern, replacement in RELEASE_NAMES:
            name = pattern.sub(replacement, name)
        out[name] = tensor
    return cfg, out


MODEL = Inkling2Decoder
