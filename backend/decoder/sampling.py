"""Token sampling for a batch of sequences: greedy, temperature, top-k and top-p, with per-sequence seeds."""
from __future__ import annotations

import random

import torch

from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.device import to_device_async


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


class Sampler:
    """Turns a batch of logits into one token per sequence, each with its own parameters.

    One vectorised pass over the batch, on the logits' device: greedy rows are one argmax; all
    sampled rows share one temperature divide, one sort, one top-k/top-p mask and one Gumbel-max
    draw. The only device->host transfer is the final token list (one sync per call).

    Randomness is counter-based: a sequence (key) holds a 63-bit seed (params.seed, or a random
    one drawn at its first sample) and a step counter, and its noise is a hash of (seed, step,
    token id). The same seed and prompt give the same samples alone or batched with anything.
    """

    def __init__(self):
        self._state: dict[int, list[int]] = {}  # key -> [seed, tokens sampled so far]

    def release(self, key: int) -> None:
        """Forget a finished sequence's seed and step counter."""
        self._state.pop(key, None)

    def _next_row_key(self, key: int, p: SamplingParams) -> int:
        state = self._state.get(key)
        if state is None:
            seed = p.seed if p.seed is not None else random.getrandbits(63)
            state = self._state[key] = [seed, 0]
        row_key = _row_key(state[0], state[1])
        state[1] += 1
        return row_key

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

        # Per-row parameters, decided on the host and sent in two small copies. Disabled filters
        # get values that never drop anything (k = vocab, p = inf) so every row takes one path;
        # a whole filter is skipped when no row uses it (known on the host: no sync to find out).
        use_top_k = any(0 < p.top_k < vocab for p in sp)
        use_top_p = any(p.top_p < 1.0 for p in sp)
        ints = torch.tensor(
            [rows,
             [p.top_k if 0 < p.top_k < vocab else vocab for p in sp],
             [self._next_row_key(keys[i], params[i]) for i in rows]],
            dtype=torch.int64,
        )
        floats = torch.tensor(
            [[p.temperature for p in sp], [p.top_p if p.top_p < 1.0 else float("inf") for p in sp]],
            dtype=torch.float32,
        )
        ints, floats = to_device_async(ints, device), to_device_async(floats, device)
        row_ids, top_k, row_keys = ints[0], ints[1], ints[2]
        temperature, top_p = floats[0], floats[1]

        x = logits if num_rows == len(params) else logits.index_select(0, row_ids)
        x = x.float() / temperature[:, None]  # a fresh [S, V] buffer, masked in place below

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
        picked = vocab_ids.gather(1, x.argmax(dim=-1, keepdim=True)).squeeze(1)
        if num_rows == len(params):
            return picked
        # Greedy rows take the argmax; index_copy_ puts the sampled ones in without a sync.
        return logits.argmax(dim=-1).index_copy_(0, row_ids, picked)
