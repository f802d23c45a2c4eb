"""Gemma 3n (text): `gemma3n_text`, and the text model of a multimodal `gemma3n` checkpoint (Gemma-3n-E2B / E4B).

The residual stream is N = `altup_num_inputs` streams S_0 .. S_{N-1} (AltUp), each [T, H]. With e the token
embeddings times sqrt(H) (the scale rounded to the table's dtype, as Gemma's), S_0 = e and, for j >= 1,
S_j = rescale(A_j e, e) with rescale(p, e) = p * rms(e) / sqrt(max(mean(p^2), 1e-5)), rms(e) = mean(e^2) ** 0.5.

Per-layer inputs, one [T, P] row per layer i (P = `hidden_size_per_layer_input`): with E_pl the per-layer table
(`embed_tokens_per_layer`, [V_pl, L P], ids past V_pl read row 0) and W_pl `per_layer_model_projection`,

    u_i = (RMSNorm_pl((W_pl e) * H^-1/2)_i + E_pl[id]_i * sqrt(P)) * 2^-1/2      (RMSNorm_pl over each P-wide row)

Every RMSNorm here multiplies by its weight w as it is (no 1 + w) and computes in fp32. Layer i, a = `altup_active_idx`:

    router(x) = tanh(W_r (RMSNorm_r(x) / H))                                      ([T, N]; W_r `modality_router`)
    predict:  P_j = S_j + sum_k C[j, k] S_k,  C = reshape(W_p router(S_a), N x N)  (W_p `prediction_coefs`)
    x = P_a, n = RMSNorm_in(x)
    laurel = n + RMSNorm_lr(R L n)                                                 (LAuReL: L [r, H], R [H, r])
    attn = RMSNorm_pa(W_o Attention(n))
    y = (x + attn + laurel) / sqrt(2)
    z = y + RMSNorm_pf(W_down (gelu_tanh(sparse(W_gate m)) * W_up m)),  m = RMSNorm_ff(y)
    correct:  S'_j = P_j + (z - P_a) (1 + W_c router(z))_j                         (W_c `correction_coefs`)
    g = RMSNorm_ppl(W_proj (gelu_tanh(W_gate_pl (S'_a * s)) * u_i))                (s `correct_output_scale` where
                                                                                    `altup_correct_scale`)
    S'_j += g for j = 1 .. N-1 (as transformers adds it: every stream but the first, whichever is active)

The attention: q = rope(RMSNorm_q(W_q n)), k = rope(RMSNorm_k(W_k n)) per head, v = RMSNorm(W_v n) per head without
a weight; scores not scaled (scale 1), causal, the sliding layers (`layer_types` "sliding_attention") over the last
`sliding_window` keys with the local rotary base, the full layers with the global one. The MLP's `sparse` (the
first layers' `activation_sparsity_pattern` p > 0) keeps what exceeds a Gaussian cutoff of its row:
sparse(g) = relu(g - (mean(g) + std(g) * icdf(p))) (std over the row, not Bessel-corrected; icdf the standard
normal's inverse CDF, once at load): element-wise math over row statistics, no sort, nothing on the host.

KV sharing: the last `num_kv_shared_layers` layers compute only q; each attends over the keys and values of the
last layer before them of its own attention type (what transformers' `kv_sharing_modes` calls "store" / "reuse").
The cache holds the other layers only (`num_kv_layers` = L - num_kv_shared_layers), and a sharing layer reads its
source layer's cache layer, written earlier in the same forward, so a chunked prefill and a decode see the keys as a
whole sequence's prefill does.

The output: with S the last layer's streams, the streams 1 .. N-1 through `altup_unembed_projections` and rescaled
to rms(S_0), h = RMSNorm_final(mean of S_0 and those); logits = cap * tanh((E h) / cap) (`final_logit_softcapping`;
the head tied to the embeddings unless `tie_word_embeddings` is false and the checkpoint has one).

Decode rows are one batched pass per layer (the linears through kernels.linear_act, q / k norms, rotary and the
cache write through kernels.qkv_to_cache, the attention over the paged cache, the rest plain element-wise and
small batched PyTorch ops): no host sync, nothing per sequence, as a CUDA graph replays it.

Tensor parallelism (Megatron-LM's split, as the shared decoder's): each rank holds its query heads' rows of q_proj
and its KV heads' of k_proj / v_proj (its KV heads' cache; a sharing layer reads its source's on the same rank), the
matching columns of o_proj, one all-reduce after it (before RMSNorm_pa); its columns of each MLP (rows of gate and
up, columns of down), one all-reduce after down (before RMSNorm_pf); a sparse gate's row mean and spread come from
each rank's sums of its values and their squares (fp32), summed by one more small all-reduce. The embedding, the
head and the per-layer table E_pl are split by vocabulary rows: each rank looks up the ids it holds of both tables
and one all-reduce of the two side by side joins them. Whole on every rank (small, or run once a step): the norms,
AltUp's router, prediction and correction coefficients and its in / out projections, LAuReL's L and R, the
per-layer gate and projection, W_pl. Heads, KV heads or a layer's MLP columns that do not divide by the ranks are
refused at load, by name (Gemma-3n-E2B / E4B's 2 KV heads split 2 ways, not 4).

Refused by name: a `hidden_activation` other than gelu_pytorch_tanh, `attention_bias`, `layer_types` other than
sliding_attention / full_attention, a `num_kv_shared_layers` whose shared layers have no earlier layer of their type
(transformers' own error), an activation sparsity outside [0, 1), an `altup_active_idx` outside the streams, and FP8
linears (decoder.py: the spec is not the shared decoder's)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel, eos_ids
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.rope import Rope, params_by_layer_type
from tritonformer.backend.models.transformer import TransformerDecoder

LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class Gemma3nSpec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    rope: Rope  # the full-attention layers'
    local_rope: Rope  # the sliding layers'
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    intermediate_sizes: tuple[int, ...]  # per layer
    sparsity: tuple[float, ...]  # per layer: activation_sparsity_pattern (0: a dense MLP)
    layer_windows: tuple[int | None, ...]  # per layer: the sliding window, or None (full attention)
    kv_sources: tuple[int, ...]  # per layer: the layer whose keys and values it attends over (itself, or shared)
    altup_inputs: int = 4
    altup_active: int = 0
    altup_correct_scale: bool = True
    laurel_rank: int = 64
    per_layer_size: int = 256  # hidden_size_per_layer_input
    per_layer_vocab: int = 262144  # vocab_size_per_layer_input
    final_softcap: float | None = 30.0
    norm_offset: ClassVar[float] = 0.0  # (norm weights applied as they are: model_shapes draws them around 1)
    attends: ClassVar[bool] = True  # (every layer attends: its heads split over tensor-parallel ranks)

    def check_split(self, tp) -> None:
        """Raise where this model cannot split over `tp`'s ranks (decoder._check_split): its attention heads, KV
        heads and each layer's MLP columns must divide by them."""
        tp.part(self.num_heads, "attention heads")
        tp.part(self.num_kv_heads, "KV heads")
        for i, inter in enumerate(self.intermediate_sizes):
            tp.part(inter, f"layer {i}'s MLP columns (intermediate_size)")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint holds, by name (the model prefix stripped): client/model_shapes.tensor_shapes."""
        h, n, p, layers = self.hidden_size, self.altup_inputs, self.per_layer_size, self.num_layers
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes = {"embed_tokens.weight": (self.vocab_size, h), "norm.weight": (h,),
                  "embed_tokens_per_layer.weight": (self.per_layer_vocab, layers * p),
                  "per_layer_model_projection.weight": (layers * p, h), "per_layer_projection_norm.weight": (p,)}
        for j in range(n - 1):
            shapes.update({f"altup_projections.{j}.weight": (h, h), f"altup_unembed_projections.{j}.weight": (h, h)})
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        for i, inter in enumerate(self.intermediate_sizes):
            pre = f"layers.{i}."
            layer = {"self_attn.q_proj": (q, h), "self_attn.q_norm": (self.head_dim,), "self_attn.o_proj": (h, q),
                     "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter),
                     "altup.correction_coefs": (n, n), "altup.prediction_coefs": (n * n, n),
                     "altup.modality_router": (n, h), "laurel.linear_left": (self.laurel_rank, h),
                     "laurel.linear_right": (h, self.laurel_rank), "per_layer_input_gate": (p, h),
                     "per_layer_projection": (h, p)}
            if self.kv_sources[i] == i:
                layer.update({"self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
                              "self_attn.k_norm": (self.head_dim,)})
            for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                         "post_feedforward_layernorm", "altup.router_norm", "laurel.post_laurel_norm",
                         "post_per_layer_input_norm"):
                layer[norm] = (h,)
            shapes.update({pre + name + ".weight": shape for name, shape in layer.items()})
            shapes[pre + "altup.correct_output_scale"] = (h,)
        return shapes


def kv_sources(layer_types: list[str], shared: int, family: str = "Gemma 3n") -> tuple[int, ...]:
    """Per layer the layer whose keys and values it reads: itself, or for the last `shared` layers the last layer
    before them of the same type (transformers' kv_sharing_modes; Gemma 3n's and Gemma 4's, `family` naming it)."""
    layers = len(layer_types)
    first = layers - shared
    if not 0 <= shared <= layers or (shared and first == 0):
        raise ValueError(f"unsupported {family} num_kv_shared_layers {shared} (supported: num_kv_shared_layers from 0 "
                         f"to {layers - 1}, the shared layers after at least one that keeps its keys)")
    sources = list(range(layers))
    for i in range(first, layers):
        earlier = [j for j in range(first) if layer_types[j] == layer_types[i]]
        if not earlier:
            raise ValueError(f"unsupported {family} num_kv_shared_layers {shared}: shared layer {i} "
                             f"({layer_types[i]}) has no earlier layer of its type to read (supported: "
                             f"num_kv_shared_layers whose layers' types each have a layer before them)")
        sources[i] = earlier[-1]
    return tuple(sources)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A multimodal Gemma 3n checkpoint (model_type gemma3n): its text model's config and tensors."""
    if cfg.get("model_type") != "gemma3n":
        return cfg, state
    return text_part(cfg, state, "gemma3n_text")


def _per_layer(cfg: dict, key: str, layers: int, default) -> list:
    value = cfg.get(key)
    value = default if value is None else value
    values = list(value) if isinstance(value, (list, tuple)) else [value] * layers
    if len(values) != layers:
        raise ValueError(f"Gemma 3n {key} lists {len(values)} values for {layers} layers (supported: {key} with one "
                         f"value, or one per layer)")
    return values


def check_activation_and_bias(cfg: dict, family: str = "Gemma 3n") -> None:
    """Refuse (by name) what Gemma 3n and Gemma 4 do not publish: an MLP activation other than the tanh GELU, and
    biases on the attention's projections."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported {family} hidden_activation {act!r} (supported: hidden_activation "
                         f"gelu_pytorch_tanh)")
    if cfg.get("attention_bias"):
        raise ValueError(f"{family} with attention_bias is not supported (supported: attention_bias false, as "
                         "published)")


def from_hf(cfg: dict) -> Gemma3nSpec:
    check_activation_and_bias(cfg)
    layers, hidden = cfg.get("num_hidden_layers", 35), cfg.get("hidden_size", 2048)
    types = cfg.get("layer_types") or ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
                                       for i in range(layers)]
    if len(types) != layers or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"unsupported Gemma 3n layer_types {types!r} (supported: layer_types sliding_attention / "
                         f"full_attention for each of the {layers} layers)")
    inter = _per_layer(cfg, "intermediate_size", layers, 16384)
    sparse = [0.95] * 10 + [0.0] * (layers - 10) if layers > 10 else [0.0] * layers
    sparsity = [float(p) for p in _per_layer(cfg, "activation_sparsity_pattern", layers, sparse)]
    if any(not 0.0 <= p < 1.0 for p in sparsity):
        raise ValueError(f"unsupported Gemma 3n activation_sparsity_pattern {sparsity} (supported: "
                         f"activation_sparsity_pattern values in [0, 1))")
    streams, active = cfg.get("altup_num_inputs", 4), cfg.get("altup_active_idx", 0)
    if not 0 <= active < streams:
        raise ValueError(f"unsupported Gemma 3n altup_active_idx {active} (supported: altup_active_idx from 0 to "
                         f"altup_num_inputs - 1 = {streams - 1})")
    max_positions = cfg.get("max_position_embeddings", 32768)
    full, local = params_by_layer_type(cfg)
    window = cfg.get("sliding_window", 512)
    heads = cfg.get("num_attention_heads", 8)
    return Gemma3nSpec(
        vocab_size=cfg.get("vocab_size", 262400), hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=cfg.get("head_dim") or 256,
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope=Rope.from_hf(full, cfg.get("rope_theta", full.get("rope_theta", 1_000_000.0)), max_positions),
        local_rope=Rope.from_hf(local, cfg.get("rope_local_base_freq", local.get("rope_theta", 10_000.0)),
                                max_positions),
        max_position_embeddings=max_positions, tie_word_embeddings=cfg.get("tie_word_embeddings", True),
        bos_token_id=cfg.get("bos_token_id", 2), eos_token_ids=eos_ids({"eos_token_id": 1, **cfg}),
        intermediate_sizes=tuple(int(i) for i in inter), sparsity=tuple(sparsity),
        layer_windows=tuple(window if t == "sliding_attention" else None for t in types),
        kv_sources=kv_sources(types, cfg.get("num_kv_shared_layers", 15)),
        altup_inputs=streams, altup_active=active, altup_correct_scale=bool(cfg.get("altup_correct_scale", True)),
        laurel_rank=cfg.get("laurel_rank", 64), per_layer_size=cfg.get("hidden_size_per_layer_input", 256),
        per_layer_vocab=cfg.get("vocab_size_per_layer_input", 262144),
        final_softcap=cfg.get("final_logit_softcapping", 30.0))


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    qkv_w: torch.Tensor  # [q; k; v] rows, or q's only in a layer that reads another's keys
    q_norm: torch.Tensor
    k_norm: torch.Tensor | None
    o_w: torch.Tensor
    attn_post_norm: torch.Tensor
    mlp_norm: torch.Tensor
    gate_up_w: torch.Tensor  # [gate; up]
    down_w: torch.Tensor
    mlp_post_norm: torch.Tensor
    cutoff_std: torch.Tensor | None  # icdf(p) of a sparse MLP's p in the model's dtype, None where dense
    router_norm: torch.Tensor
    router_w: torch.Tensor  # [N, H]
    predict_w: torch.Tensor  # [N * N, N]
    correct_w: torch.Tensor  # [N, N]
    correct_scale: torch.Tensor | None  # [H] (altup_correct_scale)
    laurel_left: torch.Tensor  # [r, H]
    laurel_right: torch.Tensor  # [H, r]
    laurel_norm: torch.Tensor
    gate_pl_w: torch.Tensor  # [P, H]
    proj_pl_w: torch.Tensor  # [H, P]
    pl_norm: torch.Tensor
    window: int | None
    kv_index: int  # the cache layer it attends over (its own, or its source's)
    writes_kv: bool


class Gemma3nDecoder(DecoderModel):
    """Gemma 3n's text model over the paged KV cache (see the module's docstring)."""

    # (a `[vocab, width]` table's rows of this rank, padded as the shared decoder pads its embedding and head)
    _vocab_rows = TransformerDecoder._vocab_rows

    def __init__(self, config: Gemma3nSpec, state, device, dtype, tp=None):
        """With `tp`, this rank's share (see the module's docstring): its heads' rows of q, k, v and columns of
        o_proj, its columns of each MLP, its vocabulary rows of the embedding, the head and the per-layer table;
        the rest whole. `self.config` then describes the share (heads, KV heads, MLP widths divided)."""
        if tp is not None:
            config.check_split(tp)
        super().__init__(config, state, device, dtype)
        self.tp = tp
        c = config
        d = c.head_dim
        shapes = c.tensor_shapes()

        def checked(name: str) -> str:
            if name not in state:
                raise KeyError(f"checkpoint is missing weight {name!r}")
            if tuple(state[name].shape) != shapes[name]:
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(state[name].shape)}, but the config "
                                 f"(hidden {c.hidden_size}, heads {c.num_heads}/{c.num_kv_heads} x {c.head_dim}, "
                                 f"per-layer inputs {c.per_layer_size}, LAuReL rank {c.laurel_rank}, "
                                 f"{c.altup_inputs} AltUp streams) needs {shapes[name]}")
            return name

        def read(name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
            """The tensor (its shape checked), or this rank's `rows` / `cols` of it only."""
            if tp is None or (rows is None and cols is None):
                return self.weight(checked(name))
            index = (rows or slice(None),) if cols is None else (rows or slice(None), cols)
            return state[checked(name)][index].to(device=device, dtype=dtype).contiguous()

        # This rank's rows of q and of k / v (all of them without tp)
        q_part, kv_part = slice(0, c.num_heads * d), slice(0, c.num_kv_heads * d)
        if tp is not None:
            heads, kv_heads = tp.part(c.num_heads, "attention heads"), tp.part(c.num_kv_heads, "KV heads")
            q_part, kv_part = slice(heads.start * d, heads.stop * d), slice(kv_heads.start * d, kv_heads.stop * d)

        untied = not c.tie_word_embeddings and "lm_head.weight" in state
        if tp is None:
            self.embed = read("embed_tokens.weight")
            self.set_output_head(read("lm_head.weight") if untied else self.embed)
            self.per_layer_embed = read("embed_tokens_per_layer.weight")
        else:  # vocabulary-parallel: this rank's rows of the embedding, the head and the per-layer table
            self.vocab_size = c.vocab_size
            self.embed = self._vocab_rows(state[checked("embed_tokens.weight")])
            self.output_head = self._vocab_rows(state[checked("lm_head.weight")]) if untied else self.embed
            self.per_layer_embed = self._vocab_rows(state[checked("embed_tokens_per_layer.weight")])
        self.final_norm = read("norm.weight")
        self.per_layer_proj = read("per_layer_model_projection.weight")
        self.per_layer_norm = read("per_layer_projection_norm.weight")
        # (the scales as transformers applies them: buffers rounded to the model's dtype)
        self.per_layer_proj_scale = torch.tensor(c.hidden_size ** -0.5, device=device, dtype=dtype)
        self.per_layer_input_scale = torch.rsqrt(torch.tensor(2.0)).to(device=device, dtype=dtype)
        streams = range(c.altup_inputs - 1)
        # The AltUp projections of e stacked into one linear; the unembedding ones as a batch [N - 1, H, H]
        self.altup_in = torch.cat([read(f"altup_projections.{j}.weight") for j in streams]) if c.altup_inputs > 1 \
            else None
        self.altup_out_t = (torch.stack([read(f"altup_unembed_projections.{j}.weight") for j in streams])
                            .transpose(1, 2).contiguous() if c.altup_inputs > 1 else None)
        self.v_norm = torch.ones(c.head_dim, device=device, dtype=dtype)  # (v's RMSNorm has no weight)
        self.rope_cos_sin = c.rope.cos_sin(c.max_position_embeddings, c.head_dim, device)
        self.local_cos_sin = c.local_rope.cos_sin(c.max_position_embeddings, c.head_dim, device)
        kv_index: dict[int, int] = {}
        self.layers: list[_Layer] = []
        for i, source in enumerate(c.kv_sources):
            p = f"layers.{i}."
            own = source == i
            if own:
                kv_index[i] = len(kv_index)
            rows = [read(p + "self_attn.q_proj.weight", rows=q_part)]
            if own:
                rows += [read(p + "self_attn.k_proj.weight", rows=kv_part),
                         read(p + "self_attn.v_proj.weight", rows=kv_part)]
            mlp_part = tp.part(c.intermediate_sizes[i], f"layer {i}'s MLP columns") if tp is not None else None
            sparsity = c.sparsity[i]
            self.layers.append(_Layer(
                attn_norm=read(p + "input_layernorm.weight"), qkv_w=torch.cat(rows),
                q_norm=read(p + "self_attn.q_norm.weight"),
                k_norm=read(p + "self_attn.k_norm.weight") if own else None,
                o_w=read(p + "self_attn.o_proj.weight", cols=q_part),
                attn_post_norm=read(p + "post_attention_layernorm.weight"),
                mlp_norm=read(p + "pre_feedforward_layernorm.weight"),
                gate_up_w=torch.cat([read(p + "mlp.gate_proj.weight", rows=mlp_part),
                                     read(p + "mlp.up_proj.weight", rows=mlp_part)]),
                down_w=read(p + "mlp.down_proj.weight", cols=mlp_part),
                mlp_post_norm=read(p + "post_feedforward_layernorm.weight"),
                # (the standard normal's inverse CDF as torch.distributions computes it, in fp32, once)
                cutoff_std=((torch.erfinv(2 * torch.tensor(sparsity, dtype=torch.float32) - 1) * math.sqrt(2))
                            .to(device=device, dtype=dtype) if sparsity > 0 else None),
                router_norm=read(p + "altup.router_norm.weight"), router_w=read(p + "altup.modality_router.weight"),
                predict_w=read(p + "altup.prediction_coefs.weight"),
                correct_w=read(p + "altup.correction_coefs.weight"),
                correct_scale=read(p + "altup.correct_output_scale") if c.altup_correct_scale else None,
                laurel_left=read(p + "laurel.linear_left.weight"), laurel_right=read(p + "laurel.linear_right.weight"),
                laurel_norm=read(p + "laurel.post_laurel_norm.weight"),
                gate_pl_w=read(p + "per_layer_input_gate.weight"), proj_pl_w=read(p + "per_layer_projection.weight"),
                pl_norm=read(p + "post_per_layer_input_norm.weight"), window=c.layer_windows[i],
                kv_index=kv_index[source], writes_kv=own))
        self.num_kv_layers = len(kv_index)  # (the sharing layers hold none of their own)
        if tp is not None:  # what the forward, the KV cache and the graphs size themselves by
            self.config = replace(c, num_heads=c.num_heads // tp.world, num_kv_heads=c.num_kv_heads // tp.world,
                                  intermediate_sizes=tuple(i // tp.world for i in c.intermediate_sizes))

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        """One iteration over the batch's packed tokens; `[S, vocab]` logits of the rows in `batch.logits_index`."""
        return self.logits(self.hidden_states(batch, cache), fp32_logits)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, weight, self.config.norm_eps)[0]

    @staticmethod
    def _rescaled(p: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """p's rows at the root-mean-square `target` (AltUp's projections of the streams)."""
        return p * target / torch.sqrt(torch.mean(p ** 2, dim=-1, keepdim=True).clamp(min=1e-5))

    def _embeddings(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(e `[T, H]`, the token embeddings times sqrt(H); the per-layer table's rows `[T, L P]` times sqrt(P)).
        Under tensor parallelism each rank looks up the ids it holds of both tables, zeros for the rest, and one
        all-reduce of the two side by side sums them (exactly: one rank gives each row)."""
        c = self.config
        held = torch.where((ids >= 0) & (ids < c.per_layer_vocab), ids, torch.zeros_like(ids))
        rank = self.tp.rank if self.tp is not None else 0
        e = kernels.embedding_part(ids, self.embed, rank * self.embed.shape[0], c.hidden_size ** 0.5)
        table = kernels.embedding_part(held, self.per_layer_embed, rank * self.per_layer_embed.shape[0],
                                       c.per_layer_size ** 0.5)
        if self.tp is None:
            return e, table
        both = self.tp.all_reduce(torch.cat([e, table], dim=1))
        return both[:, : c.hidden_size].contiguous(), both[:, c.hidden_size :].contiguous()

    def _per_layer_inputs(self, e: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """u `[T, L, P]`: each layer's per-layer input of each token, from e and its per-layer table rows."""
        c = self.config
        rows, p = e.shape[0], c.per_layer_size
        table = table.view(rows, c.num_layers, p)
        projected = kernels.linear_act(e, self.per_layer_proj) * self.per_layer_proj_scale
        projected = self._norm(projected.view(rows * c.num_layers, p), self.per_layer_norm)
        return (projected.view(rows, c.num_layers, p) + table) * self.per_layer_input_scale

    def _router(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """tanh of the modality router over RMSNorm(x) / H: `[T, N]` in x's dtype."""
        routed = kernels.linear_act(self._norm(x, layer.router_norm) * (self.config.hidden_size ** -1.0),
                                    layer.router_w)
        return torch.tanh(routed.float()).to(x.dtype)

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for the rows in `batch.logits_index`."""
        c = self.config
        ids = batch.input_ids
        rows, n = ids.shape[0], c.altup_inputs
        e, table = self._embeddings(ids)
        per_layer = self._per_layer_inputs(e, table)
        streams = [e]
        if n > 1:
            target = torch.mean(e ** 2, dim=-1, keepdim=True) ** 0.5
            projected = kernels.linear_act(e, self.altup_in).view(rows, n - 1, c.hidden_size)
            streams += [self._rescaled(projected[:, j], target) for j in range(n - 1)]
        s = torch.stack(streams)  # [N, T, H]
        cos_sin = self.rope_cos_sin[batch.positions]
        local = self.local_cos_sin[batch.positions]
        for i, layer in enumerate(self.layers):
            s = self._layer(s, per_layer[:, i], layer, batch, cache, local if layer.window else cos_sin)
        if not batch.logits_every_row:
            s = s[:, batch.logits_index]
        first = s[0]
        if n > 1:
            target = torch.mean(first ** 2, dim=-1, keepdim=True) ** 0.5
            unembedded = torch.matmul(s[1:], self.altup_out_t)  # [N - 1, S, H]
            s = torch.stack([first] + [self._rescaled(unembedded[j], target) for j in range(n - 1)])
        return self._norm(torch.mean(s, dim=0), self.final_norm)

    def _layer(self, s: torch.Tensor, per_layer: torch.Tensor, layer: _Layer, batch: DecoderBatch,
               cache: PagedKVCache, cos_sin: torch.Tensor) -> torch.Tensor:
        """One decoder layer over the streams s `[N, T, H]` (see the module's docstring): the new streams."""
        a, n = self.config.altup_active, self.config.altup_inputs
        rows = s.shape[1]
        # AltUp's prediction: P_j = S_j + sum_k C[j, k] S_k, C per token
        coefs = kernels.linear_act(self._router(s[a], layer), layer.predict_w).view(rows, n, n)
        predicted = s + torch.einsum("tjk,kth->jth", coefs, s)
        x = predicted[a]
        normed = self._norm(x, layer.attn_norm)
        laurel = normed + self._norm(kernels.linear_act(kernels.linear_act(normed, layer.laurel_left),
                                                        layer.laurel_right), layer.laurel_norm)
        attn = self._norm(self._attend(normed, layer, batch, cache, cos_sin), layer.attn_post_norm)
        y = (x + attn + laurel) / math.sqrt(2)
        z = y + self._norm(self._mlp(y, layer), layer.mlp_post_norm)
        # AltUp's correction: S'_j = P_j + (z - P_a) (1 + W_c router(z))_j
        weights = kernels.linear_act(self._router(z, layer), layer.correct_w) + 1.0  # [T, N]
        corrected = (z - x)[None] * weights.t()[:, :, None] + predicted
        first = corrected[a] if layer.correct_scale is None else corrected[a] * layer.correct_scale
        gated = kernels.linear_act(first, layer.gate_pl_w, activation="gelu_tanh") * per_layer
        injected = self._norm(kernels.linear_act(gated, layer.proj_pl_w), layer.pl_norm)
        corrected[1:] += injected
        return corrected

    def _attend(self, x: torch.Tensor, layer: _Layer, batch: DecoderBatch, cache: PagedKVCache,
                cos_sin: torch.Tensor) -> torch.Tensor:
        """The attention's output projection `[T, H]` over the normalised rows x: q (and k, v where the layer
        keeps its own, into its cache layer) normalised per head and rotated; keys and values those of its
        cache layer (its own or its source's); scores unscaled."""
        c = self.config
        rows, d = x.shape[0], c.head_dim
        cos, sin = cos_sin[:, 0], cos_sin[:, 1]
        keys, values = cache.keys(layer.kv_index), cache.values(layer.kv_index)
        qkv = kernels.linear_act(x, layer.qkv_w)
        if layer.writes_kv:
            v_start = (c.num_heads + c.num_kv_heads) * d
            qkv[:, v_start:] = self._norm(qkv[:, v_start:].reshape(-1, d), self.v_norm).view(rows, -1)
            q = kernels.qkv_to_cache(qkv, None, c.num_heads, c.num_kv_heads, d, cos, sin, keys, values,
                                     batch.slot_mapping, q_norm=layer.q_norm, k_norm=layer.k_norm, norm_eps=c.norm_eps)
        else:
            q = self._norm(qkv.view(-1, d), layer.q_norm).view(rows, c.num_heads, d)
            q = kernels.apply_rotary(q, cos, sin)
        ctx = batch.attention(q, keys, values, scale=1.0, window=layer.window)
        out = kernels.linear_act(ctx.reshape(rows, -1), layer.o_w)
        return out if self.tp is None else self.tp.all_reduce(out)  # (each rank's heads' partial sums, summed)

    def _mlp(self, y: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """W_down (gelu_tanh(sparse(W_gate m)) * W_up m), m = RMSNorm_ff(y): the gate's sparsity (where the layer's
        is above 0) a cutoff of mean + std * icdf(p) over each row."""
        pre = kernels.PreNorm(layer.mlp_norm, None, self.config.norm_eps)
        if layer.cutoff_std is None:
            h = kernels.linear_act(y, layer.gate_up_w, None, "gelu_tanh_mul", prenorm=pre)
        else:
            gate_up = kernels.linear_act(y, layer.gate_up_w, prenorm=pre)
            gate = gate_up[:, : gate_up.shape[1] // 2]
            if self.tp is None:
                mean = torch.mean(gate, dim=-1, keepdim=True)
                std = torch.std(gate, dim=-1, keepdim=True, unbiased=False)
            else:
                mean, std = self._row_statistics(gate)
            cutoff = mean + std * layer.cutoff_std
            gate_up[:, : gate.shape[1]] = torch.relu(gate - cutoff)
            h = kernels.gated_act(gate_up, "gelu_tanh_mul")
        down = kernels.linear_act(h, layer.down_w)
        return down if self.tp is None else self.tp.all_reduce(down)  # (each rank's columns' partial sums, summed)

    def _row_statistics(self, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and the standard deviation (not Bessel-corrected) of each row of the gate, whose columns the
        ranks share: each rank's sums of its values and of their squares in fp32, summed over the ranks in one
        all-reduce; the variance E[g^2] - E[g]^2 (clamped at 0) in fp32, both rounded to the gate's dtype once."""
        g = gate.float()
        sums = self.tp.all_reduce(torch.stack([g.sum(-1), g.pow(2).sum(-1)], dim=1))
        width = gate.shape[1] * self.tp.world
        mean = sums[:, :1] / width
        variance = (sums[:, 1:] / width - mean * mean).clamp(min=0.0)
        return mean.to(gate.dtype), variance.sqrt().to(gate.dtype)


MODEL = Gemma3nDecoder
