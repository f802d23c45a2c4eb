"""The paged KV cache's layouts: one tensor for every layer, or (layer_shapes) one per distinct (KV heads, head dim)."""
from __future__ import annotations

import pytest
import torch

from tritonformer.backend.decoder.kv_cache import PagedKVCache

CPU = torch.device("cpu")


def test_one_shape_keeps_one_tensor_for_every_layer():
    cache = PagedKVCache(3, 4, 8, 2, 16, CPU, torch.float16)
    same = PagedKVCache(3, 4, 8, 2, 16, CPU, torch.float16, layer_shapes=[(2, 16)] * 3)
    for c in (cache, same):
        assert c.data.shape == (3, 2, 5, 8, 2, 16) and c.parts == {}
        assert c.keys(1).data_ptr() == c.data[1, 0].data_ptr() and c.values(2).data_ptr() == c.data[2, 1].data_ptr()
        assert c.nbytes() == 3 * 2 * 5 * 8 * 2 * 16 * 2 and c.bytes_per_block() == 3 * 2 * 8 * 2 * 16 * 2


def test_layers_of_different_shapes_each_hold_their_own_without_padding():
    """Gemma 4's kind: sliding layers (4 KV heads of 8) and full ones (1 of 16), each layer's keys and values
    contiguous views of their shape's tensor, the bytes those of the shapes alone."""
    shapes = [(4, 8), (1, 16), (4, 8), (1, 16), (4, 8)]
    cache = PagedKVCache(5, 3, 2, 4, 8, CPU, torch.float32, layer_shapes=shapes)
    assert cache.data is None and {s: t.shape[0] for s, t in cache.parts.items()} == {(4, 8): 3, (1, 16): 2}
    for layer, (kv, d) in enumerate(shapes):
        for t in (cache.keys(layer), cache.values(layer)):
            assert t.shape == (4, 2, kv, d) and t.is_contiguous()
    cache.keys(3).fill_(1.0)  # (a layer's write touches no other layer's keys or values)
    for layer in range(5):
        cache.values(layer).zero_()
        if layer != 3:
            cache.keys(layer).zero_()
    assert cache.keys(3).eq(1.0).all() and cache.keys(1).eq(0.0).all() and cache.values(3).eq(0.0).all()
    per_token = 2 * (3 * 4 * 8 + 2 * 1 * 16) * 4
    assert cache.nbytes() == per_token * 4 * 2 and cache.bytes_per_block() == per_token * 2
    with pytest.raises(ValueError, match="2 KV layer shapes for 3 layers"):
        PagedKVCache(3, 3, 2, 4, 8, CPU, torch.float32, layer_shapes=[(4, 8), (1, 16)])
