"""Inkling's text model (`inkling_text`: Thinking Machines' Inkling, transformers' InklingForCausalLM) and the
multimodal checkpoint's (`inkling_mm_model`, InklingForConditionalGeneration: its text model, the vision and audio
towers left unread).

No rotary anywhere: positions enter through relative logits. Per layer, x the residual stream, every RMSNorm w * x:

    n = RMSNorm(x)                                 (`input_layernorm`)
    q = W_q n, k = conv_k(W_k n), v = conv_v(W_v n), r = W_r n   (H heads of D; Hkv of D; H rows of d_rel)
    q, k RMS-normalised per head (`q_norm` / `k_norm`)
    score(i, j) = q_i . k_j / D + rel_i[h, i - j]  where 0 <= i - j < extent, + 0 further back
    rel_i = r_i @ P                                (P `rel_logits_proj.proj` `[d_rel, extent]`: per head, a bias for
                                                    each backward distance, mixed from a bank of profiles)
    a = conv_attn(W_o softmax(score) v)
    x = x + a
    x = x + conv_mlp(MLP(RMSNorm(x)))              (`post_attention_layernorm`)

conv(y) = y + depthwise_causal_conv(y): a short convolution of `conv_kernel_size` taps per channel, no bias,
computed in fp32 with its residual and rounded once (transformers keeps the four convolutions in fp32). A layer
is full (`hybrid`: H = num_attention_heads, Hkv = num_key_value_heads, head_dim, extent = rel_extent) or sliding
(`hybrid_sliding`: the swa_ sizes, the last `sliding_window_size` keys, extent = the window). Full layers may scale
logits logarithmically from `log_scaling_n_floor` on: the query and its bias both times
1 + log_scaling_alpha * log(max((p + 1) / n_floor, 1)), p the query's position.

The MLP is `dense` (a SwiGLU MLP times a learnt `global_scale`) or `sparse`: a router over the routed experts and
the shared ones together (fp32 logits z); the top `num_experts_per_tok` routed by sigmoid(z) +
`e_score_correction_bias`; the chosen ones and every shared expert weighted by sigmoid(z) over the sum of those
sigmoids (the shared experts a sink in that normalisation), times `route_scale` * the router's `global_scale`.
Routed experts are SwiGLU (`experts.gate_up_proj` [gate; up]); the shared experts SwiGLU each, their weighted
outputs summed.

The embedding rows are RMS-normalised (`embed_tokens.embed_norm`); after the final norm the rows are divided by
`logits_mup_width_multiplier` before the head (never tied); logits past `unpadded_vocab_size` are dropped.

How it runs: linears, norms and routed experts are the shared kernels; the convolutions are mixers.causal_conv1d
(each layer's four carry their last K - 1 inputs in the recurrent state: k and v together, the attention's and the
MLP's output); the attention with its relative bias is PyTorch ops over the paged cache (no new GPU kernel): decode
rows one batched pass over their block tables without a host sync, prompt chunks looped per sequence on the host.
Keys and values are cached after their convolution and norm, each layer type in its own shape.

Refused by name: layer kinds other than those above, an activation other than silu, `shared_expert_sink` false or
no shared experts (transformers always normalises over them and cannot run without), a convolution of fewer than
2 taps, tensor parallelism and FP8 linears. Multi-token-prediction layers (`num_mtp_layers`) are left unread, as
transformers leaves them. Tensors are read under transformers' names (`language_model.` in the multimodal layout,
the head `lm_head`) or the published ones, which transformers also saves (`llm.`: `embed`, `unembed`, `attn.wq_du`,
gate and up rows paired row by row in the `w13` tensors); a quantised release's tensors (Inkling-NVFP4) are not."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.decoder.state_cache import StateCache
from tritonformer.backend.models.decoder import DecoderModel, eos_ids
from tritonformer.backend.models.mixers import causal_conv1d
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.paged_gather import table_slots

TEXT_TYPE = "inkling_text"
FULL, SLIDING = "hybrid", "hybrid_sliding"
# transformers' InklingTextConfig defaults, where a config.json leaves a key out
DEFAULTS = {"vocab_size": 201024, "hidden_size": 6144, "num_hidden_layers": 66, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 128, "swa_num_attention_heads": 64, "swa_num_key_value_heads": 16,
            "swa_head_dim": 128, "sliding_window_size": 512, "d_rel": 16, "rel_extent": 1024,
            "log_scaling_alpha": 0.1, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "conv_kernel_size": 4,
            "intermediate_size": 24576, "hidden_act": "silu", "moe_intermediate_size": 3072, "n_routed_experts": 256,
            "num_experts_per_tok": 6, "n_shared_experts": 2, "route_scale": 8.0, "logits_mup_width_multiplier": 24.0,
            "bos_token_id": 1, "eos_token_id": 2}
# (config.json's names for transformers' attributes: InklingTextConfig.attribute_map)
ALIASES = (("sconv_kernel_size", "conv_kernel_size"), ("sliding_window", "sliding_window_size"),
           ("num_local_experts", "n_routed_experts"), ("embedding_multiplier", "logits_mup_width_multiplier"),
           ("model_max_length", "max_position_embeddings"))


@dataclass(frozen=True)
class InklingSpec:
    vocab_size: int
    unpadded_vocab_size: int | None  # the head's rows that give logits (None: all of them)
    hidden_size: int
    num_layers: int
    heads: tuple[int, int]  # (full layers', sliding layers') query heads
    kv_heads: tuple[int, int]
    head_dims: tuple[int, int]
    window: int
    d_rel: int
    rel_extent: int  # the full layers' (sliding ones': the window)
    log_scaling: tuple[int, float] | None  # (n_floor, alpha) of the full layers' logit scaling, None: off
    sliding: tuple[bool, ...]  # per layer
    sparse: tuple[bool, ...]  # per layer: experts (else the dense MLP)
    conv_kernel: int
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    top_k: int
    shared_experts: int
    route_scale: float
    mup: float  # logits_mup_width_multiplier
    norm_eps: float
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    norm_offset: ClassVar[float] = 0.0  # (norm weights applied as they are)
    attends: ClassVar[bool] = True
    tie_word_embeddings: ClassVar[bool] = False

    # the full layers' sizes, as the generator's sizing reads a model's (the sliding ones' are their own below)
    @property
    def num_heads(self) -> int:
        return self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[0]

    @property
    def head_dim(self) -> int:
        return self.head_dims[0]

    def shape(self, layer: int) -> tuple[int, int, int, int]:
        """Layer `layer`'s (heads, kv heads, head dim, relative extent)."""
        s = int(self.sliding[layer])
        return self.heads[s], self.kv_heads[s], self.head_dims[s], self.window if s else self.rel_extent

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint holds, by name (the model prefix stripped): client/model_shapes.tensor_shapes."""
        h, k, e, s = self.hidden_size, self.conv_kernel, self.num_experts, self.shared_experts
        inter, moe = self.intermediate_size, self.moe_intermediate_size
        shapes = {"embed_tokens.weight": (self.vocab_size, h), "embed_tokens.embed_norm.weight": (h,),
                  "norm.weight": (h,), "lm_head.weight": (self.vocab_size, h)}
        for i in range(self.num_layers):
            p, a = f"layers.{i}.", f"layers.{i}.self_attn."
            heads, kv_heads, d, extent = self.shape(i)
            shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                           a + "q_proj.weight": (heads * d, h), a + "k_proj.weight": (kv_heads * d, h),
                           a + "v_proj.weight": (kv_heads * d, h), a + "r_proj.weight": (heads * self.d_rel, h),
                           a + "o_proj.weight": (h, heads * d), a + "q_norm.weight": (d,), a + "k_norm.weight": (d,),
                           a + "k_sconv.conv1d.weight": (kv_heads * d, 1, k),
                           a + "v_sconv.conv1d.weight": (kv_heads * d, 1, k),
                           a + "rel_logits_proj.proj": (self.d_rel, extent),
                           p + "attn_sconv.conv1d.weight": (h, 1, k), p + "mlp_sconv.conv1d.weight": (h, 1, k)})
            m = p + "mlp."
            if self.sparse[i]:
                shapes.update({m + "gate.weight": (e + s, h), m + "gate.global_scale": (1,),
                               m + "gate.e_score_correction_bias": (e,), m + "experts.gate_up_proj": (e, 2 * moe, h),
                               m + "experts.down_proj": (e, h, moe), m + "shared_experts.gate_proj": (s, moe, h),
                               m + "shared_experts.up_proj": (s, moe, h), m + "shared_experts.down_proj": (s, h, moe)})
            else:
                shapes.update({m + "gate_proj.weight": (inter, h), m + "up_proj.weight": (inter, h),
                               m + "down_proj.weight": (h, inter), m + "global_scale": (1,)})
        return shapes


# the published checkpoint's names within a layer (as transformers saves it too) -> transformers' module names
PUBLISHED = (("attn.wq_du.", "self_attn.q_proj."), ("attn.wk_dv.", "self_attn.k_proj."),
             ("attn.wv_dv.", "self_attn.v_proj."), ("attn.wr_du.", "self_attn.r_proj."),
             ("attn.wo_ud.", "self_attn.o_proj."), ("attn.q_norm.", "self_attn.q_norm."),
             ("attn.k_norm.", "self_attn.k_norm."), ("attn.k_sconv.", "self_attn.k_sconv.conv1d."),
             ("attn.v_sconv.", "self_attn.v_sconv.conv1d."), ("attn.rel_logits_proj.", "self_attn.rel_logits_proj."),
             ("attn_sconv.", "attn_sconv.conv1d."), ("mlp_sconv.", "mlp_sconv.conv1d."),
             ("attn_norm.", "input_layernorm."), ("mlp_norm.", "post_attention_layernorm."),
             ("mlp.gate.bias", "mlp.gate.e_score_correction_bias"), ("mlp.experts.w2_weight", "mlp.experts.down_proj"),
             ("mlp.shared_experts.shared_w2_weight", "mlp.shared_experts.down_proj"),
             ("mlp.w2_md.", "mlp.down_proj."))
PUBLISHED_TOP = {"llm.embed.weight": "embed_tokens.weight", "llm.embed_norm.weight": "embed_tokens.embed_norm.weight",
                 "llm.norm.weight": "norm.weight", "llm.unembed.weight": "lm_head.weight"}


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The multimodal checkpoint (model_type inkling_mm_model): its text model's config and tensors, under
    transformers' names (`language_model.`) or the published ones (`llm.`, as transformers saves it too)."""
    published = any(name.removeprefix("model.").startswith("llm.") for name in state)
    if cfg.get("model_type") == "inkling_mm_model":
        text, tensors = text_part(cfg, state, TEXT_TYPE)
        cfg, state = text, state if published else tensors
    return cfg, published_renamed(state) if published else state


