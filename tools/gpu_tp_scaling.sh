#!/usr/bin/env bash
# Tensor parallelism on a host of 4 GPUs (and 8 where present), in device commands of under
# 10 minutes each (`bench tensor-parallel`, client/bench_tensor_parallel.py):
#   PART=1  agreement (greedy tokens, first-step logits against TP=1 and TP=2) and decode steps at
#           batch 1 and 64, context 512, on the Llama-3.1-8B shape at TP 1, 2, 4 (8), all-reduce
#           nccl and auto, one after the other in one run;
#   PART=2  decode steps on the Llama-3.1-70B shape at TP 2, 4 (8), the Orca trace at each size
#           that holds it (tokens/s, TTFT p50/p99), the all-reduce time per step from a profile;
#   PART=3  (optional) the Orca trace on the 8B shape at TP 1, 2, 4 (8) beside as many one-GPU
#           replicas, the profile, and one 4,096-token prefill (its all-reduce share).
# Overrides: SIZES (e.g. SIZES=8 PART=2 when 2,4,8 do not fit in one command), ALLREDUCE,
# KV_FRACTION, LIMIT (seconds for the whole run, default 570). Outputs under $OUT:
# tp_scaling_<part>[_<sizes>].log / .json (the sizes named where SIZES is given), tp_scaling_gpus.txt.
set -uo pipefail
PART=${PART:-1}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tritonformer-gpu-out}
mkdir -p "$OUT" /tmp/tf
ln -sfn "$PWD" /tmp/tf/tritonformer          # import tritonformer.* without installing
export PYTHONPATH=/tmp/tf PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# NVLink multicast off (NCCL's NVLS, torch's symmetric-memory multimem): not lent on these machines.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
bash tools/build_native.sh >/dev/null
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$OUT/tp_scaling_gpus.txt"
nvidia-smi topo -m 2>/dev/null | head -12 >> "$OUT/tp_scaling_gpus.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'nccl',
  torch.cuda.nccl.version() if torch.cuda.is_available() else '-')"
GPUS=$(nvidia-smi -L | wc -l)
if (( GPUS >= 8 )); then SIZES_8B=1,2,4,8; SIZES_70B=2,4,8; else SIZES_8B=1,2,4; SIZES_70B=2,4; fi
(( GPUS < 4 )) && echo "note: $GPUS GPUs here: the sizes above $GPUS are skipped"
LIMIT=${LIMIT:-570}
NAME=tp_scaling_$PART${SIZES:+_${SIZES//,/-}}
bench() {  # the whole run bounded; SIGTERM first: the benchmark prints what it measured, then stops
  timeout -k 20 "$LIMIT" python3 -m tritonformer.client.cli bench tensor-parallel "$@" \
    --json "$OUT/$NAME.json" 2>&1 | tee "$OUT/$NAME.log"
  return "${PIPESTATUS[0]}"
}
case $PART in
  1) bench --model llama-3.1-8b --sizes "${SIZES:-$SIZES_8B}" --batches 1,64 --parts agree,steps \
       --allreduce "${ALLREDUCE:-nccl,auto}" --timeout 240 ;;
  2) bench --model llama-3.1-70b --sizes "${SIZES:-$SIZES_70B}" --batches 1,64 --parts steps,trace,profile \
       --allreduce "${ALLREDUCE:-auto}" --kv-fraction "${KV_FRACTION:-0.5}" --timeout 420 ;;
  3) bench --model llama-3.1-8b --sizes "${SIZES:-$SIZES_8B}" --batches 1,64 --parts trace,profile,prefill --replicas \
       --allreduce "${ALLREDUCE:-auto}" --timeout 240 ;;
  *) echo "PART must be 1, 2 or 3" >&2; exit 2 ;;
esac
rc=$?
echo "tp scaling part $PART rc=$rc (124: the run's time limit, rows so far above)"
exit $rc
