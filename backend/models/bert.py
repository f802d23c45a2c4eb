"""BERT-family encoder (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, MiniLM) over packed
variable-length batches, with the sequence-classification heads of its Hugging Face classes.

A batch of sequences of different lengths runs as one `[total_tokens, hidden]` activation:
every GEMM sees only real tokens and attention uses cumulative sequence offsets, so there is
no padding anywhere (TurboTransformers / EET's idea). Position tables of any length load as
they are (bge-m3's XLM-R reads 8,192 tokens); nothing here assumes 512.
The family contract is in models/encoder.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.encoder.activation_arena import ActivationArena, UsageRecord
from tritonformer.backend.checkpoints.weights import weight_getter
from tritonformer.backend.models.encoder import ClassifierLabels, first_token_rows
from tritonformer.kernels.fp8 import Fp8Weight, cat_rows


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    layer_norm_eps: float
    hidden_act: str
    position_offset: int  # RoBERTa numbers positions from padding_idx + 1
    model_type: str = "bert"  # picks the classification head's layout (BERT's pooler or RoBERTa's head)
    type_vocab_size: int = 2  # token types (segments); RoBERTa and XLM-R have one

    @classmethod
    def from_hf(cls, cfg: dict) -> "BertConfig":
        model_type = cfg.get("model_type", "bert")
        if model_type not in ("bert", "roberta", "xlm-roberta", "camembert"):
            raise ValueError(f"unsupported encoder model_type {model_type!r} (expected a BERT/RoBERTa family model)")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        offset = cfg.get("pad_token_id", 1) + 1 if model_type != "bert" else 0
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            max_position_embeddings=cfg["max_position_embeddings"],
            layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
            hidden_act=cfg.get("hidden_act", "gelu"),
            position_offset=offset,
            model_type=model_type,
            type_vocab_size=cfg.get("type_vocab_size", 2),
        )

    @property
    def max_tokens_per_sequence(self) -> int:
        return self.max_position_embeddings - self.position_offset

    @property
    def gelu_approximate(self) -> str:
        if self.hidden_act == "gelu":
            return "none"
        if self.hidden_act in ("gelu_new", "gelu_pytorch_tanh"):
            return "tanh"
        raise ValueError(f"unsupported hidden_act {self.hidden_act!r}")


class BertEncoder:
    """Weights plus a forward over packed sequences. Not an nn.Module: inference only."""

    # Each layer's linear weights: what quantization fp8 turns into FP8 (backend/quantization.py);
    # the classification head stays 16-bit, and so do the first and last layers: all-MiniLM-L6-v2's
    # embedding cosine to fp32 HF, min over the test texts, 0.99469 with every layer FP8 and
    # 0.99708 with those two kept (CPU, fp32 activations; H100 fp16 with every layer: 0.99449).
    LINEAR_WEIGHTS = ("qkv_w", "out_w", "ffn_in_w", "ffn_out_w")
    FP8_KEEP_EDGE_LAYERS = True

    def __init__(self, config: BertConfig, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 labels: ClassifierLabels | None = None):
        """`labels`: the checkpoint has a sequence-classification head with these labels (its
        tensors are read from `state`); None: the bare encoder."""
        self.config = config
        self.device = device
        self.dtype = dtype
        # The FFN up-projection's bias + GELU: kernels.linear_act picks where by rows (few: its
        # small fused Triton kernel; many, on Hopper, the fused many-row Triton GEMM; otherwise
        # the cuBLAS GEMM, then the bias_gelu kernel in place).
        self.activation = kernels.gelu_activation(config.gelu_approximate)
        w = weight_getter(state, device, dtype)

        self.word_emb = w("embeddings.word_embeddings.weight")
        self.pos_emb = w("embeddings.position_embeddings.weight")
        # Single-segment inputs: token type 0 for every token, folded into one bias vector.
        type_emb = w("embeddings.token_type_embeddings.weight")
        self.type_emb0 = type_emb[0]
        # Text pairs (a reranker's query and document): BERT gives the second segment type 1.
        # One table holds position + type rows for every type, so the same one-pass embedding
        # kernel reads row `position + type * positions` and the single-segment path is untouched.
        self.pos_type_emb = None
        if type_emb.shape[0] > 1:
            pos32, types32 = self.pos_emb.float(), type_emb.float()
            self.pos_type_emb = torch.cat([pos32 + types32[t] for t in range(type_emb.shape[0])]).to(dtype)
        self.emb_ln = (w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
        self.layers = []
        for i in range(config.num_layers):
            p = f"encoder.layer.{i}."
            att = p + "attention.self."
            self.layers.append(
                {
                    # Q, K and V fused into one GEMM.
                    "qkv_w": cat_rows([w(att + "query.weight"), w(att + "key.weight"), w(att + "value.weight")]),
                    "qkv_b": torch.cat([w(att + "query.bias"), w(att + "key.bias"), w(att + "value.bias")]),
                    "out_w": w(p + "attention.output.dense.weight"),
                    "out_b": w(p + "attention.output.dense.bias"),
                    "ln1": (w(p + "attention.output.LayerNorm.weight"), w(p + "attention.output.LayerNorm.bias")),
                    "ffn_in_w": w(p + "intermediate.dense.weight"),
                    "ffn_in_b": w(p + "intermediate.dense.bias"),
                    "ffn_out_w": w(p + "output.dense.weight"),
                    "ffn_out_b": w(p + "output.dense.bias"),
                    "ln2": (w(p + "output.LayerNorm.weight"), w(p + "output.LayerNorm.bias")),
                }
            )
        self.labels = labels
        if labels is not None:
            self.head = self._load_head(w, labels)

    def _load_head(self, w, labels: ClassifierLabels) -> dict[str, torch.Tensor]:
        """The classification head's tensors. BertForSequenceClassification: `pooler.dense`
        (dense + tanh on [CLS]) then `classifier`; the RoBERTa family's classes (RoBERTa, XLM-R,
        CamemBERT): `classifier.dense` (+ tanh) then `classifier.out_proj`, no pooler."""
        if self.config.model_type == "bert":
            head = {"dense_w": w("pooler.dense.weight"), "dense_b": w("pooler.dense.bias"),
                    "out_w": w("classifier.weight"), "out_b": w("classifier.bias")}
        else:
            head = {"dense_w": w("classifier.dense.weight"), "dense_b": w("classifier.dense.bias"),
                    "out_w": w("classifier.out_proj.weight"), "out_b": w("classifier.out_proj.bias")}
        if head["out_w"].shape[0] != labels.num_labels:
            raise ValueError(f"the classifier has {head['out_w'].shape[0]} outputs but config.json names "
                             f"{labels.num_labels} labels (id2label)")
        return head

    def classify(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[B, num_labels]` of the classification head over each sequence's first
        token: tanh(dense(x)) then the output projection, as both HF head classes compute it
        (dropout is off at inference)."""
        if self.labels is None:
            raise ValueError("this checkpoint has no sequence-classification head")
        x = first_token_rows(hidden, cu_seqlens)
        x = torch.tanh(F.linear(x, self.head["dense_w"], self.head["dense_b"]))
        return F.linear(x, self.head["out_w"], self.head["out_b"]).float()

    def _intermediates(self) -> list[tuple[str, int, int, int]]:
        """(name, first op, last op, width) of one forward's intermediates, in op order. Every
        layer repeats ops 1-7 with the same sizes, so one plan serves them all; `hidden` is the
        layer input and output (LN2 writes it in place once the layer no longer reads it)."""
        h = self.config.hidden_size
        return [
            ("hidden", 0, 7, h), ("qkv", 1, 2, 3 * h), ("ctx", 2, 3, h),
            ("attn_out", 3, 4, h), ("h1", 4, 7, h), ("ffn", 5, 6, self.config.intermediate_size), ("ffn_out", 6, 7, h),
        ]

    def usage_records(self, total_tokens: int) -> list[UsageRecord]:
        """The intermediates' usage records for the activation allocator."""
        e = self.dtype.itemsize
        return [UsageRecord(name, first, last, total_tokens * width * e) for name, first, last, width in self._intermediates()]

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
        """input_ids `[T]` (all sequences concatenated), cu_seqlens `[B + 1]` int32.
        `max_seqlen` (the longest sequence), when the caller knows it, saves a device sync.
        `positions` (position ids, offset included) default to 0.. within each sequence.
        `token_type_ids` `[T]`: segment ids of text pairs; None: segment 0 everywhere.
        With an `arena`, every intermediate is a view of its planned memory, and the result is
        valid until the arena's next forward. Returns the last hidden state `[T, hidden]`."""
        cfg = self.config
        total, hsz = input_ids.shape[0], cfg.hidden_size
        if max_seqlen is None:
            max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        if positions is None:
            positions = position_ids(cu_seqlens, total, cfg.position_offset)
        # With an arena, every intermediate's view is made once here: all layers share them.
        bufs: dict[str, torch.Tensor | None] = dict.fromkeys(name for name, *_ in self._intermediates())
        if arena is not None:
            plan = arena.plan(self.usage_records(total))
            bufs = {name: arena.view(plan, name, (total, width), self.dtype) for name, _, _, width in self._intermediates()}

        # Token + token-type + position embeddings and their LayerNorm, one pass.
        if token_type_ids is None:
            h = kernels.embedding_layer_norm(input_ids, self.word_emb, positions, self.pos_emb, self.type_emb0,
                                             *self.emb_ln, cfg.layer_norm_eps, out=bufs["hidden"])
        else:
            if self.pos_type_emb is None:
                raise ValueError(f"this {cfg.model_type} checkpoint has one token type: pairs need no token_type_ids")
            rows = positions + token_type_ids * self.pos_emb.shape[0]
            h = kernels.embedding_layer_norm(input_ids, self.word_emb, rows, self.pos_type_emb, None,
                                             *self.emb_ln, cfg.layer_norm_eps, out=bufs["hidden"])
        head_dim = hsz // cfg.num_heads
        for layer in self.layers:
            # The QKV bias rides in the GEMM's epilogue; q, k and v are strided views of its
            # output (the attention kernel reads strides), so no split/copy pass is needed.
            qkv = _linear(h, layer["qkv_w"], layer["qkv_b"], bufs["qkv"]).view(-1, 3, cfg.num_heads, head_dim)
            ctx = bufs["ctx"]
            ctx = kernels.varlen_attention(
                qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, causal=False, max_seqlen_q=max_seqlen,
                out=None if ctx is None else ctx.view(-1, cfg.num_heads, head_dim),
            )
            attn_out = _linear(ctx.reshape(-1, hsz), layer["out_w"], None, bufs["attn_out"])
            h1 = kernels.add_bias_residual_layer_norm(
                attn_out, layer["out_b"], h, *layer["ln1"], cfg.layer_norm_eps, out=bufs["h1"]
            )
            ffn = kernels.linear_act(h1, layer["ffn_in_w"], layer["ffn_in_b"], self.activation, out=bufs["ffn"])
            ffn_out = _linear(ffn, layer["ffn_out_w"], None, bufs["ffn_out"])
            h = kernels.add_bias_residual_layer_norm(
                ffn_out, layer["ffn_out_b"], h1, *layer["ln2"], cfg.layer_norm_eps, out=h if arena is not None else None
            )
        return h


