"""Token sampling for a batch of sequences: greedy, temperature, top-k and top-p, with per-sequence
seeds; the logit processing users ask for (logit_bias, min_tokens, repetition / frequency /
presence penalties, a structured output's grammar); and the log-probabilities of the picked and the
top tokens."""
from __future__ import annotations

import logging
import random
from collections import deque
from dataclasses import dataclass

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.device import to_device_async
from tritonformer.backend.errors import InvalidRequest

log = logging.getLogger("tritonformer")


# ---- counter-based randomness ---------------------------------------------------------------
# The noise for one token is a pure function of (sequence seed, step, vocab index): a splitmix64
# hash. Unlike a stateful generator shared by the batch (or torch.Generator draws, whose stream
# position depends on what else was drawn), this makes a seeded request's samples independent of
# which other requests happen to share its batch, and of their order; it is also the same
# integer math on CPU and GPU. Integers are held in int64 tensors read as uint64 bit patterns:
# torch's int64 multiply wraps modulo 2**64, which is exactly the unsigned product's low bits,
# but `>>` on a negative int64 is arithmetic (fills with ones), so every right shift is masked.

_U64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment (2**64 / golden ratio)
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _as_i64(x: int) -> int:
    """The uint64 bit pattern `x` (mod 2**64) as a signed int64 value, as a tensor stores it."""
    x &= _U64
    return x - (1 << 64) if x >> 63 else x


def _mix64(x: int) -> int:
    """splitmix64's finaliser on Python ints (exact reference; used for per-row keys)."""
    x &= _U64
    x = ((x ^ (x >> 30)) * _MIX1) & _U64
    x = ((x ^ (x >> 27)) * _MIX2) & _U64
    return x ^ (x >> 31)


def _mix64_(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser, in place, on an int64 tensor of uint64 bit patterns."""
    for shift, mult in ((30, _MIX1), (27, _MIX2), (31, None)):
        t = x >> shift
        t &= (1 << (64 - shift)) - 1  # logical shift: clear the sign bits an arithmetic one copies
        x ^= t
        if mult is not None:
            x *= _as_i64(mult)  # wraps mod 2**64: the low 64 bits of the unsigned product
    return x


def _row_key(seed: int, step: int) -> int:
    """A per-(sequence, step) 64-bit key, as int64 (computed on the host: O(batch) Python ints)."""
    return _as_i64(_mix64(_mix64(seed + _GOLDEN) + step * _GOLDEN))


def _gumbel_noise(row_keys: torch.Tensor, vocab_ids: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise `[S, V]` fp32 for token `vocab_ids[s, j]` of row `s`.

    Element (s, j) is the vocab_ids[s, j]-th output of a splitmix64 stream keyed by row_keys[s],
    so a token's noise does not depend on where it lands after sorting, nor on the other rows.
    """
    h = vocab_ids + 1  # a fresh [S, V] int64 buffer; the rest works in place on it
    h *= _as_i64(_GOLDEN)
    h += row_keys[:, None]
    _mix64_(h)
    # Top 32 bits -> w in (0, 1], converted exactly as int -> fp32 (round to nearest) on every
    # device. fp32 keeps w's fine resolution near 0, where it matters: E = -log1p(-w) ~ w there
    # gives the tiny Exp(1) values that let improbable tokens win at their true (small) rate.
    h >>= 32
    h &= 0xFFFFFFFF
    w = h.to(torch.float32).add_(0.5).mul_(2.0**-32)
    e = w.neg_().log1p_().neg_()  # Exp(1); w == 1 (rounded) gives inf: that token cannot win
    return e.log_().neg_()  # Gumbel = -log(Exp)


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a request with `seed` (n > 1): sample 0 keeps the request's
    own stream (so n = 1 and the first of n draw the same tokens), the others get independent
    ones."""
    return seed if index == 0 else _mix64(_mix64(seed) + index * _GOLDEN)


@dataclass
class _LogprobBatch:
    """One sampling call's log-probabilities for its rows that asked (on the logits' device
    until first read): the picked token's log-probability and rank, and the top tokens."""

    picked: torch.Tensor  # [R] int64
    picked_logprob: torch.Tensor  # [R] fp32
    picked_rank: torch.Tensor  # [R] int64: 1 + tokens more likely (vLLM: count of logprob >= it)
    top_ids: torch.Tensor  # [R, K] int64, most likely first
    top_logprobs: torch.Tensor  # [R, K] fp32
    _host: tuple | None = None

    def row(self, r: int, k: int) -> dict[int, tuple[float, int]]:
        """Row r as {token id: (logprob, rank)}: the picked token first, then the top k (ranks
        1..k), as vLLM reports them."""
        if self._host is None:  # one device->host read for the whole call
            self._host = tuple(t.tolist() for t in (self.picked, self.picked_logprob, self.picked_rank, self.top_ids,
                                                    self.top_logprobs))
        picked, lp, rank, top_ids, top_lp = self._host
        out = {picked[r]: (lp[r], rank[r])}
        for j in range(k):
            out[top_ids[r][j]] = (top_lp[r][j], j + 1)
        return out


