#!/usr/bin/env bash
# Run on the GPU machine (not part of CI, which has no GPU): the GPU-marked tests and the
# runtime and decoder benchmarks, in one go. Expects the image's python3 with torch, triton, transformers.
# Optional: TRITONFORMER_MINILM_DIR pointing at an all-MiniLM-L6-v2 folder (tools/carry_minilm_fp16.py
# writes one small enough to carry).
# PARTS (default "tests runtime decoder") picks what runs; "families" (not a default) benchmarks the
# decoder families at their published shapes (FAMILIES, a comma-separated list of client/model_shapes.py names), e.g. PARTS=decoder bash .ci/gpu.sh:
# a device command is capped at 10 minutes, so the parts can go in separate calls. "policies"
# (not a default) runs the encoder batching policies in-process on padded and packed execution;
# "profile" (not a default) times the few-row GEMMs against cuBLAS, a decode step's linears as
# separate kernels against the prefetching GEMV with and without PDL, and profiles the benchmarked
# shapes kernel by kernel (tools/gpu/time_small_gemm.py, tools/gpu/time_decode_linears.py,
# tools/gpu/profile_gpu_kernels.py); "dp" (not a default) times the DP batcher's decision on this
# host's CPU (tools/time_dp_decision.py); "ffn" (not a default) sweeps the fused many-row FFN
# GEMM's tiles and the packed attention's launch configurations (tools/gpu/time_ffn_gemm.py,
# tools/gpu/tune_prefill_attention.py); "tp" (not a default; 2+ GPUs) runs the tensor-parallel GPU
# tests and `bench tensor-parallel` on the Llama-3.1-8B (TP 1 and 2) and 70B (TP 2) shapes. The other
# measurements: tools/README.md.
set -uo pipefail
PARTS=${PARTS:-tests runtime decoder}
want() { [[ " $PARTS " == *" $1 "* ]]; }
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tritonformer-gpu-out}
mkdir -p "$OUT" /tmp/tf
ln -sfn "$PWD" /tmp/tf/tritonformer          # import tritonformer.* without installing
export PYTHONPATH=/tmp/tf PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
bash tools/build_native.sh  # the compiled DP loop, which `pip install` builds elsewhere
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
tests_rc=0
if want tests; then
  python3 -m pytest -q -p no:cacheprovider -m "gpu or cuda_ok" -rs "$@" \
    tests/test_kernels_triton_norms.py tests/test_kernels_triton_attention.py tests/test_kernels_triton_gemm.py \
    tests/test_kernels_paged_attention.py tests/test_kernels_out_param.py tests/test_models_gpu.py \
    tests/test_kernels_triton_pooling.py tests/test_kernels_small_gemm.py tests/test_kernels_prenorm_linear.py \
    tests/test_kernels_gemv.py tests/test_sampling.py tests/test_kernels_triton_sampling.py \
    tests/test_kernels_triton_decode_steps.py tests/test_kernels_triton_rotary.py tests/test_modernbert.py \
    tests/test_encoder_heads_gpu.py tests/test_sampling_options.py tests/test_prefix_cache.py \
    tests/test_decoder_runner_gpu.py tests/test_fp8.py tests/test_deberta_v2.py \
    tests/test_kernels_disentangled_attention.py tests/test_encoder_families_vs_hf.py \
    tests/test_kernels_relative_attention.py 2>&1 | tee "$OUT/gpu-tests.log"
  tests_rc=${PIPESTATUS[0]}
fi
bench_rc=0
if want runtime; then
  python3 -m tritonformer.client.cli bench runtime --json "$OUT/bench_runtime.json" 2>&1 | tee "$OUT/bench_runtime.log"
  bench_rc=${PIPESTATUS[0]}
fi
decoder_rc=0
if want decoder; then
  python3 -m tritonformer.client.cli bench serve-decoder --in-process --json "$OUT/bench_decoder.json" 2>&1 \
    | grep -v '^\[hf-baseline\]' | tee "$OUT/bench_decoder.log"
  decoder_rc=${PIPESTATUS[0]}
fi
families_rc=0
if want families; then
  python3 -m tritonformer.client.cli bench serve-decoder --in-process --dtype bfloat16 \
    --model "${FAMILIES:-llama-3.1-8b,qwen2.5-7b,qwen3-8b,mistral-7b,gemma-2-9b,phi-3-mini}" \
    --json "$OUT/bench_families.json" 2>&1 | tee "$OUT/bench_families.log"
  families_rc=${PIPESTATUS[0]}
fi
policies_rc=0
if want policies; then
  for execution in padded packed; do
    python3 -m tritonformer.client.cli bench serve-encoder --in-process --execution "$execution" \
      --policies fifo-count,fifo-tokens,sort-window,dp --rates 500,1000,2000,4000,6000,8000 --seconds 3 \
      --json "$OUT/bench_policies_$execution.json" 2>&1 | tee "$OUT/bench_policies_$execution.log"
    policies_rc=$(( policies_rc || PIPESTATUS[0] ))
  done
fi
profile_rc=0
if want profile; then
  python3 tools/gpu/time_small_gemm.py 2>&1 | tee "$OUT/time_small_gemm.log"
  profile_rc=${PIPESTATUS[0]}
  python3 tools/gpu/time_decode_linears.py 2>&1 | tee "$OUT/time_decode_linears.log"
  profile_rc=$(( profile_rc || PIPESTATUS[0] ))
  python3 tools/gpu/profile_gpu_kernels.py --json "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log"
  profile_rc=$(( profile_rc || PIPESTATUS[0] ))
fi
dp_rc=0
if want dp; then
  python3 tools/time_dp_decision.py 2>&1 | tee "$OUT/time_dp_decision.log"
  dp_rc=${PIPESTATUS[0]}
fi
ffn_rc=0
if want ffn; then
  python3 tools/gpu/time_ffn_gemm.py 2>&1 | tee "$OUT/time_ffn_gemm.log"
  ffn_rc=${PIPESTATUS[0]}
  python3 tools/gpu/tune_prefill_attention.py 2>&1 | tee "$OUT/tune_prefill_attention.log"
  ffn_rc=$(( ffn_rc || PIPESTATUS[0] ))
fi
echo "gpu tests rc=$tests_rc bench rc=$bench_rc decoder bench rc=$decoder_rc families rc=$families_rc policies rc=$policies_rc profile rc=$profile_rc dp rc=$dp_rc ffn rc=$ffn_rc"
tp_rc=0
if want tp; then  # a machine of 2 or more GPUs: the split against one GPU, then the 70B shape split
  python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_allreduce.py tests/test_tensor_parallel.py 2>&1 \
    | tee "$OUT/tp-tests.log"
  tp_rc=${PIPESTATUS[0]}
  python3 -m tritonformer.client.cli bench tensor-parallel --model llama-3.1-8b --sizes 1,2 --batches 1,64 \
    --allreduce nccl,auto --json "$OUT/tp_8b.json" 2>&1 | tee "$OUT/tp_8b.log"
  python3 -m tritonformer.client.cli bench tensor-parallel --model llama-3.1-70b --sizes 2 --batches 1,64 \
    --json "$OUT/tp_70b.json" 2>&1 | tee "$OUT/tp_70b.log"
  tp_rc=$(( tp_rc || PIPESTATUS[0] ))
fi
exit $(( tests_rc || bench_rc || decoder_rc || families_rc || policies_rc || profile_rc || dp_rc || ffn_rc || tp_rc ))
