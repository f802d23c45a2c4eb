#!/usr/bin/env bash
# Build the compiled DP loop (scheduler/_dp_native.c) in place, for running from a source tree
# that `pip install` never saw (the GPU machine imports tritonformer through PYTHONPATH).
# `pip install -e .` does the same with pyproject.toml's flags; keep the two in step.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
include=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
"${CC:-cc}" -O3 -ffp-contract=off -shared -fPIC -I"$include" scheduler/_dp_native.c -o "scheduler/_dp_native$suffix"
echo "built scheduler/_dp_native$suffix"
