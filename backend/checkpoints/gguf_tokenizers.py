"""A `tokenizers` Tokenizer (tokenizer.json) and its small JSON companions from GGUF metadata.

GGUF stores a vocabulary, not a tokenizer.json. Two kinds are rebuilt here, picked by
`tokenizer.ggml.model`:

    "gpt2"   byte-level BPE (GPT-2, Llama 3, SmolLM): the file lists its merges; text is split into
             words by a regex named in `tokenizer.ggml.pre`, and every byte is spelled as a character.
    "llama"  SentencePiece BPE (Llama 2, Gemma): tokens with scores and no merges. SentencePiece
             joins, at each step, the adjacent pair whose concatenation is the vocabulary piece
             with the highest score; listing every split (left, right) of every piece, best piece
             first, as a merge gives a BPE model that does the same. Spaces are "▁", characters
             the vocabulary lacks fall back to the byte tokens <0x00>..<0xFF>.

Token types (tokenizer.ggml.token_type) decide what is matched whole on the raw text: control
tokens (<bos>, <|im_start|>) are added as special tokens, user-defined ones ("\\n\\n", "<h1>",
runs of spaces) as ordinary added tokens, as SentencePiece and llama.cpp match them before BPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from .gguf_file import GGUFFile, field

# llama.cpp token types (tokenizer.ggml.token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
# Hugging Face role -> GGUF metadata key "tokenizer.ggml.<key>"
_SPECIAL_ROLES = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id"}
# SentencePiece's spelling of a space.
_SPACE = "\u2581"

# Split regex of Llama 3 style vocabularies (tokenizer.ggml.pre "llama-bpe"), as in their tokenizer.json.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass
class GGUFTokenizer:
    tokenizer: Tokenizer
    special: dict[str, tuple[int, str]]  # {"bos" | "eos" | "pad" | "unk": (id, text)}
    add_bos: bool  # whether encoding adds `bos` in front (the post-processor does it)
    add_eos: bool


def build_tokenizer(reader: GGUFFile) -> GGUFTokenizer:
    """The tokenizer the GGUF's metadata describes, plus its special tokens."""
    kind = field(reader, "tokenizer.ggml.model")
    if kind not in _BUILDERS:
        raise NotImplementedError(f"GGUF tokenizer model {kind!r} is not supported (known: {', '.join(_BUILDERS)})")
    tokens: list[str] = field(reader, "tokenizer.ggml.tokens")
    types: list[int] = field(reader, "tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
    tokenizer = _BUILDERS[kind](reader, tokens, types)

    special: dict[str, tuple[int, str]] = {}
    for role, key in _SPECIAL_ROLES.items():
        token_id = field(reader, f"tokenizer.ggml.{key}", None)
        if token_id is not None:
            special[role] = (int(token_id), tokens[int(token_id)])
    # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise.
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", kind == "llama")) and "bos" in special
    add_eos = bool(field(reader, "tokenizer.ggml.add_eos_token", False)) and "eos" in special
    post = _post_processor(special, add_bos, add_eos)
    if post is not None:
        tokenizer.post_processor = post
    elif kind == "gpt2":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return GGUFTokenizer(tokenizer, special, add_bos, add_eos)


# --------------------------------------------------------------------------- byte-level BPE


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in.

    Printable Latin-1 bytes stand for themselves; the remaining 68 (control chars, space, ...) are
    moved, in byte order, to code points 256, 257, ... so every byte has a visible character.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    moved = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(moved)})
    return dict(sorted(table.items()))


