"""One decoder iteration's inputs, laid out for selective batching (Orca) over a paged cache.

Every scheduled token of every sequence is one row of a packed `[tokens, hidden]` activation:
first the decoding sequences (one token each), then the prompt chunks. All non-attention ops
run once over all rows; attention runs as two launches per layer over the paged cache: one
with one query row per sequence (decode), one for the chunks (packed prefill), each with the
launch configuration that suits it.

The host builds every index as plain integers and moves them to the device in two copies
(one int64 array, one int32 array) instead of one copy per field.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tritonformer import kernels
from tritonformer.backend.device import to_device_async


@dataclass(slots=True)  # one per sequence per iteration: slots make it cheaper to build
class BatchEntry:
    tokens: list[int]  # this iteration's tokens of the sequence
    start: int  # position of tokens[0] (= tokens already cached)
    block_table: list[int]  # the sequence's KV blocks, covering start + len(tokens)
    sample: bool  # whether the logits of its last token are needed
    state_slot: int = -1  # its recurrent state's slot (hybrid models, decoder/state_cache.py; -1: none)
    prompt_len: int = 0  # its prompt's tokens (0: not known), for a model whose prompt attends both ways (CPM-Ant)


@dataclass
class DecoderBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64: where each row's key/value goes in the paged cache
    logits_index: torch.Tensor  # [S] int64: rows whose next-token logits are wanted
    num_decode: int  # rows 0..num_decode-1 are one-token sequences
    decode_tables: torch.Tensor | None = None  # [num_decode, width] int32
    decode_seqlens: torch.Tensor | None = None  # [num_decode] int32 keys incl. this token
    decode_cu_q: torch.Tensor | None = None  # [num_decode + 1] int32 = 0..num_decode
    prefill_tables: torch.Tensor | None = None
    prefill_seqlens: torch.Tensor | None = None
    prefill_cu_q: torch.Tensor | None = None
    prefill_max_q: int = 0
    decode_splits: int | None = None  # fixed key splits (a captured graph needs them fixed)
    # logits_index is every row in order (a decode-only iteration): the models skip its gather,
    # one launch less per iteration.
    logits_every_row: bool = False
    # Recurrent state (hybrid models, decoder/state_cache.py): each sequence's slot, decode rows
    # first (row i is sequence i), then the prompt chunks; and those chunks' row counts on the
    # host (their rows follow the decode rows in this order). None for a model without state.
    state_slots: torch.Tensor | None = None  # [S] int64
    prefill_lens: tuple[int, ...] = ()
    # Each entry's start and prompt length (BatchEntry's), on the host, in entry order; empty in a decode graph's
    # batch (every row a sequence past its first forward). Read by models whose prompt attends both ways.
    entry_starts: tuple[int, ...] = ()
    prompt_lens: tuple[int, ...] = ()

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *, scale: float | None = None,
                  window: int | None = None, softcap: float | None = None,
                  sinks: torch.Tensor | None = None, chunk: int | None = None,
                  alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention of every row against its sequence's cached keys (this iteration's
        already written). `scale` (default 1/sqrt(head_dim)), `window` (sliding window: the last
        `window` keys), `softcap` (score soft-capping) and `sinks` (gpt-oss's per-head sink
        logits, `[num_heads]`) and `chunk` (Llama 4's chunked attention: the keys of the query's
        chunk of `chunk` positions, up to its own) and `alibi_slopes` (ALiBi's per-head slopes, `[num_heads]`
        fp32 on the device) as in `kernels.paged_attention`."""
        out = torch.empty_like(q)
        d = self.num_decode
        if d:
            kernels.paged_attention(
                q[:d], k_cache, v_cache, self.decode_tables, self.decode_cu_q, self.decode_seqlens, True,
                scale=scale, max_seqlen_q=1, out=out[:d], num_splits=self.decode_splits, window=window, softcap=softcap,
                sinks=sinks, chunk=chunk, alibi_slopes=alibi_slopes,
            )
        if self.prefill_cu_q is not None:
            kernels.paged_attention(
                q[d:], k_cache, v_cache, self.prefill_tables, self.prefill_cu_q, self.prefill_seqlens, True,
                scale=scale, max_seqlen_q=self.prefill_max_q, out=out[d:], window=window, softcap=softcap,
                sinks=sinks, chunk=chunk, alibi_slopes=alibi_slopes,
            )
        return out


def _tables(entries: list[BatchEntry], width: int) -> np.ndarray:
    out = np.zeros((len(entries), width), dtype=np.int32)
    for row, e in zip(out, entries):
        row[: len(e.block_table)] = e.block_table
    return out


_LONG_FIELDS = ("input_ids", "positions", "slot_mapping", "logits_index", "state_slots")


