#!/usr/bin/env bash
# The embedder with its engine in a process of its own (engine_process=true) against the engine on
# each stub's thread (false), served by a real tritonserver on the GPU machine, in one machine
# start (carry .gpu-carry/server, as for tools/gpu_served_bench.sh). Random-weight bert-base,
# the "mixed" length distribution, open-loop Poisson load at each of EMBED_RATES for POINT_SECONDS (4).
#
# One server start per CONFIGS entry, "engine_process:instances[:b][/threads]" (default: the thread
# with 1 and 4 instances, the engine process with 1, 2 and 4); a third field "b" puts the embedder
# behind Triton's batcher (EMBEDDER_TRITON_BATCHING=1: several requests per execute() call, requests
# shaped [1, ...]); "/threads" sets response_threads (else the config.pbtxt default).
# CLIENT_PROCESSES (4) load-generator processes, about one per 1,500 req/s.
# EMBEDDER_EXTRA: more config parameters for every configuration ("key=value ...").
# Per load point it samples the GPU's busy % with
# nvidia-smi and the server's CPU (tritonserver, its stubs and the engine process: cores used) from
# /proc, and prints one table, then per configuration the goodput: the highest throughput whose
# p99 <= SLO_MS (50) with every request answered.
# Targets (H100, issue "one engine per GPU"): goodput >= 10,000 req/s, GPU busy >= 70% at saturation.
#
#   bash tools/encoder_engine_process_bench.sh     (~100 s per configuration, the first ~50 s more
#                                                   on a fresh machine; results under $OUT)
set -uo pipefail
trap 'tools/gpu_server.sh stop > /dev/null 2>&1' EXIT  # a server left running would take the next one's ports
trap 'exit 143' TERM
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/served-out}
CONFIGS=${CONFIGS:-false:1 false:4 true:1 true:2 true:4}
EMBED_RATES=${EMBED_RATES:-2000,4000,6000,8000,10000,12000,16000}
POINT_SECONDS=${POINT_SECONDS:-4}
SLO_MS=${SLO_MS:-50}
CLIENT_PROCESSES=${CLIENT_PROCESSES:-4}
mkdir -p "$OUT" /tmp/tf
ln -sfn "$PWD" /tmp/tf/tritonformer
export PYTHONPATH=/tmp/tf PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
[[ -d /tmp/ckpt/bert-base ]] || python3 tools/make_bench_checkpoints.py /tmp/ckpt --tokenizers .gpu-carry/server/tokenizers
export EMBEDDER_CHECKPOINT=/tmp/ckpt/bert-base GENERATOR_CHECKPOINT=/tmp/ckpt/gpt2 SERVE_MODELS=embedder

server_cpu_seconds() {  # user + system CPU seconds of tritonserver and every process under it
  python3 - "$(cat /tmp/tritonserver.pid 2>/dev/null || echo 0)" <<'EOF'
import os, sys
root, tick = int(sys.argv[1]), os.sysconf("SC_CLK_TCK")
parents, cpu = {}, {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    parents[int(pid)], cpu[int(pid)] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
def under(pid):
    while pid > 1:
        if pid == root:
            return True
        pid = parents.get(pid, 0)
    return False
print(sum(c for p, c in cpu.items() if under(p)))
EOF
}

for config in $CONFIGS; do
  IFS=/ read -r base threads <<<"$config"
  IFS=: read -r ep instances batching <<<"$base"
  tag="ep${ep}_x$instances${batching:+_$batching}${threads:+_t$threads}"
  batch_dim=() triton_batching=0
  if [[ $batching == b ]]; then batch_dim=(--batch-dim) triton_batching=1; fi
  echo "== engine_process=$ep, $instances instance(s)${batching:+, behind the Triton batcher}${threads:+, $threads response threads}"
  t0=$(date +%s)
  if ! EMBEDDER_TRITON_BATCHING=$triton_batching \
      EMBEDDER_PARAMS="pooling=mean normalize=true engine_process=$ep ${threads:+response_threads=$threads} ${EMBEDDER_EXTRA:-}" EMBEDDER_INSTANCES=$instances \
      timeout 300 tools/gpu_server.sh start > "$OUT/encoder_ep_server_$tag.log" 2>&1; then
    echo "server did not start:"; tail -20 /tmp/tritonserver.log; tools/gpu_server.sh stop > /dev/null 2>&1; continue
  fi
  echo "ready after $(( $(date +%s) - t0 )) s"
  for rate in ${EMBED_RATES//,/ }; do
    timeout 30 nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -i 0 -lms 200 \
      > "$OUT/encoder_ep_gpu_${tag}_$rate.txt" 2>/dev/null &
    sampler=$!
    cpu0=$(server_cpu_seconds); w0=$(date +%s.%N)
    timeout 120 python3 -m tritonformer.client.loadgen embed --url 127.0.0.1:8000 --rates "$rate" \
      --seconds "$POINT_SECONDS" --warmup 1 --distribution mixed --processes "$CLIENT_PROCESSES" "${batch_dim[@]}" \
      --json "$OUT/encoder_ep_${tag}_$rate.json" > "$OUT/encoder_ep_${tag}_$rate.log" 2>&1 \
      || { echo "load at $rate req/s failed:"; tail -5 "$OUT/encoder_ep_${tag}_$rate.log"; }
    cpu1=$(server_cpu_seconds); w1=$(date +%s.%N)
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    python3 -c "print(($cpu1 - $cpu0) / ($w1 - $w0))" > "$OUT/encoder_ep_cpu_${tag}_$rate.txt"
  done
  grep -E "Signal \([0-9]+\) received|engine process failed" /tmp/tritonserver.log | grep -v "Signal (15)" | head -5
  cp /tmp/tritonserver.log "$OUT/encoder_ep_tritonserver_$tag.log" 2>/dev/null
  tools/gpu_server.sh stop > /dev/null 2>&1
done

python3 tools/encoder_ep_table.py "$OUT" "$SLO_MS" $CONFIGS