class _PenaltyState:
    """Per-sequence token counts for the penalized sequences only: rows of two device pools
    (`[rows, V]` int32 generated counts, `[rows, V]` bool prompt tokens), grown by doubling.
    Sequences without penalties never get a row, so they pay nothing for them."""

    def __init__(self):
        self.counts: torch.Tensor | None = None
        self.in_prompt: torch.Tensor | None = None
        self.slots: dict[int, int] = {}  # key -> row
        self._free: list[int] = []

    def slot(self, key: int, prompt_ids: list[int] | None, vocab: int, device: torch.device) -> int:
        slot = self.slots.get(key)
        if slot is not None:
            return slot
        if not self._free:
            self._grow(vocab, device)
        slot = self.slots[key] = self._free.pop()
        self.counts[slot].zero_()
        self.in_prompt[slot].zero_()
        if prompt_ids:
            ids = to_device_async(torch.tensor(prompt_ids, dtype=torch.int64), device)
            self.in_prompt[slot].index_fill_(0, ids, True)
        return slot

    def _grow(self, vocab: int, device: torch.device) -> None:
        old = 0 if self.counts is None else self.counts.shape[0]
        new = max(8, 2 * old)
        counts = torch.zeros(new, vocab, dtype=torch.int32, device=device)
        in_prompt = torch.zeros(new, vocab, dtype=torch.bool, device=device)
        if old:
            counts[:old].copy_(self.counts)
            in_prompt[:old].copy_(self.in_prompt)
        self.counts, self.in_prompt = counts, in_prompt
        self._free.extend(range(new - 1, old - 1, -1))

    def release(self, key: int) -> None:
        slot = self.slots.pop(key, None)
        if slot is not None:
            self._free.append(slot)


