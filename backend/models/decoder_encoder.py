"""Embedders and classifiers built on a decoder family: Qwen3-Embedding, gte-Qwen2, e5-mistral;
Qwen2 / Qwen3 / Llama / Mistral / Gemma `*ForSequenceClassification` cross-encoders.

The encoder contract (models/encoder.py) over the shared decoder (transformer.py): each packed
sequence is a prompt that the decoder prefills whole, causal attention and all, into a scratch
paged KV cache that nothing reads after the forward (the generator's prefill path, so every
decoder family's features come along). The result is the final norm's rows, Hugging Face's
`*Model` last_hidden_state. Such embedders pool each sequence's last token (sentence-transformers'
`pooling_mode_lasttoken`: kernels.pool_sequences "last"); a classification head (`score`, a
linear without bias) reads the last token too, as `*ForSequenceClassification` does for
sequences without padding.

Small batches replay CUDA graphs like every encoder's (backend/cuda_graphs.py): on a GPU the
scratch cache is made once, large enough for the largest graph bucket, so that no later batch
moves it under a captured graph; a batch larger than that gets a cache of its own for its forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonformer import kernels
from tritonformer.backend.cuda_graphs import SEQUENCE_BUCKETS, TOKEN_BUCKETS
from tritonformer.backend.decoder.batch import whole_prompts_batch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.encoder.activation_arena import UsageRecord
from tritonformer.backend.models.decoder import decoder_family
from tritonformer.backend.models.encoder import ClassifierLabels
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder

BLOCK_SIZE = 16  # the scratch cache's block: the paged attention kernels' smallest
# The blocks whole_prompts_batch asks for at the largest graph bucket: its tokens' blocks plus
# one partly filled block per sequence.
GRAPH_BLOCKS = TOKEN_BUCKETS[-1] // BLOCK_SIZE + SEQUENCE_BUCKETS[-1]


@dataclass(frozen=True)
class DecoderEncoderConfig:
    decoder: DecoderSpec
    vocab_size: int
    hidden_size: int
    max_tokens_per_sequence: int
    position_offset: int = 0


def from_hf(cfg: dict) -> DecoderEncoderConfig:
    if cfg.get("use_bidirectional_attention"):  # (EmbeddingGemma: its attention is not causal)
        raise ValueError(f"model_type {cfg.get('model_type')!r} with bidirectional attention is not supported as an "
                         f"encoder (decoder-based encoders here attend causally)")
    family, cfg, _ = decoder_family(cfg, {})
    spec = family.from_hf(cfg)
    if not isinstance(spec, DecoderSpec):
        raise ValueError(f"model_type {cfg.get('model_type')!r} does not embed (the decoder families built on "
                         f"the shared decoder do)")
    if spec.mixers:  # (whole prompts in one pass over a scratch cache: no per-sequence state slots)
        raise ValueError(f"model_type {cfg.get('model_type')!r} has recurrent layers and is not supported as an "
                         f"encoder (supported: decoder families whose layers all attend)")
    return DecoderEncoderConfig(spec, spec.vocab_size, spec.hidden_size, spec.max_position_embeddings)


def token_score_state(cfg: dict, state: dict, token_ids: tuple[int, ...]) -> dict:
    """`state` with a one-label `score.weight` made of the output head's rows (the input embedding
    where they are tied): row a, or row b minus row a for (a, b), so that score @ h is the next
    token's logit, or logit(b) - logit(a) (models/encoder.load_encoder)."""
    spec = from_hf(cfg).decoder
    head_name = spec.names.embed if spec.tie_word_embeddings or spec.names.lm_head not in state else spec.names.lm_head
    if head_name not in state:
        raise KeyError(f"checkpoint is missing weight {head_name!r} (score_tokens reads the output head)")
    head = state[head_name]
    rows = [head[t : t + 1].float() for t in token_ids]
    score = rows[0] if len(rows) == 1 else rows[1] - rows[0]
    return {**state, "score.weight": score}


class DecoderEncoder:
    def __init__(self, config: DecoderEncoderConfig, state: dict, device: torch.device, dtype: torch.dtype,
                 labels: ClassifierLabels | None = None):
        self.config, self.device, self.dtype, self.labels = config, device, dtype, labels
        self.decoder = TransformerDecoder(config.decoder, state, device, dtype)
        self.score = None
        if labels is not None:
            if "score.weight" not in state:
                raise KeyError("checkpoint is missing weight 'score.weight' (the classification head)")
            self.score = self.decoder.weight("score.weight")
            if tuple(self.score.shape) != (labels.num_labels, config.hidden_size):
                raise ValueError(f"checkpoint tensor 'score.weight' has shape {tuple(self.score.shape)}, but the "
                                 f"config needs ({labels.num_labels}, {config.hidden_size})")
        self._cache: PagedKVCache | None = None

    def _scratch(self, blocks: int) -> PagedKVCache:
        """The kept scratch cache when it holds `blocks`, else one for this forward alone. The
        kept one never moves once made (captured graphs hold its address); on a GPU it is made
        for the largest graph bucket at once, on the CPU (no graphs) as large as the first batch."""
        if self._cache is None:
            floor = GRAPH_BLOCKS if self.device.type == "cuda" else 0
            self._cache = self.decoder.new_kv_cache(max(blocks, floor), BLOCK_SIZE)
        if self._cache.num_blocks >= blocks:
            return self._cache
        return self.decoder.new_kv_cache(blocks, BLOCK_SIZE)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int | None = None,
                positions: torch.Tensor | None = None, arena=None, token_type_ids: torch.Tensor | None = None):
        if token_type_ids is not None and bool((token_type_ids != 0).any()):
            raise ValueError("a decoder-based encoder has one token type: send the pair as one text")
        if max_seqlen is None:
            max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0
        if input_ids.numel() == 0:
            return torch.empty(0, self.config.hidden_size, device=self.device, dtype=self.dtype)
        batch, blocks = whole_prompts_batch(input_ids, cu_seqlens, max_seqlen, BLOCK_SIZE, positions)
        return self.decoder.hidden_states(batch, self._scratch(blocks))

    def usage_records(self, total_tokens: int) -> list[UsageRecord]:
        return []  # (its intermediates are the decoder's own allocations, not the arena's)

    def classify(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        last = hidden.index_select(0, (cu_seqlens[1:] - 1).long())
        return kernels.linear_act(last, self.score).float()


MODEL = DecoderEncoder