class _Packer:
    """Concatenates host arrays into one buffer, each part starting 16-byte aligned: one copy to
    the device, and the kernels see the same pointer alignment every iteration (Triton compiles
    a variant per alignment class)."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.parts: list[np.ndarray] = []
        self.size = 0

    def add(self, values) -> slice:
        arr = np.asarray(values, dtype=self.dtype).reshape(-1)
        align = 16 // self.dtype.itemsize
        start = -(-self.size // align) * align
        if start > self.size:
            self.parts.append(np.zeros(start - self.size, dtype=self.dtype))
        self.parts.append(arr)
        self.size = start + arr.size
        return slice(start, self.size)

    def to(self, device: torch.device) -> torch.Tensor:
        host = np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=self.dtype)
        return to_device_async(torch.from_numpy(host), device)


def build_batch(entries: list[BatchEntry], block_size: int, device: torch.device) -> DecoderBatch:
    """Pack the scheduled entries (decode entries, one token each, first) into a DecoderBatch."""
    num_decode = 0
    while num_decode < len(entries) and len(entries[num_decode].tokens) == 1:
        num_decode += 1
    decode, prefill = entries[:num_decode], entries[num_decode:]

    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    logits_rows: list[int] = []
    for e in entries:
        n = len(e.tokens)
        row0 = len(ids)
        ids.extend(e.tokens)
        table = e.block_table
        for pos in range(e.start, e.start + n):
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        if e.sample:
            logits_rows.append(row0 + n - 1)
    longs, ints = _Packer(np.int64), _Packer(np.int32)
    where = {"input_ids": longs.add(ids), "positions": longs.add(positions), "slot_mapping": longs.add(slots),
             "logits_index": longs.add(logits_rows)}
    if entries and entries[0].state_slot >= 0:  # (a model with recurrent state: every entry holds a slot)
        where["state_slots"] = longs.add([e.state_slot for e in entries])
    shapes = {}
    for group, name in ((decode, "decode"), (prefill, "prefill")):
        if group:
            width = max(len(e.block_table) for e in group)
            where[f"{name}_cu_q"] = ints.add(np.concatenate(([0], np.cumsum([len(e.tokens) for e in group]))))
            where[f"{name}_seqlens"] = ints.add([e.start + len(e.tokens) for e in group])
            where[f"{name}_tables"] = ints.add(_tables(group, width))
            shapes[f"{name}_tables"] = (len(group), width)
    long_dev, int_dev = longs.to(device), ints.to(device)
    fields = {name: (long_dev if name in _LONG_FIELDS else int_dev)[sl] for name, sl in where.items()}
    for name, shape in shapes.items():
        fields[name] = fields[name].view(shape)
    # Each entry samples at most its last row, so as many sampled rows as rows means each
    # entry is one token that samples: logits_index = 0..T-1.
    lens = tuple(len(e.tokens) for e in prefill)
    return DecoderBatch(num_decode=num_decode, prefill_max_q=max(lens, default=0), prefill_lens=lens,
                        logits_every_row=len(logits_rows) == len(ids), entry_starts=tuple(e.start for e in entries),
                        prompt_lens=tuple(e.prompt_len for e in entries), **fields)


def whole_prompts_batch(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, block_size: int,
                        positions: torch.Tensor | None = None) -> tuple[DecoderBatch, int]:
    """A DecoderBatch that prefills packed sequences whole (`cu_seqlens` `[B + 1]` on the device)
    into a scratch cache, built with tensor ops (no host copy of the ids): sequence i's keys go to
    consecutive blocks from the first after sequence i - 1's, every row's output is wanted.
    Returns (batch, blocks the cache needs: an upper bound known on the host)."""
    device, tokens = input_ids.device, input_ids.numel()
    starts = cu_seqlens[:-1].long()
    lengths = cu_seqlens[1:].long() - starts
    blocks = (lengths + block_size - 1) // block_size
    first_block = torch.cumsum(blocks, 0) - blocks
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths, output_size=tokens)
    offset = torch.arange(tokens, device=device) - starts[seq]
    width = max(1, -(-max_seqlen // block_size))
    num_blocks = -(-tokens // block_size) + lengths.numel()
    tables = (first_block[:, None] + torch.arange(width, device=device)[None, :]).clamp(max=num_blocks - 1)
    batch = DecoderBatch(
        input_ids=input_ids.long(), positions=offset if positions is None else positions.long(),
        slot_mapping=first_block[seq] * block_size + offset, logits_index=torch.arange(tokens, device=device),
        num_decode=0, prefill_tables=tables.int(), prefill_seqlens=lengths.int(), prefill_cu_q=cu_seqlens.int(),
        prefill_max_q=max_seqlen, logits_every_row=True)
    return batch, num_blocks
