#!/usr/bin/env bash
# Quick start, command 2: install (first run only) and run the whole test suite. The
# integration tests start their own tritonserver on free loopback ports.
# Arguments go to pytest (e.g. -k embedder, -m "not server").
set -euo pipefail
cd "$(dirname "$0")"
./install.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
