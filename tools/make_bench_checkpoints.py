"""Random-weight checkpoint folders for the served benchmarks on a machine without internet.

    python3 tools/make_bench_checkpoints.py OUT_DIR [--tokenizers DIR]

Writes OUT_DIR/bert-base (bert-base-uncased shape, random weights, safetensors) and
OUT_DIR/gpt2 (gpt2 124M shape, random weights). Weights come from transformers' own
initialisation with seed 0, the same as the in-process benchmarks use. Tokenizers cannot be
downloaded there, so they are made here, on a machine with this repository's dependencies
(`--make-tokenizers DIR`), and carried: the BERT one is MiniLM's (the same uncased WordPiece
vocabulary as bert-base-uncased); the GPT-2 one is a byte-level BPE with GPT-2's vocabulary
size whose ids beyond the 256 bytes decode to placeholder words (the weights are random: the
benchmark sends token ids and counts tokens; the text is meaningless anyway).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

BERT_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def make_tokenizers(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    from tritonformer.backend.checkpoints import minilm_dir

    (out / "bert").mkdir(parents=True, exist_ok=True)
    for name in BERT_TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, out / "bert" / name)

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(vocab) < 50257:  # placeholder words "aa", "ab", ... for the ids past the bytes
        word, n = "", i
        while True:
            word = letters[n % 26] + word
            n //= 26
            if n == 0:
                break
        vocab.setdefault("Ġ" + word, len(vocab))
        i += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    (out / "gpt2").mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "gpt2" / "tokenizer.json"))


def make_checkpoints(out: Path, tokenizers: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False)
    bert.save_pretrained(out / "bert-base", safe_serialization=True)
    for name in BERT_TOKENIZER_FILES:
        shutil.copy(tokenizers / "bert" / name, out / "bert-base" / name)

    from tritonformer.client.hf_reference import random_gpt2

    gpt2 = random_gpt2("cpu", torch.float32)
    gpt2.save_pretrained(out / "gpt2", safe_serialization=True)
    shutil.copy(tokenizers / "gpt2" / "tokenizer.json", out / "gpt2" / "tokenizer.json")
    for folder in (out / "bert-base", out / "gpt2"):
        print(folder, json.loads((folder / "config.json").read_text())["model_type"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizers", type=Path, help="carried tokenizers (made with --make-tokenizers)")
    parser.add_argument("--make-tokenizers", action="store_true", help="write the tokenizers to OUT and stop")
    args = parser.parse_args()
    if args.make_tokenizers:
        make_tokenizers(args.out)
    else:
        make_checkpoints(args.out, args.tokenizers)


if __name__ == "__main__":
    main()