def _paired(tensor, dim: int) -> torch.Tensor:
    """A [gate; up] stack of the published rows, which pair gate and up row by row along `dim`."""
    t = tensor if isinstance(tensor, torch.Tensor) else tensor.read()
    shape = list(t.shape)
    shape[dim: dim + 1] = [shape[dim] // 2, 2]
    return t.reshape(shape).transpose(dim, dim + 1).reshape(t.shape)


def published_renamed(state: dict) -> dict:
    """The published checkpoint's text tensors (`llm.`) under transformers' names, their paired gate / up rows
    stacked as transformers converts them; the towers (`visual.`, `audio.`) and MTP layers left out."""
    out = {}
    for full, tensor in state.items():
        name = full.removeprefix("model.")
        if not name.startswith("llm.") or name.startswith("llm.mtp."):
            continue
        if name in PUBLISHED_TOP:
            out[PUBLISHED_TOP[name]] = tensor
            continue
        name = name.removeprefix("llm.")
        for old, new in PUBLISHED:
            name = name.replace(old, new)
        if name.endswith("mlp.experts.w13_weight"):
            out[name.replace("w13_weight", "gate_up_proj")] = _paired(tensor, 1)
        elif name.endswith("mlp.shared_experts.shared_w13_weight"):
            gate, up = _paired(tensor, 1).chunk(2, dim=1)
            base = name.removesuffix("shared_w13_weight")
            out.update({base + "gate_proj": gate, base + "up_proj": up})
        elif name.endswith("mlp.w13_dn.weight"):
            gate, up = _paired(tensor, 0).chunk(2, dim=0)
            base = name.removesuffix("w13_dn.weight")
            out.update({base + "gate_proj.weight": gate, base + "up_proj.weight": up})
        else:
            out[name] = tensor
    return out


def config_aliased(cfg: dict, aliases: tuple[tuple[str, str], ...]) -> dict:
    """A copy of the config with each (alias, name)'s value under the name wherever the name is unset or null
    (Inkling's and Inkling 2's: unlike transformer.config_renamed, which keeps an explicit null)."""
    cfg = dict(cfg)
    for alias, name in aliases:
        if cfg.get(name) is None and cfg.get(alias) is not None:
            cfg[name] = cfg[alias]
    return cfg


def _config(cfg: dict) -> dict:
    """`cfg` with transformers' defaults and its config.json names read as InklingTextConfig reads them."""
    cfg = config_aliased(cfg, ALIASES)
    if cfg.get("dense_intermediate_size") is not None:  # (then intermediate_size is the experts' width)
        cfg["moe_intermediate_size"] = cfg.get("intermediate_size", DEFAULTS["intermediate_size"])
        cfg["intermediate_size"] = cfg["dense_intermediate_size"]
    return {**DEFAULTS, **cfg}


def from_hf(cfg: dict) -> InklingSpec:
    cfg = _config(cfg)
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        local = cfg.get("local_layer_ids")
        local = set(local) if local is not None else {i for i in range(layers) if (i + 1) % 6}
        types = [SLIDING if i in local else FULL for i in range(layers)]
    if len(types) != layers or not set(types) <= {FULL, SLIDING}:
        raise ValueError(f"unsupported {TEXT_TYPE} layer_types {types!r} (supported: layer_types {FULL!r} or "
                         f"{SLIDING!r} for each of the {layers} layers)")
    mlp = cfg.get("mlp_layer_types")
    if mlp is None:
        dense = cfg.get("dense_mlp_idx", 0)
        mlp = ["dense" if i < dense else "sparse" for i in range(layers)]
    if len(mlp) != layers or not set(mlp) <= {"dense", "sparse"}:
        raise ValueError(f"unsupported {TEXT_TYPE} mlp_layer_types {mlp!r} (supported: mlp_layer_types 'dense' or "
                         f"'sparse' for each of the {layers} layers)")
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"unsupported {TEXT_TYPE} hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    if cfg.get("shared_expert_sink", True) is False:
        raise ValueError(f"{TEXT_TYPE} with shared_expert_sink false is not supported (supported: shared_expert_sink "
                         f"true, what transformers runs whatever the config says)")
    if "sparse" in mlp and cfg["n_shared_experts"] < 1:
        raise ValueError(f"{TEXT_TYPE} n_shared_experts {cfg['n_shared_experts']} is not supported (supported: "
                         f"n_shared_experts 1 or more, as transformers' router needs)")
    if cfg["conv_kernel_size"] < 2:
        raise ValueError(f"{TEXT_TYPE} conv_kernel_size {cfg['conv_kernel_size']} is not supported (supported: "
                         f"conv_kernel_size 2 or more)")
    floor = cfg.get("log_scaling_n_floor")
    unpadded = cfg.get("unpadded_vocab_size")
    return InklingSpec(
        vocab_size=cfg["vocab_size"],
        unpadded_vocab_size=unpadded if unpadded is not None and unpadded < cfg["vocab_size"] else None,
        hidden_size=cfg["hidden_size"], num_layers=layers,
        heads=(cfg["num_attention_heads"], cfg["swa_num_attention_heads"]),
        kv_heads=(cfg["num_key_value_heads"], cfg["swa_num_key_value_heads"]),
        head_dims=(cfg["head_dim"], cfg["swa_head_dim"]), window=cfg["sliding_window_size"], d_rel=cfg["d_rel"],
        rel_extent=cfg["rel_extent"], log_scaling=None if floor is None else (floor, float(cfg["log_scaling_alpha"])),
        sliding=tuple(t == SLIDING for t in types), sparse=tuple(t == "sparse" for t in mlp),
        conv_kernel=cfg["conv_kernel_size"], intermediate_size=cfg["intermediate_size"],
        moe_intermediate_size=cfg["moe_intermediate_size"], num_experts=cfg["n_routed_experts"],
        top_k=cfg["num_experts_per_tok"], shared_experts=cfg["n_shared_experts"],
        route_scale=float(cfg["route_scale"]), mup=float(cfg["logits_mup_width_multiplier"]),
        norm_eps=cfg["rms_norm_eps"], max_position_embeddings=cfg["max_position_embeddings"],
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids(cfg))


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    qkvr_w: torch.Tensor  # [(H + 2 Hkv) D + H d_rel, hidden]: q's rows, k's, v's, r's
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    kv_conv: torch.Tensor  # [2 Hkv D, K] fp32: k's taps, then v's
    rel: torch.Tensor  # [d_rel, extent]
    o_w: torch.Tensor
    attn_conv: torch.Tensor  # [hidden, K] fp32
    mlp_norm: torch.Tensor
    mlp_conv: torch.Tensor  # [hidden, K] fp32
    dense_gate_up: torch.Tensor | None = None  # [2I, hidden] (a dense layer)
    dense_down: torch.Tensor | None = None
    dense_scale: torch.Tensor | None = None  # [1]
    router_w: torch.Tensor | None = None  # [E + S, hidden] fp32 (a sparse layer)
    router_scale: torch.Tensor | None = None  # [1] fp32: route_scale * global_scale
    score_bias: torch.Tensor | None = None  # [E] fp32
    experts_gate_up: torch.Tensor | None = None  # [E, 2I, hidden]
    experts_down: torch.Tensor | None = None  # [E, hidden, I]
    shared_gate_up: torch.Tensor | None = None  # [2 S I, hidden]: every shared expert's gate rows, then their up rows
    shared_down: torch.Tensor | None = None  # [hidden, S I]: their down columns side by side


class InklingFamily:
    """What Inkling's and Inkling 2's decoders share: their checkpoint readers (`_readers`), and their caches: each
    layer's keys and values at its own shape (`config.shape(i)`), and per sequence each layer's short-convolution
    states (on k / v, the attention's output and the MLP's: `conv_kernel` - 1 inputs each; `_init_caches`)."""

    def _readers(self, state: dict[str, torch.Tensor]):
        """(read, taps): a tensor of the checkpoint by name, checked against the spec's shape for it and moved to the
        model's device (in `dtype`, default the model's); a short convolution's taps `[channels, kernel]` in fp32."""
        c = self.config
        shapes = c.tensor_shapes()
        sizes = (f"hidden {c.hidden_size}, heads {c.heads}/{c.kv_heads} x {c.head_dims}, {c.num_experts} experts of "
                 f"{c.moe_intermediate_size}, vocab {c.vocab_size}")

        def read(name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"checkpoint is missing weight {name!r}")
            if tuple(state[name].shape) != shapes[name]:
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(state[name].shape)}, but the config "
                                 f"({sizes}) needs {shapes[name]}")
            return state[name].to(device=self.device, dtype=dtype or self.dtype).contiguous()

        def taps(name: str) -> torch.Tensor:
            return read(name + ".conv1d.weight", torch.float32)[:, 0].contiguous()

        return read, taps

    def _init_caches(self) -> None:
        c = self.config
        self.kv_shapes = [c.shape(i)[1:3] for i in range(c.num_layers)]
        k = c.conv_kernel - 1
        self.state_layouts = [{"kv": (2 * kv * d, k), "attn": (c.hidden_size, k), "mlp": (c.hidden_size, k)}
                              for kv, d in self.kv_shapes]

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        c = self.config
        return PagedKVCache(c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, self.device, self.dtype,
                            layer_shapes=self.kv_shapes)

    def kv_bytes_per_token(self) -> int:
        return 2 * sum(kv * d for kv, d in self.kv_shapes) * self.dtype.itemsize

    def new_state_cache(self, num_slots: int) -> StateCache:
        return StateCache(self.state_layouts, num_slots, self.device)

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        return self.logits(self.hidden_states(batch, cache), fp32_logits)


