"""The decoder that Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, OLMo 2 and their kin share, driven by options.

A family file (llama.py, qwen3.py, gemma2.py, ...) maps its Hugging Face config onto a
`DecoderSpec` and names its tensors (`WeightNames`); this module builds the model from those
and runs it. What differs between the families is data, read here in one place:

    norm_offset      norm weight applied as (offset + w): Gemma's (1 + w), Nemotron's LayerNorm's; kept in fp32
    activation       the gated MLP's activation: silu (SwiGLU), gelu_tanh or gelu (GeGLU; gelu exact: ModernBERT
                     decoder); with
                     gated_mlp False the plain MLP's: gelu_tanh, gelu, relu2 (squared ReLU) or xielu
                     (Apertus's xIELU: learnt scalars per layer, a kernel of its own after the first linear)
    gated_mlp        False: up projection, activation, down projection, no gate (Starcoder2,
                     Nemotron, Arcee)
    mlp_bias         biases on the MLP's projections (Starcoder2; Llama's, Nemotron's where set)
    qkv_bias         biases on Q, K, V (Qwen2)
    o_bias           a bias on the attention's output projection (gpt-oss)
    sinks            per layer and query head a learnt logit in the attention's softmax, whose
                     share of the probability goes nowhere (gpt-oss's attention sinks)
    qk_norm          per-head RMSNorm on q and k before rotary (Qwen3, Gemma 3)
    sandwich_norms   norms after attention and after the MLP too, before the residual add (Gemma)
    pre_norms        False: no norm before attention and the MLP, only those after (OLMo 2, EXAONE 4)
    post_norm_layers  per layer: True a post-norm block (norms after attention and the MLP only, as pre_norms
                     False with sandwich_norms), False a pre-norm one (norms before them only): OLMo hybrid's
                     attention layers are OLMo 3's, its DeltaNet layers Llama's
    attn_norm_layers  per layer: whether a pre-norm layer has its norm before attention (ModernBERT decoder's first
                     layer has none: it reads the embeddings as the family's _embed gives them, normalised there)
    post_ln          the norms after the residual adds, BERT's post-LN (GPT-1): x = norm_a(x + attn(x)),
                     x = norm_m(x + mlp(x)), each norm's output the next residual stream (`attn_post_norm` /
                     `mlp_post_norm`, with biases where norm_bias), no norm before attention or the MLP, none at the end
    parallel_block   attention and the MLP side by side on one norm's output, both added (Cohere, Phi)
    parallel_mlp_norm  in the parallel block, the MLP on a norm of its own (GPT-NeoX's parallel residual)
    layer_norm       LayerNorm (mean subtracted) instead of RMSNorm: without a bias (Cohere), or
                     with one (norm_bias: Starcoder2, Phi)
    qk_norm_full     the q / k norms over all of a token's query / key heads at once (OLMo 2;
                     weights [H * D] / [Hkv * D], which kernels.qkv_to_cache reads as such; with a
                     partial rotary each head's share of them stored in the rotary's order, as its rows;
                     under tensor parallelism each rank's heads' rows, normalised by every rank's sums of
                     squares: kernels.qk_squares, all-reduced, read by kernels.qkv_to_cache)
    qk_norm_after_rope  the per-head q / k norms after the rotary, not before (Hunyuan)
    qk_norm_layers   per layer: whether it has the q / k norms (Llama 4's rope layers do, its NoPE ones not)
    qk_norm_bias     the per-head q / k norms are LayerNorms with biases (Persimmon), before the rotary
    attn_output_gate  the attention's output times sigmoid(gate_proj(x)) per element before the output
                     projection (AFMoE). Qwen3-Next's full-attention gate is the same operation, its G the
                     second D of each head's 2D rows of q_proj (query and gate interleaved per head)
    attn_gate_softplus  that gate's softplus(gate_proj(x)) in fp32, rounded to the activation dtype, in place of
                     its sigmoid (Laguna)
    attn_gate_per_head  that gate has one row per head (`[heads, hidden]`): each head's output times one value
                     (Dots3's, Ling's, LFM3's, Laguna's per-head g_proj), read as published, not repeated over
                     the head's columns (which would read head_dim times its weights every step)
    attn_gate_head_bias  that gate's pre-activation plus a learnt bias per head (`gate_bias` `[heads]`, Beam's),
                     repeated over the head's columns at load: the gate linear's bias
    clip_qkv         the QKV projection's outputs clamped to [-clip, clip] before the split and the rotary
                     (DBRX): the projection then runs unfused, the clamp in place on its output
    rope, local_rope rotary tables: one, or a second for sliding-window layers (Gemma 3)
    layer_windows    per layer: a sliding window in tokens, or None (full attention)
    layer_chunks     per layer: chunked attention's chunk size C, or None: a query at position p
                     sees keys (p // C) * C .. p, its own chunk up to itself (Llama 4's rope layers)
    nope_temperature  (floor_scale, attn_scale): on the NoPE layers each query times
                     log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1 at its position p, in
                     fp32 (Llama 4's attention temperature tuning)
    nope_query_power  (length, power): on the NoPE layers each query times (1 + (p + 1) / length) ** power at
                     its position p, in fp32 (Beam's scalable-softmax scale of its full-attention layers)
    query_scaling    (beta, original): on every layer each query times 1 + beta * log(1 + floor(p / original)) at
                     its position p, rounded to the activation dtype as transformers does (Mistral 4's
                     `llama_4_scaling_beta`; exactly 1 below `original`)
    rope_layers      per layer: whether it rotates q and k (SmolLM3's NoPE layers do not)
    alibi_slopes     ALiBi (BLOOM, MPT, Falcon-RW): one slope per query head, every layer's score of key
                     position k for the query at position p plus slope * (k - p) after the scaling, in fp32
                     (kernels.paged_attention's alibi_slopes); a device tensor made once at load (this rank's
                     heads' under tensor parallelism), which the decode graphs read as they are
    attn_scale       query scale (Gemma: query_pre_attn_scalar ** -0.5; else head_dim ** -0.5)
    attn_softcap     tanh soft-capping of attention scores (Gemma 2)
    final_softcap    tanh soft-capping of the logits (Gemma 2); in fp32 where final_softcap_fp32 (Beam)
    embed_scale      token embeddings times a scalar: sqrt(hidden) (Gemma), embedding_multiplier (Granite)
    residual_scale   attention and MLP outputs times a scalar before the residual add (Granite),
                     folded into the output and down projections at load
    logit_scale      logits times a scalar (Granite: 1 / logits_scaling), folded into the final norm
    head_bias        a bias on the output head (Phi)
    learned_positions  a learnt absolute position embedding added to the token embeddings
                     (GPT-BigCode's `wpe`), with no rotary (rope_layers all False); its table's
                     first `position_offset` rows unused (OPT's 2); `position_rows` of them past that
                     in the checkpoint (default max_position_embeddings, before max_model_len caps it)
    rotary_dim       a partial rotary: only that many of each head's dims rotate (Phi-4-mini, GLM)
    rotary_interleaved  dims 2i, 2i + 1 rotate together (GLM) instead of i, i + rotary_dim / 2
    moe              mixture-of-experts MLPs in the layers it names (Mixtral, Qwen MoE: moe.py)
    mla              multi-head latent attention in place of Q, K, V (DeepSeek-V2 / V3: mla.py)
    layer_mla        per layer its latent attention's own shape (mla.LayerMla: spec, heads, softmax scale), where the
                     layers' differ (Dots3); each cache layer then holds that layer's heads (kv_cache's layer_shapes)
    mlp_layers       per layer: whether an MLP follows attention or the mixer (Nemotron-H's mixer-only blocks)
    parallel_mixers  the layers' recurrent mixers run beside attention on the same normed input, both outputs
                     added (Falcon-H1), not in its place
    layer_sources    per layer the checkpoint layer whose weights it runs (`layers.{source}.`): layers naming one
                     source share its tensors, read once, each with a cache layer of its own (HRM-Text's stacks,
                     run several times over an iteration); empty: layer i runs `layers.{i}.`
    tie_word_embeddings

One `forward` is one model iteration over every scheduled sequence (Orca's shape): prompt
chunks of joining sequences and one decode token of each running sequence are packed into a
single `[tokens, hidden]` activation, so every non-attention op runs once over all of them
(selective batching); attention reads each sequence's keys from the paged cache.

A layer's linear weights (LINEAR_WEIGHTS) may be FP8 (kernels.Fp8Weight: from an FP8 checkpoint,
or quantised at load, backend/quantization.py); the linear ops take either.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.decoder.state_cache import StateCache
from tritonformer.backend.models.decoder import DecoderModel, eos_ids
from tritonformer.backend.models.moe import MoeLayer, MoeSpec, load_moe_layer
from tritonformer.backend.models.mla import LayerMla, MlaLayer, MlaSpec, load_mla_layer
from tritonformer.backend.models.rope import Rope, rotary_order
from tritonformer.backend.parallel.group import TensorParallelGroup, adds_biases
from tritonformer.kernels.fp8 import Fp8Weight, cat_rows, scaled, take_rows

# spec name -> kernels.linear_act's (swiglu_oai: gpt-oss's clamped SwiGLU, (up + 1) times the gate's)
GATED_ACTIVATIONS = {"silu": "silu_mul", "gelu_tanh": "gelu_tanh_mul", "gelu": "gelu_mul", "swiglu_oai": "swiglu_oai"}
# the same for a plain (ungated) MLP's activation; xielu (Apertus's xIELU, learnt scalars per layer) is no epilogue:
# the first linear's output as it is, then kernels.xielu with the layer's scalars (_Layer.act_params)
PLAIN_ACTIVATIONS = {"gelu_tanh": "gelu_tanh", "gelu": "gelu", "relu2": "relu2", "relu": "relu", "xielu": "none"}
# Hugging Face's `hidden_act` names of those -> the spec's
HF_PLAIN_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu", "relu2": "relu2",
                        "relu": "relu", "xielu": "xielu"}


def plain_activation(cfg: dict, family: str, supported: tuple[str, ...]) -> str:
    """The plain MLP's activation (a PLAIN_ACTIVATIONS name) for the config's `hidden_act`, one
    of the family's `supported` Hugging Face names (the first where the config has none); any
    other is a load error that names them."""
    act = cfg.get("hidden_act", supported[0])
    if act not in supported:
        raise ValueError(f"unsupported {family} hidden_act {act!r} (supported: {', '.join(supported)})")
    return HF_PLAIN_ACTIVATIONS[act]


@dataclass(frozen=True)
class WeightNames:
    """Where a family keeps each tensor, relative to `layers.{i}.` (the model prefix stripped).
    `qkv` / `gate_up` name fused projections; otherwise q, k, v / gate, up are concatenated at
    load. `mlp_norm` is the norm before the MLP; `attn_post_norm` / `mlp_post_norm` the
    sandwich norms after attention and the MLP (None where the family has none)."""

    q: str = "self_attn.q_proj"
    k: str = "self_attn.k_proj"
    v: str = "self_attn.v_proj"
    qkv: str | None = None
    # the fused qkv's rows per KV group: the group's query heads, its key head, its value head, then the
    # next group's (Falcon-40B's; with as many KV heads as query heads, per head: GPT-NeoX's, Falcon-7B-style)
    qkv_grouped: bool = False
    o: str = "self_attn.o_proj"
    gate: str = "mlp.gate_proj"
    up: str = "mlp.up_proj"
    gate_up: str | None = None
    down: str = "mlp.down_proj"
    act: str = "mlp.act_fn"  # (a learnt activation's parameters: xIELU's alpha_p, alpha_n, beta, eps)
    attn_norm: str = "input_layernorm"
    mlp_norm: str = "post_attention_layernorm"
    attn_post_norm: str | None = None
    mlp_post_norm: str | None = None
    q_norm: str = "self_attn.q_norm"
    k_norm: str = "self_attn.k_norm"
    attn_gate: str = "self_attn.gate_proj"  # (attn_output_gate)
    attn_gate_bias: str = "self_attn.gate_bias"  # (attn_gate_head_bias: one per head)
    sinks: str = "self_attn.sinks"
    embed: str = "embed_tokens.weight"
    positions: str = "wpe.weight"  # (learned_positions)
    final_norm: str = "norm.weight"
    lm_head: str = "lm_head.weight"


@dataclass(frozen=True)
class DecoderSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    rope: Rope
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    activation: str = "silu"
    gated_mlp: bool = True
    mlp_bias: bool = False
    norm_offset: float = 0.0
    qkv_bias: bool = False
    o_bias: bool = False
    sinks: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    pre_norms: bool = True
    post_norm_layers: tuple[bool, ...] = ()  # empty: every layer's norms as pre_norms / sandwich_norms say
    attn_norm_layers: tuple[bool, ...] = ()  # empty: every pre-norm layer has its norm before attention
    post_ln: bool = False  # norms after the residual adds, in place of pre_norms / sandwich_norms, no final norm
    parallel_block: bool = False
    parallel_mlp_norm: bool = False
    layer_norm: bool = False
    norm_bias: bool = False
    qk_norm_full: bool = False
    qk_norm_after_rope: bool = False
    qk_norm_layers: tuple[bool, ...] = ()  # empty: every layer has them (with qk_norm)
    qk_norm_bias: bool = False
    attn_output_gate: bool = False
    attn_gate_softplus: bool = False  # the output gate is softplus(x_n @ G^T), not its sigmoid (Laguna)
    attn_gate_per_head: bool = False  # the output gate has one row per head, not one per element
    attn_gate_head_bias: bool = False  # the output gate's pre-activation has a bias per head (Beam)
    clip_qkv: float | None = None  # the QKV projection's outputs clamped to [-clip_qkv, clip_qkv] (DBRX)
    local_rope: Rope | None = None  # sliding-window layers' rope, when it differs (Gemma 3)
    layer_windows: tuple[int | None, ...] = ()  # empty: every layer attends to all keys
    layer_chunks: tuple[int | None, ...] = ()  # empty: no layer's attention is chunked
    nope_temperature: tuple[float, float] | None = None
    nope_query_power: tuple[float, float] | None = None  # (length, power): see the module's docstring
    alibi_slopes: tuple[float, ...] | None = None  # one per query head (ALiBi), None: no linear biases
    query_scaling: tuple[float, int] | None = None  # (beta, original): see the module's docstring
    rope_layers: tuple[bool, ...] = ()  # empty: every layer rotates q and k
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    final_softcap_fp32: bool = False  # the cap in fp32 from the projection's output (models/decoder.py's logits)
    embed_scale: float | None = None
    rotary_dim: int | None = None  # None: every head dim rotates
    rotary_interleaved: bool = False
    residual_scale: float | None = None
    logit_scale: float | None = None
    head_bias: bool = False
    learned_positions: bool = False
    position_offset: int = 0
    position_rows: int | None = None
    final_norm_eps: float | None = None  # the final norm's eps where it is not norm_eps (JetMoE; CTRL's LayerNorm)
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    layer_mla: tuple[LayerMla, ...] = ()  # empty: every layer's latent attention is `mla` over num_heads
    # Hybrid models: layer i's recurrent token mixer in place of attention, named by its kind (a
    # linear attention, a Mamba layer, a short convolution; None: the layer attends). The family's
    # `load_mixer` builds it (mixers.py has the contract); empty: every layer attends.
    mixers: tuple[str | None, ...] = ()
    # Per layer whether an MLP follows its attention or mixer (False: the block ends there, Nemotron-H's
    # mixer-only layers; sequential block only); empty: every layer has one.
    mlp_layers: tuple[bool, ...] = ()
    # The mixers run beside attention, not in its place: both on the layer's normalised input, their outputs added
    # (Falcon-H1's parallel hybrid; sequential block only)
    parallel_mixers: bool = False
    # Per layer the checkpoint layer whose weights it runs (see the module's docstring); empty: its own
    layer_sources: tuple[int, ...] = ()
    names: WeightNames = field(default_factory=WeightNames)

    def __post_init__(self):
        activations = GATED_ACTIVATIONS if self.gated_mlp else PLAIN_ACTIVATIONS
        if self.activation not in activations:
            raise ValueError(f"unsupported {'gated' if self.gated_mlp else 'plain'} MLP activation {self.activation!r} "
                             f"(supported: {sorted(activations)})")
        if self.moe and (self.moe.gated != self.gated_mlp or self.activation == "xielu"):
            raise ValueError("mixture-of-experts layers' experts are gated as the dense MLP is (MoeSpec.gated), "
                             "plain ones without xIELU")
        if self.learned_positions and not (self.layer_norm and not self.parallel_block):
            raise ValueError("learnt position embeddings are supported with LayerNorms before attention and the MLP")
        if self.learned_positions and self.position_rows is None:  # the checkpoint's table, whatever caps the length
            object.__setattr__(self, "position_rows", self.max_position_embeddings)
        if self.parallel_mlp_norm and not self.parallel_block:
            raise ValueError("parallel_mlp_norm is the parallel block's (parallel_block)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} attention heads are not a multiple of {self.num_kv_heads} KV heads")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(f"{len(self.layer_windows)} layer windows for {self.num_layers} layers")
        if self.rope_layers and len(self.rope_layers) != self.num_layers:
            raise ValueError(f"{len(self.rope_layers)} rope layers for {self.num_layers} layers")
        if self.qk_norm_layers and (len(self.qk_norm_layers) != self.num_layers or not self.qk_norm):
            raise ValueError(f"{len(self.qk_norm_layers)} q/k norm layer flags for {self.num_layers} layers (qk_norm)")
        if self.layer_chunks and len(self.layer_chunks) != self.num_layers:
            raise ValueError(f"{len(self.layer_chunks)} layer chunk sizes for {self.num_layers} layers")
        if any(chunk and self.window(i) for i, chunk in enumerate(self.layer_chunks)):
            raise ValueError("a layer's attention is chunked or has a sliding window, not both")
        if self.mla and (self.head_dim != self.mla.qk_head_dim or self.num_kv_heads != self.num_heads
                         or self.qk_norm or self.qkv_bias or self.parallel_block):
            raise ValueError("latent attention (mla) caches qk_head_dim-wide heads, one KV head per query head, "
                             "without q/k norms, QKV biases or the parallel block")
        if self.layer_mla and (len(self.layer_mla) != self.num_layers or not self.mla or self.mixers):
            raise ValueError(f"{len(self.layer_mla)} latent attention shapes for {self.num_layers} layers (layer_mla: "
                             f"one per layer, beside `mla`, without recurrent mixers)")
        if self.mixers and (len(self.mixers) != self.num_layers or self.parallel_block
                            or (self.mla and self.parallel_mixers)):
            raise ValueError(f"{len(self.mixers)} mixer kinds for {self.num_layers} layers (recurrent mixers are "
                             f"supported in the sequential block, in place of latent attention but not beside it)")
        if self.layer_sources and (len(self.layer_sources) != self.num_layers or self.mixers or self.layer_mla):
            raise ValueError(f"{len(self.layer_sources)} layer sources for {self.num_layers} layers (layers that "
                             f"share weights are supported without recurrent mixers or per-layer latent attention)")
        if self.parallel_mixers and not self.mixers:
            raise ValueError("parallel_mixers runs the layers' mixers beside attention: name them in `mixers`")
        if self.mlp_layers and (len(self.mlp_layers) != self.num_layers or self.parallel_block):
            raise ValueError(f"{len(self.mlp_layers)} MLP layer flags for {self.num_layers} layers (layers without "
                             f"an MLP are supported in the sequential block)")
        if self.moe and len(self.moe.layers) != self.num_layers:
            raise ValueError(f"{len(self.moe.layers)} MoE layer flags for {self.num_layers} layers")
        if self.post_norm_layers and (len(self.post_norm_layers) != self.num_layers or self.parallel_block
                                      or self.layer_norm or not self.pre_norms or self.sandwich_norms):
            raise ValueError(f"{len(self.post_norm_layers)} post-norm layer flags for {self.num_layers} layers "
                             f"(supported in the sequential block of RMSNorms, in place of pre_norms / sandwich_norms)")
        if self.attn_norm_layers and (len(self.attn_norm_layers) != self.num_layers or self.parallel_block
                                      or not self.pre_norms or self.sandwich_norms or self.post_norm_layers):
            raise ValueError(f"{len(self.attn_norm_layers)} attention norm layer flags for {self.num_layers} layers "
                             f"(supported in the sequential pre-norm block)")
        if not self.pre_norms and not self.sandwich_norms:
            raise ValueError("a block without norms before attention and the MLP needs the norms after them")
        if self.post_ln and (self.parallel_block or self.sandwich_norms or not self.pre_norms or self.post_norm_layers
                             or self.attn_norm_layers or self.mixers or self.mlp_layers or self.logit_scale is not None
                             or self.final_norm_eps is not None):
            raise ValueError("post_ln norms (after the residual adds) are supported in the sequential block of "
                             "attending layers, in place of pre_norms / sandwich_norms, with no final norm to scale")
        if self.layer_norm and not ((not self.qk_norm or self.qk_norm_bias) and not self.sandwich_norms
                                    and self.pre_norms and not (self.parallel_block and self.norm_offset)):
            raise ValueError("LayerNorms are supported before attention and the MLP (with biases: Starcoder2) and in "
                             "the parallel block (with a bias or without), as w not (1 + w), without sandwich norms "
                             "or q/k norms but LayerNorms with biases (Persimmon's)")
        if self.norm_bias and not self.layer_norm:
            raise ValueError("norm biases need LayerNorms (layer_norm)")
        if self.qk_norm_full and not self.qk_norm:
            raise ValueError("whole-width q/k norms need qk_norm")
        if self.qk_norm_after_rope and (not self.qk_norm or self.qk_norm_full):
            raise ValueError("q/k norms after the rotary need per-head qk_norm")
        if self.clip_qkv is not None and (self.qk_norm or self.mla):
            raise ValueError("a clamped QKV projection (clip_qkv) is supported without q/k norms or latent attention")
        if self.alibi_slopes is not None and (len(self.alibi_slopes) != self.num_heads or self.mla):
            raise ValueError(f"{len(self.alibi_slopes)} ALiBi slopes for {self.num_heads} heads (one per query head; "
                             f"supported without latent attention)")
        if (self.attn_gate_softplus or self.attn_gate_per_head) and not self.attn_output_gate:
            raise ValueError("attn_gate_softplus and attn_gate_per_head are the output gate's (attn_output_gate)")
        if self.attn_gate_head_bias and (not self.attn_output_gate or self.mla):
            raise ValueError("attn_gate_head_bias is the output gate's (attn_output_gate), without latent attention")
        if self.qk_norm_bias and (not self.qk_norm or self.qk_norm_full or self.qk_norm_after_rope):
            raise ValueError("q/k LayerNorms with biases are per-head norms (qk_norm) before the rotary")

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def chunk(self, layer: int) -> int | None:
        return self.layer_chunks[layer] if self.layer_chunks else None

    def mixer(self, layer: int) -> str | None:
        return self.mixers[layer] if self.mixers else None

    @property
    def attends(self) -> bool:
        """Whether any layer attends (attention-free models, Mamba's, have placeholder heads that do not split)."""
        return not self.mixers or self.parallel_mixers or None in self.mixers

    def split_mixers(self, tp) -> None:
        """Raise where the recurrent mixers cannot split over `tp`'s ranks (a family whose mixers split
        overrides this with their heads' checks)."""
        kinds = ", ".join(sorted({kind for kind in self.mixers if kind}))
        raise ValueError(f"tensor parallelism is not supported for the recurrent layers ({kinds}) of this family "
                         f"(supported: gated DeltaNet, KDA, Mamba-1, Mamba-2 and short-convolution layers)")

    def has_mlp(self, layer: int) -> bool:
        return self.mlp_layers[layer] if self.mlp_layers else True

    def layer_pre_norms(self, layer: int) -> bool:
        """Whether layer `layer` has norms before attention and the MLP (post_norm_layers, else pre_norms; none
        with post_ln)."""
        if self.post_ln:
            return False
        return not self.post_norm_layers[layer] if self.post_norm_layers else self.pre_norms

    def layer_attn_norm(self, layer: int) -> bool:
        """Whether it has a norm before attention (layer_pre_norms, and attn_norm_layers where given)."""
        return self.layer_pre_norms(layer) and (not self.attn_norm_layers or self.attn_norm_layers[layer])

    def layer_post_norms(self, layer: int) -> bool:
        """Whether it has norms after them (post_norm_layers, else sandwich_norms; post_ln's after the adds)."""
        if self.post_ln:
            return True
        return self.post_norm_layers[layer] if self.post_norm_layers else self.sandwich_norms


def rope_parameters(cfg: dict) -> dict | None:
    """The rope dict of a config written by transformers < 5 (`rope_scaling`, `rope_theta`) or
    >= 5 (`rope_parameters`); where both are there, `rope_scaling` wins, as transformers reads it."""
    return cfg.get("rope_scaling") or cfg.get("rope_parameters")


def rotary_dims(cfg: dict, head_dim: int) -> int | None:
    """The rotating dims of each head where the config rotates only a part of them
    (`partial_rotary_factor`, as Hugging Face rounds it), else None."""
    params = rope_parameters(cfg) or {}
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial == 1.0:
        return None
    dims = int(head_dim * partial)
    rotary_order(head_dim, dims)  # (an odd or empty share is an error that says so)
    return dims


@dataclass
class _Layer:
    attn_norm: torch.Tensor | None  # None in a post-norm block (and mlp_norm)
    qkv_w: torch.Tensor | Fp8Weight | None  # None with latent attention (mla)
    qkv_b: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o_w: torch.Tensor | Fp8Weight
    o_b: torch.Tensor | None
    sinks: torch.Tensor | None  # [heads] fp32: this rank's query heads' sink logits
    attn_post_norm: torch.Tensor | None
    mlp_norm: torch.Tensor | None
    gate_up_w: torch.Tensor | Fp8Weight | None  # None in a MoE layer
    down_w: torch.Tensor | Fp8Weight | None
    mlp_post_norm: torch.Tensor | None
    window: int | None
    local: bool  # sliding-window layer using the local rope table
    rotary: bool = True  # False: q and k are not rotated (a NoPE layer)
    moe: MoeLayer | None = None  # the layer's mixture-of-experts MLP, in place of gate_up_w / down_w
    mla: MlaLayer | None = None  # the layer's latent attention projections, in place of qkv_w (qkv_w None)
    attn_norm_b: torch.Tensor | None = None  # LayerNorm biases (norm_bias)
    mlp_norm_b: torch.Tensor | None = None
    attn_post_norm_b: torch.Tensor | None = None  # (post_ln's LayerNorms with biases)
    mlp_post_norm_b: torch.Tensor | None = None
    gate_up_b: torch.Tensor | None = None  # MLP biases (mlp_bias; down_b on one rank only)
    down_b: torch.Tensor | None = None
    q_norm_b: torch.Tensor | None = None  # the q / k LayerNorms' biases (qk_norm_bias)
    k_norm_b: torch.Tensor | None = None
    attn_gate_w: torch.Tensor | None = None  # [heads * head_dim, hidden]: this rank's heads' rows (attn_output_gate)
    attn_gate_b: torch.Tensor | None = None  # [heads * head_dim]: its bias, each head's repeated (attn_gate_head_bias)
    chunk: int | None = None  # chunked attention's chunk size (layer_chunks)
    attn_scale: float | None = None  # the layer's own softmax scale (layer_mla), None: the spec's attn_scale
    act_params: torch.Tensor | None = None  # [4] fp32: xIELU's alpha_p, alpha_n, beta, eps as applied (every rank's)
    mixer: Any = None  # a recurrent token mixer in place of attention (hybrid models: mixers.py)
    kv_index: int = 0  # an attending layer's place in the KV cache (which holds attending layers only)
    state_index: int = 0  # a mixer layer's place in the recurrent state (decoder/state_cache.py)
    has_mlp: bool = True  # False: no MLP after attention or the mixer (DecoderSpec.mlp_layers)


class TransformerDecoder(DecoderModel):
    # Each layer's linear weights: what quantization fp8 turns into FP8 (backend/quantization.py),
    # but the first and last layers', which stay 16-bit (measured there: perplexity). Any of them
    # may be a kernels.Fp8Weight (an FP8 checkpoint, or quantised after the build).
    LINEAR_WEIGHTS = ("qkv_w", "o_w", "gate_up_w", "down_w")
    FP8_KEEP_EDGE_LAYERS = True

    def __init__(self, config: DecoderSpec, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 tp: TensorParallelGroup | None = None):
        """With `tp`, this rank's share of the model (Megatron-LM's split): its query and KV heads
        of the QKV projection and the matching columns of the output projection, its columns of
        gate/up and rows of down, its rows of the (padded) vocabulary embedding and head (one
        tensor where they are tied); the norms whole. `config` then describes the share (heads,
        KV heads and intermediate size divided), which is what the forward, the KV cache and the
        decode graphs read."""
        super().__init__(config, state, device, dtype)
        c, n = config, config.names
        hidden, head = c.hidden_size, c.head_dim
        q_rows, kv_rows = c.num_heads * head, c.num_kv_heads * head
        self.tp = tp
        # This rank's rows of the Q, K / V and gate / up projections (None: all of them).
        q_part = kv_part = mlp_part = expert_part = shared_part = heads_part = None
        first_rank = adds_biases(tp)
        if tp is not None:
            if c.attends:
                heads_part, kv_heads = tp.part(c.num_heads, "attention heads"), tp.part(c.num_kv_heads, "KV heads")
                q_part = slice(heads_part.start * head, heads_part.stop * head)
                kv_part = slice(kv_heads.start * head, kv_heads.stop * head)
            mlp_part = tp.part(c.intermediate_size, "MLP columns (intermediate_size)")
            if c.moe:
                expert_part = tp.part(c.moe.intermediate_size, "expert columns (moe_intermediate_size)")
                shared_part = tp.part(c.moe.shared_intermediate_size, "shared expert columns")

        experts = f", {c.moe.num_experts} experts of {c.moe.intermediate_size}" if c.moe else ""

        sizes = (f"hidden {hidden}, heads {c.num_heads}/{c.num_kv_heads} x {head}, intermediate "
                 f"{c.intermediate_size}{experts}, vocab {c.vocab_size}")

        def checked(name: str, shape: tuple[int, ...]) -> str:
            return self.checked(state, name, shape, sizes)

        def read(name: str, shape: tuple[int, ...], index: tuple | None = None) -> torch.Tensor:
            """The tensor `name` (its shape checked), or its `index` part only (read from the
            checkpoint as such), on the device in the model's dtype."""
            if index is None:
                return self.weight(checked(name, shape))
            return state[checked(name, shape)][index].to(device=device, dtype=dtype).contiguous()

        def w(name: str, *shape: int, rows: slice | list[slice] | None = None,
              cols: slice | None = None) -> torch.Tensor:
            """The tensor, or its `rows` (a range, or ranges whose rows are stacked) / `cols` only."""
            if isinstance(rows, list):
                return torch.cat([w(name, *shape, rows=part, cols=cols) for part in rows])
            if rows is None and cols is None:
                return read(name, shape)
            return read(name, shape, (rows or slice(None),) if cols is None else (rows or slice(None), cols))

        def fused(name: str, parts: list[tuple[int, slice | None]], *shape: int) -> torch.Tensor:
            """A fused projection `name` of stacked parts (each: its row count, this rank's rows of
            it or None for all): this rank's rows of every part, stacked."""
            if all(rows is None for _, rows in parts):
                return w(name, *shape)
            taken, start = [], 0
            for size, rows in parts:
                taken.append(w(name, *shape, rows=slice(start + rows.start, start + rows.stop)))
                start += size
            return cat_rows(taken)  # (FP8 parts: values and scales)

        def norm_bias(name: str) -> torch.Tensor | None:
            """The bias beside a LayerNorm's weight `name` (norm_bias), else None."""
            return w(name.removesuffix(".weight") + ".bias", hidden) if c.norm_bias else None

        def norm(name: str, size: int = hidden, rows: slice | None = None) -> torch.Tensor:
            """A norm's weight (`rows` of it: a whole-width q / k norm's, this rank's heads')."""
            if not c.norm_offset:
                return w(name, size, rows=rows)
            # (offset + w) once, in fp32, never rounded to the activation dtype: what the family's
            # norm multiplies by (kernels accept an fp32 norm weight beside fp16/bf16 activations).
            weight = state[checked(name, (size,))][rows if rows is not None else slice(None)]
            return weight.to(device=device, dtype=torch.float32) + c.norm_offset

        tied = c.tie_word_embeddings or n.lm_head not in state
        head_b = n.lm_head.removesuffix(".weight") + ".bias" if c.head_bias else None
        if tp is None:
            self.embed = w(n.embed, c.vocab_size, hidden)
            self.set_output_head(self.embed if tied else w(n.lm_head, c.vocab_size, hidden),
                                 w(head_b, c.vocab_size) if head_b else None)
        else:  # vocabulary-parallel: this rank's rows of the embedding and of the head (and its bias)
            self.vocab_size = c.vocab_size
            table = (c.vocab_size, hidden)
            self.embed = self._vocab_rows(state[checked(n.embed, table)])
            self.output_head = self.embed if tied else self._vocab_rows(state[checked(n.lm_head, table)])
            if head_b:
                self.output_head_b = self._vocab_rows(state[checked(head_b, (c.vocab_size,))])
        self.position_embed = None  # (learned_positions: the rows of positions 0, 1, ...)
        self.alibi_slopes = None  # (alibi_slopes: this rank's heads' slopes, fp32 on the device)
        alibi_part = None
        if c.alibi_slopes is not None:
            alibi_part = c.alibi_slopes[heads_part.start:heads_part.stop] if heads_part else c.alibi_slopes
            self.alibi_slopes = torch.tensor(alibi_part, dtype=torch.float32, device=device)
        if c.learned_positions:
            table = w(n.positions, c.position_offset + c.position_rows, hidden,
                      rows=slice(0, c.position_offset + c.max_position_embeddings))
            self.position_embed = table[c.position_offset:]
        # (post_ln: the last layer's norm closes the stack, no final norm)
        self.final_norm = norm(n.final_norm) if not c.post_ln else None
        self.final_norm_b = norm_bias(n.final_norm) if not c.post_ln else None
        # (LayerNorm without a bias: the kernels' LayerNorm with a zero one)
        self.zero_bias = torch.zeros(hidden, device=device, dtype=dtype) if c.layer_norm and not c.norm_bias else None
        if c.logit_scale is not None:  # logits = head(norm(x) * w * s): the scale rides on the norm's weight
            self.final_norm = (self.final_norm.float() * c.logit_scale).to(self.final_norm.dtype)
            if self.final_norm_b is not None:  # (and its bias)
                self.final_norm_b = (self.final_norm_b.float() * c.logit_scale).to(self.final_norm_b.dtype)
        # Rotary tables for every position, looked up per token: no per-iteration trigonometry,
        # and a lookup is all a captured CUDA graph needs to replay.
        self.rope_cos_sin = c.rope.cos_sin(c.max_position_embeddings, head, device, c.rotary_dim)
        self.local_cos_sin = (c.local_rope.cos_sin(c.max_position_embeddings, head, device, c.rotary_dim)
                              if c.local_rope else None)
        # A partial or interleaved rotary: every layer's Q and K rows (and q/k norms) in the
        # kernels' order (rope.rotary_order), the same indices for each layer.
        order = rows_in_order = None
        if not c.mla and (c.rotary_interleaved or (c.rotary_dim or head) < head):  # (MLA orders its rows itself)
            world = tp.world if tp is not None else 1
            order = rotary_order(head, c.rotary_dim or head, c.rotary_interleaved)
            rows_in_order = qkv_rows_in_rotary_order(order, head, c.num_heads // world, c.num_kv_heads // world)
            order, rows_in_order = order.to(device), rows_in_order.to(device)
        # A QKV stored per KV group (qkv_grouped): this rank's groups' rows, and their order as [q; k; v].
        group_order = head_rows = None
        if n.qkv_grouped:
            groups, per_group = c.num_kv_heads // (tp.world if tp is not None else 1), c.num_heads // c.num_kv_heads
            rows = torch.arange(groups * (per_group + 2) * head).view(groups, per_group + 2, head)
            group_order = torch.cat([rows[:, :per_group].reshape(-1), rows[:, per_group].reshape(-1),
                                     rows[:, per_group + 1].reshape(-1)])
            group_rows = (per_group + 2) * head
            head_rows = slice(kv_heads.start * group_rows, kv_heads.stop * group_rows) if tp is not None else None
        # The output projection's columns: the query heads' (MLA's: v_head_dim per head), this rank's.
        o_cols, o_part = q_rows, q_part
        if c.mla:
            v = c.mla.v_head_dim
            o_cols, o_part = c.num_heads * v, heads_part and slice(heads_part.start * v, heads_part.stop * v)
        own_mlp_norm = not c.parallel_block or c.parallel_mlp_norm  # (one norm before both in Cohere's and Phi's)
        self.layers: list[_Layer] = []

        def attention(i: int, p: str) -> dict:
            """Layer i's attention weights, as _Layer's fields."""
            qkv_parts = [(q_rows, q_part), (kv_rows, kv_part), (kv_rows, kv_part)]
            own, cols, cols_part, gate_rows, gate_part = None, o_cols, o_part, q_rows, q_part
            if c.attn_gate_per_head:  # (one row per head: the ranks' heads split it)
                gate_rows, gate_part = c.num_heads, heads_part
            if c.layer_mla:  # (a latent attention of its own shape: its heads, o_proj's columns, the gate's rows)
                own = c.layer_mla[i]
                part = tp.part(own.heads, f"layer {i}'s attention heads") if tp is not None else None
                mla = load_mla_layer(own.spec, read, p, hidden, own.heads, part)
                v, d = own.spec.v_head_dim, own.spec.qk_head_dim
                cols, cols_part = own.heads * v, part and slice(part.start * v, part.stop * v)
                gate_rows, gate_part = own.heads * d, part and slice(part.start * d, part.stop * d)
                if c.attn_gate_per_head:
                    gate_rows, gate_part = own.heads, part
                self.kv_shapes.append((mla.heads, d))
            else:
                mla = self.load_mla(p, read, heads_part) if c.mla else None
            if mla is not None:  # (its own projections in place of Q, K, V: mla.py)
                qkv_w = None
            elif group_order is not None:
                qkv_w = take_rows(w(p + n.qkv + ".weight", q_rows + 2 * kv_rows, hidden, rows=head_rows), group_order)
            elif n.qkv:
                qkv_w = fused(p + n.qkv + ".weight", qkv_parts, q_rows + 2 * kv_rows, hidden)
            else:
                qkv_w = cat_rows([w(p + n.q + ".weight", q_rows, hidden, rows=q_part),
                                  w(p + n.k + ".weight", kv_rows, hidden, rows=kv_part),
                                  w(p + n.v + ".weight", kv_rows, hidden, rows=kv_part)])
            qkv_b = None
            if c.qkv_bias and group_order is not None:
                qkv_b = w(p + n.qkv + ".bias", q_rows + 2 * kv_rows, rows=head_rows)[group_order.to(device)]
            elif c.qkv_bias:
                qkv_b = (fused(p + n.qkv + ".bias", qkv_parts, q_rows + 2 * kv_rows) if n.qkv else
                         torch.cat([w(p + n.q + ".bias", q_rows, rows=q_part), w(p + n.k + ".bias", kv_rows, rows=kv_part),
                                    w(p + n.v + ".bias", kv_rows, rows=kv_part)]))
            qk_norm = c.qk_norm and (not c.qk_norm_layers or c.qk_norm_layers[i])
            # (whole-width norms: this rank's heads' rows of them)
            q_norm = (norm(p + n.q_norm + ".weight", *((q_rows, q_part) if c.qk_norm_full else (head,)))
                      if qk_norm else None)
            k_norm = (norm(p + n.k_norm + ".weight", *((kv_rows, kv_part) if c.qk_norm_full else (head,)))
                      if qk_norm else None)
            q_norm_b = w(p + n.q_norm + ".bias", head) if c.qk_norm_bias else None
            k_norm_b = w(p + n.k_norm + ".bias", head) if c.qk_norm_bias else None
            if order is not None:
                qkv_w = take_rows(qkv_w, rows_in_order)
                qkv_b = qkv_b[rows_in_order] if qkv_b is not None else None
                # (each head's dims of a per-head `[D]` or a whole-width `[H * D]` norm weight, as its rows; a
                # LayerNorm's bias likewise: its mean and variance do not depend on the dims' order)
                q_norm, k_norm, q_norm_b, k_norm_b = (t.view(-1, head)[:, order].reshape(-1) if t is not None else None
                                                      for t in (q_norm, k_norm, q_norm_b, k_norm_b))
            return dict(qkv_w=qkv_w, qkv_b=qkv_b, q_norm=q_norm, k_norm=k_norm, q_norm_b=q_norm_b, k_norm_b=k_norm_b,
                        o_w=scaled(w(p + n.o + ".weight", hidden, cols, cols=cols_part), c.residual_scale),
                        # (the output projection's bias: one rank adds it, the all-reduce sums the ranks')
                        o_b=scaled(w(p + n.o + ".bias", hidden), c.residual_scale) if c.o_bias and first_rank else None,
                        sinks=w(p + n.sinks, c.num_heads, rows=heads_part).float() if c.sinks else None, mla=mla,
                        # (the output gate's rows are split by heads as Q's are)
                        attn_gate_w=(w(p + n.attn_gate + ".weight", gate_rows, hidden, rows=gate_part)
                                     if c.attn_output_gate else None), attn_scale=own.scale if own else None,
                        attn_gate_b=(w(p + n.attn_gate_bias, c.num_heads, rows=heads_part)
                                     .repeat_interleave(1 if c.attn_gate_per_head else head)
                                     if c.attn_gate_head_bias else None))

        no_attention = dict(qkv_w=None, qkv_b=None, q_norm=None, k_norm=None, o_w=None, o_b=None, sinks=None)
        self.kv_shapes: list[tuple[int, int]] = []  # (layer_mla: each cache layer's (heads, head dim), this rank's)
        kv_layers = state_layers = 0
        self.state_layouts: list[dict[str, tuple[int, ...]]] = []  # each mixer layer's state (mixers.py)
        loaded: dict[int, _Layer] = {}  # (layer_sources: each source's layer, as first read)
        for i in range(c.num_layers):
            source = c.layer_sources[i] if c.layer_sources else i
            if source in loaded:  # its weights read already: the same tensors, a cache layer of its own
                self.layers.append(replace(loaded[source], kv_index=kv_layers))
                kv_layers += 1
                continue
            p = f"layers.{source}."
            attn = no_attention
            if c.mixer(i) is None or c.parallel_mixers:
                attn = attention(i, p) | dict(kv_index=kv_layers)
                kv_layers += 1
            if c.mixer(i) is not None:  # a recurrent mixer in place of attention or beside it (its projections its own)
                mixer = self.load_mixer(i, p, w, read)
                attn = attn | dict(mixer=mixer, state_index=state_layers)
                self.state_layouts.append(mixer.state_shapes)
                state_layers += 1
            inter = c.intermediate_size
            moe = gate_up_w = down_w = gate_up_b = down_b = act_params = None
            if not c.has_mlp(i):  # (the block ends after attention or its mixer: no MLP weights)
                pass
            elif c.moe and c.moe.layers[i]:
                moe = load_moe_layer(c.moe, state, read, p, hidden, expert_part, shared_part, first_rank=first_rank)
                moe.scale_output(c.residual_scale)
            elif not c.gated_mlp:  # (its one projection in gate_up_w: the fused MLP's first linear)
                gate_up_w = w(p + n.up + ".weight", inter, hidden, rows=mlp_part)
                gate_up_b = w(p + n.up + ".bias", inter, rows=mlp_part) if c.mlp_bias else None
                if c.activation == "xielu":
                    act_params = xielu_params(state, p + n.act + ".", device)
            elif n.gate_up:
                gate_up_w = fused(p + n.gate_up + ".weight", [(inter, mlp_part), (inter, mlp_part)], 2 * inter, hidden)
                if c.mlp_bias:
                    gate_up_b = fused(p + n.gate_up + ".bias", [(inter, mlp_part), (inter, mlp_part)], 2 * inter)
            else:
                gate_up_w = cat_rows([w(p + n.gate + ".weight", inter, hidden, rows=mlp_part),
                                      w(p + n.up + ".weight", inter, hidden, rows=mlp_part)])
                if c.mlp_bias:
                    gate_up_b = torch.cat([w(p + n.gate + ".bias", inter, rows=mlp_part),
                                           w(p + n.up + ".bias", inter, rows=mlp_part)])
            if moe is None and c.has_mlp(i):
                down_w = scaled(w(p + n.down + ".weight", hidden, inter, cols=mlp_part), c.residual_scale)
                if c.mlp_bias and first_rank:  # (one rank adds it, as the output projection's)
                    down_b = scaled(w(p + n.down + ".bias", hidden), c.residual_scale)
            window = c.window(i)
            self.layers.append(_Layer(
                attn_norm=norm(p + n.attn_norm + ".weight") if c.layer_attn_norm(i) else None,
                attn_post_norm=norm(p + n.attn_post_norm + ".weight") if c.layer_post_norms(i) else None,
                mlp_norm=(norm(p + n.mlp_norm + ".weight") if c.layer_pre_norms(i) and own_mlp_norm and c.has_mlp(i)
                          else None),
                gate_up_w=gate_up_w,
                down_w=down_w,
                mlp_post_norm=norm(p + n.mlp_post_norm + ".weight") if c.layer_post_norms(i) else None,
                window=window,
                local=window is not None and self.local_cos_sin is not None,
                rotary=not c.rope_layers or c.rope_layers[i],
                moe=moe,
                attn_norm_b=norm_bias(p + n.attn_norm + ".weight") if c.layer_attn_norm(i) else None,
                mlp_norm_b=(norm_bias(p + n.mlp_norm + ".weight") if c.layer_pre_norms(i) and own_mlp_norm
                            and c.has_mlp(i) else None),
                attn_post_norm_b=norm_bias(p + n.attn_post_norm + ".weight") if c.layer_post_norms(i) else None,
                mlp_post_norm_b=norm_bias(p + n.mlp_post_norm + ".weight") if c.layer_post_norms(i) else None,
                gate_up_b=gate_up_b,
                down_b=down_b,
                act_params=act_params,
                chunk=c.chunk(i),
                has_mlp=c.has_mlp(i),
                **attn,
            ))
            loaded[source] = self.layers[-1]
        self.num_kv_layers = kv_layers
        self.activation = (GATED_ACTIVATIONS if c.gated_mlp else PLAIN_ACTIVATIONS)[c.activation]
        if tp is not None:  # what the forward, the KV cache and the graphs size themselves by
            heads = tp.world if c.attends else 1
            self.config = replace(c, num_heads=c.num_heads // heads, num_kv_heads=c.num_kv_heads // heads,
                                  intermediate_size=c.intermediate_size // tp.world, alibi_slopes=alibi_part,
                                  moe=c.moe.split(tp.world) if c.moe else None)

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """One cache layer per attending layer; with layer_mla each at its layer's (heads, head dim), the layers
        of each shape in one tensor (kv_cache's layer_shapes)."""
        if not getattr(self, "kv_shapes", None):
            return super().new_kv_cache(num_blocks, block_size)
        c = self.config
        return PagedKVCache(self.num_kv_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, self.device,
                            self.dtype, layer_shapes=self.kv_shapes)

    def kv_bytes_per_token(self) -> int:
        if not getattr(self, "kv_shapes", None):
            return super().kv_bytes_per_token()
        return 2 * sum(heads * dim for heads, dim in self.kv_shapes) * self.dtype.itemsize

    @staticmethod
    def checked(state: dict, name: str, shape: tuple[int, ...], sizes: str) -> str:
        """`name`, once the checkpoint is seen to hold it at `shape`; the errors name the tensor and the
        config's `sizes` that call for that shape."""
        if name not in state:
            raise KeyError(f"checkpoint is missing weight {name!r}")
        if tuple(state[name].shape) != shape:
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(state[name].shape)}, but the config "
                             f"({sizes}) needs {shape}")
        return name

    def load_mla(self, prefix: str, read, part: slice | None) -> MlaLayer:
        """The latent attention of the layer under `prefix` (mla.load_mla_layer; a family whose attention adds
        to it overrides this): `read(name, shape, index=None)` as load_mla_layer's, `part` this rank's heads."""
        return load_mla_layer(self.config.mla, read, prefix, self.config.hidden_size, self.config.num_heads, part)

    def load_mixer(self, i: int, prefix: str, weight, read):
        """Layer i's recurrent token mixer (a hybrid family's, which overrides this: mixers.py has
        the contract), from its tensors under `prefix` ("layers.{i}."): `weight(name, *shape)`
        reads one in the model's dtype on the device, `read(name, shape)` as stored."""
        raise ValueError(f"layer {i}'s mixer {self.config.mixer(i)!r} has no loader in this family")

    def new_state_cache(self, num_slots: int) -> StateCache | None:
        return StateCache(self.state_layouts, num_slots, self.device) if self.state_layouts else None

    def _vocab_rows(self, weight) -> torch.Tensor:
        """This rank's rows of a `[vocab, hidden]` table (the embedding, the head) or of a `[vocab]`
        bias, read in part: the vocabulary padded to a multiple of 64 per rank (see
        set_output_head) and split; rows past the vocabulary are zeros. Rank r holds ids
        [r * rows, (r + 1) * rows)."""
        tp, (vocab, *rest) = self.tp, tuple(weight.shape)
        per_rank = -(-vocab // (64 * tp.world)) * 64
        start = tp.rank * per_rank
        stop = min(start + per_rank, vocab)
        rows = torch.zeros(per_rank, *rest, device=self.device, dtype=self.dtype)
        if stop > start:
            rows[: stop - start] = weight[start:stop].to(device=self.device, dtype=self.dtype)
        return rows

    def _parallel_embedding(self, ids: torch.Tensor, norm: torch.Tensor, eps: float):
        """kernels.embedding_rms_norm over the ranks' rows of the table (_embed), then the first norm."""
        return kernels.rms_norm(self._embed(ids), norm, eps)

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The token embeddings (scaled where the family scales them; plus the learnt embeddings
        of their `positions` where the family has them). Under tensor parallelism each rank looks
        up the ids it holds, zeros for the rest, in one launch; one all-reduce sums them (exactly:
        one rank gives each row, the others add zeros); every rank adds the positions' rows."""
        start = self.tp.rank * self.embed.shape[0] if self.tp is not None else 0
        rows = kernels.embedding_part(ids, self.embed, start, self.config.embed_scale)
        if self.tp is not None:
            self.tp.all_reduce(rows)
        if self.position_embed is not None:
            rows += self.position_embed[positions]
        return rows

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        """One iteration over the batch's packed tokens; returns `[S, vocab]` logits of the rows
        in `batch.logits_index` (fp32, or with `fp32_logits=False` the projection's own dtype)."""
        return self.logits(self.hidden_states(batch, cache), fp32_logits)

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """`forward` up to the output head: the final norm's rows `[S, hidden]` for the rows in
        `batch.logits_index` (what a decoder embedder pools, models/decoder_encoder.py).

        Each layer's residual add and norm before its QKV projection and its MLP are those
        linears' PreNorms (kernels.PreNorm, with the sandwich norm of the block before folded in
        as `x_norm`): for a decode row or two one kernel with the GEMM (and rotary and the cache
        write: kernels.prenorm_qkv_to_cache); for more rows norm kernels of their own. A
        post-norm block (OLMo 2, EXAONE 4: norms only after attention and the MLP) is the same
        chain with no norm before the linears: each PreNorm normalises the block's output
        (`x_norm`), adds the residual and hands the linear that sum (PreNorm weight None)."""
        c = self.config
        eps = c.norm_eps
        cos_sin = self.rope_cos_sin[batch.positions]  # one gather for both tables
        local = self.local_cos_sin[batch.positions] if self.local_cos_sin is not None else None
        if c.parallel_block:
            return self._parallel_hidden_states(batch, cache, cos_sin, local)
        if c.post_ln:
            return self._post_ln_hidden_states(batch, cache, cos_sin, local)
        # The token embeddings (the first residual) and the first norm in one launch (an
        # RMSNorm's; a LayerNorm runs in the first QKV projection's prologue instead).
        pre = None  # (the first layer's input comes normalised from the embedding kernel)
        if self.layers[0].attn_norm is None:  # a post-norm block (or attn_norm_layers): the embeddings as they are
            x = residual = self._embed(batch.input_ids)
        elif c.layer_norm:
            x = residual = self._embed(batch.input_ids, batch.positions)
            pre = kernels.PreNorm(self.layers[0].attn_norm, self._norm_bias(self.layers[0].attn_norm_b), eps)
        elif self.tp is None:
            x, residual = kernels.embedding_rms_norm(batch.input_ids, self.embed, self.layers[0].attn_norm, eps,
                                                     scale=c.embed_scale)
        else:
            x, residual = self._parallel_embedding(batch.input_ids, self.layers[0].attn_norm, eps)
        for li, layer in enumerate(self.layers):
            h = self._attend(x, li, layer, batch, cache, cos_sin, local, pre)
            if not layer.has_mlp:  # (the block ends here: its output joins the residual stream in the next norm)
                x = h
            else:
                mlp_pre = kernels.PreNorm(layer.mlp_norm, self._norm_bias(layer.mlp_norm_b), eps, residual=residual,
                                          sum_out=torch.empty_like(residual), x_norm=layer.attn_post_norm)
                residual = mlp_pre.sum_out  # the residual stream from here, written by the prenorm
                if self.tp is not None:  # each rank's heads' share of the projection, summed (and normed where fused)
                    h, mlp_pre = self.tp.all_reduce_then(h, mlp_pre)
                if layer.moe is None:
                    up = kernels.linear_act(h, layer.gate_up_w, layer.gate_up_b, self.activation, prenorm=mlp_pre)
                    x = kernels.linear_act(self._learnt_act(up, layer), layer.down_w, layer.down_b)
                else:  # the router's linear normalises the rows (mlp_pre) for itself and the experts
                    x = layer.moe(h, self.activation, mlp_pre)
            pre = None
            # (post_norm_layers: a pre-norm block, then a post-norm one: no norm between, the sum is the input)
            plain = li + 1 < len(self.layers) and self.layers[li + 1].attn_norm is None and layer.mlp_post_norm is None
            if li + 1 < len(self.layers) and not plain:
                following = self.layers[li + 1]
                pre = kernels.PreNorm(following.attn_norm, self._norm_bias(following.attn_norm_b), eps,
                                      residual=residual, sum_out=torch.empty_like(residual), x_norm=layer.mlp_post_norm)
                residual = pre.sum_out
            if self.tp is not None:
                x, pre = self.tp.all_reduce_then(x, pre)
            if plain:
                x = residual = x + residual
        if not batch.logits_every_row:
            x, residual = x[batch.logits_index], residual[batch.logits_index]
        last = self.layers[-1]
        if last.mlp_post_norm is not None:
            x, _ = kernels.rms_norm(x, last.mlp_post_norm, eps)
        if c.layer_norm:
            return self._norm(x, self.final_norm, residual, self.final_norm_b, eps=c.final_norm_eps)[0]
        x, _ = kernels.rms_norm(x, self.final_norm, eps if c.final_norm_eps is None else c.final_norm_eps, residual)
        return x

    def _parallel_hidden_states(self, batch: DecoderBatch, cache: PagedKVCache, cos_sin: torch.Tensor,
                                local: torch.Tensor | None) -> torch.Tensor:
        """hidden_states of the parallel block (Cohere, Phi): attention and the MLP side by side on one
        norm's output, both added to the residual stream. Two linears read that output, so the
        norm is a kernel of its own, fused with the add of the block before's MLP output (its
        sum written as the next residual stream): two launches a layer besides the linears' and
        the attention's (that norm and the add of the attention's output). Taking the block's sum
        into the next QKV and first MLP linears' prologues instead (the GEMV's PreNorm with the
        attention output as a third addend, no launch between layers) lost on an H200, one start
        (ab_decode_step.py): Phi-2 1.13x at batch 1 and 1.46x at batch 2, Pythia-6.9B 1.05x /
        1.58x, GPT-J-6B 1.07x / 1.59x: a LayerNorm in every program of the wide first MLP linear
        costs more than the two launches it saves."""
        x = self._embed(batch.input_ids)  # the residual stream
        n = self._norm(x, self.layers[0].attn_norm, bias=self.layers[0].attn_norm_b)[0]
        n_mlp = self._mlp_norm(x, self.layers[0], n)
        for li, layer in enumerate(self.layers):
            h = self._attend(n, li, layer, batch, cache, cos_sin, local)
            m = self._mlp(n_mlp, layer)
            if self.tp is None:  # residual + attention + MLP, as Hugging Face adds them
                x = x + h
            else:  # one collective for both rows' partial sums
                m = self.tp.all_reduce(h + m)
            if li + 1 < len(self.layers):
                n, x = self._norm(m, self.layers[li + 1].attn_norm, x, self.layers[li + 1].attn_norm_b)
                n_mlp = self._mlp_norm(x, self.layers[li + 1], n)
        if not batch.logits_every_row:
            m, x = m[batch.logits_index], x[batch.logits_index]
        return self._norm(m, self.final_norm, x, self.final_norm_b)[0]

    def _post_ln_hidden_states(self, batch: DecoderBatch, cache: PagedKVCache, cos_sin: torch.Tensor,
                               local: torch.Tensor | None) -> torch.Tensor:
        """hidden_states of the post-LN block (GPT-1's): each norm after its residual add, its output the next
        residual stream, x = norm_a(x + attn(x)), then x = norm_m(x + mlp(x)); the last layer's closes the stack
        (no final norm). The linears read the stream itself, so each add and its norm are one launch of their own
        (the sum is not kept: the norm's output replaces it); the last norm runs on the logits' rows only."""
        x = self._embed(batch.input_ids, batch.positions)
        for li, layer in enumerate(self.layers):
            h = self._attend(x, li, layer, batch, cache, cos_sin, local)
            if self.tp is not None:  # (each rank's heads' share of the output projection, summed)
                h = self.tp.all_reduce(h)
            x = self._norm(h, layer.attn_post_norm, x, layer.attn_post_norm_b)[0]
            m = self._mlp(x, layer)
            if self.tp is not None:
                m = self.tp.all_reduce(m)
            if li + 1 == len(self.layers) and not batch.logits_every_row:
                m, x = m[batch.logits_index], x[batch.logits_index]
            x = self._norm(m, layer.mlp_post_norm, x, layer.mlp_post_norm_b)[0]
        return x

    def _mlp_norm(self, x: torch.Tensor, layer: _Layer, attn_input: torch.Tensor) -> torch.Tensor:
        """The parallel block's MLP input: the norm attention reads (`attn_input`), or with
        parallel_mlp_norm (GPT-NeoX) the layer's own norm of the residual stream x."""
        if not self.config.parallel_mlp_norm:
            return attn_input
        return self._norm(x, layer.mlp_norm, bias=layer.mlp_norm_b)[0]

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, eps: float | None = None):
        """(RMSNorm, or with `layer_norm` LayerNorm (with `bias` as Phi's, or without one as Cohere's), of
        x's rows plus `residual`'s, that sum as the next residual stream: written by the same
        launch; x itself without a residual). At `eps` where given, else the config's norm_eps."""
        total = None if residual is None else torch.empty_like(residual)
        eps = self.config.norm_eps if eps is None else eps
        pre = kernels.PreNorm(weight, self._norm_bias(bias), eps, residual=residual, sum_out=total)
        return kernels.prenormed(x, pre), x if total is None else total

    def _norm_bias(self, bias: torch.Tensor | None) -> torch.Tensor | None:
        """What a PreNorm takes as the norm's bias: `bias`; with `layer_norm` and no bias a zero
        one (the kernels' LayerNorm); None for an RMSNorm."""
        return bias if bias is not None else self.zero_bias

    def _attend(self, x: torch.Tensor, li: int, layer: _Layer, batch: DecoderBatch, cache: PagedKVCache,
                cos_sin: torch.Tensor, local: torch.Tensor | None, pre: kernels.PreNorm | None = None) -> torch.Tensor:
        """Layer `li`'s attention over its input rows x (PreNorm'd by `pre` where given), to the
        output projection's rows (this rank's partial sums under tensor parallelism). The QKV
        projection writes k and v to the cache, its q/k norms (per head, or over all heads:
        qk_norm_full) applied before the rotary; per-head norms after the rotary
        (qk_norm_after_rope) run on the rotated heads before the cache write, and LayerNorms with
        biases (qk_norm_bias) on the heads before the rotary, each a norm kernel of its own.

        With attn_output_gate the attention's output o (this rank's heads) is gated per element
        before the output projection: o * sigmoid(x_n @ G^T), x_n the normalised input rows. The
        gate's linear runs first and writes x_n for the QKV projection (PreNorm.normed_out), so
        the norm runs once; the gating is one element-wise kernel (kernels.sigmoid_mul)."""
        beside = None
        if layer.mixer is not None:  # a recurrent mixer (hybrid models): its own state, no keys
            if layer.o_w is None:  # (in place of attention)
                return layer.mixer(x, pre, batch, cache.state.layer(layer.state_index))
            if pre is not None:  # beside attention (parallel_mixers): both read the normalised rows
                x, pre = kernels.prenormed(x, pre), None
            beside = layer.mixer(x, None, batch, cache.state.layer(layer.state_index))
        li = layer.kv_index  # (the cache holds the attending layers only)
        c, eps = self.config, self.config.norm_eps
        table = local if layer.local else cos_sin
        cos, sin = (table[:, 0], table[:, 1]) if layer.rotary else (None, None)
        gate = None
        # whole-width q / k norms over heads that the ranks share: their sums of squares are summed first
        split_norms = self.tp is not None and c.qk_norm_full and layer.q_norm is not None
        if layer.attn_gate_w is not None and pre is not None:
            normed = torch.empty_like(x)
            gate = kernels.linear_act(x, layer.attn_gate_w, layer.attn_gate_b, prenorm=replace(pre, normed_out=normed))
            x, pre = normed, None
        elif layer.attn_gate_w is not None:
            gate = kernels.linear_act(x, layer.attn_gate_w, layer.attn_gate_b)
        if layer.mla is not None:  # multi-head latent attention: its projections write the cache (mla.py)
            q = layer.mla.to_cache(x, pre, cos, sin, cache.keys(li), cache.values(li), batch.slot_mapping)
        elif split_norms:  # each rank's sums of squares of its q and k, summed over the ranks, normalise its heads
            qkv = kernels.linear_act(x, layer.qkv_w, layer.qkv_b, prenorm=pre)
            heads = (c.num_heads, c.num_kv_heads, c.head_dim)
            squares = self.tp.all_reduce(kernels.qk_squares(qkv, *heads))
            q = kernels.qkv_to_cache(qkv, None, *heads, cos, sin, cache.keys(li), cache.values(li), batch.slot_mapping,
                                     layer.q_norm, layer.k_norm, eps, norm_squares=squares, norm_ranks=self.tp.world)
        elif not (c.qk_norm_after_rope or c.qk_norm_bias or c.clip_qkv is not None):
            # (whole-width q/k norms: their [H * D] weights say so)
            q = kernels.prenorm_qkv_to_cache(
                x, pre, layer.qkv_w, layer.qkv_b, c.num_heads, c.num_kv_heads, c.head_dim, cos, sin,
                cache.keys(li), cache.values(li), batch.slot_mapping,
                q_norm=layer.q_norm, k_norm=layer.k_norm, norm_eps=eps,
            )
        else:
            qkv = kernels.linear_act(x, layer.qkv_w, layer.qkv_b, prenorm=pre)
            if c.clip_qkv is not None:  # (DBRX: every q, k, v value clamped to [-clip, clip], in place)
                qkv = qkv.clamp_(-c.clip_qkv, c.clip_qkv)
            # One split, rotated there (a NoPE layer: not at all) unless LayerNorms come first (qk_norm_bias).
            heads = (c.num_heads, c.num_kv_heads, c.head_dim)
            rotate_now = cos is not None and not c.qk_norm_bias
            q, k, v = (kernels.qkv_split_rotary(qkv, None, *heads, cos, sin) if rotate_now
                       else kernels.qkv_split(qkv, None, *heads))
            if c.qk_norm_after_rope and layer.q_norm is not None:  # (a layer without them (qk_norm_layers): none)
                q, k = kernels.rms_norm(q, layer.q_norm, eps)[0], kernels.rms_norm(k, layer.k_norm, eps)[0]
            elif c.qk_norm_bias:  # each head LayerNorm'd with its bias, then rotated
                q = kernels.add_bias_residual_layer_norm(q.reshape(-1, c.head_dim), None, None, layer.q_norm,
                                                         layer.q_norm_b, eps).view(q.shape)
                k = kernels.add_bias_residual_layer_norm(k.reshape(-1, c.head_dim), None, None, layer.k_norm,
                                                         layer.k_norm_b, eps).view(k.shape)
                if cos is not None:
                    q, k = kernels.apply_rotary(q, cos, sin), kernels.apply_rotary(k, cos, sin)
            kernels.write_kv(cache.keys(li), cache.values(li), k, v, batch.slot_mapping)
        if c.nope_temperature is not None and not layer.rotary:  # q times its position's temperature, in fp32
            floor_scale, strength = c.nope_temperature
            t = torch.log1p(torch.floor((batch.positions.float() + 1.0) / floor_scale)) * strength + 1.0
            q = (q.float() * t[:, None, None]).to(q.dtype)
        if c.nope_query_power is not None and not layer.rotary:  # q times its position's scale, in fp32
            length, power = c.nope_query_power
            t = torch.exp(power * torch.log1p((batch.positions.float() + 1.0) / length))
            q = (q.float() * t[:, None, None]).to(q.dtype)
        if c.query_scaling is not None:  # every layer's q times its position's factor, rounded to q's dtype first
            beta, original = c.query_scaling
            t = 1.0 + beta * torch.log(1.0 + torch.floor(batch.positions.float() / original))
            q = q * t.to(q.dtype)[:, None, None]
        scale = c.attn_scale if layer.attn_scale is None else layer.attn_scale
        ctx = batch.attention(q, cache.keys(li), cache.values(li), scale=scale, window=layer.window,
                              softcap=c.attn_softcap, sinks=layer.sinks, chunk=layer.chunk,
                              alibi_slopes=self.alibi_slopes)
        if gate is not None and c.attn_gate_softplus:  # (fp32 softplus rounded to ctx's dtype, as transformers)
            ctx = ctx * torch.nn.functional.softplus(gate.float()).to(ctx.dtype).view(*ctx.shape[:2], -1)
        elif gate is not None:
            ctx = kernels.sigmoid_mul(ctx, gate)
        if layer.mla is not None:  # (each head's values, past their zero padding)
            ctx = layer.mla.values(ctx)
        out = kernels.linear_act(ctx.reshape(ctx.shape[0], -1), layer.o_w, layer.o_b)
        return out if beside is None else beside + out  # (Falcon-H1 adds the mixer's output first)

    def _mlp(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """The layer's MLP (dense or mixture of experts) over its input rows x."""
        if layer.moe is not None:
            return layer.moe(x, self.activation)
        up = kernels.linear_act(x, layer.gate_up_w, layer.gate_up_b, self.activation)
        return kernels.linear_act(self._learnt_act(up, layer), layer.down_w, layer.down_b)

    @staticmethod
    def _learnt_act(up: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """The plain MLP's first linear's output `up` through the layer's learnt activation (xIELU: its
        scalars read on the device, in place), or as it is where the activation was the linear's epilogue."""
        return up if layer.act_params is None else kernels.xielu(up, layer.act_params, out=up)


def xielu_params(state: dict, prefix: str, device: torch.device) -> torch.Tensor:
    """xIELU's four scalars `[alpha_p, alpha_n, beta, eps]` in fp32 on `device` as kernels.xielu applies them,
    from a checkpoint's `{prefix}alpha_p`, `alpha_n` (learnt: alpha_p = softplus(a_p), alpha_n = beta +
    softplus(a_n), computed once here in fp32) and `beta`, `eps` (buffers: 0.5 and -1e-6 where a checkpoint
    leaves them out). Whole on every tensor-parallel rank: the activation is element-wise."""
    def scalar(name: str, default: float | None = None) -> torch.Tensor:
        if prefix + name not in state:
            if default is None:
                raise KeyError(f"checkpoint is missing weight {prefix + name!r}")
            return torch.tensor(default, dtype=torch.float32)
        t = state[prefix + name]  # (a tensor, or a lazy one: a shape and `to`)
        if any(size != 1 for size in t.shape):
            raise ValueError(f"checkpoint tensor {prefix + name!r} has shape {tuple(t.shape)}, a scalar expected")
        return t.to(device="cpu", dtype=torch.float32).reshape(())

    beta, eps = scalar("beta", 0.5), scalar("eps", -1e-6)
    alpha_p = torch.nn.functional.softplus(scalar("alpha_p"))
    alpha_n = beta + torch.nn.functional.softplus(scalar("alpha_n"))
    return torch.stack([alpha_p, alpha_n, beta, eps]).to(device)


def qkv_rows_in_rotary_order(order: torch.Tensor, head_dim: int, q_heads: int, kv_heads: int) -> torch.Tensor:
    """Indices of the rows of a fused QKV projection of `q_heads` query and `kv_heads` key and
    value heads (this rank's) that store each query and key head's dims in `order`
    (rope.rotary_order), the value rows as they are."""
    starts = torch.arange(q_heads + kv_heads)[:, None] * head_dim  # the query heads, then the key heads
    rotated = (starts + order[None, :]).reshape(-1)
    return torch.cat([rotated, torch.arange((q_heads + kv_heads) * head_dim, (q_heads + 2 * kv_heads) * head_dim)])


def spec_from_hf(cfg: dict, *, default_theta: float = 10000.0, tie_default: bool = False, **options) -> DecoderSpec:
    """The options every family reads the same way from a Hugging Face config, plus the
    family's own (`options`, DecoderSpec's fields). `default_theta` / `tie_default` are the
    family's defaults where the config omits rope_theta / tie_word_embeddings."""
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    max_positions = cfg.get("max_position_embeddings", 2048)
    theta = cfg.get("rope_theta", (rope_parameters(cfg) or {}).get("rope_theta", default_theta))
    fields = dict(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rotary_dim=rotary_dims(cfg, head_dim),
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope=Rope.from_hf(rope_parameters(cfg), theta, max_positions),
        max_position_embeddings=max_positions,
        tie_word_embeddings=cfg.get("tie_word_embeddings", tie_default),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids(cfg),
    )
    return DecoderSpec(**{**fields, **options})


def sliding_pattern(cfg: dict, default: int | str | None) -> list[bool]:
    """Per layer whether it is a sliding-window layer by the config's `sliding_window_pattern`
    (the family's `default` where the config has none): an int n makes every n-th layer, counting
    from 1, global and the others local (Gemma 3, Cohere2, OLMo 3, EXAONE 4); a string names the
    layers of the repeating pattern, "L" local ("LLLG", as EXAONE-4.0-32B's config.json writes
    it); None or 0 makes none local."""
    pattern, layers = cfg.get("sliding_window_pattern", default), cfg["num_hidden_layers"]
    if isinstance(pattern, str):
        return [pattern[i % len(pattern)] == "L" for i in range(layers)]
    return [bool(pattern) and (i + 1) % pattern != 0 for i in range(layers)]


def layer_windows(cfg: dict, window: int | None, sliding: list[bool] | None = None) -> tuple[int | None, ...]:
    """Per layer the sliding window or None: from the config's `layer_types` when it lists them
    ("sliding_attention" / "full_attention"), else from `sliding` (the family's rule), else every
    layer windowed when `window` is set."""
    if not window:
        return ()
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types:
        if len(types) != layers or not set(types) <= {"sliding_attention", "full_attention"}:
            raise ValueError(f"layer_types must list 'sliding_attention' / 'full_attention' for each of {layers} layers")
        sliding = [t == "sliding_attention" for t in types]
    elif sliding is None:
        sliding = [True] * layers
    return tuple(window if s else None for s in sliding)


def per_layer_kinds(cfg: dict, key: str, known: tuple[str, ...], default: Callable[[int], list[str]],
                    family: str) -> list[str]:
    """Per layer its kind from the config's `key` (`mlp_layer_types`, `indexer_types`, ...), else
    `default(num_hidden_layers)`, the family's rule (called only then: a rule may read options the
    list overrides); refused in the family's name unless it names one of `known` for each layer."""
    layers = cfg["num_hidden_layers"]
    kinds = cfg.get(key)
    kinds = default(layers) if kinds is None else list(kinds)
    if len(kinds) != layers or not set(kinds) <= set(known):
        raise ValueError(f"{family} with {key} {kinds} is not supported (supported: {key}, one of "
                         f"{', '.join(repr(k) for k in known)} for each of {layers} layers)")
    return kinds


def layers_renamed(state: dict, prefix: str) -> dict:
    """The checkpoint's tensors with layers named `{prefix}{i}.` (Falcon's and GPT-BigCode's `h.`)
    renamed to the `layers.{i}.` this decoder reads."""
    if not any(name.startswith(prefix) for name in state):
        return state
    return {("layers." + name[len(prefix):] if name.startswith(prefix) else name): t for name, t in state.items()}


def tensors_renamed(state: dict, renames) -> dict:
    """The checkpoint's tensors with each name rewritten by `renames`, (compiled pattern, replacement) pairs applied
    in order (re.sub): a published checkpoint's names as transformers' modules name them."""
    renamed = {}
    for name, t in state.items():
        for pattern, replacement in renames:
            name = pattern.sub(replacement, name)
        renamed[name] = t
    return renamed


# GPT-2's names for the config's sizes, which GPT-1, CTRL, GPT-BigCode and GPT-J keep.
GPT2_CONFIG_NAMES = (("n_embd", "hidden_size"), ("n_head", "num_attention_heads"), ("n_layer", "num_hidden_layers"),
                     ("n_positions", "max_position_embeddings"))


def config_renamed(cfg: dict, renames: tuple[tuple[str, str], ...]) -> dict:
    """A copy of the config with each (old, new) name's value also under the new name (transformers'
    canonical one, which the decoder reads) where that is not set: configs written with GPT-2's or
    older names (`n_layer`, `n_head`: Falcon's, GPT-BigCode's, GPT-J's)."""
    cfg = dict(cfg)
    for old, new in renames:
        if old in cfg:
            cfg.setdefault(new, cfg[old])
    return cfg
