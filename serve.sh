#!/usr/bin/env bash
# Quick start, command 1: install (first run only), prepare the checkpoints, and serve
# model_repository/ with the bundled tritonserver on 127.0.0.1 in the foreground.
# Arguments go to `tritonformer serve` (e.g. --http-port 9000); ports also come from
# TRITONFORMER_HTTP_PORT / TRITONFORMER_GRPC_PORT / TRITONFORMER_METRICS_PORT.
set -euo pipefail
cd "$(dirname "$0")"
./install.sh
exec .venv/bin/tritonformer serve "$@"
