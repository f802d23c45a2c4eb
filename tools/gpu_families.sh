#!/usr/bin/env bash
# The decoder families on one GPU, in one device command of under 10 minutes: each family's GPU
# check against Hugging Face at its published width (tests/test_models_gpu.py, 8 layers; and, named
# in ON_7B, families without a published shape here on a 7B one, `on_a_7b_shape`), then the
# families benchmark (batch-1 and batch-64 steps against the weight-read floor, the Orca trace,
# the time to first token of 2,000 tokens; `bench serve-decoder --in-process --model ...`).
#
#   MODELS=phi-4-mini,granite-3.1-8b bash tools/gpu_families.sh
#
# MODELS: the published shapes (client/model_shapes.py; default: the families not yet timed, more than
# one run's LIMIT holds: split them over two calls);
# ON_7B: `on_a_7b_shape` families to check too (e.g. "exaone4 or cohere2"; default none);
# TESTS=0 skips the GPU checks (KERNEL_TESTS=0 only the kernels'), BENCH=0 the benchmark, TUNE=0 the MoE GEMM timings (tools/gpu/tune_moe_gemm.py:
# the tile sweep at 1, 2 and 2,000 tokens; run when MODELS holds a MoE shape);
# LIMIT: seconds for the whole run (570); TRANSFORMERS_WHEEL: a transformers wheel (copied into the
# working tree, untracked, so it travels) that the HF checks import instead of the image's, for
# families newer than it (the H200 image's 5.17 has no internlm3, exaone_moe, cwm, granite_swa,
# granitemoe_swa, nanochat, hyperclovax or mellum: their checks skip). Each check prints as it ends
# (-v), so a run cut short by LIMIT still says which passed.
# Outputs under $OUT: families_kernel_tests.log, families_gpu_tests.log, families_moe_tune.md,
# families_bench.log / .json, families_gpus.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tritonformer-gpu-out}
MODELS=${MODELS:-cwm-32b,granite-swash-2b,granitemoe-swa-3b,olmo-7b,nanochat-d32,hyperclovax,mellum2-12b-a2.5b,minimax-m2,command-a-plus,codegen-350m-mono,gpt-neo-125m,hy3-preview,biogpt,flint}
LIMIT=${LIMIT:-570}
START=$(date +%s)
mkdir -p "$OUT" /tmp/tf
ln -sfn "$PWD" /tmp/tf/tritonformer          # import tritonformer.* without installing
export PYTHONPATH=/tmp/tf PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
bash tools/build_native.sh >/dev/null
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$OUT/families_gpus.txt"
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
if [[ ${TESTS:-1} != 0 ]]; then
  # The kernels only the newest families use, on the GPU against their references first: MoE
  # routing and GEMMs, the post-norm block's prologue ("sum"), whole-width and per-head q/k norms,
  # the plain MLP's ReLU and squared ReLU epilogues, the long rows of Falcon's and StarCoder's down projections.
  [[ ${KERNEL_TESTS:-1} == 0 ]] || timeout -k 10 240 python3 -m pytest -q tests/test_kernels_moe.py \
    tests/test_kernels_gemv.py tests/test_kernels_prenorm_linear.py tests/test_kernels_triton_norms.py \
    tests/test_kernels_small_gemm.py \
    -k "moe or sum or whole or head_norms or relu or long" \
    -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/families_kernel_tests.log"
  names=${MODELS//,/ or }
  hf_path=$PYTHONPATH
  if [[ -n ${TRANSFORMERS_WHEEL:-} ]]; then
    python3 -m pip install -q --no-deps --target /tmp/tf-transformers "$TRANSFORMERS_WHEEL" && hf_path=/tmp/tf-transformers:$PYTHONPATH
  fi
  PYTHONPATH=$hf_path timeout -k 10 "$(( $(left) / 2 ))" python3 -m pytest -m gpu tests/test_models_gpu.py -v \
    -k "(published_width and ($names))${ON_7B:+ or (on_a_7b_shape and ($ON_7B))}" \
    -p no:cacheprovider 2>&1 | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^E " | tee "$OUT/families_gpu_tests.log"
fi
moe=$(python3 -c "from tritonformer.client.model_shapes import DECODER_SHAPES as s; import sys
print(','.join(m for m in sys.argv[1].split(',') if 'num_experts_per_tok' in s[m]))" "$MODELS")
if [[ ${TUNE:-1} != 0 && -n $moe ]]; then
  timeout -k 10 "$(( $(left) / 4 ))" python3 tools/gpu/tune_moe_gemm.py --models "$moe" --tokens 1,2,2000 \
    2>/dev/null | tee "$OUT/families_moe_tune.md"
fi
if [[ ${BENCH:-1} != 0 ]]; then
  timeout -k 20 "$(left)" python3 -m tritonformer.client.cli bench serve-decoder --in-process --skip-hf \
    --dtype bfloat16 --model "$MODELS" --json "$OUT/families_bench.json" 2>&1 | tee "$OUT/families_bench.log" | grep '^|'
fi
echo "families run done in $(( $(date +%s) - START )) s"
