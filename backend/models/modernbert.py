"""ModernBERT (answerdotai/ModernBERT-base and its fine-tunes, e.g. gte-reranker-modernbert-base)
over packed, padding-free batches, with its sequence-classification head.

What differs from BERT, written from Hugging Face's modeling_modernbert.py:

- Pre-norm blocks: x + Attn(LN(x)), then x + MLP(LN(x)); the first layer's attention norm is
  the identity (the embedding norm precedes it), a final LayerNorm closes the stack. LayerNorms
  carry no bias (`norm_bias` false), nor do the linears (`attention_bias`, `mlp_bias`): a bias a
  config asks for is loaded, one it omits stays None.
- No position table: rotary embeddings (rotate-half) on q and k, with a base per layer kind:
  `global_rope_theta` (160,000) on global layers, `local_rope_theta` (10,000) on local ones.
- Alternating attention: every `global_attn_every_n_layers`-th layer (0, 3, 6, ...) attends to the
  whole sequence; the others to a symmetric window, |i - j| <= local_attention // 2 (64 keys
  each side for `local_attention` 128). Both are bidirectional.
- A GeGLU MLP: Wi projects to [input | gate] (2 x intermediate), act(input) * gate, then Wo;
  `hidden_activation` "gelu" is the exact (erf) GELU, kernels.linear_act's "gelu_mul".
- The classification head (ModernBertForSequenceClassification): `classifier_pooling` "cls" (the
  first token) or "mean" over each sequence's last hidden states, then head.dense, the
  classifier activation and head.norm, then the classifier linear.

How it runs: one `[total_tokens, hidden]` activation for the whole batch. The residual stream's
add and the next LayerNorm are one kernel (add_bias_residual_layer_norm with `sum_out`), the
QKV GEMM's output is rotated in place on its q and k heads (kernels.rotary_in_place, reading
cos/sin tables of every position built once at load time) and the attention reads q, k, v as
strided views of it (kernels.varlen_attention, with `window` on the local layers).
The family contract (what the engine calls) is in models/encoder.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.checkpoints.weights import weight_getter
from tritonformer.backend.encoder.activation_arena import ActivationArena, UsageRecord, buffer_getter
from tritonformer.backend.models.bert import linear_into, position_ids
from tritonformer.backend.models.encoder import ClassifierLabels


# config `hidden_activation` -> kernels.linear_act's gated activation (act on the first half)
_MLP_ACTIVATIONS = {"gelu": "gelu_mul", "gelu_pytorch_tanh": "gelu_tanh_mul", "gelu_new": "gelu_tanh_mul",
                    "silu": "silu_mul", "swish": "silu_mul"}
# config `classifier_activation` -> the function the head applies (on fp32 values)
_HEAD_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "swish": F.silu, "relu": F.relu, "tanh": torch.tanh,
}
GLOBAL, LOCAL = "full_attention", "sliding_attention"  # Hugging Face's layer_types names


@dataclass(frozen=True)
class ModernBertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    hidden_activation: str
    layer_types: tuple[str, ...]  # GLOBAL or LOCAL per layer
    local_attention: int  # the local window: keys |i - j| <= local_attention // 2
    global_rope_theta: float
    local_rope_theta: float
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    classifier_pooling: str = "cls"
    classifier_activation: str = "gelu"
    classifier_bias: bool = False
    position_offset: int = 0  # rotary: positions are 0.. within each sequence (the CUDA graphs read this)

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModernBertConfig":
        """From config.json as the Hub ships it (`global_attn_every_n_layers`, `global_rope_theta`,
        `local_rope_theta`) or as transformers >= 5 writes it (`layer_types`, `rope_parameters`)."""
        if cfg.get("model_type", "modernbert") != "modernbert":
            raise ValueError(f"not a ModernBERT config: model_type {cfg.get('model_type')!r}")
        layers = cfg.get("num_hidden_layers", 22)
        layer_types = cfg.get("layer_types")
        if layer_types is None:
            every = cfg.get("global_attn_every_n_layers", 3)
            layer_types = [GLOBAL if i % every == 0 else LOCAL for i in range(layers)]
        if len(layer_types) != layers or not set(layer_types) <= {GLOBAL, LOCAL}:
            raise ValueError(f"layer_types must name {GLOBAL!r} or {LOCAL!r} for each of {layers} layers")
        thetas = {GLOBAL: cfg.get("global_rope_theta") or 160_000.0, LOCAL: cfg.get("local_rope_theta") or 10_000.0}
        for kind, params in (cfg.get("rope_parameters") or {}).items():
            if params is None or kind not in thetas:
                continue
            if params.get("rope_type", "default") != "default":
                raise ValueError(f"unsupported rope_type {params['rope_type']!r} for {kind} layers "
                                 "(supported: default)")
            thetas[kind] = params.get("rope_theta", thetas[kind])
        if cfg.get("rope_scaling"):
            raise ValueError("rope_scaling is not supported for ModernBERT (supported: plain rotary embeddings)")
        activation = cfg.get("hidden_activation", "gelu")
        if activation not in _MLP_ACTIVATIONS:
            raise ValueError(f"unsupported hidden_activation {activation!r} (supported: {', '.join(_MLP_ACTIVATIONS)})")
        head_activation = cfg.get("classifier_activation", "gelu")
        if head_activation not in _HEAD_ACTIVATIONS:
            raise ValueError(f"unsupported classifier_activation {head_activation!r} "
                             f"(supported: {', '.join(_HEAD_ACTIVATIONS)})")
        pooling = cfg.get("classifier_pooling", "cls")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling must be 'cls' or 'mean', got {pooling!r}")
        hidden, heads = cfg.get("hidden_size", 768), cfg.get("num_attention_heads", 12)
        if hidden % heads or (hidden // heads) % 2:
            raise ValueError(f"hidden_size {hidden} must split into {heads} heads of an even size (rotary)")
        return cls(
            vocab_size=cfg.get("vocab_size", 50368),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            intermediate_size=cfg.get("intermediate_size", 1152),
            max_position_embeddings=cfg.get("max_position_embeddings", 8192),
            norm_eps=cfg.get("norm_eps", 1e-5),
            hidden_activation=activation,
            layer_types=tuple(layer_types),
            local_attention=int(cfg.get("local_attention", 128)),
            global_rope_theta=float(thetas[GLOBAL]),
            local_rope_theta=float(thetas[LOCAL]),
            norm_bias=bool(cfg.get("norm_bias", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            classifier_pooling=pooling,
            classifier_activation=head_activation,
            classifier_bias=bool(cfg.get("classifier_bias", False)),
        )

    @property
    def max_tokens_per_sequence(self) -> int:
        """Rotary has no table to run past, but the checkpoint was trained to this length and
        the cos/sin tables are built for it."""
        return self.max_position_embeddings

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class ModernBertEncoder:
    """Weights plus a forward over packed sequences (models/encoder.py's `Encoder`). Not an
    nn.Module: inference only."""

    # Each layer's linear weights: what quantization fp8 turns into FP8 (backend/quantization.py);
    # the classification head stays in fp32.
    LINEAR_WEIGHTS = ("qkv_w", "out_w", "wi_w", "wo_w")

    def __init__(self, config: ModernBertConfig, state: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, labels: ClassifierLabels | None = None):
        """`state`: the checkpoint's tensors with the head class's `model.` prefix stripped (as
        checkpoints.weights.load_state_dict returns them). `labels`: the checkpoint has a
        sequence-classification head with these labels; None: the bare encoder."""
        self.config = config
        self.device = device
        self.dtype = dtype
        self.activation = _MLP_ACTIVATIONS[config.hidden_activation]
        w = weight_getter(state, device, dtype)
        hidden = config.hidden_size

        def maybe(name: str, present: bool) -> torch.Tensor | None:
            return w(name) if present else None

        # A LayerNorm without a bias runs the biased kernel with zeros: one shared vector.
        zeros = torch.zeros(hidden, device=device, dtype=dtype)

        def norm(prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
            return w(prefix + ".weight"), (w(prefix + ".bias") if config.norm_bias else zeros)

        self.tok_emb = w("embeddings.tok_embeddings.weight")
        self.emb_norm = norm("embeddings.norm")
        self.layers = []
        for i, kind in enumerate(config.layer_types):
            p = f"layers.{i}."
            self.layers.append({
                "attn_norm": norm(p + "attn_norm") if i > 0 else None,  # layer 0: the identity
                "qkv_w": w(p + "attn.Wqkv.weight"), "qkv_b": maybe(p + "attn.Wqkv.bias", config.attention_bias),
                "out_w": w(p + "attn.Wo.weight"), "out_b": maybe(p + "attn.Wo.bias", config.attention_bias),
                "mlp_norm": norm(p + "mlp_norm"),
                "wi_w": w(p + "mlp.Wi.weight"), "wi_b": maybe(p + "mlp.Wi.bias", config.mlp_bias),
                "wo_w": w(p + "mlp.Wo.weight"), "wo_b": maybe(p + "mlp.Wo.bias", config.mlp_bias),
                "window": config.local_attention if kind == LOCAL else None,
                "kind": kind,
            })
            shape = tuple(self.layers[-1]["wi_w"].shape)
            if shape != (2 * config.intermediate_size, hidden):
                raise ValueError(f"layer {i}'s mlp.Wi.weight is {list(shape)}, expected "
                                 f"[2 * intermediate_size, hidden_size] = [{2 * config.intermediate_size}, {hidden}]")
        self.final_norm = norm("final_norm")
        # cos/sin of every position once, per rotary base: a forward only indexes them.
        all_positions = torch.arange(config.max_position_embeddings, device=device)
        self.rotary = {
            GLOBAL: kernels.rotary_cos_sin(all_positions, config.head_dim, config.global_rope_theta),
            LOCAL: kernels.rotary_cos_sin(all_positions, config.head_dim, config.local_rope_theta),
        }
        self.labels = labels
        self.head = self._load_head(state, labels) if labels is not None else None

    def _load_head(self, state: dict[str, torch.Tensor], labels: ClassifierLabels) -> dict:
        """head.dense (+ bias with `classifier_bias`), head.norm, classifier (always biased): in
        fp32, as the head runs on each sequence's pooled fp32 row."""
        cfg = self.config
        w = weight_getter(state, self.device, torch.float32)
        head = {
            "dense_w": w("head.dense.weight"), "dense_b": w("head.dense.bias") if cfg.classifier_bias else None,
            "norm_w": w("head.norm.weight"), "norm_b": w("head.norm.bias") if cfg.norm_bias else None,
            "out_w": w("classifier.weight"), "out_b": w("classifier.bias"),
        }
        if head["out_w"].shape[0] != labels.num_labels:
            raise ValueError(f"the classifier has {head['out_w'].shape[0]} outputs but config.json names "
                             f"{labels.num_labels} labels (id2label)")
        return head

    def classify(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[B, num_labels]`: `classifier_pooling` over each sequence's final hidden
        states, then head.dense, the activation, head.norm and the classifier (dropout is off at
        inference), all in fp32."""
        if self.head is None:
            raise ValueError("this checkpoint has no sequence-classification head")
        cfg, head = self.config, self.head
        pooled = kernels.pool_sequences(hidden, cu_seqlens, cfg.classifier_pooling, False)
        x = _HEAD_ACTIVATIONS[cfg.classifier_activation](F.linear(pooled, head["dense_w"], head["dense_b"]))
        x = F.layer_norm(x, (cfg.hidden_size,), head["norm_w"], head["norm_b"], cfg.norm_eps)
        return F.linear(x, head["out_w"], head["out_b"])

    def _intermediates(self) -> list[tuple[str, int, int, int]]:
        """(name, first op, last op, width) of one layer's intermediates in op order: 1 QKV GEMM,
        2 rotary + attention, 3 output GEMM, 4 residual add + MLP norm, 5 Wi + GeGLU, 6 Wo,
        7 residual add + the next layer's attention norm. The two residual streams (each layer
        reads one and writes the other) and the normed attention input (written by op 7, read by
        the next layer's op 1) live through every op. The GeGLU's output is linear_act's own
        (its fused routes write it directly; an `out` would cost a copy on the cuBLAS route)."""
        h = self.config.hidden_size
        return [
            ("residual_a", 0, 7, h), ("residual_b", 0, 7, h), ("attn_in", 0, 7, h),
            ("qkv", 1, 2, 3 * h), ("ctx", 2, 3, h), ("attn_out", 3, 4, h), ("mlp_in", 4, 5, h), ("mlp_out", 6, 7, h),
        ]

    def usage_records(self, total_tokens: int) -> list[UsageRecord]:
        """The intermediates' usage records for the activation allocator."""
        e = self.dtype.itemsize
        return [UsageRecord(name, first, last, total_tokens * width * e)
                for name, first, last, width in self._intermediates()]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        positions: torch.Tensor | None = None,
        arena: ActivationArena | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids `[T]` (all sequences concatenated), cu_seqlens `[B + 1]` int32; returns the
        final-normed last hidden state `[T, hidden]` (Hugging Face's `last_hidden_state`).
        `max_seqlen` (the longest sequence), when the caller knows it, saves a device sync.
        `positions` default to 0.. within each sequence; every one must be below
        max_position_embeddings. With an `arena`, intermediates are views of its planned memory
        and the result is valid until the arena's next forward. ModernBERT has no token types:
        `token_type_ids` must be None."""
        if token_type_ids is not None:
            raise ValueError("ModernBERT has no token types: encode text pairs without token_type_ids")
        cfg = self.config
        total, hsz, heads, head_dim = input_ids.shape[0], cfg.hidden_size, cfg.num_heads, cfg.head_dim
        if max_seqlen is None:
            max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if total else 0
        if positions is None:
            positions = position_ids(cu_seqlens, total, 0)
        widths = {name: width for name, _, _, width in self._intermediates()}
        buf = buffer_getter(arena, self.usage_records(total), widths, total, self.device, self.dtype)

        # Token embeddings (gathered into `attn_in`, free until layer 0 ends) and their norm, which
        # is layer 0's attention input as it is (its attention norm is the identity) and the
        # residual stream. Each residual add writes the other stream (`sum_out` must not overlap
        # its inputs), so the two swap roles twice per layer.
        rows = torch.index_select(self.tok_emb, 0, input_ids, out=buf("attn_in"))
        residual, spare = buf("residual_a"), buf("residual_b")
        kernels.add_bias_residual_layer_norm(rows, None, None, *self.emb_norm, cfg.norm_eps, out=residual)
        attn_in = residual
        for i, layer in enumerate(self.layers):
            qkv = linear_into(attn_in, layer["qkv_w"], layer["qkv_b"], buf("qkv"))
            cos, sin = self.rotary[layer["kind"]]
            kernels.rotary_in_place(qkv.view(total, 3 * heads, head_dim)[:, : 2 * heads], cos, sin, positions)
            qkv4 = qkv.view(total, 3, heads, head_dim)
            ctx = kernels.varlen_attention(
                qkv4[:, 0], qkv4[:, 1], qkv4[:, 2], cu_seqlens, cu_seqlens, causal=False, max_seqlen_q=max_seqlen,
                out=buf("ctx").view(total, heads, head_dim), window=layer["window"],
            )
            attn_out = linear_into(ctx.view(total, hsz), layer["out_w"], layer["out_b"], buf("attn_out"))
            # residual + attn_out (the new residual stream) and the MLP's norm of it, one pass
            mlp_in = kernels.add_bias_residual_layer_norm(attn_out, None, residual, *layer["mlp_norm"], cfg.norm_eps,
                                                          out=buf("mlp_in"), sum_out=spare)
            residual, spare = spare, residual
            act = kernels.linear_act(mlp_in, layer["wi_w"], layer["wi_b"], self.activation)
            mlp_out = linear_into(act, layer["wo_w"], layer["wo_b"], buf("mlp_out"))
            # residual + mlp_out and the next layer's attention norm of it; after the last layer
            # the final norm, whose residual sum nobody reads
            last = i == len(self.layers) - 1
            next_norm = self.final_norm if last else self.layers[i + 1]["attn_norm"]
            attn_in = kernels.add_bias_residual_layer_norm(mlp_out, None, residual, *next_norm, cfg.norm_eps,
                                                           out=buf("attn_in"), sum_out=None if last else spare)
            if not last:
                residual, spare = spare, residual
        return attn_in


def from_hf(cfg: dict) -> ModernBertConfig:
    """The family-table entry point (models/encoder.py)."""
    return ModernBertConfig.from_hf(cfg)


MODEL = ModernBertEncoder
