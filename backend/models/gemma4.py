"""Gemma 4 (text): `gemma4_text`, and the text model of a multimodal `gemma4` checkpoint (Gemma-4-E2B / E4B / 26B-A4B /
31B), text in and text out, as transformers' Gemma4TextModel / Gemma4ForCausalLM compute it; and Gemma 4 unified
(`gemma4_unified_text`, and the text model of a multimodal `gemma4_unified` checkpoint, Gemma-4-12B), whose layers are
Gemma 4's without per-layer inputs or experts (transformers' Gemma4UnifiedTextDecoderLayer: the four norms, the dense
GeGLU MLP, the layer scalar; the attention, kv sharing and double-wide MLPs Gemma 4's): its config is read as a Gemma 4
text config without those options (keys naming them, which transformers' unified model never reads, are dropped) and
with its own defaults (`sliding_window` 1,024, `max_position_embeddings` 262,144).

Every RMSNorm here is x * (mean(x^2) + eps)^-1/2 in fp32 times its weight as it is (no 1 + w), rounded to x's dtype.
With e the token embeddings times sqrt(H) (the scale rounded to the table's dtype), layer i of L:

    x = x + RMSNorm_pa(W_o Attention_i(RMSNorm_in(x)))
    m = RMSNorm_ff(x)
    f = W_down (gelu_tanh(W_gate m) * W_up m)
    MoE layers (`enable_moe_block`, the 26B-A4B): f = RMSNorm_f1(f) + RMSNorm_f2(Experts(RMSNorm_ff2(x), route(x)))
    x = x + RMSNorm_pf(f)
    per-layer inputs (`hidden_size_per_layer_input` P > 0, the E models; 256 where a config leaves it out, as
    transformers reads it; none in Gemma 4 unified):
        x = x + RMSNorm_ppl(W_proj (gelu_tanh(W_g x) * u_i))
    x = x * s_i                                                        (`layer_scalar`, one learnt scalar per layer)

then h = RMSNorm_final(x); logits = cap * tanh((E h) / cap) where `final_logit_softcapping` is set (head tied to the
embeddings unless `tie_word_embeddings` is false and the checkpoint has one).

The attention of layer i: sliding layers (`layer_types` "sliding_attention") have heads of `head_dim` over
`num_key_value_heads` KV heads, the last `sliding_window` keys (the query's own included), the default rotary of
their base; full layers heads of `global_head_dim` (512) over `num_global_key_value_heads` where `attention_k_eq_v`
(else `num_key_value_heads`), or whatever a config's `per_layer_config` says per layer, all keys, the 'proportional'
rotary (rope.py: the first int(partial_rotary_factor * d // 2) frequency pairs (j, j + d/2) of the whole head turn,
the rest do not). q = rope(RMSNorm_q(W_q n)), k = rope(RMSNorm_k(W_k n)) per head, v = RMSNorm(W_v n) per head without
a weight; on full layers with `attention_k_eq_v` there is no W_v: v = RMSNorm(W_k n), the key projection's output
before k's norm and rotary. Scores are not scaled (scale 1): the q / k norms set their size.

Per-layer inputs (as Gemma 3n's): with E_pl the per-layer table (`embed_tokens_per_layer`, [V_pl, L P]) and W_pl
`per_layer_model_projection`, u_i = (RMSNorm_pl((W_pl e) * H^-1/2)_i + E_pl[id]_i * sqrt(P)) * 2^-1/2, the two scales
Python floats as transformers applies them (ids past V_pl, which transformers cannot look up, read row 0 here).

KV sharing (`num_kv_shared_layers`, the E models): the last layers compute only q and attend over the keys and values
of the last earlier layer of their type (transformers' kv_sharing_modes "store" / "reuse"); their MLPs are twice as
wide where `use_double_wide_mlp`. The cache holds the other layers only, each at its own (KV heads, head dim): the
paged cache keeps one tensor per distinct shape (decoder/kv_cache.py's layer_shapes), so nothing is padded (the 31B's
full layers hold 4 x 512 per token beside the sliding layers' 16 x 256; one padded shape would cost 1.09x there and
1.7x on E2B, whose full layers' single KV head is 512 wide beside 256).

The experts (26B-A4B): route(x) = the top `top_k_experts` of softmax(W_r (RMSNorm(x) * s * H^-1/2)) in fp32 (RMSNorm
without a weight, s the router's `scale`, over the layer's input x, not m), renormalised to sum to 1, each weight
times the expert's `per_expert_scale` (folded into its down projection at load, a linear map: in bf16 the folded
weights round once where transformers rounds the weighted outputs); expert j is
W_down_j (gelu_tanh(W_gate_j y) * W_up_j y) over y = RMSNorm_ff2(x), the chosen ones' outputs weighted and summed
(kernels.moe_mlp).

Decode rows are one batched pass per layer, no host sync, nothing per sequence, as a CUDA graph replays it. The norms
and residual adds between the linears run in the linears' prologues (kernels.PreNorm; for one decode row inside the
GEMV): the QKV linear's computes (stream + RMSNorm_post(delta)) * s of the layer before (x_norm, sum_scale) and this
layer's input norm, the gate / up linear's x + RMSNorm_pa(attention) and RMSNorm_ff, the per-layer gate's (E models)
x + RMSNorm_pf(f); q / k / v norms, rotary and the cache write are one kernels.qkv_to_cache (v_norm, v_from_k); the
experts kernels.moe_mlp. Profiled on the H200 (Gemma-4-31B, batch 1, bf16), the unfused form spent 1.1 ms of its
17.3 ms step in 300 norm, add, scale and copy kernels.

Tensor parallelism (Megatron-LM's split, as Gemma 3n's): each rank holds its query heads' rows of q_proj and the
matching columns of o_proj, one all-reduce after it (before RMSNorm_pa); on every layer that keeps its keys, its KV
heads' rows of k_proj (and v_proj) and its KV heads' cache, at that layer's shape: the heads' share where they
divide by the ranks, else, where the ranks are a multiple of them (E2B's single KV head at TP 2, the 26B-A4B's full
layers' 2 at TP 4, the 31B's 4 at TP 8), the one KV head its query heads read, replicated on the ranks that read it
(each holds that head's cache: world / KV heads copies of it in all); a sharing layer reads its source's on the same
rank. Its columns of the dense MLP (rows of gate and up, columns of down) and of every expert (rows of each expert's
gate and up halves, columns of its down projection, per_expert_scale folded in on every rank), one all-reduce after
them (the dense and the experts' partial sums side by side in one, before their own norms); the router whole, so
every rank routes alike. The embedding, the head and the per-layer table E_pl split by vocabulary rows: each rank
looks up the ids it holds and one all-reduce (of both tables' rows side by side) joins them. Whole on every rank:
the norms, layer scalars, the per-layer gate and projection, W_pl. Query heads, MLP or expert columns that do not
divide by the ranks, and a layer's KV heads that neither divide by the ranks nor divide them, are refused at load,
the layer and the numbers named.

`use_bidirectional_attention` "vision" (the larger multimodal checkpoints') makes only image tokens attend both ways:
text tokens attend causally, as transformers masks a text-only input, so it is served as None is.

Refused by name: `use_bidirectional_attention` "all" (every token both ways: an encoder), a `hidden_activation`
other than gelu_pytorch_tanh, `attention_bias`, `layer_types` other than sliding_attention / full_attention, a
`num_kv_shared_layers` whose shared layers have no earlier layer of their type (transformers' own error), a
`per_layer_config` entry other than a layer's head_dim / num_key_value_heads, MoE without its sizes, and FP8
linears (decoder.py: the spec is not the shared decoder's)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel, eos_ids
from tritonformer.backend.models.gemma3n import check_activation_and_bias, kv_sources
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.rope import Rope, params_by_layer_type
from tritonformer.backend.models.transformer import TransformerDecoder

LAYER_TYPES = ("sliding_attention", "full_attention")
# transformers' Gemma4TextConfig rotary where a config has none
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}


@dataclass(frozen=True)
class Gemma4Spec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # the sliding layers' (what the decode graphs size their key splits by)
    head_dim: int  # the sliding layers'
    norm_eps: float
    rope: Rope  # the full-attention layers'
    local_rope: Rope  # the sliding layers'
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    intermediate_sizes: tuple[int, ...]  # per layer (double-wide on shared layers where use_double_wide_mlp)
    layer_windows: tuple[int | None, ...]  # per layer: the sliding window, or None (full attention)
    layer_heads: tuple[tuple[int, int], ...]  # per layer: (KV heads, head dim)
    values_from_keys: tuple[bool, ...]  # per layer: v is W_k's output (attention_k_eq_v on a full layer)
    kv_sources: tuple[int, ...]  # per layer: the layer whose keys and values it attends over (itself, or shared)
    per_layer_size: int = 0  # hidden_size_per_layer_input (0: no per-layer inputs)
    per_layer_vocab: int = 262144
    final_softcap: float | None = None
    num_experts: int = 0  # 0: no experts (enable_moe_block false)
    top_k: int = 0
    moe_intermediate_size: int = 0
    norm_offset: ClassVar[float] = 0.0  # (norm weights applied as they are: model_shapes draws them around 1)
    attends: ClassVar[bool] = True  # (every layer attends: its heads split over tensor-parallel ranks)

    def check_split(self, tp) -> None:
        """Raise where this model cannot split over `tp`'s ranks (decoder._check_split): its attention heads, each
        layer's KV heads (dividing by the ranks, or a divisor of them: replicated), MLP and expert columns."""
        tp.part(self.num_heads, "attention heads")
        for i, source in enumerate(self.kv_sources):
            if source == i:
                kv_heads_part(self.layer_heads[i][0], self.num_heads, tp, i)
            tp.part(self.intermediate_sizes[i], f"layer {i}'s MLP columns (intermediate_size)")
        if self.num_experts:
            tp.part(self.moe_intermediate_size, "expert columns (moe_intermediate_size)")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint holds, by name (the model prefix stripped): client/model_shapes.tensor_shapes."""
        h, p, layers = self.hidden_size, self.per_layer_size, self.num_layers
        shapes = {"embed_tokens.weight": (self.vocab_size, h), "norm.weight": (h,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        if p:
            shapes.update({"embed_tokens_per_layer.weight": (self.per_layer_vocab, layers * p),
                           "per_layer_model_projection.weight": (layers * p, h),
                           "per_layer_projection_norm.weight": (p,)})
        for i, inter in enumerate(self.intermediate_sizes):
            kv, d = self.layer_heads[i]
            q = self.num_heads * d
            layer = {"self_attn.q_proj.weight": (q, h), "self_attn.q_norm.weight": (d,),
                     "self_attn.o_proj.weight": (h, q), "mlp.gate_proj.weight": (inter, h),
                     "mlp.up_proj.weight": (inter, h), "mlp.down_proj.weight": (h, inter), "layer_scalar": (1,)}
            if self.kv_sources[i] == i:
                layer.update({"self_attn.k_proj.weight": (kv * d, h), "self_attn.k_norm.weight": (d,)})
                if not self.values_from_keys[i]:
                    layer["self_attn.v_proj.weight"] = (kv * d, h)
            norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"]
            if p:
                layer.update({"per_layer_input_gate.weight": (p, h), "per_layer_projection.weight": (h, p)})
                norms.append("post_per_layer_input_norm")
            if self.num_experts:
                e, m = self.num_experts, self.moe_intermediate_size
                layer.update({"router.proj.weight": (e, h), "router.scale": (h,), "router.per_expert_scale": (e,),
                              "experts.gate_up_proj": (e, 2 * m, h), "experts.down_proj": (e, h, m)})
                norms += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"]
            layer.update({f"{norm}.weight": (h,) for norm in norms})
            shapes.update({f"layers.{i}.{name}": shape for name, shape in layer.items()})
        return shapes


def kv_heads_part(kv: int, heads: int, tp, layer: int) -> slice:
    """This rank's KV heads of a layer with `kv` of them over `heads` query heads: its share where they divide by the
    ranks; where the ranks are a multiple of them (a full layer's 1 or 2 KV heads, E2B's one), the one KV head its
    query heads read, replicated on the ranks whose query heads read it."""
    world = tp.world
    if kv % world == 0:
        return tp.part(kv, f"layer {layer}'s KV heads")
    if world % kv or heads % world:
        raise ValueError(f"layer {layer}'s KV heads ({kv}, over {heads} attention heads) neither divide by "
                         f"tensor_parallel_size {world} nor divide it (supported: KV heads that divide by "
                         f"tensor_parallel_size, or divide it: replicated)")
    head = tp.rank * kv // world
    return slice(head, head + 1)


# the multimodal checkpoints' model types, and their text models'
TEXT_TYPES = {"gemma4": "gemma4_text", "gemma4_unified": "gemma4_unified_text"}
# what Gemma 4 unified's text config has not (transformers' Gemma4UnifiedTextConfig removes them; its layers read none)
NOT_UNIFIED = ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block", "num_experts",
               "top_k_experts", "moe_intermediate_size")


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A multimodal Gemma 4 (unified) checkpoint (model_type gemma4, gemma4_unified): its text model's config and
    tensors."""
    if cfg.get("model_type") not in TEXT_TYPES:
        return cfg, state
    return text_part(cfg, state, TEXT_TYPES[cfg["model_type"]])


