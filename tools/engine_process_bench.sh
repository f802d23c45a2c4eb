#!/usr/bin/env bash
# The generator's engine process (engine_process=true) against the engine in the stub
# (engine_process=false) and against the engine driven in process, on the GPU machine, in one
# machine start (carry .gpu-carry/server, as for tools/gpu_served_bench.sh):
#   1. in process: the Orca trace all at once (the engine's capacity), and arriving at the highest
#      of GEN_RATES (bench serve-decoder --in-process --parts trace --trace-rate): the served
#      run at that offered rate is compared with the latter, the same arrivals without the server
#   2. served: the Orca trace at GEN_RATES (128,1000) over /generate_stream, one server start per
#      value of engine_process in ORDER ("false true")
#   3. the failure drill (tools/engine_process_failover.py) on a server with engine_process=true:
#      the engine process killed with requests in flight
# (each server's log kept as $OUT/engine_process_tritonserver_<engine_process>.log, a crash named)
# and prints one table: served tok/s at the highest rate / in-process tok/s at that rate, TTFT and TPOT.
# Targets (H100): served >= 0.8x in-process at 1,000 req/s; TPOT p50 <= 3 ms at 128 req/s.
#
#   bash tools/engine_process_bench.sh            (~6 min on a fresh machine; results under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/served-out}
GEN_RATES=${GEN_RATES:-128,1000}
mkdir -p "$OUT" /tmp/tf
ln -sfn "$PWD" /tmp/tf/tritonformer
export PYTHONPATH=/tmp/tf PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT GEN_RATES
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"

if [[ ${SKIP_INPROCESS:-0} == 1 ]]; then
  echo "in-process trace skipped (SKIP_INPROCESS=1): no served / in-process ratio"
else
  timeout 300 python3 -m tritonformer.client.cli bench serve-decoder --in-process --parts trace --skip-hf \
    --trace-rate "$(tr , '\n' <<<"$GEN_RATES" | sort -n | tail -1)" \
    --json "$OUT/engine_process_inprocess.json" > "$OUT/engine_process_inprocess.log" 2>&1 \
    || { echo "in-process bench failed:"; tail -20 "$OUT/engine_process_inprocess.log"; }
fi
for ep in ${ORDER:-false true}; do
  echo "== served, engine_process=$ep"
  GEN_TAG=_ep$ep GENERATOR_EXTRA="engine_process=$ep ${EXTRA:-}" SKIP_EMBED=1 \
    timeout 400 bash tools/gpu_served_bench.sh fifo 1 > "$OUT/engine_process_served_$ep.log" 2>&1 \
    || { echo "served run failed:"; tail -30 "$OUT/engine_process_served_$ep.log"; }
  grep -E "ready after" "$OUT/engine_process_served_$ep.log"
  cp /tmp/tritonserver.log "$OUT/engine_process_tritonserver_$ep.log" 2>/dev/null  # kept: the next start overwrites it
  grep -E "Signal \([0-9]+\) received|could not send a response|engine process failed" \
    "$OUT/engine_process_tritonserver_$ep.log" 2>/dev/null | grep -v "Signal (15)" | head -5
done
echo "== failure drill"
if [[ ${SKIP_DRILL:-0} == 1 ]]; then
  echo "skipped (SKIP_DRILL=1)"
elif GENERATOR_CHECKPOINT=/tmp/ckpt/gpt2 SERVE_MODELS=generator GENERATOR_PARAMS="engine_process=true" \
    timeout 300 tools/gpu_server.sh start > "$OUT/engine_process_drill_server.log" 2>&1; then
  timeout 90 python3 tools/engine_process_failover.py --kill engine --requests 64 --max-tokens 512 \
    2>&1 | tee "$OUT/engine_process_drill.log"
else
  echo "drill server did not start:"; tail -20 "$OUT/engine_process_drill_server.log"
fi
SERVE_MODELS=generator tools/gpu_server.sh stop > /dev/null 2>&1

python3 - "$OUT" ${ORDER:-false true} <<'EOF'
import json, sys
from pathlib import Path
out, order = Path(sys.argv[1]), sys.argv[2:]
inproc = at_rate = None
try:
    data = json.loads((out / "engine_process_inprocess.json").read_text())
    trace = next(v for k, v in data.items() if k.startswith("trace_orca"))
    inproc, at_rate = trace["ours"]["tok_per_s"], trace.get("at_rate")
except Exception as e:
    print(f"(no in-process result: {e})")
if inproc:
    print(f"\nin-process Orca trace, all at once (capacity): {inproc:,.0f} useful tok/s")
if at_rate:
    print(f"in-process Orca trace arriving at {at_rate['rate']:g} req/s: {at_rate['tok_per_s']:,.0f} useful tok/s, "
          f"TTFT p50 / p99 {at_rate['ttft_p50_ms']:.1f} / {at_rate['ttft_p99_ms']:.1f} ms")
print("| engine_process | offered req/s | output tok/s | vs in-process at that rate | TTFT p50 / p99 ms | TPOT p50 / p99 ms | errors |")
print("|---|---:|---:|---:|---|---|---:|")
for ep in order:
    try:
        results = json.loads((out / f"served_generate_si1_ep{ep}.json").read_text())["results"]
    except Exception as e:
        print(f"| {ep} | (no result: {e}) | | | | | |")
        continue
    for r in results:
        same_rate = at_rate and r["offered_rate"] == at_rate["rate"]
        ratio = f"{r['output_tok_per_s'] / at_rate['tok_per_s']:.2f}x" if same_rate else "-"
        print(f"| {ep} | {r['offered_rate']:g} | {r['output_tok_per_s']:,.0f} | {ratio} | "
              f"{r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | {r['tpot_p50_ms']:.2f} / {r['tpot_p99_ms']:.2f} | "
              f"{r['errors'] + r['timeouts'] + r['overloaded_503']} |")
print("targets (H100): engine_process=true at 1000 req/s >= 0.80x in-process; TPOT p50 <= 3 ms at 128 req/s")
EOF
