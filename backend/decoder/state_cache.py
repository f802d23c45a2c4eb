"""Per-sequence recurrent state: what a hybrid model's non-attention layers carry from one token
to the next (a linear attention's or a Mamba layer's state matrix, a short convolution's last
inputs), beside the paged KV cache of its attention layers.

Unlike keys and values, such a state does not grow with the sequence: each running sequence
holds one fixed-size slot (vLLM's "mamba cache"). The scheduler gives a sequence a slot when it
joins the running batch and takes it back when it leaves or is preempted (a preempted sequence
recomputes from its first token, so its state starts again from zero); the runner zeroes a slot
before its sequence's first token runs.

`data` is `[num_slots + 1, floats per slot]` fp32: each layer's named tensors are views of it
with the slot first (`[num_slots + 1, *shape]`), so one launch zeroes a slot of every layer. The
extra last slot belongs to no sequence: padded rows of a captured decode graph update it.
"""
from __future__ import annotations

import math

import torch

from tritonformer.backend.device import to_device_async


class StateCache:
    def __init__(self, layouts: list[dict[str, tuple[int, ...]]], num_slots: int, device: torch.device):
        """`layouts[i]`: the state of the model's i-th recurrent layer, name -> per-sequence shape."""
        if num_slots < 1:
            raise ValueError("the recurrent state needs at least one slot")
        self.num_slots = num_slots
        width = sum(math.prod(shape) for layout in layouts for shape in layout.values())
        self.data = torch.zeros((num_slots + 1, width), device=device, dtype=torch.float32)
        self._layers: list[dict[str, torch.Tensor]] = []
        offset = 0
        for layout in layouts:
            views = {}
            for name, shape in layout.items():
                size = math.prod(shape)
                views[name] = self.data[:, offset : offset + size].view(num_slots + 1, *shape)
                offset += size
            self._layers.append(views)

    @property
    def scratch_slot(self) -> int:
        """The slot no sequence holds (for padding rows)."""
        return self.num_slots

    def layer(self, index: int) -> dict[str, torch.Tensor]:
        """Recurrent layer `index`'s state tensors, name -> `[num_slots + 1, *shape]` fp32."""
        return self._layers[index]

    def reset(self, slots: list[int]) -> None:
        """Zero these slots (their sequences start at their first token)."""
        index = to_device_async(torch.tensor(slots, dtype=torch.long), self.data.device)
        self.data.index_fill_(0, index, 0.0)