def unified_as_gemma4(cfg: dict) -> dict:
    """A `gemma4_unified_text` config as the Gemma 4 text config it computes as: no per-layer inputs and no experts
    (keys naming them, which transformers' unified model never reads, dropped), and its own defaults (a window of
    1,024, 262,144 positions)."""
    return {"sliding_window": 1024, "max_position_embeddings": 262144,
            **{k: v for k, v in cfg.items() if k not in NOT_UNIFIED}, "hidden_size_per_layer_input": 0}


def _layer_types(cfg: dict, layers: int) -> list[str]:
    """The config's layer_types, or transformers' default (every 6th layer full); the last layer full either way."""
    types = list(cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                            for i in range(layers)])
    if len(types) != layers or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"unsupported Gemma 4 layer_types {types!r} (supported: layer_types sliding_attention / "
                         f"full_attention for each of the {layers} layers)")
    types[-1] = "full_attention"  # (as transformers forces it)
    return types


def _layer_heads(cfg: dict, types: list[str], kv: int, head_dim: int) -> list[tuple[int, int]]:
    """Per layer (KV heads, head dim): a config.json's `global_head_dim` / `num_global_key_value_heads` on the full
    layers (the latter only where attention_k_eq_v, as transformers reads it), or a saved config's `per_layer_config`
    (layer index -> head_dim / num_key_value_heads overrides)."""
    heads = [(kv, head_dim)] * len(types)
    overrides = cfg.get("per_layer_config")
    if overrides is None:
        global_kv = cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v") else None
        full = (global_kv or kv, cfg.get("global_head_dim") or 512)
        return [full if t == "full_attention" else h for t, h in zip(types, heads)]
    for key, values in dict(overrides).items():
        try:
            layer = int(key)
        except (TypeError, ValueError):
            layer = -1
        if not 0 <= layer < len(types) or not isinstance(values, dict) or \
                set(values) - {"head_dim", "num_key_value_heads"}:
            raise ValueError(f"unsupported Gemma 4 per_layer_config entry {key!r}: {values!r} (supported: "
                             f"per_layer_config by layer index of head_dim / num_key_value_heads)")
        heads[layer] = (values.get("num_key_value_heads") or kv, values.get("head_dim") or head_dim)
    return heads