def _byte_level_pre_tokenizer(pre: str, add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
    """How text is cut into words before BPE; must match how the vocabulary's merges were learned."""
    if pre == "smollm":
        # SmolLM / SmolLM2 (and StarCoder-family) vocabularies: every digit is its own word, then
        # GPT-2's split. llama.cpp's "smollm" regex does the same; the vocab holds no multi-digit tokens.
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True),
            ]
        )
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
            ]
        )
    if pre in ("gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    raise NotImplementedError(f"tokenizer.ggml.pre {pre!r} is not supported (known: smollm, llama-bpe, gpt2)")


def _byte_level_bpe(reader: GGUFFile, tokens: list[str], types: list[int]) -> Tokenizer:
    merges = [tuple(m.split(" ")) for m in field(reader, "tokenizer.ggml.merges")]
    if any(len(m) != 2 for m in merges):
        raise ValueError("tokenizer.ggml.merges holds an entry that is not two space-separated tokens")

    # Ordinary tokens must be spelled in the byte alphabet for BPE to find them; a few files store
    # some as raw text, so respell those. Control / user-defined tokens are matched whole on the
    # raw text (added tokens below), so they keep their spelling.
    alphabet = _byte_alphabet()
    chars = set(alphabet.values())

    def spelled(token: str, token_type: int) -> str:
        if token_type in (TOKEN_CONTROL, TOKEN_USER_DEFINED) or set(token) <= chars:
            return token
        return "".join(alphabet[b] for b in token.encode("utf-8"))

    vocab = {spelled(tok, typ): i for i, (tok, typ) in enumerate(zip(tokens, types))}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF vocabulary has duplicate tokens")

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    add_prefix_space = bool(field(reader, "tokenizer.ggml.add_space_prefix", False))
    pre = field(reader, "tokenizer.ggml.pre", "default")
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(pre, add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    _add_whole_tokens(tokenizer, list(zip(tokens, types)))
    return tokenizer


# --------------------------------------------------------------------------- SentencePiece BPE


def _sentencepiece_bpe(reader: GGUFFile, tokens: list[str], types: list[int]) -> Tokenizer:
    # llama.cpp's default when the key is missing is to add the prefix space (Llama 2 style).
    if field(reader, "tokenizer.ggml.add_space_prefix", True):
        raise NotImplementedError(
            "SentencePiece vocabularies that prepend a space to the text (tokenizer.ggml.add_space_prefix) "
            "are not supported; Gemma style ones (no prefix) are"
        )
    scores: list[float] = field(reader, "tokenizer.ggml.scores")
    # Pieces spell a space "▁", but llama.cpp's converter writes Gemma's runs of spaces ("▁▁",
    # user-defined) as real spaces; spell them the way the normalizer below writes text.
    spelled = [tok if typ == TOKEN_CONTROL else tok.replace(" ", _SPACE) for tok, typ in zip(tokens, types)]
    vocab = {tok: i for i, tok in enumerate(spelled)}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF vocabulary has duplicate tokens")
    unk = field(reader, "tokenizer.ggml.unknown_token_id", None)

    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_sentencepiece_merges(spelled, scores, types),
            unk_token=None if unk is None else spelled[int(unk)],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", _SPACE)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    _add_whole_tokens(tokenizer, list(zip(spelled, types)))
    return tokenizer


def _sentencepiece_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's "join the best-scoring piece first".

    Only normal pieces take part: SentencePiece never builds a control, byte or user-defined piece
    out of smaller ones (user-defined ones are matched whole; see _add_whole_tokens). A piece's
    rank is its score, best first, ties in file order; its merges are all its splits into two
    normal pieces, the split with the better-ranked left piece (then right piece) first.
    """
    normal = [i for i, typ in enumerate(types) if typ == TOKEN_NORMAL]
    normal.sort(key=lambda i: (-scores[i], i))
    rank = {tokens[i]: r for r, i in enumerate(normal)}
    merges: list[tuple[str, str]] = []
    for i in normal:
        piece = tokens[i]
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))]
        splits = [(left, right) for left, right in splits if left in rank and right in rank]
        merges.extend(sorted(splits, key=lambda s: (rank[s[0]], rank[s[1]])))
    return merges


# --------------------------------------------------------------------------- shared pieces


def _add_whole_tokens(tokenizer: Tokenizer, typed: list[tuple[str, int]]) -> None:
    """Tokens matched whole on the text, never split: control ones special (dropped by
    decode(skip_special_tokens=True)), user-defined ones ordinary. A user-defined token spelled
    with "▁" (a run of spaces) is matched after the normalizer has turned spaces into "▁"."""
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, typ in typed if typ == TOKEN_CONTROL]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=_SPACE in t)
            for t, typ in typed
            if typ == TOKEN_USER_DEFINED
        ]
    )


def _post_processor(
    special: dict[str, tuple[int, str]], add_bos: bool, add_eos: bool
) -> processors.PostProcessor | None:
    """Adds bos/eos around encoded text when the GGUF asks for it (SmolLM2 asks for neither)."""
    if not (add_bos or add_eos):
        return None
    used = [role for role, wanted in (("bos", add_bos), ("eos", add_eos)) if wanted]
    bos = [special["bos"][1]] if add_bos else []
    eos = [special["eos"][1]] if add_eos else []
    return processors.TemplateProcessing(
        single=" ".join([*bos, "$A:0", *eos]),
        pair=" ".join([*bos, "$A:0", *eos, *bos, "$B:1", *eos]),
        special_tokens=[(special[role][1], special[role][0]) for role in used],
    )


_BUILDERS = {"gpt2": _byte_level_bpe, "llama": _sentencepiece_bpe}


# --------------------------------------------------------------------------- small JSON files


def special_tokens_map(reader: GGUFFile, built: GGUFTokenizer) -> dict[str, Any]:
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type", [])
    roles = {f"{role}_token": text for role, (_, text) in built.special.items()}
    named = set(roles.values())
    extra = [t for t, typ in zip(tokens, types) if typ == TOKEN_CONTROL and t not in named]
    return {**roles, "additional_special_tokens": extra}


def tokenizer_config(reader: GGUFFile, built: GGUFTokenizer, model_max_length: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        # The generic fast tokenizer loads tokenizer.json as written; a model-specific class
        # (LlamaTokenizer...) could impose its own pre-tokenizer instead.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "add_bos_token": built.add_bos,
        "add_eos_token": built.add_eos,
        # Both kinds round-trip text exactly; the legacy clean-up would change " ." to ".".
        "clean_up_tokenization_spaces": False,
        **{f"{role}_token": text for role, (_, text) in built.special.items()},
    }
    template = field(reader, "tokenizer.chat_template", None)
    if template is not None:
        result["chat_template"] = template
    return result
