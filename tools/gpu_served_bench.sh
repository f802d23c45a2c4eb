#!/usr/bin/env bash
# The served benchmarks on the GPU machine: a real tritonserver (tools/gpu_server.sh) with
# random-weight bert-base (embedder) and gpt2 (generator), driven over HTTP by the open-loop
# Poisson load generator (client/loadgen.py) in separate processes.
#
#   tools/gpu_served_bench.sh fifo|dp [INSTANCES]   (carry .gpu-carry/server; results under $OUT)
#   tools/gpu_served_bench.sh stock                  the stock set-ups on the same checkpoints
#   tools/gpu_served_bench.sh batched [INSTANCES]    fifo, the embedder behind Triton's batcher
#   tools/gpu_served_bench.sh rerank                 the reranker: ours with fifo, ours with dp, and the
#                                                    stock hf_reranker, one server start each, on a
#                                                    random bge-reranker-v2-m3-shaped checkpoint; 1 query
#                                                    x 32 "mixed" documents per request at RERANK_RATES
#                                                    (STOCK_RERANK_RATES for the stock one); goodput at
#                                                    p99 <= 100 ms of each and ours / stock
#   tools/gpu_served_bench.sh profile                py-spy samples the embedder's stub process
#                                                    at PROFILE_RATE req/s (carry .gpu-carry/pyspy),
#                                                    and its engine process with
#                                                    EMBEDDER_EXTRA="engine_process=true"
#
# fifo / dp: the embedder's batch_policy for this server start (the served default is fifo with
# a token budget); INSTANCES: embedder model instances (1). The generator part runs with
# "fifo 1" only, once per stream_interval in $STREAM_INTERVALS, with $GENERATOR_EXTRA added to
# its parameters (e.g. "max_decode_steps=1"), $EMBEDDER_EXTRA to the embedder's, and $GEN_TAG to its result names; SKIP_EMBED=1
# skips the embedder's load. stock: HF BertModel and HF
# generate behind Triton's dynamic batcher (client/stock_repository), at STOCK_EMBED_RATES and
# STOCK_GEN_RATES with STOCK_GEN_REQUESTS requests per point.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-fifo}
INSTANCES=${2:-1}
POLICY=$MODE  # our embedder's batch_policy: fifo or dp, fifo for the other modes
BATCH_DIM=()
if [[ $MODE == batched ]]; then  # several requests per execute() call; requests shaped [1, ...]
  export EMBEDDER_TRITON_BATCHING=1
  BATCH_DIM=(--batch-dim)
  POLICY=fifo
  TAG_SUFFIX=_batched
elif [[ $MODE == profile ]]; then
  POLICY=fifo
fi
STREAM_INTERVALS=${STREAM_INTERVALS:-1}
OUT=${OUT:-/tmp/served-out}
EMBED_RATES=${EMBED_RATES:-500,1000,2000,4000,6000,8000}
GEN_RATES=${GEN_RATES:-8,32,128}
mkdir -p "$OUT" /tmp/tf
ln -sfn "$PWD" /tmp/tf/tritonformer
export PYTHONPATH=/tmp/tf PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

[[ -d /tmp/ckpt/gpt2 ]] || python3 tools/make_bench_checkpoints.py /tmp/ckpt --tokenizers .gpu-carry/server/tokenizers
export EMBEDDER_CHECKPOINT=/tmp/ckpt/bert-base GENERATOR_CHECKPOINT=/tmp/ckpt/gpt2
if [[ $MODE != stock ]]; then  # our models' parameters: the stock configs have none of them
  export EMBEDDER_PARAMS="pooling=mean normalize=true batch_policy=$POLICY ${EMBEDDER_EXTRA:-}" EMBEDDER_INSTANCES=$INSTANCES
