#!/usr/bin/env bash
# Build .gpu-carry/openai/site.tar.xz: the Python packages the OpenAI routes and their benchmark need on
# the GPU machine, which has no pip index and (env.md) no tritonclient: FastAPI + uvicorn for the
# routes, tritonclient's gRPC client (asyncio) for the routes and the benchmark's direct way.
# Runs HERE (PyPI reachable); the versions are this venv's (requirements.txt's pins).
#
#   tools/build_gpu_openai_carry.sh            # cp312 (the GPU image's Python)
#   PYTHON_VERSION=3.11 tools/build_gpu_openai_carry.sh
#
# Installed with pip --target for that Python (a folder to put on PYTHONPATH: the GPU machine has
# no pip), without tritonclient's binaries (perf_analyzer, perf_client: ~40 MB), and packed: 37 MB
# unpacked, ~9 MB as xz, beside .gpu-carry/server's ~44 MB (the whole carry is capped at 64 MiB).
# tools/gpu_openai_bench.sh unpacks and uses it.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_VERSION=${PYTHON_VERSION:-3.12}
OUT=.gpu-carry/openai
PIP=${PIP:-.venv/bin/python -m pip}
PACKAGES="fastapi starlette uvicorn httptools pydantic pydantic_core annotated-types annotated-doc
  typing-inspection typing_extensions anyio sniffio idna h11 click tritonclient grpcio protobuf python-rapidjson
  opentelemetry-api"  # fastapi >= 0.16x imports opentelemetry (its telemetry module) at start-up

if ! git check-ignore -q "$OUT/x"; then
    echo "error: $OUT is not git-ignored (.gpu-carry/ should be)" >&2
    exit 1
fi
pins=()
for name in $PACKAGES; do
    pin=$($PIP freeze 2>/dev/null | grep -i -E "^${name//[-_]/[-_]}==" | head -n1 || true)
    [[ -n $pin ]] || { echo "error: $name is not installed in .venv (run ./install.sh)" >&2; exit 1; }
    pins+=("$pin")
done
staging=$(mktemp -d /tmp/openai-carry.XXXXXX)
trap 'rm -rf "$staging"' EXIT
$PIP install --quiet --disable-pip-version-check --no-deps --only-binary=:all: --target "$staging/site" \
    --python-version "$PYTHON_VERSION" --implementation cp --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "${pins[@]}"
rm -rf "$staging"/site/tritonclient/bin "$staging"/site/bin
find "$staging/site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$OUT"
XZ_OPT="-9 -T0" tar -C "$staging" -cJf "$OUT/site.tar.xz.part" site
mv "$OUT/site.tar.xz.part" "$OUT/site.tar.xz"
echo "$OUT/site.tar.xz: $(du -h "$OUT/site.tar.xz" | cut -f1) (${pins[*]})"
