"""Random paged KV pools for the attention kernels' tests (sinks, ALiBi): each sequence's keys scattered
over random blocks of a pool with a few blocks owned by nobody."""
from __future__ import annotations

import torch


def random_paged_pool(lq, lk, heads, kv_heads, head_dim, block_size, dtype, gen, device):
    """(q `[sum(lq), heads, D]`, k_cache, v_cache `[blocks, block_size, kv_heads, D]`, block tables, key counts)
    for query rows `lq` and key counts `lk` per sequence, drawn from the CPU generator `gen` in that order."""
    blocks_each = [-(-n // block_size) for n in lk]
    num_blocks = sum(blocks_each) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(lk), max(blocks_each + [1]), dtype=torch.int32)
    for i, nb in enumerate(blocks_each):
        tables[i, :nb] = torch.tensor(order[:nb], dtype=torch.int32)
        order = order[nb:]

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    k_cache = rand(num_blocks, block_size, kv_heads, head_dim)
    v_cache = rand(num_blocks, block_size, kv_heads, head_dim)
    q = rand(sum(lq), heads, head_dim)
    return q, k_cache, v_cache, tables.to(device), torch.tensor(lk, dtype=torch.int32, device=device)