class InklingDecoder(InklingFamily, DecoderModel):
    def __init__(self, config: InklingSpec, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 tp=None):
        if tp is not None:  # (decoder._check_split refuses it first: the spec has no shared decoder's names)
            raise ValueError(f"tensor parallelism is not supported for model_type {TEXT_TYPE!r}")
        super().__init__(config, state, device, dtype)
        c = config
        read, taps = self._readers(state)

        self.embed = read("embed_tokens.weight")
        self.embed_norm = read("embed_tokens.embed_norm.weight")
        self.final_norm = read("norm.weight")
        head = read("lm_head.weight")
        self.set_output_head(head[: c.unpadded_vocab_size] if c.unpadded_vocab_size else head)
        self.layers: list[_Layer] = []
        for i in range(c.num_layers):
            p, a, m = f"layers.{i}.", f"layers.{i}.self_attn.", f"layers.{i}.mlp."
            layer = _Layer(
                attn_norm=read(p + "input_layernorm.weight"),
                qkvr_w=torch.cat([read(a + n + "_proj.weight") for n in "qkvr"]),
                q_norm=read(a + "q_norm.weight"), k_norm=read(a + "k_norm.weight"),
                kv_conv=torch.cat([taps(a + "k_sconv"), taps(a + "v_sconv")]),
                rel=read(a + "rel_logits_proj.proj"), o_w=read(a + "o_proj.weight"), attn_conv=taps(p + "attn_sconv"),
                mlp_norm=read(p + "post_attention_layernorm.weight"), mlp_conv=taps(p + "mlp_sconv"))
            if c.sparse[i]:
                gate, up = read(m + "shared_experts.gate_proj"), read(m + "shared_experts.up_proj")
                layer.router_w = read(m + "gate.weight", torch.float32)
                layer.router_scale = read(m + "gate.global_scale", torch.float32) * c.route_scale
                layer.score_bias = read(m + "gate.e_score_correction_bias", torch.float32)
                layer.experts_gate_up = read(m + "experts.gate_up_proj")
                layer.experts_down = read(m + "experts.down_proj")
                layer.shared_gate_up = torch.cat([gate.reshape(-1, c.hidden_size), up.reshape(-1, c.hidden_size)])
                layer.shared_down = read(m + "shared_experts.down_proj").permute(1, 0, 2).reshape(c.hidden_size,
                                                                                                   -1).contiguous()
            else:
                layer.dense_gate_up = torch.cat([read(m + "gate_proj.weight"), read(m + "up_proj.weight")])
                layer.dense_down = read(m + "down_proj.weight")
                layer.dense_scale = read(m + "global_scale")
            self.layers.append(layer)
        self._init_caches()

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` over the muP width multiplier, for the rows in `batch.logits_index`."""
        if batch.state_slots is None:
            raise ValueError("Inkling's short convolutions need each sequence's state slot (DecoderBatch.state_slots)")
        c = self.config
        e = kernels.embedding_part(batch.input_ids, self.embed, 0)
        x = kernels.rms_norm(e, self.embed_norm, c.norm_eps)[0]
        for i, layer in enumerate(self.layers):
            state = cache.state.layer(i)
            n = kernels.rms_norm(x, layer.attn_norm, c.norm_eps)[0]
            a = self._attend(n, i, layer, batch, cache, state["kv"])
            x = x + self._conv(a, layer.attn_conv, batch, state["attn"])
            m = kernels.rms_norm(x, layer.mlp_norm, c.norm_eps)[0]
            f = self._experts(m, layer) if layer.router_w is not None else self._dense(m, layer)
            x = x + self._conv(f, layer.mlp_conv, batch, state["mlp"])
        if not batch.logits_every_row:
            x = x[batch.logits_index]
        return kernels.rms_norm(x, self.final_norm, c.norm_eps)[0] / c.mup

    @staticmethod
    def _conv(y: torch.Tensor, weight: torch.Tensor, batch: DecoderBatch, conv_state: torch.Tensor) -> torch.Tensor:
        """y + its depthwise causal convolution over each sequence's rows, in fp32, rounded once to y's dtype."""
        f = y.float()
        return (causal_conv1d(f, weight, None, batch, conv_state) + f).to(y.dtype)

    def _dense(self, m: torch.Tensor, layer: _Layer) -> torch.Tensor:
        h = kernels.linear_act(m, layer.dense_gate_up, None, "silu_mul")
        return kernels.linear_act(h, layer.dense_down) * layer.dense_scale

    def _experts(self, m: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """The routed experts' and the shared experts' weighted sum (see the module's docstring)."""
        c = self.config
        e = c.num_experts
        logits = m.float() @ layer.router_w.t()  # [T, E + S] fp32, as transformers' router
        scores = torch.sigmoid(logits)
        chosen = torch.topk(scores[:, :e] + layer.score_bias, c.top_k, dim=-1).indices
        total = scores[:, :e].gather(1, chosen).sum(-1, keepdim=True) + scores[:, e:].sum(-1, keepdim=True)
        factor = layer.router_scale / total  # [T, 1]: each sigmoid's share of the sink's sum, times the scale
        # (moe_mlp weights each chosen expert by its sigmoid alone; the sink's normalisation, one factor a row, follows)
        routed = kernels.moe_mlp(m, logits[:, :e].contiguous(), layer.experts_gate_up, layer.experts_down, c.top_k,
                                 False, scoring="sigmoid", score_bias=layer.score_bias)
        gammas = (scores[:, e:] * factor).to(m.dtype)  # [T, S]
        inter = c.moe_intermediate_size
        h = kernels.linear_act(m, layer.shared_gate_up, None, "silu_mul")  # [T, S I]
        h = (h.view(-1, c.shared_experts, inter) * gammas[:, :, None]).view(h.shape)
        shared = kernels.linear_act(h, layer.shared_down)
        return (routed.float() * factor).to(m.dtype) + shared

    def _attend(self, n: torch.Tensor, i: int, layer: _Layer, batch: DecoderBatch, cache: PagedKVCache,
                conv_state: torch.Tensor) -> torch.Tensor:
        c = self.config
        heads, kv_heads, d, extent = c.shape(i)
        t = n.shape[0]
        qkvr = kernels.linear_act(n, layer.qkvr_w)
        q_end, kv_end = heads * d, (heads + 2 * kv_heads) * d
        kv = self._conv(qkvr[:, q_end:kv_end], layer.kv_conv, batch, conv_state)
        q = kernels.rms_norm(qkvr[:, :q_end].reshape(-1, d), layer.q_norm, c.norm_eps)[0].view(t, heads, d)
        k = kernels.rms_norm(kv[:, : kv_heads * d].reshape(-1, d), layer.k_norm, c.norm_eps)[0].view(t, kv_heads, d)
        v = kv[:, kv_heads * d:].reshape(t, kv_heads, d)
        kernels.write_kv(cache.keys(i), cache.values(i), k, v.contiguous(), batch.slot_mapping)
        rel = (qkvr[:, kv_end:].reshape(t, heads, c.d_rel) @ layer.rel).float()  # [T, H, extent]
        positions = batch.positions
        tau = None
        if not c.sliding[i] and c.log_scaling is not None:
            floor, alpha = c.log_scaling
            tau = 1.0 + alpha * torch.log(((positions + 1).float() / floor).clamp(min=1.0))  # [T]
        window = c.window if c.sliding[i] else None
        keys = cache.keys(i).view(-1, kv_heads, d)
        values = cache.values(i).view(-1, kv_heads, d)
        out = torch.empty_like(q)
        nd = batch.num_decode
        if nd:  # every slot of each row's block table, those past its position masked: no host sync
            slots = table_slots(batch.decode_tables, cache.block_size)  # [D, L]
            out[:nd] = self._attention(q[:nd], keys[slots], values[slots], rel[:nd], positions[:nd],
                                       None if tau is None else tau[:nd], extent, window)
        if batch.prefill_cu_q is not None:
            cu, lengths = batch.prefill_cu_q.tolist(), batch.prefill_seqlens.tolist()
            for j, (start, end, length) in enumerate(zip(cu, cu[1:], lengths)):
                rows = slice(nd + start, nd + end)
                slots = table_slots(batch.prefill_tables[j: j + 1], cache.block_size)[0, :length]
                out[rows] = self._attention(q[rows], keys[slots], values[slots], rel[rows],
                                            positions[rows], None if tau is None else tau[rows], extent, window)
        return kernels.linear_act(out.reshape(t, -1), layer.o_w)

    @staticmethod
    def _attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rel: torch.Tensor,
                   positions: torch.Tensor, tau: torch.Tensor | None, extent: int, window: int | None,
                   sinks: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
        """Queries `[R, H, D]` at `positions` `[R]` over keys / values at positions 0..L-1: a prompt chunk's, which
        its rows share, `[L, Hkv, D]`, or decode rows' own `[R, L, Hkv, D]` (their block tables' every slot),
        each score q . k / D (times `scale` where given: Inkling 2's) plus the query's relative bias `rel`
        `[R, H, extent]` at its distance (0 from extent on), both times `tau` `[R]` where given; causal, within the
        last `window` keys where given; with `sinks` `[R, H]` (Inkling 2's) one more logit per head whose value is
        zero; fp32, rounded to q's dtype."""
        r, heads, d = q.shape
        length, kv_heads = keys.shape[-3], keys.shape[-2]
        group = heads // kv_heads
        distance = positions[:, None] - torch.arange(length, device=q.device)[None, :]  # [R, L]
        bias = rel.gather(2, distance.clamp(0, extent - 1)[:, None, :].expand(r, heads, length))
        bias = bias.masked_fill(((distance < 0) | (distance >= extent))[:, None, :], 0.0)
        qf = q.float().view(r, kv_heads, group, d)
        if tau is not None:
            qf, bias = qf * tau[:, None, None, None], bias * tau[:, None, None]
        shared = keys.dim() == 3
        k_form = "lkd" if shared else "rlkd"
        scores = torch.einsum(f"rkgd,{k_form}->rkgl", qf, keys.float()).reshape(r, heads, length)
        scores = (scores / d if scale is None else scores * scale) + bias
        visible = distance >= 0
        if window is not None:
            visible = visible & (distance < window)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        if sinks is None:
            probs = torch.softmax(scores, dim=-1)
        else:
            probs = torch.softmax(torch.cat([scores, sinks[:, :, None].float()], dim=-1), dim=-1)[..., :-1]
        values = values.float()
        if not shared:  # (a decode row's block table runs past its keys into slots never written: no NaN from them)
            values = values.masked_fill(~visible[:, :, None, None], 0.0)
        out = torch.einsum(f"rkgl,{k_form}->rkgd", probs.view(r, kv_heads, group, length), values)
        return out.reshape(r, heads, d).to(q.dtype)


MODEL = InklingDecoder
