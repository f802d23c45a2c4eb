#!/usr/bin/env bash
# The OpenAI routes against direct gRPC streaming on the GPU machine, one server start:
# client/bench_openai.py (the Orca trace both ways: output tokens/s at saturation, TTFT p50 at
# 8 req/s, as ratios) against a real tritonserver (tools/gpu_server.sh) serving random-weight
# gpt2 as the generator, with the same generator parameters as the served Orca benchmark
# (tools/gpu_served_bench.sh).
#
#   bash tools/gpu_openai_bench.sh        (carry .gpu-carry/server and .gpu-carry/openai;
#                                          results under $OUT)
#
# .gpu-carry/openai/site.tar.xz (tools/build_gpu_openai_carry.sh): FastAPI, uvicorn and
# tritonclient's gRPC client for the GPU image's Python, which has none of them. The routes run
# in their own process (started here unless the server's launcher already serves them on 9000),
# the benchmark's client in another.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openai-out}
SITE=/tmp/openai-site
OPENAI_PORT=${TRITONFORMER_OPENAI_PORT:-9000}
GRPC_PORT=${TRITONFORMER_GRPC_PORT:-8001}
mkdir -p "$OUT" /tmp/tf "$SITE"
ln -sfn "$PWD" /tmp/tf/tritonformer
tar -C "$SITE" -xJf .gpu-carry/openai/site.tar.xz || { echo "carry .gpu-carry/openai (tools/build_gpu_openai_carry.sh)"; exit 2; }
export PYTHONPATH=/tmp/tf:$SITE/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

[[ -d /tmp/ckpt/gpt2 ]] || python3 tools/make_bench_checkpoints.py /tmp/ckpt --tokenizers .gpu-carry/server/tokenizers
export EMBEDDER_CHECKPOINT=/tmp/ckpt/bert-base GENERATOR_CHECKPOINT=/tmp/ckpt/gpt2
export GENERATOR_PARAMS="max_running_sequences=256 max_tokens_per_iteration=4096 kv_cache_memory_fraction=0.4 ${GENERATOR_EXTRA:-}"
t0=$(date +%s)
tools/gpu_server.sh start || { tail -50 /tmp/tritonserver.log; exit 1; }
echo "server ready after $(( $(date +%s) - t0 )) s"

healthy() { python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$OPENAI_PORT/health', timeout=2)" 2>/dev/null; }
routes_pid=
if healthy; then
    echo "the server's launcher serves the OpenAI routes on $OPENAI_PORT"
else  # the stub env's Python (numpy 1.26, the image's tokenizers) with the carried packages
    /tmp/stubenv/bin/python3 -m tritonformer.client.openai_routes --grpc-url "127.0.0.1:$GRPC_PORT" \
        --port "$OPENAI_PORT" --log-level warning > "$OUT/openai_routes.log" 2>&1 &
    routes_pid=$!
    for _ in $(seq 100); do healthy && break; sleep 0.2; done
    healthy || { echo "the OpenAI routes did not start:"; cat "$OUT/openai_routes.log"; tools/gpu_server.sh stop; exit 1; }
    echo "OpenAI routes started alone (pid $routes_pid)"
fi
nvidia-smi --query-gpu=name --format=csv,noheader | head -n1 | sed 's/^/GPU: /'
/tmp/stubenv/bin/python3 -m tritonformer.client.bench_openai --grpc-url "127.0.0.1:$GRPC_PORT" \
    --openai-url "http://127.0.0.1:$OPENAI_PORT" --json "$OUT/bench_openai.json" ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench_openai.log"
code=${PIPESTATUS[0]}
[[ -n $routes_pid ]] && kill "$routes_pid"
tools/gpu_server.sh stop
exit "$code"
