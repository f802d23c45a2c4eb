"""Recurrent token mixers: what a hybrid model's layers run in place of attention (Qwen3-Next's
and Qwen3.5's gated DeltaNet, Mamba-2 in Granite 4.0-H and Bamba, LFM2's short convolutions).

A mixer carries a fixed-size state per sequence instead of keys and values (decoder/
state_cache.py). The contract, which TransformerDecoder calls from its layer loop where the
spec's `mixers[i]` names a kind (the family's `load_mixer` builds the object):

    mixer.state_shapes: dict[str, tuple[int, ...]]  # its per-sequence state, name -> shape (fp32)
    mixer(x, pre, batch, state) -> [T, hidden]

`x` is the layer's input rows `[T, hidden]`, to be normalised by `pre` (a kernels.PreNorm, which
also writes the residual stream's sum: apply it once, `kernels.prenormed(x, pre)`) or, where
`pre` is None, normalised already. `batch` is the iteration's DecoderBatch: rows
0..num_decode-1 are one token each of sequences 0..num_decode-1, then come the prompt chunks,
`batch.prefill_lens` rows each (host ints); `batch.state_slots` `[S]` holds each sequence's
slot. `state` maps each name of state_shapes to `[slots + 1, *shape]`: read a sequence's state
at its slot, write it back there. A sequence whose first token runs finds its slot zeroed. The
result is the layer's output projection rows, which the layer adds to the residual stream.

The decode rows' work must be one batched pass (a captured CUDA graph replays it), the chunks'
may loop over sequences on the host (they never run in a graph).

Under tensor parallelism a mixer splits like attention: each rank holds a contiguous share of its heads (or
channels), their rows of the input projection and the convolution, their state, and their columns of the
output projection, whose partial sums the decoder's all-reduce after the layer adds up (`HeadShare`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch


@dataclass(frozen=True)
class HeadShare:
    """This rank's share `heads` of a mixer's `total` heads (all of them without tensor parallelism) and the
    rows they own in a checkpoint's tensors. `whole`: nothing is split (a read needs no slicing)."""

    heads: slice
    total: int

    @classmethod
    def of(cls, tp, total: int, what: str) -> "HeadShare":
        """The share of rank `tp` (a TensorParallelGroup or None); `what` names the heads in the error where
        they do not divide."""
        return cls(slice(0, total) if tp is None else tp.part(total, what), total)

    @property
    def whole(self) -> bool:
        return self.heads == slice(0, self.total)

    @property
    def count(self) -> int:
        return self.heads.stop - self.heads.start

    def rows(self, width: int, offset: int = 0) -> slice:
        """The rows of these heads in a block of `width` rows per head that starts at row `offset`."""
        return slice(offset + self.heads.start * width, offset + self.heads.stop * width)


def merged(parts: list[slice]) -> list[slice] | slice:
    """Row ranges with neighbours joined: one slice where they are contiguous (a whole tensor's, unsplit)."""
    out = [parts[0]]
    for part in parts[1:]:
        if part.start == out[-1].stop:
            out[-1] = slice(out[-1].start, part.stop)
        else:
            out.append(part)
    return out[0] if len(out) == 1 else out


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, batch: DecoderBatch,
                  conv_state: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """A depthwise causal convolution of each sequence's rows over time, continuing from the
    last `K - 1` inputs it saw (`conv_state` `[slots + 1, C, K - 1]`, updated in place).

    x `[T, C]`, weight `[C, K]`, bias `[C]` or None; `activation` None or "silu". Computed in
    fp32, returned in x's dtype (Hugging Face's Conv1d rounds its sum to the model's dtype once,
    as here)."""
    if batch.state_slots is None:
        raise ValueError("a recurrent layer needs its sequences' state slots (DecoderBatch.state_slots)")
    d = batch.num_decode
    slots = batch.state_slots
    if d and d == x.shape[0]:  # decode rows only (a decode graph's step): the kernel's output as it is, no copy
        return kernels.conv1d_decode(x, weight, bias, conv_state, slots[:d], activation)
    out = torch.empty_like(x)
    if d:  # each decode row: its window is the saved inputs and its own (one kernel)
        out[:d] = kernels.conv1d_decode(x[:d], weight, bias, conv_state, slots[:d], activation)
    row = d
    for j, n in enumerate(batch.prefill_lens):  # each chunk continues from its saved inputs (one kernel)
        out[row : row + n] = kernels.conv1d_chunk(x[row : row + n], weight, bias, conv_state, slots[d + j : d + j + 1],
                                                  activation)
        row += n
    return out



def token_shift(x: torch.Tensor, batch: DecoderBatch, last: torch.Tensor) -> torch.Tensor:
    """Each row's predecessor in its sequence `[T, C]` in x's dtype (RWKV's token shift): the row before it, or for
    a sequence's first row of this iteration the last row it saw in its previous forward (`last` `[slots + 1, C]`
    fp32 at its slot: zeros for a new sequence), which then becomes the sequence's last row, in place. The decode
    rows' in one gather and one scatter (no host sync); each prompt chunk's a shifted copy."""
    if batch.state_slots is None:
        raise ValueError("a recurrent layer needs its sequences' state slots (DecoderBatch.state_slots)")
    d, slots = batch.num_decode, batch.state_slots
    if d and d == x.shape[0]:  # decode rows only (a decode graph's step)
        prev = last[slots[:d]].to(x.dtype)
        last.index_copy_(0, slots[:d], x.float())
        return prev
    prev = torch.empty_like(x)
    if d:
        prev[:d] = last[slots[:d]]
        last.index_copy_(0, slots[:d], x[:d].float())
    row = d
    for j, n in enumerate(batch.prefill_lens):
        at = slots[d + j : d + j + 1]
        prev[row : row + 1] = last[at]
        prev[row + 1 : row + n] = x[row : row + n - 1]
        last.index_copy_(0, at, x[row + n - 1 : row + n].float())
        row += n
    return prev
