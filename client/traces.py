"""Request traces and length distributions: what the benchmarks, the load generator, the GPU tools
and the tests send.

* ``TraceRequest``: one decoder request, prompt token ids and its own budget of new tokens;
* ``orca_trace`` / ``fixed_trace`` / ``shared_prefix_trace``: decoder traces of random prompts
  (``random_prompts``, ids below ``token_high``: no special tokens); ``useful_tokens``: a trace's
  budgets summed, the tokens every system is credited with;
* ``trace_texts`` / ``one_token_words``: a trace as prompt text of the same token counts;
* ``lengths_for`` / ``DISTRIBUTIONS``: token counts of encoder requests.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

__all__ = [
    "TraceRequest",
    "warm_up_copy",
    "shifted_prompts",
    "token_high",
    "random_prompts",
    "orca_trace",
    "fixed_trace",
    "shared_prefix_trace",
    "useful_tokens",
    "trace_texts",
    "one_token_words",
    "lengths_for",
    "PAPER_DISTRIBUTIONS",
    "DISTRIBUTIONS",
]


@dataclass
class TraceRequest:
    prompt_ids: list[int]
    max_new_tokens: int


def warm_up_copy(trace: list[TraceRequest], share: int = 1) -> list[TraceRequest]:
    """The first 1/`share` of `trace` with every prompt reversed, for an untimed pass before a
    timed one: the same prompt lengths (so the same prefill shapes compile) but no KV block that
    the timed pass could find in the prefix cache. A warm-up on the trace itself would hand the
    timed pass its prompts already computed."""
    return [TraceRequest(r.prompt_ids[::-1], r.max_new_tokens) for r in trace[: max(1, len(trace) // share)]]


def shifted_prompts(trace: list[TraceRequest], shift: int, vocab_size: int) -> list[TraceRequest]:
    """`trace` with every prompt token id moved up by `shift` (wrapping below token_high): the
    same lengths, hence the same work, but after `shift` > 0 none of the prompts of the trace
    as drawn, which a server that already ran it would find in its prefix cache."""
    high = token_high(vocab_size)
    return [TraceRequest([(t + shift) % high for t in r.prompt_ids], r.max_new_tokens) for r in trace]


def token_high(vocab_size: int) -> int:
    """Exclusive upper bound for random prompt ids that keeps out the well-known special tokens:
    GPT-2's only special token is its last id (50256, <|endoftext|>); Llama-3's 256 special tokens
    are ids 128000..128255. Other vocabularies are used whole."""
    if vocab_size == 50257:
        return 50256
    if vocab_size == 128256:
        return 128000
    return vocab_size


def random_prompts(rng: np.random.Generator, lengths, vocab_size: int) -> list[list[int]]:
    high = token_high(vocab_size)
    return [rng.integers(0, high, int(n)).tolist() for n in lengths]


def orca_trace(
    num_requests: int = 256,
    seed: int = 0,
    prompt_range: tuple[int, int] = (32, 512),
    output_range: tuple[int, int] = (1, 128),
    vocab_size: int = 50257,
) -> list[TraceRequest]:
    """Orca-style synthetic trace: prompt and output lengths uniform on the inclusive ranges.

    Draw order (one ``numpy.random.default_rng(seed)``): all prompt lengths first, then all output
    lengths, then each request's prompt ids in turn. Prompt lengths first is the order that
    reproduces the issue's number: n=256, seed 0, U[32,512] / U[1,128] gives 17,193 output tokens
    (72,245 prompt tokens). The other order (outputs first) gives 17,215.
    """
    rng = np.random.default_rng(seed)
    p_lo, p_hi = prompt_range
    o_lo, o_hi = output_range
    prompt_lens = rng.integers(p_lo, p_hi + 1, num_requests)
    output_lens = rng.integers(o_lo, o_hi + 1, num_requests)
    prompts = random_prompts(rng, prompt_lens, vocab_size)
    return [TraceRequest(p, int(o)) for p, o in zip(prompts, output_lens)]


def fixed_trace(
    prompt_len: int, output_len: int, num_requests: int, seed: int = 0, vocab_size: int = 50257
) -> list[TraceRequest]:
    """``num_requests`` requests, each with a ``prompt_len`` random prompt and ``output_len`` budget."""
    rng = np.random.default_rng(seed)
    prompts = random_prompts(rng, [prompt_len] * num_requests, vocab_size)
    return [TraceRequest(p, int(output_len)) for p in prompts]


def shared_prefix_trace(num_requests: int = 100, prefix_tokens: int = 1024, distinct_tokens: int = 64,
                        new_tokens: int = 64, seed: int = 0, vocab_size: int = 50257) -> list:
    """Requests whose prompts share one random prefix (a system prompt, a document), each
    followed by tokens of its own."""
    rng = np.random.default_rng(seed)
    prefix = random_prompts(rng, [prefix_tokens], vocab_size)[0]
    return [TraceRequest(prefix + own, new_tokens)
            for own in random_prompts(rng, [distinct_tokens] * num_requests, vocab_size)]


def useful_tokens(trace: list[TraceRequest]) -> int:
    return sum(r.max_new_tokens for r in trace)


def trace_texts(tokenizer, requests: int, seed: int, prompt_range, output_range,
                text_seed: int | None = None, words: list[str] | None = None) -> list[tuple[str, int, int]]:
    """(prompt text, its token count, max_tokens) per Orca-trace request: as many words as the
    trace's prompt has tokens, each word one token of the served vocabulary (` the`, ` house`:
    a pre-tokenizer splits at spaces, so the words tokenize back to one token each). Random ids
    decoded to text would not do: GPT-2's byte pieces re-tokenize to ~2.6x as many tokens,
    which pushed half the trace past a 1,024-token context. The count is the text tokenized
    again, as both ways will. `text_seed` (default `seed`) picks the words: other texts of the
    same lengths; `words`: one_token_words(tokenizer), if already found."""
    trace = orca_trace(requests, seed, prompt_range, output_range, vocab_size=tokenizer.vocab_size)
    words = words or one_token_words(tokenizer)
    rng = random.Random(seed if text_seed is None else text_seed)
    texts = ["".join(rng.choice(words) for _ in r.prompt_ids) for r in trace]
    counts = [len(ids) for ids in tokenizer.encode_batch(texts)]
    return [(t, n, r.max_new_tokens) for t, n, r in zip(texts, counts, trace)]


def one_token_words(tokenizer, limit: int = 5000) -> list[str]:
    """Lower-case words that the tokenizer reads as one token with their leading space; where
    it has none (a byte-level vocabulary without merges, as the benchmark's placeholder GPT-2
    tokenizer), single letters, each one byte and one token."""
    def one_token(text: str) -> bool:
        return len(tokenizer.encode(text, add_special_tokens=False)) == 1

    words = []
    for i in range(min(tokenizer.vocab_size, 50_000)):
        word = " " + tokenizer.decode([i], skip_special_tokens=True).strip()
        if len(word) >= 4 and word[1:].isalpha() and word[1:].islower() and one_token(word):
            words.append(word)
            if len(words) >= limit:
                break
    words = words or [c for c in "abcdefghijklmnopqrstuvwxyz" if one_token(c)]
    if not words:
        raise RuntimeError("no one-token words found in the served tokenizer")
    return words


def lengths_for(distribution: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Token counts (special tokens included) of n requests."""
    short = np.clip(rng.lognormal(np.log(24), 0.6, n), 4, 512).astype(int)
    if distribution == "short":  # search queries: lognormal, median 24
        return short
    if distribution == "mixed":  # 70% short + 30% passages U[128, 512]
        return np.where(rng.random(n) < 0.7, short, rng.integers(128, 513, n))
    if distribution == "uniform":
        return rng.integers(16, 513, n)
    if distribution in PAPER_DISTRIBUTIONS:  # TurboTransformers §6.3: U[2,100] and U[5,500]
        lo, hi = PAPER_DISTRIBUTIONS[distribution]
        return rng.integers(lo, hi + 1, n)
    return np.full(n, 128)


PAPER_DISTRIBUTIONS = {"u2-100": (2, 100), "u5-500": (5, 500)}
DISTRIBUTIONS = ("short", "mixed", "uniform", "constant", *PAPER_DISTRIBUTIONS)