def from_hf(cfg: dict) -> Gemma4Spec:
    if cfg.get("model_type") == "gemma4_unified_text":
        cfg = unified_as_gemma4(cfg)
    if cfg.get("use_bidirectional_attention") not in (None, "vision"):
        raise ValueError(f"unsupported Gemma 4 use_bidirectional_attention {cfg['use_bidirectional_attention']!r} "
                         f"(supported: use_bidirectional_attention None, or 'vision', whose text tokens attend "
                         f"causally: text in, text out)")
    check_activation_and_bias(cfg, "Gemma 4")
    layers, hidden = cfg.get("num_hidden_layers", 30), cfg.get("hidden_size", 2304)
    heads = cfg.get("num_attention_heads", 8)
    kv, head_dim = cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or 256
    types = _layer_types(cfg, layers)
    layer_heads = _layer_heads(cfg, types, kv, head_dim)
    if any(heads % n for n, _ in layer_heads):
        raise ValueError(f"unsupported Gemma 4 KV heads {sorted({n for n, _ in layer_heads})} for {heads} attention "
                         f"heads (supported: num_key_value_heads that divide num_attention_heads)")
    sources = kv_sources(types, cfg.get("num_kv_shared_layers") or 0, "Gemma 4")
    inter = cfg.get("intermediate_size", 9216)
    double = bool(cfg.get("use_double_wide_mlp"))
    moe = bool(cfg.get("enable_moe_block"))
    experts, top_k, moe_inter = (cfg.get("num_experts"), cfg.get("top_k_experts"), cfg.get("moe_intermediate_size"))
    if moe and not (experts and top_k and moe_inter and 0 < top_k <= experts):
        raise ValueError(f"unsupported Gemma 4 enable_moe_block with num_experts {experts}, top_k_experts {top_k}, "
                         f"moe_intermediate_size {moe_inter} (supported: enable_moe_block with num_experts, "
                         f"top_k_experts (at most num_experts) and moe_intermediate_size set)")
    max_positions = cfg.get("max_position_embeddings", 131072)
    params = cfg.get("rope_parameters") or DEFAULT_ROPE
    full, local = params_by_layer_type({"rope_parameters": params})
    window = cfg.get("sliding_window") or 512
    return Gemma4Spec(
        vocab_size=cfg.get("vocab_size", 262144), hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope=Rope.from_hf(full or DEFAULT_ROPE["full_attention"], 1_000_000.0, max_positions),
        local_rope=Rope.from_hf(local or DEFAULT_ROPE["sliding_attention"], 10_000.0, max_positions),
        max_position_embeddings=max_positions, tie_word_embeddings=cfg.get("tie_word_embeddings", True),
        bos_token_id=cfg.get("bos_token_id", 2), eos_token_ids=eos_ids({"eos_token_id": 1, **cfg}),
        intermediate_sizes=tuple(inter * (2 if double and sources[i] != i else 1) for i in range(layers)),
        layer_windows=tuple(window if t == "sliding_attention" else None for t in types),
        layer_heads=tuple(layer_heads),
        values_from_keys=tuple(bool(cfg.get("attention_k_eq_v")) and t == "full_attention" for t in types),
        kv_sources=sources, per_layer_size=cfg.get("hidden_size_per_layer_input", 256) or 0,
        per_layer_vocab=cfg.get("vocab_size_per_layer_input") or cfg.get("vocab_size", 262144),
        final_softcap=cfg.get("final_logit_softcapping"),
        num_experts=experts if moe else 0, top_k=top_k if moe else 0, moe_intermediate_size=moe_inter if moe else 0)


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    qkv_w: torch.Tensor  # [q; k; v] rows, [q; k] where v is k's output, or q's only in a layer that reads another's
    q_norm: torch.Tensor
    k_norm: torch.Tensor | None
    o_w: torch.Tensor
    attn_post_norm: torch.Tensor
    mlp_norm: torch.Tensor
    gate_up_w: torch.Tensor  # [gate; up]
    down_w: torch.Tensor
    mlp_post_norm: torch.Tensor
    scalar: torch.Tensor  # [1]: layer_scalar
    kv_heads: int
    head_dim: int
    window: int | None
    values_from_keys: bool
    kv_index: int  # the cache layer it attends over (its own, or its source's)
    writes_kv: bool
    gate_pl_w: torch.Tensor | None = None  # [P, H]
    proj_pl_w: torch.Tensor | None = None  # [H, P]
    pl_norm: torch.Tensor | None = None
    router_w: torch.Tensor | None = None  # [E, H]
    router_scale: torch.Tensor | None = None  # [H]
    experts_gate_up: torch.Tensor | None = None  # [E, 2I, H]
    experts_down: torch.Tensor | None = None  # [E, H, I], times each expert's per_expert_scale
    moe_pre_norm: torch.Tensor | None = None  # pre_feedforward_layernorm_2
    mlp_post_norm_1: torch.Tensor | None = None
    moe_post_norm: torch.Tensor | None = None  # post_feedforward_layernorm_2


