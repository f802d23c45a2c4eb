"""Write the installed all-MiniLM-L6-v2 checkpoint with its weights in fp16, for the GPU machine.

The GPU machine has no internet and a call carries at most 64 MiB; the checkpoint's fp32
safetensors is 87 MiB. The GPU test loads it in fp16 anyway (`torch_dtype=torch.float16`), and
rounding to fp16 here gives exactly the tensors that load would, so the fp16 copy is the same
real checkpoint for that test:

    .venv/bin/python tools/carry_minilm_fp16.py .gpu-carry/minilm-fp16
    # then carry .gpu-carry/minilm-fp16 and run with TRITONFORMER_MINILM_DIR=.gpu-carry/minilm-fp16
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tritonformer.backend.checkpoints import minilm_dir


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    source, target = minilm_dir(), Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(source / name, target / name)
    state = {k: v.to(torch.float16) if v.is_floating_point() else v
             for k, v in load_file(source / "model.safetensors").items()}
    save_file(state, target / "model.safetensors", metadata={"format": "pt"})
    size = sum(f.stat().st_size for f in target.iterdir()) / 2**20
    print(f"{target}: {len(state)} tensors, {size:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
