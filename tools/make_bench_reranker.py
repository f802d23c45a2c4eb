"""A random-weight cross-encoder checkpoint for the served reranker benchmark, on a machine
without internet.

    python3 tools/make_bench_reranker.py OUT_DIR --tokenizers DIR

Writes OUT_DIR/bge-reranker-v2-m3: BAAI/bge-reranker-v2-m3's shape (XLMRobertaForSequenceClassification,
24 layers, hidden 1024, 8,194 positions, one label), random weights from transformers' own
initialisation with seed 0, safetensors. Its tokenizer is the carried BERT WordPiece one
(tools/make_bench_checkpoints.py --make-tokenizers): the benchmark's texts are random common
words, so only the token counts matter, and they are about one token a word in either vocabulary.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from make_bench_checkpoints import BERT_TOKENIZER_FILES  # noqa: E402  (tools/ sibling)

BGE_RERANKER_V2_M3 = dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                          intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1, layer_norm_eps=1e-5,
                          pad_token_id=1, bos_token_id=0, eos_token_id=2, num_labels=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizers", type=Path, required=True, help="carried tokenizers (bert/ inside)")
    args = parser.parse_args()
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.XLMRobertaForSequenceClassification(transformers.XLMRobertaConfig(**BGE_RERANKER_V2_M3))
    folder = args.out / "bge-reranker-v2-m3"
    model.half().save_pretrained(folder, safe_serialization=True)
    for name in BERT_TOKENIZER_FILES:
        shutil.copy(args.tokenizers / "bert" / name, folder / name)
    print(folder)


if __name__ == "__main__":
    main()
