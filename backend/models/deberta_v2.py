"""DeBERTa-v2 / v3 (`model_type` deberta-v2: microsoft/deberta-v3-base and -large and the
classifiers fine-tuned from them: NLI zero-shot, prompt-injection detectors, cross-encoder
rerankers) over packed, padding-free batches, with DebertaV2ForSequenceClassification's head.

The math, written from Hugging Face's modeling_deberta_v2.py:

- Embeddings: word embeddings (`embedding_size` wide), + absolute position embeddings only with
  `position_biased_input` (v3: false, no table), + token-type embeddings when `type_vocab_size`
  > 0, then a bias-free projection to `hidden_size` when `embedding_size` differs, then LayerNorm.
- Post-LN blocks as BERT's: h1 = LN(x + Wo attn(x)), out = LN(h1 + W2 act(W1 h1)).
- Relative positions: the encoder's `rel_embeddings` (2 * span rows, span = `position_buckets`,
  or `max_relative_positions` without buckets; that one -1 means `max_position_embeddings`), put
  through the encoder's LayerNorm (`norm_rel_ebd` "layer_norm"). With `share_att_key` each layer
  projects them with its own query and key projections (biases included): pos_q = Wq rel + bq,
  pos_k = Wk rel + bk, `[2 * span, H, D]`. These depend on the weights only: computed at load.
- The relative distance d = i - j (query i, key j) is log-bucketed: |d| <= mid = buckets // 2
  stays d; beyond, sign(d) * (mid + ceil(log(|d| / mid) / log((max_rel - 1) / mid) * (mid - 1))).
  Its column is idx(d) = clamp(bucket(d) + span, 0, 2 * span - 1).
- Attention (`pos_att_type` c2p and p2c), for head h:
  score(i, j) = (q_i . k_j + q_i . pos_k[idx(i - j)] + k_j . pos_q[idx(i - j)]) / sqrt(D * 3).
  Hugging Face writes the p2c column as clamp(span - bucket(j - i)); the bucket is odd in d, so
  that is idx(i - j), the c2p column (checked when the table is built). The scale counts one
  term per position type: sqrt(D * (1 + 2)).
- DebertaV2ForSequenceClassification: ContextPooler (dense on the first token, then
  `pooler_hidden_act`, GELU by default), then the classifier linear.

How it runs: one `[total_tokens, hidden]` activation. Per layer, the QKV GEMM (q, k, v are strided
views of its output), two batched GEMMs for every token's position scores c2p[t, h, r] = q_t .
pos_k[h, r] and p2c[t, h, r] = k_t . pos_q[h, r] (`[T, H, 2 * span]`), then kernels.
disentangled_attention (a flash-attention kernel that gathers c2p[i, idx(i - j)] and
p2c[j, idx(i - j)] per (i, j) through `rel_index`, the column of each clamped distance, a table
built here once with the bucket formula above, so the rounding is the host's), then BERT's
fused bias + residual + LayerNorm kernels. The position-score GEMMs cover only the columns the
batch's longest sequence reaches (63 of 512 for 32-token sequences, 385 for 256, nearly all from
512 on). The family contract is in models/encoder.py.

Refused at load, by name: `relative_attention` false, `share_att_key` false (separate position
projections), a `pos_att_type` other than exactly c2p and p2c, `conv_kernel_size` > 0
(DeBERTa-v2-xlarge/xxlarge's convolution after the first layer), `norm_rel_ebd` other than
layer_norm, `attention_head_size` other than hidden_size / heads, `pooler_hidden_size` other than
hidden_size; DeBERTa v1 (`model_type` deberta) is not this family.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonformer import kernels
from tritonformer.backend.checkpoints.weights import weight_getter
from tritonformer.backend.encoder.activation_arena import ActivationArena, UsageRecord, buffer_getter
from tritonformer.backend.models.bert import linear_into, position_ids
from tritonformer.backend.models.encoder import ClassifierLabels, first_token_rows
from tritonformer.kernels.fp8 import cat_rows

# config `pooler_hidden_act` -> the function the head applies (on fp32 values)
_POOLER_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "tanh": torch.tanh, "relu": F.relu, "silu": F.silu, "swish": F.silu,
}
_GELU_APPROXIMATE = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
_PREFIX = "deberta."  # DebertaV2For*'s prefix of the bare model's tensors


@dataclass(frozen=True)
class DebertaV2Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    layer_norm_eps: float
    hidden_act: str
    embedding_size: int
    position_biased_input: bool
    type_vocab_size: int  # 0: no token-type table (v3)
    position_buckets: int  # <= 0: no log buckets
    max_relative_positions: int  # resolved: -1 in config.json means max_position_embeddings
    pooler_hidden_act: str = "gelu"
    position_offset: int = 0  # absolute positions (with position_biased_input) count from 0

    @classmethod
    def from_hf(cls, cfg: dict) -> "DebertaV2Config":
        model_type = cfg.get("model_type", "deberta-v2")
        if model_type != "deberta-v2":
            raise ValueError(f"not a DeBERTa-v2/v3 config: model_type {model_type!r} (DeBERTa v1, 'deberta', "
                             "is not supported)")
        if not cfg.get("relative_attention", False):
            raise ValueError("relative_attention false is not supported (DeBERTa-v2/v3 run relative attention)")
        if not cfg.get("share_att_key", False):
            raise ValueError("share_att_key false is not supported (separate pos_key_proj / pos_query_proj)")
        pos_att_type = cfg.get("pos_att_type") or []
        if isinstance(pos_att_type, str):
            pos_att_type = [x.strip() for x in pos_att_type.lower().split("|")]
        if sorted(pos_att_type) != ["c2p", "p2c"]:
            raise ValueError(f"pos_att_type {'|'.join(pos_att_type)!r} is not supported (supported: c2p|p2c)")
        if cfg.get("conv_kernel_size", 0) > 0:
            raise ValueError(f"conv_kernel_size {cfg['conv_kernel_size']} is not supported (DeBERTa-v2-xlarge's "
                             "convolution layer)")
        norm_rel = [x.strip() for x in str(cfg.get("norm_rel_ebd", "none")).lower().split("|")]
        if norm_rel != ["layer_norm"]:
            raise ValueError(f"norm_rel_ebd {cfg.get('norm_rel_ebd')!r} is not supported (supported: layer_norm)")
        hidden, heads = cfg.get("hidden_size", 1536), cfg.get("num_attention_heads", 24)
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        if cfg.get("attention_head_size", hidden // heads) != hidden // heads:
            raise ValueError(f"attention_head_size {cfg['attention_head_size']} is not supported "
                             f"(supported: hidden_size / num_attention_heads = {hidden // heads})")
        if cfg.get("pooler_hidden_size", hidden) != hidden:
            raise ValueError(f"pooler_hidden_size {cfg['pooler_hidden_size']} other than hidden_size is not supported")
        act = cfg.get("hidden_act", "gelu")
        if act not in _GELU_APPROXIMATE:
            raise ValueError(f"unsupported hidden_act {act!r} (supported: {', '.join(_GELU_APPROXIMATE)})")
        pooler_act = cfg.get("pooler_hidden_act", "gelu")
        if pooler_act not in _POOLER_ACTIVATIONS:
            raise ValueError(f"unsupported pooler_hidden_act {pooler_act!r} "
                             f"(supported: {', '.join(_POOLER_ACTIVATIONS)})")
        max_pos = cfg.get("max_position_embeddings", 512)
        max_rel = cfg.get("max_relative_positions", -1)
        return cls(
            vocab_size=cfg.get("vocab_size", 128100),
            hidden_size=hidden,
            num_layers=cfg.get("num_hidden_layers", 24),
            num_heads=heads,
            intermediate_size=cfg.get("intermediate_size", 6144),
            max_position_embeddings=max_pos,
            layer_norm_eps=cfg.get("layer_norm_eps", 1e-7),
            hidden_act=act,
            embedding_size=cfg.get("embedding_size") or hidden,
            position_biased_input=bool(cfg.get("position_biased_input", True)),
            type_vocab_size=int(cfg.get("type_vocab_size", 0)),
            position_buckets=int(cfg.get("position_buckets", -1)),
            max_relative_positions=max_rel if max_rel >= 1 else max_pos,
            pooler_hidden_act=pooler_act,
        )

    @property
    def max_tokens_per_sequence(self) -> int:
        """The length the checkpoints are trained to (relative positions have no table to run
        past: longer inputs run, every distance past the buckets' reach in the last column)."""
        return self.max_position_embeddings

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def att_span(self) -> int:
        """Half the relative-embedding rows: `position_buckets`, or `max_relative_positions`."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions


def log_bucket(distance: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """Hugging Face's log-bucketed relative position of integer distances (fp32 on the host):
    |d| <= mid = buckets // 2 stays d, beyond it sign(d) * (mid + ceil(log(|d| / mid) /
    log((max_position - 1) / mid) * (mid - 1)))."""
    mid = buckets // 2
    magnitude = distance.abs()
    # Distances within mid take mid - 1 in the log (a value the result never uses) so it stays finite.
    safe = torch.where(magnitude < mid, torch.full_like(magnitude, mid - 1), magnitude)
    log_pos = torch.ceil(torch.log(safe / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                         * (mid - 1)) + mid
    return torch.where(safe <= mid, distance.float(), log_pos * torch.sign(distance))


def relative_column_table(config: DebertaV2Config) -> torch.Tensor:
    """int32 `[2 * reach + 1]`: the position-score column idx(d) of each distance d = i - j in
    [-reach, reach] (entry d + reach), saturated past reach: clamp(bucket(d) + span, 0, 2 * span - 1),
    with bucket(d) = d when the config has no buckets."""
    span = config.att_span

    def columns(distance: torch.Tensor) -> torch.Tensor:
        bucket = (log_bucket(distance, config.position_buckets, config.max_relative_positions).long()
                  if config.position_buckets > 0 else distance)
        return (bucket + span).clamp(0, 2 * span - 1)

    reach = max(config.max_relative_positions, span) + 1
    distance = torch.arange(-reach, reach + 1)
    table = columns(distance)
    # The kernel clamps every distance to +-reach: the columns must already be constant there.
    far = columns(torch.tensor([-100 * reach - 7, 100 * reach + 7]))
    if far[0] != table[0] or far[1] != table[-1]:
        raise ValueError("relative positions do not saturate within the table's reach")
    # Hugging Face's p2c column for key j against query i is clamp(span - bucket(j - i)): the same
    # column as c2p's clamp(bucket(i - j) + span) because the bucket is odd in the distance.
    p2c = (span - (log_bucket(-distance, config.position_buckets, config.max_relative_positions).long()
                   if config.position_buckets > 0 else -distance)).clamp(0, 2 * span - 1)
    if not torch.equal(p2c, table):
        raise ValueError("the c2p and p2c position columns differ for this bucket configuration")
    return table.to(torch.int32)


class DebertaV2Encoder:
    """Weights plus a forward over packed sequences (models/encoder.py's `Encoder`). Not an
    nn.Module: inference only."""

    # Each layer's linear weights: what quantization fp8 turns into FP8 (backend/quantization.py);
    # the position projections (computed at load) stay in the model's dtype, the classification head in fp32.
    LINEAR_WEIGHTS = ("qkv_w", "out_w", "ffn_in_w", "ffn_out_w")

    def __init__(self, config: DebertaV2Config, state: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, labels: ClassifierLabels | None = None):
        """`state`: the checkpoint's tensors (the bare model's under `deberta.` or without a
        prefix). `labels`: the checkpoint has a sequence-classification head with these labels;
        None: the bare encoder."""
        self.config = config
        self.device = device
        self.dtype = dtype
        self.activation = kernels.gelu_activation(_GELU_APPROXIMATE[config.hidden_act])
        state = {k[len(_PREFIX):] if k.startswith(_PREFIX) else k: t for k, t in state.items()}
        w = weight_getter(state, device, dtype)
        w32 = weight_getter(state, device, torch.float32)

        self.word_emb = w("embeddings.word_embeddings.weight")
        self.pos_emb = w("embeddings.position_embeddings.weight") if config.position_biased_input else None
        self.type_emb = w("embeddings.token_type_embeddings.weight") if config.type_vocab_size > 0 else None
        self.embed_proj = (w("embeddings.embed_proj.weight") if config.embedding_size != config.hidden_size
                           else None)
        self.emb_ln = (w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
        span = config.att_span
        rel = w32("encoder.rel_embeddings.weight")
        if rel.shape[0] < 2 * span:
            raise ValueError(f"encoder.rel_embeddings has {rel.shape[0]} rows, expected 2 * {span}")
        rel = F.layer_norm(rel[: 2 * span], (config.hidden_size,), w32("encoder.LayerNorm.weight"),
                           w32("encoder.LayerNorm.bias"), config.layer_norm_eps)
        table = relative_column_table(config)
        self.rel_index = table.to(device)
        self._columns = table.tolist()  # host copy: a forward picks its column range without a device sync
        heads, head_dim = config.num_heads, config.head_dim
        self.layers = []
        for i in range(config.num_layers):
            p = f"encoder.layer.{i}."
            att = p + "attention.self."

            def position_proj(name: str) -> torch.Tensor:
                """The layer's own projection of the normed relative embeddings (share_att_key),
                computed in fp32, stored in the model's dtype as `[H, D, 2 * span]`, the batched
                GEMM's right operand."""
                proj = F.linear(rel, w32(att + name + ".weight"), w32(att + name + ".bias"))
                return proj.view(2 * span, heads, head_dim).permute(1, 2, 0).contiguous().to(dtype)

            self.layers.append({
                "qkv_w": cat_rows([w(att + "query_proj.weight"), w(att + "key_proj.weight"),
                                   w(att + "value_proj.weight")]),
                "qkv_b": torch.cat([w(att + "query_proj.bias"), w(att + "key_proj.bias"), w(att + "value_proj.bias")]),
                "pos_k": position_proj("key_proj"),
                "pos_q": position_proj("query_proj"),
                "out_w": w(p + "attention.output.dense.weight"),
                "out_b": w(p + "attention.output.dense.bias"),
                "ln1": (w(p + "attention.output.LayerNorm.weight"), w(p + "attention.output.LayerNorm.bias")),
                "ffn_in_w": w(p + "intermediate.dense.weight"),
                "ffn_in_b": w(p + "intermediate.dense.bias"),
                "ffn_out_w": w(p + "output.dense.weight"),
                "ffn_out_b": w(p + "output.dense.bias"),
                "ln2": (w(p + "output.LayerNorm.weight"), w(p + "output.LayerNorm.bias")),
            })
        self.scale = 1.0 / math.sqrt(head_dim * 3)  # one term each for content, c2p and p2c
        self.labels = labels
        self.head = None
        if labels is not None:
            self.head = {"dense_w": w32("pooler.dense.weight"), "dense_b": w32("pooler.dense.bias"),
                         "out_w": w32("classifier.weight"), "out_b": w32("classifier.bias")}
            if self.head["out_w"].shape[0] != labels.num_labels:
                raise ValueError(f"the classifier has {self.head['out_w'].shape[0]} outputs but config.json names "
                                 f"{labels.num_labels} labels (id2label)")

    def classify(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[B, num_labels]`: DebertaV2ForSequenceClassification's ContextPooler
        (dense on each sequence's first token, then `pooler_hidden_act`), then the classifier
        (dropout is off at inference), in fp32."""
        if self.head is None:
            raise ValueError("this checkpoint has no sequence-classification head")
        x = first_token_rows(hidden, cu_seqlens).float()
        x = _POOLER_ACTIVATIONS[self.config.pooler_hidden_act](F.linear(x, self.head["dense_w"], self.head["dense_b"]))
        return F.linear(x, self.head["out_w"], self.head["out_b"])

    def _intermediates(self) -> list[tuple[str, int, int, int]]:
        """(name, first op, last op, width per token) of one layer's intermediates in op order:
        1 QKV GEMM, 2 the position-score GEMMs, 3 attention, 4 output GEMM, 5 bias + residual +
        LN, 6 FFN in + GELU, 7 FFN out, 8 bias + residual + LN into `hidden` (the layer's input
        and output). c2p and p2c are `[H, T, 2 * span]` each."""
        cfg = self.config
        h, scores = cfg.hidden_size, cfg.num_heads * 2 * cfg.att_span
        return [
            ("hidden", 0, 8, h), ("qkv", 1, 3, 3 * h), ("c2p", 2, 3, scores), ("p2c", 2, 3, scores),
            ("ctx", 3, 4, h), ("attn_out", 4, 5, h), ("h1", 5, 8, h), ("ffn", 6, 7, cfg.intermediate_size),
            ("ffn_out", 7, 8, h),
        ]

    def usage_records(self, total_tokens: int) -> list[UsageRecord]:
        """The intermediates' usage records for the activation allocator."""
        e = self.dtype.itemsize
        return [UsageRecord(name, first, last, total_tokens * width * e)
                for name, first, last, width in self._intermediates()]

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor | None,
               out: torch.Tensor | None) -> torch.Tensor:
        """LayerNorm(proj(word + position + token type)), the sum in fp32 as Hugging Face's in
        the model's dtype would round it no finer."""
        cfg = self.config
        if token_type_ids is not None and (self.type_emb is None or self.type_emb.shape[0] < 2):
            raise ValueError(f"this DeBERTa checkpoint has {cfg.type_vocab_size} token types: pairs need no "
                             "token_type_ids")
        if self.embed_proj is None and self.pos_emb is not None and token_type_ids is None:
            bias = None if self.type_emb is None else self.type_emb[0]
            return kernels.embedding_layer_norm(input_ids, self.word_emb, positions, self.pos_emb, bias,
                                                *self.emb_ln, cfg.layer_norm_eps, out=out)
        rows = self.word_emb.index_select(0, input_ids)
        extra = None  # what is added to the word rows: position rows, token-type rows
        if self.pos_emb is not None:
            extra = self.pos_emb.index_select(0, positions)
        if self.type_emb is not None:
            types = (self.type_emb[0].expand_as(rows) if token_type_ids is None
                     else self.type_emb.index_select(0, token_type_ids))
            extra = types if extra is None else extra + types
        if self.embed_proj is not None:
            if extra is not None:
                rows = rows + extra
            rows, extra = F.linear(rows, self.embed_proj), None
        return kernels.add_bias_residual_layer_norm(rows, None, extra, *self.emb_ln, cfg.layer_norm_eps, out=out)

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
        last hidden state `[T, hidden]`. `max_seqlen` (the longest sequence), when the caller
        knows it, saves a device sync. `positions` (absolute, read only with
        position_biased_input) default to 0.. within each sequence; the relative positions are
        always 0.. within each sequence. With an `arena`, intermediates are views of its planned
        memory and the result is valid until the arena's next forward. `token_type_ids` `[T]`
        only for checkpoints with more than one token type."""
        cfg = self.config
        total, hsz, heads, head_dim = input_ids.shape[0], cfg.hidden_size, cfg.num_heads, cfg.head_dim
        if max_seqlen is None:
            max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if total else 0
        if positions is None and self.pos_emb is not None:
            positions = position_ids(cu_seqlens, total, 0)
        widths = {name: width for name, _, _, width in self._intermediates()}
        buf = buffer_getter(arena, self.usage_records(total), widths, total, self.device, self.dtype)

        # Only the columns the batch's distances reach (|i - j| < max_seqlen; the table is monotone):
        # a batch of 32-token sequences needs 63 of deberta-v3's 512.
        reach = (len(self._columns) - 1) // 2
        near = min(max(max_seqlen - 1, 0), reach)
        first, last = self._columns[reach - near], self._columns[reach + near]
        width = last - first + 1

        def scores(name: str) -> torch.Tensor:
            return buf(name).view(-1)[: heads * total * width].view(heads, total, width)

        h = self._embed(input_ids, positions, token_type_ids, buf("hidden"))
        for layer in self.layers:
            qkv = linear_into(h, layer["qkv_w"], layer["qkv_b"], buf("qkv")).view(total, 3, heads, head_dim)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
            # every token's scores against those relative-position columns: [H, T, D] @ [H, D, width]
            c2p = torch.bmm(q.transpose(0, 1), layer["pos_k"][:, :, first : last + 1], out=scores("c2p"))
            p2c = torch.bmm(k.transpose(0, 1), layer["pos_q"][:, :, first : last + 1], out=scores("p2c"))
            ctx = kernels.disentangled_attention(q, k, v, c2p.transpose(0, 1), p2c.transpose(0, 1), self.rel_index,
                                                 cu_seqlens, self.scale, max_seqlen,
                                                 out=buf("ctx").view(total, heads, head_dim), first_column=first)
            attn_out = linear_into(ctx.view(total, hsz), layer["out_w"], None, buf("attn_out"))
            h1 = kernels.add_bias_residual_layer_norm(attn_out, layer["out_b"], h, *layer["ln1"], cfg.layer_norm_eps,
                                                      out=buf("h1"))
            ffn = kernels.linear_act(h1, layer["ffn_in_w"], layer["ffn_in_b"], self.activation,
                                     out=buf("ffn") if arena is not None else None)
            ffn_out = linear_into(ffn, layer["ffn_out_w"], None, buf("ffn_out"))
            h = kernels.add_bias_residual_layer_norm(ffn_out, layer["ffn_out_b"], h1, *layer["ln2"],
                                                     cfg.layer_norm_eps, out=h)
        return h


def from_hf(cfg: dict) -> DebertaV2Config:
    """The family-table entry point (models/encoder.py)."""
    return DebertaV2Config.from_hf(cfg)


MODEL = DebertaV2Encoder
