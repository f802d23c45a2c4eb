"""Latent attention's norms and cache write (models/mla.py): the references against the plain
ops they stand for, and the Triton kernels against the references on fresh random inputs."""
from __future__ import annotations

import os

import pytest
import torch

from tritonformer.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _cache(blocks, block_size, heads, d, dtype):
    return torch.full((blocks, block_size, heads, d), 7.0, device=DEVICE, dtype=dtype)


def _inputs(t, heads, nope, v, r, dtype, seed=0):
    """kv `[T, H, nope + v]`; k_pe `[T, r]` with strided rows (a slice of a projection's output, as
    the model passes it); cos / sin `[T, r / 2]` with strided rows (as gathered from a [T, 2, D / 2]
    table); distinct cache slots of a 4 x 8 cache."""
    kv = _rand(t, heads, nope + v, seed=seed, dtype=dtype)
    k_pe = _rand(t, r + 8, seed=seed + 1, dtype=dtype)[:, 3 : 3 + r]
    table = _rand(t, 2, r, seed=seed + 2)
    slots = torch.randperm(4 * 8, generator=torch.Generator().manual_seed(seed))[:t].to(DEVICE)
    return kv, k_pe, table[:, 0, : r // 2], table[:, 1, : r // 2], slots


def test_reference_norms_are_rms_norms_of_the_slices():
    a = _rand(3, 24 + 16 + 8, seed=0)
    qn, kvn = _rand(24, seed=1), _rand(16, seed=2)
    q, kv = ref.mla_latent_norms(a, 24, qn, kvn, 1e-6)
    assert torch.equal(q, ref.rms_norm(a[:, :24].contiguous(), qn, 1e-6)[0])
    assert torch.equal(kv, ref.rms_norm(a[:, 24:40].contiguous(), kvn, 1e-6)[0])
    q, kv_only = ref.mla_latent_norms(a, 24, None, kvn, 1e-6)  # (queries from q_proj: only the kv latent)
    assert q is None and torch.equal(kv_only, kv)


def test_reference_cache_write_is_rotated_shared_key_then_nope_and_padded_values():
    t, heads, nope, v, r = 3, 4, 6, 5, 4
    kv, k_pe, cos, sin, slots = _inputs(t, heads, nope, v, r, torch.float32)
    kc, vc = _cache(4, 8, heads, nope + r, torch.float32), _cache(4, 8, heads, nope + r, torch.float32)
    ref.mla_kv_to_cache(kv, k_pe, cos, sin, kc, vc, slots)
    pe = ref.apply_rotary(k_pe.reshape(t, 1, r), cos, sin)[:, 0]
    flat_k, flat_v = kc.view(-1, heads, nope + r), vc.view(-1, heads, nope + r)
    for row, slot in enumerate(slots.tolist()):
        for h in range(heads):
            assert torch.equal(flat_k[slot, h], torch.cat([pe[row], kv[row, h, :nope]]))
            padding = torch.zeros(r + nope - v, device=DEVICE)
            assert torch.equal(flat_v[slot, h], torch.cat([kv[row, h, nope:], padding]))
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots.cpu()] = False
    assert (flat_k[untouched.to(DEVICE)] == 7.0).all()


triton = pytest.importorskip("triton")
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import triton_mla as tm  # noqa: E402

# (the interpreter's fp32 -> bf16 cast truncates where the GPU rounds to nearest)
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3),
       torch.bfloat16: (0.0, 2.0 ** -6) if DEVICE == "cpu" else (1e-2, 1e-2)}


@pytest.mark.parametrize("t,q_width,kv_width,dtype", [(1, 24, 16, torch.float32), (5, 0, 32, torch.float32),
                                                      (3, 96, 40, torch.bfloat16), (0, 8, 8, torch.float32)])
def test_latent_norms_kernel(t, q_width, kv_width, dtype):
    a = _rand(t, q_width + kv_width + 12, seed=t, dtype=dtype)[:, : q_width + kv_width + 4]
    qn = _rand(q_width, seed=1) if q_width else None
    kvn = _rand(kv_width, seed=2)
    got, expected = tm.mla_latent_norms(a, q_width, qn, kvn, 1e-6), ref.mla_latent_norms(a, q_width, qn, kvn, 1e-6)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got[1], expected[1], atol=atol, rtol=rtol)
    if q_width:
        torch.testing.assert_close(got[0], expected[0], atol=atol, rtol=rtol)
    else:
        assert got[0] is None
    assert dispatch._KERNELS["mla_latent_norms"] is tm.mla_latent_norms


@pytest.mark.parametrize("t,heads,nope,v,r,rotary,dtype", [
    (1, 4, 6, 5, 4, True, torch.float32), (5, 3, 8, 8, 8, True, torch.float32), (4, 6, 8, 16, 8, False, torch.float32),
    (2, 5, 10, 14, 6, True, torch.float16),
    (3, 16, 32, 32, 16, True, torch.bfloat16), (0, 2, 4, 4, 4, True, torch.float32),
])
def test_kv_to_cache_kernel(t, heads, nope, v, r, rotary, dtype):
    d = nope + r
    kv, k_pe, cos, sin, slots = _inputs(t, heads, nope, v, r, dtype, seed=t)
    cos, sin = (cos, sin) if rotary else (None, None)
    caches = [_cache(4, 8, heads, d, dtype) for _ in range(4)]
    tm.mla_kv_to_cache(kv, k_pe, cos, sin, caches[0], caches[1], slots)
    ref.mla_kv_to_cache(kv, k_pe, cos, sin, caches[2], caches[3], slots)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(caches[0], caches[2], atol=atol, rtol=rtol)
    torch.testing.assert_close(caches[1], caches[3], atol=0, rtol=0)  # (values are copied, never rounded)
    assert dispatch._KERNELS["mla_kv_to_cache"] is tm.mla_kv_to_cache