fi
start() {
  t0=$(date +%s)
  tools/gpu_server.sh start || { tail -50 /tmp/tritonserver.log; exit 1; }
  echo "server ready after $(( $(date +%s) - t0 )) s"
}
if [[ $MODE == rerank ]]; then
  [[ -d /tmp/ckpt/bge-reranker-v2-m3 ]] || python3 tools/make_bench_reranker.py /tmp/ckpt --tokenizers .gpu-carry/server/tokenizers
  export RERANKER_CHECKPOINT=/tmp/ckpt/bge-reranker-v2-m3
  rerank_load() {  # model, json tag, rates, extra loadgen arguments
    python3 -m tritonformer.client.loadgen rerank --url 127.0.0.1:8000 --model "$1" --rates "$3" --seconds 4 \
      --warmup 1 --documents 32 --distribution mixed --slo-ms 100 --processes 2 "${@:4}" \
      --json "$OUT/served_rerank_$2.json" 2>&1 | tee "$OUT/served_rerank_$2.log"
  }
  for policy in fifo dp; do
    SERVE_MODELS=reranker RERANKER_PARAMS="batch_policy=$policy" start
    rerank_load reranker "$policy" "${RERANK_RATES:-10,20,40,80,120,160,240}"
    SERVE_MODELS=reranker tools/gpu_server.sh stop
  done
  STOCK=1 SERVE_MODELS=hf_reranker start
  rerank_load hf_reranker stock "${STOCK_RERANK_RATES:-2,4,8,16,32}" --batch-dim
  STOCK=1 SERVE_MODELS=hf_reranker tools/gpu_server.sh stop
  python3 - "$OUT" <<'EOF'
import json, sys
from tritonformer.client.loadgen import goodput
out = sys.argv[1]
best = {tag: goodput(json.load(open(f"{out}/served_rerank_{tag}.json"))["results"], 100.0)
        for tag in ("fifo", "dp", "stock")}
print("| reranker (bge-reranker-v2-m3 shape, 1 x 32 mixed) | goodput req/s at p99 <= 100 ms | pairs/s | p99 ms | vs stock |")
print("|---|---:|---:|---:|---:|")
stock = best["stock"]["throughput_rps"] if best["stock"] else float("nan")
for tag, s in best.items():
    if s is None:
        print(f"| {tag} | none met the SLO | | | |")
    else:
        print(f"| {tag} | {s['throughput_rps']:.1f} | {s['pairs_per_s']:.0f} | {s['latency_p99_ms']:.1f} | "
              f"{s['throughput_rps'] / stock:.1f}x |")
EOF
  exit 0
fi
if [[ $MODE == stock ]]; then
  STOCK=1 start
  python3 -m tritonformer.client.loadgen embed --url 127.0.0.1:8000 --model hf_embedder --batch-dim \
    --rates "${STOCK_EMBED_RATES:-50,100,200,400,800,1600}" --seconds 4 --warmup 1 --distribution mixed \
    --processes 2 --json "$OUT/served_embed_stock.json" 2>&1 | tee "$OUT/served_embed_stock.log"
  python3 -m tritonformer.client.loadgen generate --url 127.0.0.1:8000 --model hf_generator --unary \
    --rates "${STOCK_GEN_RATES:-2,8}" --requests "${STOCK_GEN_REQUESTS:-128}" --prompt-range 32,512 \
    --output-range 1,128 --vocab-size 50256 --json "$OUT/served_generate_stock.json" 2>&1 \
    | tee "$OUT/served_generate_stock.log"
  STOCK=1 tools/gpu_server.sh stop
  if [[ -f $OUT/served_generate_si1.json ]]; then  # ours from an earlier `fifo` run into the same $OUT
    echo "ours (served_generate_si1.json) vs request-level HF behind Triton's batcher, at equal latency per token:"
    python3 tools/compare_at_latency.py "$OUT/served_generate_si1.json" "$OUT/served_generate_stock.json"
  fi
  exit 0
