"""What every encoder family gives the encoder engine, and how a checkpoint picks its family.

The `embedder`, `reranker` and `classifier` models all run one engine over one packed,
padding-free batch of token sequences; they differ only in what they read off the last hidden
state (pooled vectors, or the checkpoint's sequence-classification head). A family is one file
under backend/models/ plus one line in ENCODER_FAMILIES, like the decoder families; decoder
families that embed go through decoder_encoder.py.

The contract a family's model class satisfies (`Encoder` below, written for implementers):

- `config`: at least `vocab_size`, `hidden_size`, `max_tokens_per_sequence` (the longest input
  the model reads, special tokens included) and `position_offset` (the first position id: 2 for
  RoBERTa/XLM-R, whose table starts at padding_idx + 1; 0 for BERT and for rotary families).
  The CUDA graphs fill `positions` as 0.. + position_offset. Optional `type_vocab_size`
  (token types; absent = 1): only with more than one does the reranker send segment ids.
- `device`, `dtype`: where and in which precision the weights live.
- `forward(input_ids [T], cu_seqlens [B+1] int32, max_seqlen=None, positions=None, arena=None,
  token_type_ids=None) -> [T, hidden]`: all sequences concatenated, no padding; `max_seqlen`
  (when the caller knows it) saves a device sync; `positions` default to 0.. within each
  sequence plus `position_offset`; with an `arena` (encoder/activation_arena.py) intermediates
  are views of its planned memory and the result is valid until the arena's next forward;
  `token_type_ids [T]` (segment ids of a text pair) are None for one segment and may be ignored
  by families without token types (they raise if asked for a segment they cannot embed).
- `usage_records(total_tokens) -> list[UsageRecord]`: one forward's intermediates for the
  activation arena (sizes in bytes at that many tokens).
- `labels`: a `ClassifierLabels` when the checkpoint has a sequence-classification head
  (`*ForSequenceClassification`), else None; `classify(hidden [T, hidden], cu_seqlens) ->
  [B, num_labels]` fp32 logits from that head, applied as the family's Hugging Face class does
  (BERT: pooler dense + tanh on each sequence's first token, then the classifier; RoBERTa /
  XLM-R / MPNet: dense + tanh + out_proj on the first token; DistilBERT: pre_classifier + ReLU,
  then the classifier; ELECTRA: dense + GELU + out_proj; bert.py's LAYOUTS). Probabilities
  are not the family's business: encoder/heads.py applies one rule to every family.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

import torch

from tritonformer.backend.encoder.activation_arena import ActivationArena, UsageRecord


@dataclass(frozen=True)
class ClassifierLabels:
    """A classification head's label set, from config.json (`id2label`, `problem_type`)."""

    names: tuple[str, ...]  # index -> label name (id2label)
    multi_label: bool  # problem_type multi_label_classification: independent sigmoids

    @property
    def num_labels(self) -> int:
        return len(self.names)

    @classmethod
    def from_hf(cls, hf_config: dict) -> "ClassifierLabels":
        """Hugging Face writes `id2label` with string keys; without it a head has `num_labels`
        (default 2) labels named LABEL_i, as `PretrainedConfig` names them."""
        id2label = hf_config.get("id2label")
        if id2label:
            by_index = {int(k): str(v) for k, v in id2label.items()}
            names = tuple(by_index[i] for i in range(len(by_index)))
        else:
            names = tuple(f"LABEL_{i}" for i in range(int(hf_config.get("num_labels", 2))))
        return cls(names, hf_config.get("problem_type") == "multi_label_classification")


def first_token_rows(hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Each packed sequence's first row (its [CLS] / <s> token): `[B, hidden]`."""
    return hidden.index_select(0, cu_seqlens[:-1].long())


class Encoder(Protocol):
    """See the module docstring for the meaning of each member."""

    config: object
    device: torch.device
    dtype: torch.dtype
    labels: ClassifierLabels | None

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int | None = None,
                positions: torch.Tensor | None = None, arena: ActivationArena | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor: ...

    def usage_records(self, total_tokens: int) -> list[UsageRecord]: ...

    def classify(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor: ...


# model_type -> the module of its family under backend/models/. A family module has
# `from_hf(hf_config: dict) -> its config` (raising ValueError for what it cannot run) and
# `MODEL`, the class built as MODEL(config, state, device, dtype, labels) where `labels` is the
# ClassifierLabels of a checkpoint with a classification head (None otherwise; the family finds
# its head's tensors in `state`). Adding a family: one file and one line here (a family that runs
# BERT's post-LN block: a Layout in bert.py's LAYOUTS and one line).
ENCODER_FAMILIES = {
    "bert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
    "camembert": "bert",
    "distilbert": "bert",
    "electra": "bert",
    "mpnet": "bert",
    "modernbert": "modernbert",
    "deberta-v2": "deberta_v2",  # DeBERTa-v2 / v3 (v1's "deberta" is refused: not in this table)
    # Decoders that embed or score (Qwen3-Embedding, gte-Qwen2, e5-mistral, decoder rerankers).
    **{t: "decoder_encoder" for t in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3")},
}


def has_classification_head(hf_config: dict) -> bool:
    """Whether config.json names a `*ForSequenceClassification` architecture."""
    return any(a.endswith("ForSequenceClassification") for a in hf_config.get("architectures") or ())


def load_encoder(hf_config: dict, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 score_token_ids: tuple[int, ...] = ()) -> Encoder:
    """The encoder family named by the checkpoint's `model_type`, built on `device` in `dtype`,
    with its classification head when config.json names a `*ForSequenceClassification` class.
    `state` holds the checkpoint's tensors with the head class's prefix (`bert.`, `roberta.`,
    `model.`) stripped, as checkpoints.weights.load_state_dict returns them.

    `score_token_ids` (a decoder checkpoint's, the reranker's `score_tokens`): a one-label head
    made of the output head's rows, the logit of one token or the difference of two ("no",
    "yes": sigmoid of it is P(yes) against P(no), a causal-LM reranker's score: Qwen3-Reranker)."""
    model_type = hf_config.get("model_type", "bert")
    if model_type not in ENCODER_FAMILIES:
        raise ValueError(f"unsupported encoder model_type {model_type!r} (supported: {', '.join(ENCODER_FAMILIES)})")
    family = importlib.import_module(f"tritonformer.backend.models.{ENCODER_FAMILIES[model_type]}")
    labels = ClassifierLabels.from_hf(hf_config) if has_classification_head(hf_config) else None
    if score_token_ids:
        if not hasattr(family, "token_score_state"):
            raise ValueError(f"score_tokens needs a decoder checkpoint (model_type {model_type!r} has no next-token "
                             f"logits)")
        state, labels = family.token_score_state(hf_config, state, score_token_ids), ClassifierLabels(("score",), False)
    return family.MODEL(family.from_hf(hf_config), state, device, dtype, labels)