class Sampler:
    """Turns a batch of logits into one token per sequence, each with its own parameters.

    One vectorised pass over the batch, on the logits' device: plain greedy rows are one argmax;
    the other rows share one copy of their logits, the processing some of them ask for
    (logit_bias, min_tokens, penalties: each only over the rows that use it), one temperature
    divide, one sort, one top-k/top-p mask and one Gumbel-max draw. The only device->host
    transfer is the final token list (one sync per call); log-probabilities, when asked for,
    stay on the device until the engine reads them with the tokens.

    Randomness is counter-based: a sequence (key) holds a 64-bit seed (params.seed, or a random
    one drawn at its first sample) and a step counter, and its noise is a hash of (seed, step,
    token id). The same seed and prompt give the same samples alone or batched with anything.
    The step counter is also the number of tokens it generated (for min_tokens).

    A structured output's sequence (params.structured) holds a grammar matcher: its row is masked
    to the tokens the matcher allows, and the engine hands each of its tokens back (`accept`)
    before it samples the next one. `grammars` (a callable returning structured.Grammars) is
    called at the first such sequence.
    """

    def __init__(self, eos_token_ids: tuple[int, ...] | list[int] = (), grammars=None):
        self.eos_token_ids = tuple(eos_token_ids)  # masked, with stop_token_ids, until min_tokens
        self._grammar_source = grammars
        self._grammars = None
        self._matchers: dict[int, object] = {}  # key -> its structured output's matcher
        self._state: dict[int, list[int]] = {}  # key -> [seed, tokens sampled so far]
        self._prompts: dict[int, list[int]] = {}  # key -> prompt ids (repetition penalty only)
        self._penalties = _PenaltyState()
        self._logprobs: dict[int, deque] = {}  # key -> (batch, row) per sampled token, in order

    def register(self, key: int, params: SamplingParams, prompt_ids: list[int]) -> None:
        """A sequence joins: remember what its first sample needs (the prompt, for the
        repetition penalty). Nothing to do for most sequences."""
        if params.repetition_penalty != 1.0:
            self._prompts[key] = prompt_ids
        if params.structured is not None:  # (an InvalidRequest here: the engine refuses the request)
            if self._grammars is None:
                if self._grammar_source is None:
                    raise InvalidRequest("structured outputs are not available for this model")
                self._grammars = self._grammar_source()
            self._matchers[key] = self._grammars.matcher(params.structured)

    def accept(self, key: int, token: int) -> None:
        """A structured sequence's sampled token reached the host: advance its matcher."""
        matcher = self._matchers.get(key)
        if matcher is not None and not matcher.is_terminated() and not matcher.accept_token(token):
            log.warning("structured output: token %d was not accepted by the grammar of sequence %d", token, key)

    def release(self, key: int) -> None:
        """Forget a finished sequence's seed, step counter, token counts and log-probabilities."""
        self._state.pop(key, None)
        self._prompts.pop(key, None)
        self._penalties.release(key)
        self._logprobs.pop(key, None)
        self._matchers.pop(key, None)

    def take_logprobs(self, key: int, k: int) -> dict[int, tuple[float, int]]:
        """The log-probabilities of `key`'s oldest sampled token not yet taken (the engine takes
        them in the order the tokens were sampled): {token id: (logprob, rank)}."""
        batch, row = self._logprobs[key].popleft()
        return batch.row(row, k)

    def _next_row_key(self, key: int, p: SamplingParams) -> tuple[int, int]:
        """(noise key of this step, tokens the sequence generated before it)."""
        state = self._state.get(key)
        if state is None:
            seed = p.seed if p.seed is not None else random.getrandbits(63)
            state = self._state[key] = [seed, 0]
        step = state[1]
        state[1] += 1
        return _row_key(state[0], step), step

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, params: list[SamplingParams], keys: list[int]) -> list[int]:
        """float logits `[B, vocab]` -> one token id per row."""
        return self.sample_ids(logits, params, keys).tolist()  # the call's one device->host sync

    @torch.inference_mode()
    def sample_ids(self, logits: torch.Tensor, params: list[SamplingParams], keys: list[int]) -> torch.Tensor:
        """Like `sample`, but leaves the ids `[B]` int64 on the logits' device (never syncs)."""
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if not rows:
            return logits.argmax(dim=-1)  # all greedy: one argmax, nothing else
        device = logits.device
        num_rows, vocab = len(rows), logits.shape[-1]
        sp = [params[i] for i in rows]
        row_keys, steps = zip(*(self._next_row_key(keys[i], params[i]) for i in rows))

        # Per-row parameters, decided on the host and sent in two small copies. Disabled filters
        # get values that never drop anything (k = vocab, p = inf) so every row takes one path;
        # a whole filter is skipped when no row uses it (known on the host: no sync to find out).
        use_top_k = any(0 < p.top_k < vocab for p in sp)
        use_top_p = any(p.top_p < 1.0 for p in sp)
        ints = torch.tensor(
            [rows, [p.top_k if 0 < p.top_k < vocab else vocab for p in sp], list(row_keys)],
            dtype=torch.int64,
        )
        # An argmax row divides by 1: its pick is the argmax of its processed logits.
        floats = torch.tensor(
            [[p.temperature if not p.argmax else 1.0 for p in sp],
             [p.top_p if p.top_p < 1.0 and not p.argmax else float("inf") for p in sp]],
            dtype=torch.float32,
        )
        ints, floats = to_device_async(ints, device), to_device_async(floats, device)
        row_ids, top_k, row_keys_dev = ints[0], ints[1], ints[2]
        temperature, top_p = floats[0], floats[1]

        x = logits if num_rows == len(params) else logits.index_select(0, row_ids)
        x = x.to(torch.float32, copy=True)  # a fresh [S, V] buffer, processed in place below
        wants_logprobs = [r for r, p in enumerate(sp) if p.logprobs is not None]
        raw_logprobs = None
        if wants_logprobs:  # from the model's distribution, before any processing (as vLLM)
            lp_rows = to_device_async(torch.tensor(wants_logprobs, dtype=torch.int64), device)
            raw_logprobs = torch.log_softmax(x.index_select(0, lp_rows), dim=-1)
        self._process(x, sp, [keys[i] for i in rows], steps, vocab, device)

        argmax_rows = [r for r, p in enumerate(sp) if p.argmax]
        if len(argmax_rows) == num_rows:
            picked = x.argmax(dim=-1)
        else:
            greedy_picks = x.argmax(dim=-1) if argmax_rows else None  # before the draw changes x
            picked = self._draw(x, temperature, top_k, top_p, row_keys_dev, use_top_k, use_top_p, vocab)
            if argmax_rows:
                am = to_device_async(torch.tensor(argmax_rows, dtype=torch.int64), device)
                picked.index_copy_(0, am, greedy_picks.index_select(0, am))

        penalized = [r for r, p in enumerate(sp) if p.penalized]
        if penalized:  # count the new tokens, on the device (the next step's penalties read them)
            state = self._penalties
            slots = [state.slots[keys[rows[r]]] for r in penalized]
            pen = to_device_async(torch.tensor([penalized, slots], dtype=torch.int64), device)
            where = (pen[1], picked.index_select(0, pen[0]))  # (one pick per row: no duplicates)
            state.counts.index_put_(where, state.counts[where] + 1)
        if wants_logprobs:
            self._keep_logprobs(raw_logprobs, lp_rows, picked, [(keys[rows[r]], sp[r]) for r in wants_logprobs])

        if num_rows == len(params):
            return picked
        # Plain greedy rows take the argmax; index_copy_ puts the others in without a sync.
        return logits.argmax(dim=-1).index_copy_(0, row_ids, picked)

    def _process(self, x: torch.Tensor, sp: list[SamplingParams], keys: list[int], steps: tuple[int, ...],
                 vocab: int, device: torch.device) -> None:
        """logit_bias, min_tokens and the penalties, in place on the rows' fp32 logits, each
        over the rows that use it (vLLM's order: bias and masking, then penalties)."""
        bias_rows, bias_ids, bias_vals, mask_rows, mask_ids = [], [], [], [], []
        for r, p in enumerate(sp):
            if p.logit_bias:
                bias_rows += [r] * len(p.logit_bias)
                bias_ids += p.logit_bias.keys()
                bias_vals += p.logit_bias.values()
            if steps[r] < p.min_tokens:  # no end before min_tokens: EOS and stop ids masked
                ends = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
                ends = [t for t in ends if t < vocab]
                mask_rows += [r] * len(ends)
                mask_ids += ends
        if bias_rows:
            where = to_device_async(torch.tensor([bias_rows, bias_ids], dtype=torch.int64), device)
            values = to_device_async(torch.tensor(bias_vals, dtype=torch.float32), device)
            x.index_put_((where[0], where[1]), x[where[0], where[1]] + values)  # (a dict: no duplicates)
        if mask_rows:
            where = to_device_async(torch.tensor([mask_rows, mask_ids], dtype=torch.int64), device)
            x.index_put_((where[0], where[1]), torch.full((), float("-inf"), device=device))
        grammar_rows = [r for r, p in enumerate(sp) if p.structured is not None]
        if grammar_rows:  # the tokens each one's grammar allows next (the mask is made on the host)
            allowed = self._grammars.allowed([self._matchers[keys[r]] for r in grammar_rows])[:, :vocab]
            rows = to_device_async(torch.tensor(grammar_rows, dtype=torch.int64), device)
            part = x.index_select(0, rows).masked_fill_(~to_device_async(allowed, device), float("-inf"))
            x.index_copy_(0, rows, part)
        penalized = [r for r, p in enumerate(sp) if p.penalized]
        if penalized:
            state = self._penalties
            slots = [state.slot(keys[r], self._prompts.get(keys[r]), vocab, device) for r in penalized]
            ints = to_device_async(torch.tensor([penalized, slots], dtype=torch.int64), device)
            floats = to_device_async(torch.tensor(
                [[sp[r].frequency_penalty for r in penalized], [sp[r].presence_penalty for r in penalized],
                 [sp[r].repetition_penalty for r in penalized]], dtype=torch.float32), device)
            if len(penalized) == len(sp):
                kernels.apply_penalties(x, state.counts, state.in_prompt, ints[1], floats[0], floats[1], floats[2])
            else:
                part = x.index_select(0, ints[0])
                kernels.apply_penalties(part, state.counts, state.in_prompt, ints[1], floats[0], floats[1], floats[2])
                x.index_copy_(0, ints[0], part)

    @staticmethod
    def _draw(x: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
              row_keys: torch.Tensor, use_top_k: bool, use_top_p: bool, vocab: int) -> torch.Tensor:
        """One draw per row from softmax(x / temperature) after top-k and top-p."""
        device = x.device
        num_rows = x.shape[0]
        x.div_(temperature[:, None])
        if use_top_k or use_top_p:
            # One stable sort for both filters (stable: ties keep vocab order on every device).
            x, vocab_ids = torch.sort(x, dim=-1, descending=True, stable=True)
            if use_top_k:  # keep ranks 0 .. k-1
                rank = torch.arange(vocab, device=device)
                x.masked_fill_(rank[None, :] >= top_k[:, None], float("-inf"))
            if use_top_p:
                # Drop a token when the probability mass ranked above it already reaches top_p
                # (after top-k, renormalised). Rank 0 always stays (set explicitly rather than
                # trusting cumsum[0] - p[0] to be exactly 0 on every device).
                probs = torch.softmax(x, dim=-1)
                mass_above = probs.cumsum(dim=-1).sub_(probs)
                mass_above[:, 0] = 0.0
                x.masked_fill_(mass_above >= top_p[:, None], float("-inf"))
        else:
            vocab_ids = torch.arange(vocab, device=device).expand(num_rows, vocab)

        # Gumbel-max: argmax(logits/T + Gumbel) is a draw from softmax(logits/T) over the kept
        # tokens (masked ones are -inf). Noise is keyed by token id, not by sorted position.
        x += _gumbel_noise(row_keys, vocab_ids)
        return vocab_ids.gather(1, x.argmax(dim=-1, keepdim=True)).squeeze(1)

    def _keep_logprobs(self, logprobs: torch.Tensor, lp_rows: torch.Tensor, picked: torch.Tensor,
                       owners: list[tuple[int, SamplingParams]]) -> None:
        """The picked tokens' log-probabilities and ranks and the top k, kept per key until the
        engine takes them with the tokens."""
        chosen = picked.index_select(0, lp_rows)
        chosen_lp = logprobs.gather(1, chosen[:, None])
        rank = (logprobs >= chosen_lp).sum(dim=-1)
        k = max(p.logprobs for _, p in owners)
        top = torch.topk(logprobs, k, dim=-1) if k else None
        empty = torch.zeros(len(owners), 0, device=logprobs.device)
        batch = _LogprobBatch(chosen, chosen_lp.squeeze(1), rank, top.indices if top else empty.long(),
                              top.values if top else empty)
        for r, (key, _) in enumerate(owners):
            self._logprobs.setdefault(key, deque()).append((batch, r))
