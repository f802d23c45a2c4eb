#!/usr/bin/env bash
# A/B inside one machine start: the fused post-norm / parallel blocks against the tree before them.
# ab_before/transformer.py: the tree before the change, `git show b845b57:backend/models/transformer.py`
set -uo pipefail
mkdir -p /tmp/tf "$OUT"; ln -sfn "$PWD" /tmp/tf/tritonformer
export PYTHONPATH=/tmp/tf PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
bash tools/build_native.sh >/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
B="python3 -m tritonformer.client.cli bench serve-decoder --in-process --skip-hf --dtype bfloat16 --parts steps --model olmo-2-7b,command-r7b"
cp backend/models/transformer.py /tmp/fused.py
for run in fused unfused fused_again; do
  if [[ $run == unfused ]]; then cp ab_before/transformer.py backend/models/transformer.py; else cp /tmp/fused.py backend/models/transformer.py; fi
  timeout 170 $B --json "$OUT/$run.json" > "$OUT/$run.log" 2>&1
  echo "== $run"; grep '^|' "$OUT/$run.log"
done