fi
if [[ $MODE == profile ]]; then  # where one embedder instance's host time goes under load
  # Carried: the GPU machine has no pip index. Here: `pip download --no-deps py-spy`, then the
  # binary is the wheel's py_spy-*.data/scripts/py-spy.
  PYSPY=${PYSPY:-.gpu-carry/pyspy/py-spy}
  start
  python3 -m tritonformer.client.loadgen embed --url 127.0.0.1:8000 --rates "${PROFILE_RATE:-2000}" --seconds 20 \
    --warmup 1 --distribution mixed --processes 4 > "$OUT/served_embed_profile.log" 2>&1 &
  sleep 4
  timeout 5 nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader -lms 500 > "$OUT/gpu_utilization.txt" &
  pid=$(pgrep -f 'triton_python_backend_stub.*embedder' | head -n1)
  ps -eo pid,pcpu,args | grep -E "[t]riton_python_backend_stub|[t]ritonserver" | cut -c1-200 > "$OUT/stub_processes.txt"
  top -b -H -n 2 -d 2 -w 200 | awk '/^top -/{n++} n==2' | head -45 > "$OUT/top_threads.txt"  # busiest threads over 2 s
  "$PYSPY" dump --pid "$pid" --nonblocking > "$OUT/embedder_stub_dump.txt" 2>&1
  "$PYSPY" record --pid "$pid" --duration 5 --rate 250 --threads --nonblocking --format raw \
    --output "$OUT/embedder_stub_pyspy.txt" 2>&1 | tail -3
  # With EMBEDDER_EXTRA="engine_process=true": the engine process too (the spawned process whose
  # parent is an embedder stub), every thread and then only the samples that hold the GIL.
  engine=
  for p in $(pgrep -f spawn_main); do
    grep -q "embedder/1/model.py" "/proc/$(ps -o ppid= -p "$p" | tr -d ' ')/cmdline" 2>/dev/null && engine=$p
  done
  if [[ -n $engine ]]; then
    "$PYSPY" record --pid "$engine" --duration 3 --rate 250 --threads --nonblocking --format raw \
      --output "$OUT/embedder_engine_pyspy.txt" 2>&1 | tail -1
    "$PYSPY" record --pid "$engine" --duration 3 --rate 250 --gil --nonblocking --format raw \
      --output "$OUT/embedder_engine_pyspy_gil.txt" 2>&1 | tail -1
  fi
  wait
  grep '^|' "$OUT/served_embed_profile.log"
  tools/gpu_server.sh stop
  exit 0
fi
first=1
for interval in $STREAM_INTERVALS; do
  export GENERATOR_PARAMS="max_running_sequences=256 max_tokens_per_iteration=4096 kv_cache_memory_fraction=0.4 stream_interval=$interval ${GENERATOR_EXTRA:-}"
  start
  if [[ $first == 1 && -z ${SKIP_EMBED:-} ]]; then
    tag="${POLICY}_x$INSTANCES${TAG_SUFFIX:-}"
    python3 -m tritonformer.client.loadgen embed --url 127.0.0.1:8000 --rates "$EMBED_RATES" --seconds 4 --warmup 1 \
      --distribution mixed --processes 4 "${BATCH_DIM[@]}" --json "$OUT/served_embed_$tag.json" 2>&1 | tee "$OUT/served_embed_$tag.log"
    first=0
  fi
  if [[ $POLICY == fifo && $INSTANCES == 1 && -z ${TAG_SUFFIX:-} ]]; then
    python3 -m tritonformer.client.loadgen generate --url 127.0.0.1:8000 --rates "$GEN_RATES" --requests 256 \
      --prompt-range 32,512 --output-range 1,128 --vocab-size 50256 --processes 2 \
      --json "$OUT/served_generate_si$interval${GEN_TAG:-}.json" 2>&1 | tee "$OUT/served_generate_si$interval${GEN_TAG:-}.log"
  fi
  curl -s 127.0.0.1:8002/metrics | grep -E '^tritonformer_(batches_total|kv_blocks|preemptions|iterations_total)' | head
  tools/gpu_server.sh stop
done
