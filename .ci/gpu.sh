#!/usr/bin/env bash
# Run on the GPU machine (not part of CI, which has no GPU): the GPU-marked tests and the
# runtime and decoder benchmarks, in one go. Expects the image's python3 with torch, triton, transformers.
# Optional: TRITONFORMER_MINILM_DIR pointing at an all-MiniLM-L6-v2 folder.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tritonformer-gpu-out}
mkdir -p "$OUT" /tmp/tf
ln -sfn "$PWD" /tmp/tf/tritonformer          # import tritonformer.* without installing
export PYTHONPATH=/tmp/tf PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
python3 -m pytest -q -p no:cacheprovider -m "gpu or cuda_ok" -rs "$@" \
  tests/test_kernels_triton_norms.py tests/test_kernels_triton_attention.py tests/test_kernels_triton_gemm.py \
  tests/test_kernels_paged_attention.py tests/test_kernels_out_param.py tests/test_models_gpu.py \
  tests/test_kernels_triton_pooling.py \
  tests/test_sampling.py 2>&1 | tee "$OUT/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
python3 -m tritonformer.client.cli bench runtime --json "$OUT/bench_runtime.json" 2>&1 | tee "$OUT/bench_runtime.log"
bench_rc=${PIPESTATUS[0]}
python3 -m tritonformer.client.cli bench serve-decoder --in-process --json "$OUT/bench_decoder.json" 2>&1 \
  | grep -v '^\[hf-baseline\]' | tee "$OUT/bench_decoder.log"
decoder_rc=${PIPESTATUS[0]}
echo "gpu tests rc=$tests_rc bench rc=$bench_rc decoder bench rc=$decoder_rc"
exit $(( tests_rc || bench_rc || decoder_rc ))
