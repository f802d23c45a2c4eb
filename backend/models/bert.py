"""BERT-family encoder (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, MiniLM, DistilBERT, ELECTRA, MPNet)
over packed variable-length batches, with the sequence-classification heads of its Hugging Face
classes.

A batch of sequences of different lengths runs as one `[total_tokens, hidden]` activation:
every GEMM sees only real tokens and attention uses cumulative sequence offsets, so there is
no padding anywhere (TurboTransformers / EET's idea). Position tables of any length load as
they are (bge-m3's XLM-R reads 8,192 tokens); nothing here assumes 512.
The family contract is in models/encoder.py.

Every family here runs BERT's post-LN block, h1 = LN(x + Attn(x)), out = LN(h1 + FFN(h1)), on
the same fused kernels; what differs is data (LAYOUTS below: tensor names, head) and three options:

- DistilBERT: no token types, its own tensor names (`q_lin` ... `out_lin`, `sa_layer_norm`,
  `ffn.lin1` / `lin2`, `output_layer_norm`), LayerNorm eps 1e-12, `activation` gelu or relu;
  `sinusoidal_pos_embds`: a checkpoint without a position table gets the fixed one,
  sin(p / 10000^(2(j//2)/dim)) on even j, cos on odd j. Head: pre_classifier + ReLU + classifier.
- ELECTRA: BERT's names; token embeddings of `embedding_size`, normed at that width and then
  projected by `embeddings_project` when it is not `hidden_size`. Head: classifier.dense + GELU
  (erf) + classifier.out_proj.
- MPNet: no token types, positions from padding_idx + 1 = 2 like RoBERTa, and a relative
  position bias added to every layer's attention scores: one table `relative_attention_bias`
  [32 buckets, heads], shared by all layers, indexed by the T5 bucket of the distance j - i
  (bidirectional: 16 buckets each way, 8 exact, then log-spaced up to 128, the last bucket
  beyond). Only distances up to 128 differ, so at load it becomes a `[heads, 257]` table by
  clamped distance that kernels.relative_bias_attention adds inside the packed attention.
  Head: classifier.dense + tanh + classifier.out_proj (the RoBERTa head).

Refused by name: non-absolute `position_embedding_type`, activations other than gelu / gelu_new /
gelu_pytorch_tanh / relu, MPNet bucket counts other than 32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.encoder.activation_arena import ActivationArena, UsageRecord
from tritonformer.backend.checkpoints.weights import weight_getter
from tritonformer.backend.models.encoder import ClassifierLabels, first_token_rows
from tritonformer.kernels import fp8
from tritonformer.kernels.fp8 import Fp8Activation, Fp8Weight, cat_rows

# config `hidden_act` (DistilBERT: `activation`) -> kernels.linear_act's activation
_FFN_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
# the first position id: RoBERTa's family (and MPNet, whose padding_idx is fixed at 1) count from padding_idx + 1
_ZERO_OFFSET = ("bert", "distilbert", "electra")


@dataclass(frozen=True)
class Layout:
    """Where a family's checkpoint keeps BERT's tensors (the head class's prefix stripped) and
    its classification head: `head` = (dense, activation, output projection) on the first token."""

    layer: str = "encoder.layer.{i}."
    query: str = "attention.self.query"
    key: str = "attention.self.key"
    value: str = "attention.self.value"
    attn_out: str = "attention.output.dense"
    ln1: str = "attention.output.LayerNorm"
    ffn_in: str = "intermediate.dense"
    ffn_out: str = "output.dense"
    ln2: str = "output.LayerNorm"
    head: tuple[str, str, str] = ("classifier.dense", "tanh", "classifier.out_proj")


_ROBERTA = Layout()
LAYOUTS = {
    "bert": Layout(head=("pooler.dense", "tanh", "classifier")),
    "roberta": _ROBERTA, "xlm-roberta": _ROBERTA, "camembert": _ROBERTA,
    "distilbert": Layout(layer="transformer.layer.{i}.", query="attention.q_lin", key="attention.k_lin",
                         value="attention.v_lin", attn_out="attention.out_lin", ln1="sa_layer_norm",
                         ffn_in="ffn.lin1", ffn_out="ffn.lin2", ln2="output_layer_norm",
                         head=("pre_classifier", "relu", "classifier")),
    "electra": Layout(head=("classifier.dense", "gelu", "classifier.out_proj")),
    "mpnet": Layout(query="attention.attn.q", key="attention.attn.k", value="attention.attn.v",
                    attn_out="attention.attn.o", ln1="attention.LayerNorm"),
}
_HEAD_ACTIVATIONS = {"tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu}


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
    model_type: str = "bert"  # picks the tensor names and the classification head (LAYOUTS)
    type_vocab_size: int = 2  # token types (segments); RoBERTa, XLM-R, DistilBERT and MPNet have one
    embedding_size: int | None = None  # ELECTRA: the embeddings' width when not hidden_size (then projected)
    sinusoidal_positions: bool = False  # DistilBERT's sinusoidal_pos_embds: the fixed table if none ships
    relative_attention_buckets: int = 0  # MPNet: T5 buckets of the relative position bias (0: none)
    relative_attention_max_distance: int = 128

    @classmethod
    def from_hf(cls, cfg: dict) -> "BertConfig":
        model_type = cfg.get("model_type", "bert")
        if model_type not in LAYOUTS:
            raise ValueError(f"unsupported encoder model_type {model_type!r} (expected a BERT-family model: "
                             f"{', '.join(LAYOUTS)})")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        if model_type == "distilbert":  # DistilBERT's own key names, and one fixed LayerNorm eps
            cfg = dict(cfg, hidden_size=cfg.get("dim", cfg.get("hidden_size")),
                       num_hidden_layers=cfg.get("n_layers", cfg.get("num_hidden_layers")),
                       num_attention_heads=cfg.get("n_heads", cfg.get("num_attention_heads")),
                       intermediate_size=cfg.get("hidden_dim", cfg.get("intermediate_size")),
                       hidden_act=cfg.get("activation", "gelu"), layer_norm_eps=1e-12, type_vocab_size=1)
        act = cfg.get("hidden_act", "gelu")
        if act not in _FFN_ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {act!r} (supported: {', '.join(_FFN_ACTIVATIONS)})")
        buckets = 0
        if model_type == "mpnet":
            buckets = cfg.get("relative_attention_num_buckets", 32)
            if buckets != 32:  # HF's bucketing always makes 32 buckets, whatever the table's rows
                raise ValueError(f"MPNet relative_attention_num_buckets {buckets} is not supported (supported: 32)")
        offset = 0 if model_type in _ZERO_OFFSET else 2 if model_type == "mpnet" else cfg.get("pad_token_id", 1) + 1
        embedding_size = cfg.get("embedding_size", 128) if model_type == "electra" else None  # HF's default
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            max_position_embeddings=cfg["max_position_embeddings"],
            layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
            hidden_act=act,
            position_offset=offset,
            model_type=model_type,
            type_vocab_size=1 if model_type == "mpnet" else cfg.get("type_vocab_size", 2),
            embedding_size=None if embedding_size == cfg["hidden_size"] else embedding_size,
            sinusoidal_positions=bool(cfg.get("sinusoidal_pos_embds", False)),
            relative_attention_buckets=buckets,
        )

    @property
    def max_tokens_per_sequence(self) -> int:
        return self.max_position_embeddings - self.position_offset

    @property
    def ffn_activation(self) -> str:
        """kernels.linear_act's name for the FFN's activation."""
        if self.hidden_act not in _FFN_ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}")
        return _FFN_ACTIVATIONS[self.hidden_act]


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
        # The FFN up-projection's bias + GELU (DistilBERT's may be ReLU): kernels.linear_act picks
        # where by rows (few: its small fused Triton kernel; many, on Hopper, the fused many-row
        # Triton GEMM; otherwise the cuBLAS GEMM, then the bias_gelu kernel in place).
        self.activation = config.ffn_activation
        layout = LAYOUTS[config.model_type]
        w = weight_getter(state, device, dtype)

        self.word_emb = w("embeddings.word_embeddings.weight")
        if config.sinusoidal_positions and "embeddings.position_embeddings.weight" not in state:
            self.pos_emb = sinusoidal_table(config.max_position_embeddings, self.word_emb.shape[1]).to(device, dtype)
        else:
            self.pos_emb = w("embeddings.position_embeddings.weight")
        # ELECTRA: embeddings narrower than the layers, projected after their LayerNorm.
        self.emb_proj = None
        if config.embedding_size is not None:
            self.emb_proj = (w("embeddings_project.weight"), w("embeddings_project.bias"))
        # Single-segment inputs: token type 0 for every token, folded into one bias vector
        # (None for the families without token types).
        type_emb = w("embeddings.token_type_embeddings.weight") if config.type_vocab_size > 1 or (
            "embeddings.token_type_embeddings.weight" in state) else None
        self.type_emb0 = None if type_emb is None else type_emb[0]
        # Text pairs (a reranker's query and document): BERT gives the second segment type 1.
        # One table holds position + type rows for every type, so the same one-pass embedding
        # kernel reads row `position + type * positions` and the single-segment path is untouched.
        self.pos_type_emb = None
        if type_emb is not None and type_emb.shape[0] > 1:
            pos32, types32 = self.pos_emb.float(), type_emb.float()
            self.pos_type_emb = torch.cat([pos32 + types32[t] for t in range(type_emb.shape[0])]).to(dtype)
        self.emb_ln = (w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
        # A bare DistilBertModel's names start `transformer.`, which checkpoints.weights strips.
        layer_names = layout.layer
        if layer_names.startswith("transformer.") and "layer.0." + layout.query + ".weight" in state:
            layer_names = layer_names.removeprefix("transformer.")
        self.layers = []
        for i in range(config.num_layers):
            p = layer_names.format(i=i)
            q, k, v = p + layout.query, p + layout.key, p + layout.value
            self.layers.append(
                {
                    # Q, K and V fused into one GEMM.
                    "qkv_w": cat_rows([w(q + ".weight"), w(k + ".weight"), w(v + ".weight")]),
                    "qkv_b": torch.cat([w(q + ".bias"), w(k + ".bias"), w(v + ".bias")]),
                    "out_w": w(p + layout.attn_out + ".weight"),
                    "out_b": w(p + layout.attn_out + ".bias"),
                    "ln1": (w(p + layout.ln1 + ".weight"), w(p + layout.ln1 + ".bias")),
                    "ffn_in_w": w(p + layout.ffn_in + ".weight"),
                    "ffn_in_b": w(p + layout.ffn_in + ".bias"),
                    "ffn_out_w": w(p + layout.ffn_out + ".weight"),
                    "ffn_out_b": w(p + layout.ffn_out + ".bias"),
                    "ln2": (w(p + layout.ln2 + ".weight"), w(p + layout.ln2 + ".bias")),
                }
            )
        # MPNet: the relative position bias of every layer, by clamped distance (see the module docstring).
        self.relative_bias = None
        if config.relative_attention_buckets:
            table = weight_getter(state, device, torch.float32)("encoder.relative_attention_bias.weight")
            self.relative_bias = relative_bias_by_distance(
                table, config.relative_attention_buckets, config.relative_attention_max_distance)
        self.labels = labels
        if labels is not None:
            self.head = self._load_head(w, labels)

    def _load_head(self, w, labels: ClassifierLabels) -> dict[str, torch.Tensor]:
        """The classification head's tensors (LAYOUTS' `head`). BertForSequenceClassification:
        `pooler.dense` (dense + tanh on [CLS]) then `classifier`; the RoBERTa family's classes
        (RoBERTa, XLM-R, CamemBERT) and MPNet's: `classifier.dense` (+ tanh) then
        `classifier.out_proj`, no pooler; DistilBERT: `pre_classifier` (+ ReLU) then
        `classifier`; ELECTRA: `classifier.dense` (+ GELU) then `classifier.out_proj`."""
        dense, _, out = LAYOUTS[self.config.model_type].head
        head = {"dense_w": w(dense + ".weight"), "dense_b": w(dense + ".bias"),
                "out_w": w(out + ".weight"), "out_b": w(out + ".bias")}
        if head["out_w"].shape[0] != labels.num_labels:
            raise ValueError(f"the classifier has {head['out_w'].shape[0]} outputs but config.json names "
                             f"{labels.num_labels} labels (id2label)")
        return head

    def classify(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[B, num_labels]` of the classification head over each sequence's first
        token: act(dense(x)) then the output projection, as the family's HF head class computes
        it (the activation: LAYOUTS' `head`; dropout is off at inference)."""
        if self.labels is None:
            raise ValueError("this checkpoint has no sequence-classification head")
        x = first_token_rows(hidden, cu_seqlens)
        act = _HEAD_ACTIVATIONS[LAYOUTS[self.config.model_type].head[1]]
        x = act(F.linear(x, self.head["dense_w"], self.head["dense_b"]))
        return F.linear(x, self.head["out_w"], self.head["out_b"]).float()

    def _intermediates(self) -> list[tuple[str, int, int, int]]:
        """(name, first op, last op, width) of one forward's intermediates, in op order. Every
        layer repeats ops 1-7 with the same sizes, so one plan serves them all; `hidden` is the
        layer input and output (LN2 writes it in place once the layer no longer reads it)."""
        h = self.config.hidden_size
        emb = [("emb", 0, 0, self.config.embedding_size)] if self.config.embedding_size is not None else []
        return emb + [
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

        # Token + token-type + position embeddings and their LayerNorm, one pass (ELECTRA's
        # narrower embeddings into `emb`, then projected to the layers' width).
        emb_out = bufs["hidden"] if self.emb_proj is None else bufs["emb"]
        if token_type_ids is None:
            h = kernels.embedding_layer_norm(input_ids, self.word_emb, positions, self.pos_emb, self.type_emb0,
                                             *self.emb_ln, cfg.layer_norm_eps, out=emb_out)
        else:
            if self.pos_type_emb is None:
                raise ValueError(f"this {cfg.model_type} checkpoint has one token type: pairs need no token_type_ids")
            rows = positions + token_type_ids * self.pos_emb.shape[0]
            h = kernels.embedding_layer_norm(input_ids, self.word_emb, rows, self.pos_type_emb, None,
                                             *self.emb_ln, cfg.layer_norm_eps, out=emb_out)
        if self.emb_proj is not None:
            h = linear_into(h, *self.emb_proj, bufs["hidden"])
        head_dim = hsz // cfg.num_heads
        # FP8 linears on many rows read their input quantised per token: the LayerNorm before an
        # FP8 QKV or FFN up projection writes that E4M3 copy too (`fp8_out`), so the linear skips
        # its own quantisation pass; h_fp8 / h1_fp8 are None where no FP8 linear takes one.
        h_fp8 = None
        for i, layer in enumerate(self.layers):
            # The QKV bias rides in the GEMM's epilogue; q, k and v are strided views of its
            # output (the attention kernel reads strides), so no split/copy pass is needed.
            qkv = linear_into(h if h_fp8 is None else h_fp8, layer["qkv_w"], layer["qkv_b"],
                              bufs["qkv"]).view(-1, 3, cfg.num_heads, head_dim)
            ctx = bufs["ctx"]
            ctx = None if ctx is None else ctx.view(-1, cfg.num_heads, head_dim)
            if self.relative_bias is None:
                ctx = kernels.varlen_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, causal=False,
                                               max_seqlen_q=max_seqlen, out=ctx)
            else:
                ctx = kernels.relative_bias_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, self.relative_bias,
                                                      max_seqlen=max_seqlen, out=ctx)
            attn_out = linear_into(ctx.reshape(-1, hsz), layer["out_w"], None, bufs["attn_out"])
            h1_fp8 = _fp8_operand(layer["ffn_in_w"], total, hsz, self.dtype, h.device)
            h1 = kernels.add_bias_residual_layer_norm(
                attn_out, layer["out_b"], h, *layer["ln1"], cfg.layer_norm_eps, out=bufs["h1"], fp8_out=h1_fp8
            )
            # FP8 FFN on many rows: the down projection takes the activation quantised, act + quantise in
            # one pass after the up projection's GEMM (`fp8_out`, kernels/triton_fp8.py); ffn is then an
            # Fp8Activation, not written to bufs["ffn"]. Elsewhere fp8_out changes nothing.
            ffn = kernels.linear_act(h1 if h1_fp8 is None else h1_fp8, layer["ffn_in_w"], layer["ffn_in_b"],
                                     self.activation, out=bufs["ffn"],
                                     fp8_out=isinstance(layer["ffn_out_w"], Fp8Weight))
            ffn_out = linear_into(ffn, layer["ffn_out_w"], None, bufs["ffn_out"])
            following = self.layers[i + 1]["qkv_w"] if i + 1 < len(self.layers) else None
            h_fp8 = _fp8_operand(following, total, hsz, self.dtype, h.device)
            h = kernels.add_bias_residual_layer_norm(
                ffn_out, layer["ffn_out_b"], h1, *layer["ln2"], cfg.layer_norm_eps,
                out=h if arena is not None else None, fp8_out=h_fp8
            )
        return h


