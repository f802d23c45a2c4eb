"""kernels/triton_pooling.py against the PyTorch reference on fresh random inputs: in Triton's
CPU interpreter on small shapes (CI), and on real encoder shapes on a GPU (marked)."""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: Triton kernels cannot run", allow_module_level=True)

from tritonformer.kernels import dispatch  # noqa: E402
from tritonformer.kernels import reference as ref  # noqa: E402
from tritonformer.kernels import triton_pooling as tp  # noqa: E402


def _packed(lengths, hidden, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(sum(lengths), hidden, generator=gen) * 2 + 0.5).to(dtype).to(DEVICE)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    return x, cu


def test_registered():
    assert dispatch._KERNELS["pool_sequences"] is tp.pool_sequences


@pytest.mark.cuda_ok
@pytest.mark.parametrize("mode", ["mean", "cls", "last"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_reference(mode, normalize, dtype, monkeypatch):
    monkeypatch.setattr(tp, "_MAX_BLOCK_H", 32)  # 100 columns: four chunks, the last partial
    monkeypatch.setattr(tp, "_TILE_ELEMS", 128)  # 4 rows per step: lengths cross several steps
    lengths = [7, 1, 0, 13, 4]  # an empty sequence gives zeros
    x, cu = _packed(lengths, 100, dtype, seed=len(mode) + normalize)
    got = tp.pool_sequences(x, cu, mode, normalize)
    expected = ref.pool_sequences(x, cu, mode, normalize)
    assert got.dtype == torch.float32 and got.shape == (len(lengths), 100)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.all(got[2] == 0)
    if mode == "last":  # each sequence's last row, independently of the reference
        ends = cu[1:].long() - 1
        picked = x[ends].float()
        if normalize:
            picked = picked / picked.norm(dim=1, keepdim=True)
        torch.testing.assert_close(got[[0, 1, 3, 4]], picked[[0, 1, 3, 4]], atol=1e-5, rtol=1e-5)


def test_unknown_mode_is_an_error():
    x, cu = _packed([2], 8, torch.float32, seed=0)
    with pytest.raises(ValueError):
        tp.pool_sequences(x, cu, "max", False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("hidden", [384, 768, 4096])
def test_gpu_shapes(hidden):
    x, cu = _packed([512, 1, 37, 300, 128] * 13, hidden, torch.float16, seed=hidden)
    for mode in ("mean", "cls", "last"):
        torch.testing.assert_close(tp.pool_sequences(x, cu, mode, True), ref.pool_sequences(x, cu, mode, True),
                                   atol=1e-5, rtol=1e-4)
