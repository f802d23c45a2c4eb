"""The paged KV cache: one pool of fixed-size blocks shared by every sequence (vLLM's layout).

`data` is `[layers, 2, num_blocks + 1, block_size, kv_heads, head_dim]`. Which blocks a
sequence owns is decided by the scheduler's BlockManager; this object only holds the memory.
The extra last block belongs to no sequence: padded rows of a captured CUDA graph write their
(meaningless) keys there, so a replay never touches a live sequence's cache.

A model whose layers cache keys of different shapes (Gemma 4: sliding layers' heads of 256, full
layers' fewer of 512) passes `layer_shapes`, one (kv_heads, head_dim) per cache layer: the layers of
each distinct shape then share one tensor `[n, 2, num_blocks + 1, block_size, kv_heads, head_dim]`
(`parts`), `keys(layer)` / `values(layer)` are views into it (contiguous, as the kernels read them),
and `data` is None. Nothing is padded: every layer holds its own shape's bytes.
"""
from __future__ import annotations

import torch


class PagedKVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype, layer_shapes: list[tuple[int, int]] | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.parts: dict[tuple[int, int], torch.Tensor] = {}
        self._where: list[tuple[tuple[int, int], int]] = []  # per layer: (its shape, its index in that part)
        if layer_shapes is not None and len(set(layer_shapes)) > 1:  # layers of different shapes (module docstring)
            if len(layer_shapes) != num_layers:
                raise ValueError(f"{len(layer_shapes)} KV layer shapes for {num_layers} layers")
            counts: dict[tuple[int, int], int] = {}
            for shape in layer_shapes:
                self._where.append((tuple(shape), counts.get(tuple(shape), 0)))
                counts[tuple(shape)] = counts.get(tuple(shape), 0) + 1
            self.parts = {shape: torch.empty((n, 2, num_blocks + 1, block_size, *shape), device=device, dtype=dtype)
                          for shape, n in counts.items()}
            self.data = None
        else:
            if layer_shapes:
                num_kv_heads, head_dim = layer_shapes[0]
            self.data = torch.empty(
                (num_layers, 2, num_blocks + 1, block_size, num_kv_heads, head_dim), device=device, dtype=dtype
            )
        # A hybrid model's per-sequence recurrent state (decoder/state_cache.py), beside the KV of
        # its attention layers: what its forward reads with the cache. None for other models.
        self.state = None

    @property
    def scratch_slot(self) -> int:
        """A slot in the block no sequence owns (for padding rows)."""
        return self.num_blocks * self.block_size

    def keys(self, layer: int) -> torch.Tensor:
        if self.data is None:
            shape, index = self._where[layer]
            return self.parts[shape][index, 0]
        return self.data[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        if self.data is None:
            shape, index = self._where[layer]
            return self.parts[shape][index, 1]
        return self.data[layer, 1]

    def nbytes(self) -> int:
        if self.data is None:
            return sum(t.numel() * t.element_size() for t in self.parts.values())
        return self.data.numel() * self.data.element_size()

    def bytes_per_block(self) -> int:
        return self.nbytes() // (self.num_blocks + 1)


def plan_num_blocks(model, block_size: int, tokens_setting: str, memory_fraction: float,
                    max_running: int = 1) -> int:
    """How many blocks the cache gets: `tokens_setting` tokens' worth, or for "auto" a share
    of the GPU memory still free (other models may share the GPU), on the CPU room for the
    longest sequence or 16384 tokens. At least one longest sequence must fit, or it could never
    finish. A model without attending layers (Mamba: `num_kv_layers` 0) stores nothing in its
    blocks, which only count tokens for the scheduler: "auto" gives each of `max_running`
    sequences room for the longest."""
    per_token = model.kv_bytes_per_token()
    longest = model.config.max_position_embeddings
    if tokens_setting == "auto" and per_token == 0:
        tokens = longest * max(1, max_running)
    elif tokens_setting != "auto":
        try:
            tokens = int(tokens_setting)
        except ValueError:
            raise ValueError(f"parameter kv_cache_tokens must be an integer or auto, got {tokens_setting!r}") from None
    elif model.device.type == "cuda":
        if not 0.0 < memory_fraction < 1.0:
            raise ValueError(f"parameter kv_cache_memory_fraction must be in (0, 1), got {memory_fraction}")
        free, _ = torch.cuda.mem_get_info(model.device)
        tokens = int(free * memory_fraction) // per_token
    else:
        tokens = max(longest, 16384)
    blocks = tokens // block_size
    needed = -(-longest // block_size)
    if blocks < needed:
        raise ValueError(
            f"the KV cache holds {blocks * block_size} tokens, less than one sequence of the model's "
            f"maximum length {longest}: raise kv_cache_tokens / kv_cache_memory_fraction, or serve shorter "
            f"sequences with max_model_len (Llama 4 Scout's checkpoint allows 10,485,760 tokens)"
        )
    return blocks