def from_hf(cfg: dict) -> BertConfig:
    """The family-table entry point (models/encoder.py)."""
    return BertConfig.from_hf(cfg)


MODEL = BertEncoder


def linear_into(x: torch.Tensor | Fp8Activation, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None,
                out: torch.Tensor | None):
    """x @ weight^T (+ bias in the GEMM epilogue), into `out` when given (an arena view). An FP8
    weight runs kernels.linear_act, which routes it (kernels/fp8.py) and takes x quantised
    already (an Fp8Activation: a previous FP8 linear's `fp8_out`). The encoder families' linears
    (BERT's, ModernBERT's, DeBERTa's)."""
    if isinstance(weight, Fp8Weight):
        return kernels.linear_act(x, weight, bias, out=out)
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def _fp8_operand(weight, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> Fp8Activation | None:
    """An empty Fp8Activation `[rows, width]` for a norm to fill where a linear of `weight` takes
    its input quantised (an FP8 weight on many rows: fp8.quantizes_activations), else None."""
    return Fp8Activation.empty(rows, width, dtype, device) if fp8.quantizes_activations(weight, rows) else None


def sinusoidal_table(positions: int, width: int) -> torch.Tensor:
    """DistilBERT's fixed position table `[positions, width]` (fp32): sin(p / 10000^(2(j//2)/width))
    in even columns j, cos in odd ones."""
    p = torch.arange(positions, dtype=torch.float64)[:, None]
    j = torch.arange(width, dtype=torch.float64)[None, :]
    angle = p / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / width)
    return torch.where(j.long() % 2 == 0, torch.sin(angle), torch.cos(angle)).float()


def relative_bucket(distance: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """The T5 bidirectional bucket of key-minus-query distances (MPNet's): half the buckets per
    direction (keys after the query in the upper half); within one, distances below a quarter of
    the buckets exactly, then log-spaced up to `max_distance`, the last bucket past it."""
    half = num_buckets // 2
    exact = half // 2
    n = -distance
    bucket = (n < 0).long() * half
    n = n.abs()
    log_spaced = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                          * (half - exact)).long()
    return bucket + torch.where(n < exact, n, log_spaced.clamp(max=half - 1))


def relative_bias_by_distance(table: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """`table` [num_buckets, heads] (MPNet's relative_attention_bias) as kernels.relative_bias_attention's
    `[heads, 2R + 1]` fp32 bias by distance j - i clamped to [-R, R], R = max_distance (every
    distance of R or more falls in its direction's last bucket)."""
    distance = torch.arange(-max_distance, max_distance + 1, device=table.device)
    return table.float()[relative_bucket(distance, num_buckets, max_distance)].t().contiguous()


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
