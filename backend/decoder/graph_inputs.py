"""The inputs of one decode-graph bucket, packed on the host with little work per iteration.

A captured decode iteration of `b` rows reads static device buffers: token ids, positions, cache
slots and recurrent-state slots (int64; the last only for a hybrid model: decoder/state_cache.py),
key counts and block tables (int32). They live in one device buffer, so an
iteration sends them in one copy. The host keeps a mirror of that buffer and rewrites only
what changed: most of it is the block tables (rows x blocks per sequence), and a sequence's
table changes once every `block_size` tokens, so re-packing every row every iteration (an
interpreted loop over thousands of ints at batch 64) would cost more than the GPU's whole
iteration. Each row remembers the table it holds and is rewritten only when the sequence's
table differs (compared by value, so a table that was freed and filled again is caught too).

Rows past the real ones are padding: no keys (count 0), cache slot in the scratch block, the
scratch state slot. Their stale tables are never read.

`steps_left` tells the graph's last kernel (kernels.advance_decode_inputs) how many more
iterations of a multi-iteration round each row takes, so replays after the first need nothing
from the host. The device copy may then differ from the mirror; the next send overwrites all of
it.
"""
from __future__ import annotations

import numpy as np
import torch

from tritonformer.backend.decoder.batch import BatchEntry
from tritonformer.backend.decoder.pinned_ring import PinnedRing


class DecodeInputs:
    def __init__(self, rows: int, width: int, block_size: int, scratch_slot: int, device: torch.device,
                 scratch_state: int = -1):
        self.rows, self.block_size, self.scratch_slot = rows, block_size, scratch_slot
        self.scratch_state = scratch_state  # (-1: the model has no recurrent state)
        longs, ints = 4 * rows, rows + rows * width + rows
        nbytes = 8 * longs + 4 * ints
        self.device_buffer = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        as_long = self.device_buffer[: 8 * longs].view(torch.int64)
        as_int = self.device_buffer[8 * longs :].view(torch.int32)
        # What the graph reads (views of the one device buffer).
        self.input_ids, self.positions = as_long[:rows], as_long[rows : 2 * rows]
        self.slot_mapping, self.state_slots = as_long[2 * rows : 3 * rows], as_long[3 * rows :]
        self.seqlens, self.tables = as_int[:rows], as_int[rows : rows + rows * width].view(rows, width)
        self.steps_left = as_int[rows + rows * width :]

        self.host = np.zeros(nbytes, dtype=np.uint8)  # the mirror, laid out like device_buffer
        host_long = self.host[: 8 * longs].view(np.int64)
        host_int = self.host[8 * longs :].view(np.int32)
        self._ids, self._pos, self._slots = host_long[:rows], host_long[rows : 2 * rows], host_long[2 * rows : 3 * rows]
        self._state_slots = host_long[3 * rows :]
        self._state_slots[:] = scratch_state
        self._seqlens, self._tables = host_int[:rows], host_int[rows : rows + rows * width].reshape(rows, width)
        self._steps_left = host_int[rows + rows * width :]
        self._slots[:] = scratch_slot
        self._known: list[list[int] | None] = [None] * rows  # the block table each row holds
        self._live = 0  # rows the last pack filled (past them the mirror holds padding)
        self._row_index = np.arange(rows)
        # CUDA: the mirror goes out through pinned buffers; the CPU (tests) copies it directly.
        self._ring = PinnedRing(nbytes) if self.device_buffer.is_cuda else None
        self.send()

    def pack(self, entries: list[BatchEntry], steps: list[int] | None = None) -> None:
        """Make the mirror describe `entries` (one-token decodes, at most `rows`) then padding;
        `steps`: iterations each entry takes in this round (None: one each)."""
        n = len(entries)
        if not 0 < n <= self.rows:
            raise ValueError(f"{n} entries for a decode bucket of {self.rows} rows")
        known, tables = self._known, self._tables
        for row, e in enumerate(entries):
            table = e.block_table
            held = known[row]
            if held != table:  # a new sequence in this row, or its table grew
                if held is not None and len(table) == len(held) + 1 and table[:-1] == held:
                    tables[row, len(held)] = table[-1]  # grew by a block (one row in 16 steps)
                    held.append(table[-1])
                else:
                    tables[row, : len(table)] = table
                    known[row] = list(table)
        pos = self._pos
        if n < self._live:  # rows that held sequences last time are padding now
            pad = slice(n, self._live)
            self._ids[pad], pos[pad], self._seqlens[pad], self._slots[pad] = 0, 0, 0, self.scratch_slot
            self._state_slots[pad] = self.scratch_state
            self._steps_left[pad] = 0
        self._live = n
        if steps is None:
            self._steps_left[:n] = 0
        else:
            self._steps_left[:n] = steps
            self._steps_left[:n] -= 1  # the first iteration runs on what is packed here
        self._ids[:n] = [e.tokens[0] for e in entries]
        if self.scratch_state >= 0:
            self._state_slots[:n] = [e.state_slot for e in entries]
        pos[:n] = [e.start for e in entries]
        self._seqlens[:n] = pos[:n] + 1  # keys per sequence, this token's included
        bs = self.block_size
        live = pos[:n]
        self._slots[:n] = tables[self._row_index[:n], live // bs] * bs + live % bs

    def send(self) -> None:
        """Queue the mirror's copy to the device (never waits for the GPU)."""
        if self._ring is None:
            self.device_buffer.copy_(torch.from_numpy(self.host))
            return
        i = self._ring.take()
        np.copyto(self._ring.arrays[i], self.host)
        self.device_buffer.copy_(self._ring.buffers[i], non_blocking=True)
        self._ring.copied(i)