class Gemma4Decoder(DecoderModel):
    """Gemma 4's text model over the paged KV cache (see the module's docstring)."""

    # (a `[vocab, width]` table's rows of this rank, padded as the shared decoder pads its embedding and head)
    _vocab_rows = TransformerDecoder._vocab_rows

    def __init__(self, config: Gemma4Spec, state, device, dtype, tp=None):
        """With `tp`, this rank's share (see the module's docstring): its query heads' rows of q and columns of
        o_proj, its KV heads' rows of k and v, its columns of each MLP and of every expert, its vocabulary rows of
        the embedding, the head and the per-layer table; the rest whole. `self.config` then describes the share."""
        if tp is not None:
            config.check_split(tp)
        super().__init__(config, state, device, dtype)
        self.tp = tp
        c = config
        shapes = c.tensor_shapes()

        def checked(name: str) -> str:
            if name not in state:
                raise KeyError(f"checkpoint is missing weight {name!r}")
            if tuple(state[name].shape) != shapes[name]:
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(state[name].shape)}, but the config "
                                 f"(hidden {c.hidden_size}, {c.num_heads} heads, per layer (KV heads, head dim) "
                                 f"{sorted(set(c.layer_heads))}, per-layer inputs {c.per_layer_size}, "
                                 f"{c.num_experts} experts) needs {shapes[name]}")
            return name

        def read(name: str, index: tuple | None = None) -> torch.Tensor:
            """The tensor (its shape checked), or this rank's `index` of it only."""
            if tp is None or index is None:
                return self.weight(checked(name))
            return state[checked(name)][index].to(device=device, dtype=dtype).contiguous()

        untied = not c.tie_word_embeddings and "lm_head.weight" in state
        if tp is None:
            self.embed = read("embed_tokens.weight")
            self.set_output_head(read("lm_head.weight") if untied else self.embed)
        else:  # vocabulary-parallel: this rank's rows of the embedding, the head (and the per-layer table)
            self.vocab_size = c.vocab_size
            self.embed = self._vocab_rows(state[checked("embed_tokens.weight")])
            self.output_head = self._vocab_rows(state[checked("lm_head.weight")]) if untied else self.embed
        self.final_norm = read("norm.weight")
        if c.per_layer_size:
            self.per_layer_embed = read("embed_tokens_per_layer.weight") if tp is None else \
                self._vocab_rows(state[checked("embed_tokens_per_layer.weight")])
            self.per_layer_proj = read("per_layer_model_projection.weight")
            self.per_layer_norm = read("per_layer_projection_norm.weight")
        self.ones = torch.ones(c.hidden_size, device=device, dtype=dtype)  # (the router's norm has no weight)
        full_dims = {d for (_, d), w in zip(c.layer_heads, c.layer_windows) if w is None}
        local_dims = {d for (_, d), w in zip(c.layer_heads, c.layer_windows) if w is not None}
        # rotary tables by (local, head dim): the full layers' proportional one, the sliding layers' default one
        self.tables = {**{(False, d): c.rope.cos_sin(c.max_position_embeddings, d, device) for d in full_dims},
                       **{(True, d): c.local_rope.cos_sin(c.max_position_embeddings, d, device) for d in local_dims}}
        heads = tp.part(c.num_heads, "attention heads") if tp is not None else slice(0, c.num_heads)
        all_rows = slice(None)
        kv_index: dict[int, int] = {}
        self.kv_shapes: list[tuple[int, int]] = []
        local_heads: list[tuple[int, int]] = []  # per layer: (this rank's KV heads, head dim)
        self.layers: list[_Layer] = []
        for i, source in enumerate(c.kv_sources):
            p = f"layers.{i}."
            own = source == i
            kv, d = c.layer_heads[source]
            kv_part = kv_heads_part(kv, c.num_heads, tp, source) if tp is not None else slice(0, kv)
            kv = kv_part.stop - kv_part.start
            local_heads.append((kv, c.layer_heads[i][1]))
            q_rows, kv_rows = slice(heads.start * d, heads.stop * d), slice(kv_part.start * d, kv_part.stop * d)
            if own:
                kv_index[i] = len(kv_index)
                self.kv_shapes.append((kv, d))
            rows = [read(p + "self_attn.q_proj.weight", (q_rows,))]
            if own:
                rows.append(read(p + "self_attn.k_proj.weight", (kv_rows,)))
                if not c.values_from_keys[i]:
                    rows.append(read(p + "self_attn.v_proj.weight", (kv_rows,)))
            mlp = tp.part(c.intermediate_sizes[i], f"layer {i}'s MLP columns") if tp is not None else None
            layer = _Layer(
                attn_norm=read(p + "input_layernorm.weight"), qkv_w=torch.cat(rows),
                q_norm=read(p + "self_attn.q_norm.weight"),
                k_norm=read(p + "self_attn.k_norm.weight") if own else None,
                o_w=read(p + "self_attn.o_proj.weight", (all_rows, q_rows)),
                attn_post_norm=read(p + "post_attention_layernorm.weight"),
                mlp_norm=read(p + "pre_feedforward_layernorm.weight"),
                gate_up_w=torch.cat([read(p + "mlp.gate_proj.weight", mlp and (mlp,)),
                                     read(p + "mlp.up_proj.weight", mlp and (mlp,))]),
                down_w=read(p + "mlp.down_proj.weight", mlp and (all_rows, mlp)),
                mlp_post_norm=read(p + "post_feedforward_layernorm.weight"),
                scalar=read(p + "layer_scalar"), kv_heads=kv, head_dim=d, window=c.layer_windows[i],
                values_from_keys=c.values_from_keys[source], kv_index=kv_index[source], writes_kv=own)
            if c.per_layer_size:
                layer.gate_pl_w = read(p + "per_layer_input_gate.weight")
                layer.proj_pl_w = read(p + "per_layer_projection.weight")
                layer.pl_norm = read(p + "post_per_layer_input_norm.weight")
            if c.num_experts:
                self._read_experts(layer, p, state, checked, read, tp)
            self.layers.append(layer)
        self.num_kv_layers = len(kv_index)  # (the sharing layers hold none of their own)
        if tp is not None:  # what the forward, the KV cache and the graphs size themselves by
            sliding = next((kv for (kv, _), w in zip(local_heads, c.layer_windows) if w is not None), local_heads[0][0])
            self.config = replace(c, num_heads=c.num_heads // tp.world, num_kv_heads=sliding,
                                  layer_heads=tuple(local_heads),
                                  intermediate_sizes=tuple(n // tp.world for n in c.intermediate_sizes),
                                  moe_intermediate_size=c.moe_intermediate_size // tp.world)

    def _read_experts(self, layer: _Layer, p: str, state, checked, read, tp) -> None:
        """The router (whole on every rank), and every expert's gate / up rows and down columns (this rank's share
        of each under `tp`), the down projections times their per_expert_scale."""
        c = self.config
        layer.router_w = read(p + "router.proj.weight")
        layer.router_scale = read(p + "router.scale")
        scale = state[checked(p + "router.per_expert_scale")].to(torch.float32)
        down = state[checked(p + "experts.down_proj")]
        if tp is None:
            layer.experts_gate_up = read(p + "experts.gate_up_proj")
            down = down.to(torch.float32)
        else:  # this rank's columns of every expert: its rows of the gate and of the up halves, its down columns
            m, every = c.moe_intermediate_size, slice(None)
            cols = tp.part(m, "expert columns (moe_intermediate_size)")
            upper = slice(m + cols.start, m + cols.stop)
            layer.experts_gate_up = torch.cat([read(p + "experts.gate_up_proj", (every, cols)),
                                               read(p + "experts.gate_up_proj", (every, upper))], dim=1)
            down = down[every, every, cols].to(torch.float32)
        layer.experts_down = (down * scale[:, None, None].to(down.device)).to(device=self.device,
                                                                             dtype=self.dtype).contiguous()
        layer.moe_pre_norm = read(p + "pre_feedforward_layernorm_2.weight")
        layer.mlp_post_norm_1 = read(p + "post_feedforward_layernorm_1.weight")
        layer.moe_post_norm = read(p + "post_feedforward_layernorm_2.weight")

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """One cache layer per layer that keeps its keys, each at its own (KV heads, head dim)."""
        c = self.config
        return PagedKVCache(self.num_kv_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, self.device,
                            self.dtype, layer_shapes=self.kv_shapes)

    def kv_bytes_per_token(self) -> int:
        return 2 * sum(kv * d for kv, d in self.kv_shapes) * self.dtype.itemsize

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        """One iteration over the batch's packed tokens; `[S, vocab]` logits of the rows in `batch.logits_index`."""
        return self.logits(self.hidden_states(batch, cache), fp32_logits)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, weight, self.config.norm_eps)[0]

    def _embeddings(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(e `[T, H]`, the token embeddings times sqrt(H); the per-layer table's rows `[T, L P]` times sqrt(P), or
        None without per-layer inputs). Under tensor parallelism each rank looks up the ids it holds of both tables,
        zeros for the rest, and one all-reduce of the two side by side sums them (exactly: one rank gives each row)."""
        c = self.config
        rank = self.tp.rank if self.tp is not None else 0
        e = kernels.embedding_part(ids, self.embed, rank * self.embed.shape[0], c.hidden_size ** 0.5)
        table = None
        if c.per_layer_size:
            held = torch.where((ids >= 0) & (ids < c.per_layer_vocab), ids, torch.zeros_like(ids))
            table = kernels.embedding_part(held, self.per_layer_embed, rank * self.per_layer_embed.shape[0],
                                           c.per_layer_size ** 0.5)
        if self.tp is None:
            return e, table
        if table is None:
            return self.tp.all_reduce(e), None
        both = self.tp.all_reduce(torch.cat([e, table], dim=1))
        return both[:, : c.hidden_size].contiguous(), both[:, c.hidden_size :].contiguous()

    def _per_layer_inputs(self, e: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """u `[T, L, P]`: each layer's per-layer input of each token, from e and its per-layer table rows."""
        c = self.config
        rows, p = e.shape[0], c.per_layer_size
        projected = kernels.linear_act(e, self.per_layer_proj) * (c.hidden_size ** -0.5)
        projected = self._norm(projected.view(rows * c.num_layers, p), self.per_layer_norm)
        return (projected.view(rows, c.num_layers, p) + table.view(rows, c.num_layers, p)) * (2.0 ** -0.5)

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for the rows in `batch.logits_index`. Each layer hands the next one
        its closing (see _layer), which the next layer's first linear applies in its prologue."""
        x, table = self._embeddings(batch.input_ids)
        per_layer = None if table is None else self._per_layer_inputs(x, table)
        cos_sin = {key: rotary[batch.positions] for key, rotary in self.tables.items()}
        eps = self.config.norm_eps
        pre = kernels.PreNorm(self.layers[0].attn_norm, None, eps)  # the first layer's input: the embeddings
        for i, layer in enumerate(self.layers):
            x, post_norm, residual, scalar = self._layer(x, pre, None if per_layer is None else per_layer[:, i],
                                                         layer, batch, cache, cos_sin[(layer.window is not None,
                                                                                       layer.head_dim)])
            last = i + 1 == len(self.layers)
            if last and not batch.logits_every_row:
                x, residual = x[batch.logits_index], residual[batch.logits_index]
            pre = kernels.PreNorm(self.final_norm if last else self.layers[i + 1].attn_norm, None, eps,
                                  residual=residual, sum_out=None if last else torch.empty_like(residual),
                                  x_norm=post_norm, sum_scale=scalar)
        return kernels.prenormed(x, pre)  # (the last layer's closing and the final norm)

    def _layer(self, x: torch.Tensor, pre: kernels.PreNorm, per_layer: torch.Tensor | None, layer: _Layer,
               batch: DecoderBatch, cache: PagedKVCache, cos_sin: torch.Tensor):
        """One decoder layer (see the module's docstring) over x `[T, H]`, the layer before's closing delta (the
        embeddings for the first layer), which `pre` turns into this layer's input stream and its input norm's
        rows, in the QKV linear's prologue: pre.sum_out (x itself without one) is the stream. Returns this layer's
        closing (delta, its post-norm's weight, the stream it adds to, the layer scalar): the layer's output is
        (stream + RMSNorm_post(delta)) * scalar, which the next linear's PreNorm computes (x_norm, sum_scale)."""
        eps = self.config.norm_eps
        stream = x if pre.sum_out is None else pre.sum_out
        out = self._attend(x, pre, layer, batch, cache, cos_sin)
        # x + RMSNorm_pa(attention) and RMSNorm_ff of it, in the gate / up linear's prologue
        mlp_pre = kernels.PreNorm(layer.mlp_norm, None, eps, residual=stream, sum_out=torch.empty_like(stream),
                                  x_norm=layer.attn_post_norm)
        h, fused_pre = (out, mlp_pre) if self.tp is None else self.tp.all_reduce_then(out, mlp_pre)
        f = kernels.linear_act(kernels.linear_act(h, layer.gate_up_w, None, "gelu_tanh_mul", prenorm=fused_pre),
                               layer.down_w)
        stream = mlp_pre.sum_out
        if layer.experts_down is not None:
            experts = self._experts(stream, layer)
            if self.tp is not None:  # (each rank's columns' partial sums of both, summed in one all-reduce)
                both = self.tp.all_reduce(torch.cat([f, experts], dim=1))
                f, experts = both[:, : f.shape[1]].contiguous(), both[:, f.shape[1] :].contiguous()
            f = self._norm(f, layer.mlp_post_norm_1) + self._norm(experts, layer.moe_post_norm)
        elif self.tp is not None:
            f = self.tp.all_reduce(f)  # (each rank's columns' partial sums, summed)
        if per_layer is None:
            return f, layer.mlp_post_norm, stream, layer.scalar
        # x + RMSNorm_pf(f) is the per-layer gate's input: a post-norm prologue (no norm after the add) hands it over
        gate_pre = kernels.PreNorm(None, None, eps, residual=stream, sum_out=torch.empty_like(stream),
                                   x_norm=layer.mlp_post_norm)
        gated = kernels.linear_act(f, layer.gate_pl_w, activation="gelu_tanh", prenorm=gate_pre) * per_layer
        return kernels.linear_act(gated, layer.proj_pl_w), layer.pl_norm, gate_pre.sum_out, layer.scalar

    def _experts(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """The experts' weighted sum over RMSNorm_ff2(x), routed by softmax(W_r (RMSNorm(x) * s * H^-1/2))."""
        c = self.config
        routed = self._norm(x, self.ones) * layer.router_scale * (c.hidden_size ** -0.5)
        logits = kernels.linear_act(routed, layer.router_w)
        return kernels.moe_mlp(self._norm(x, layer.moe_pre_norm), logits, layer.experts_gate_up, layer.experts_down,
                               c.top_k, True, None, "gelu_tanh_mul", "softmax")

    def _attend(self, x: torch.Tensor, pre: kernels.PreNorm, layer: _Layer, batch: DecoderBatch, cache: PagedKVCache,
                cos_sin: torch.Tensor) -> torch.Tensor:
        """The attention's output projection `[T, H]` over the rows x PreNorm'd by `pre` (in the QKV linear's
        prologue): q (and k, v where the layer keeps its own, into its cache layer) normalised per head (v without
        a weight; on a full layer with attention_k_eq_v v is W_k's output, before k's norm and rotary) and rotated,
        in one kernel with the cache write; keys and values those of its cache layer (its own or its source's);
        scores unscaled."""
        c = self.config
        rows, d, kv = x.shape[0], layer.head_dim, layer.kv_heads
        cos, sin = cos_sin[:, 0], cos_sin[:, 1]
        keys, values = cache.keys(layer.kv_index), cache.values(layer.kv_index)
        qkv = kernels.linear_act(x, layer.qkv_w, prenorm=pre)
        if layer.writes_kv:
            q = kernels.qkv_to_cache(qkv, None, c.num_heads, kv, d, cos, sin, keys, values, batch.slot_mapping,
                                     q_norm=layer.q_norm, k_norm=layer.k_norm, norm_eps=c.norm_eps, v_norm=True,
                                     v_from_k=layer.values_from_keys)
        else:
            q = self._norm(qkv.view(-1, d), layer.q_norm).view(rows, c.num_heads, d)
            q = kernels.apply_rotary(q, cos, sin)
        ctx = batch.attention(q, keys, values, scale=1.0, window=layer.window)
        out = kernels.linear_act(ctx.reshape(rows, -1), layer.o_w)
        return out if self.tp is None else self.tp.all_reduce(out)  # (each rank's heads' partial sums, summed)


MODEL = Gemma4Decoder