def from_hf(cfg: dict) -> BertConfig:
    """The family-table entry point (models/encoder.py)."""
    return BertConfig.from_hf(cfg)


MODEL = BertEncoder


def _linear(x: torch.Tensor, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None, out: torch.Tensor | None):
    """x @ weight^T (+ bias in the GEMM epilogue), into `out` when given (an arena view). An FP8
    weight runs kernels.linear_act, which routes it (kernels/fp8.py)."""
    if isinstance(weight, Fp8Weight):
        return kernels.linear_act(x, weight, bias, out=out)
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def position_ids(cu_seqlens: torch.Tensor, total: int, offset: int) -> torch.Tensor:
    """0, 1, ... within each packed sequence (+ offset), computed on the device."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths, output_size=total)
    return torch.arange(total, device=cu_seqlens.device) - starts + offset


def pooling_from_checkpoint(checkpoint) -> tuple[str, bool]:
    """(mode, normalize) as sentence-transformers would apply them for this folder: its
    `1_Pooling/config.json` and a Normalize module in `modules.json`; mean + no
    normalisation for a bare Hugging Face folder."""
    import json
    from pathlib import Path

    folder = Path(checkpoint)
    mode, normalize = "mean", False
    modules_path = folder / "modules.json"
    if modules_path.is_file():
        modules = json.loads(modules_path.read_text())
        normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
        for m in modules:
            if m.get("type", "").endswith("Pooling"):
                cfg_path = folder / m.get("path", "") / "config.json"
                if cfg_path.is_file():
                    cfg = json.loads(cfg_path.read_text())
                    mode = ("cls" if cfg.get("pooling_mode_cls_token") else
                            "last" if cfg.get("pooling_mode_lasttoken") else "mean")
    return mode, normalize
