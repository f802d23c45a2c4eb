#!/usr/bin/env bash
# Build .gpu-carry/server/: what a real tritonserver needs on the GPU machine, which has no
# internet, no tritonserver and no pip index (see docs in /work/shared/reference/env.md).
# Runs HERE, on a machine with PyPI access. Idempotent: re-running only redoes what changed.
#
#   tools/build_gpu_server_carry.sh                       # GPU machine: stubs 3.11+3.12, numpy cp312
#   NUMPY_PYTHONS="3.11 3.12" tools/build_gpu_server_carry.sh   # also cp311, for a local test
#
# Produces (carry ONLY `.gpu-carry/server` to the GPU machine: the whole carry is capped at 64 MiB):
#   tritonserver.tar.xz  pytriton/tritonserver (server, Python backend, the stubs of $STUB_PYTHONS),
#                        nvidia_pytriton.libs (minus the bundled libpython 3.13, 31 MB, that only the
#                        3.13 stub uses) and the wheel's dist-info (so the version is known).
#                        Unpacked, it is laid out as in site-packages, which is what
#                        $TRITONFORMER_TRITONSERVER_ROOT in client/server.py expects.
#   numpy-1.26.4-cpXY-*.whl  the 2.51 Python-backend stub needs numpy 1.x; the GPU image has 2.x.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTRITON_VERSION=0.7.0
NUMPY_VERSION=1.26.4
# A stub is ~0.5 MB packed, so ship 3.11 (this CPU machine, for local tests) and 3.12 (GPU image).
STUB_PYTHONS=${STUB_PYTHONS:-"3.11 3.12"}
# A numpy wheel is ~18 MB: by default only the GPU image's Python, to stay well under the cap.
NUMPY_PYTHONS=${NUMPY_PYTHONS:-"3.12"}
OUT=.gpu-carry/server
WHEEL_DIR=${WHEEL_DIR:-/tmp/dl}
PIP=${PIP:-"python3 -m pip"}

# .gpu-carry/ must stay out of git (it is carried as an ignored path, not committed).
if ! git check-ignore -q "$OUT/x"; then
    echo "error: $OUT is not git-ignored; add '/.gpu-carry/' to .git/info/exclude" >&2
    exit 1
fi
mkdir -p "$OUT" "$WHEEL_DIR"

# ---- the nvidia-pytriton wheel (55 MB): reuse a downloaded one
wheel=$(ls "$WHEEL_DIR"/nvidia_pytriton-$PYTRITON_VERSION-*manylinux*x86_64.whl 2>/dev/null | head -n1 || true)
if [[ -z $wheel ]]; then
    $PIP download --quiet --no-deps --dest "$WHEEL_DIR" "nvidia-pytriton==$PYTRITON_VERSION"
    wheel=$(ls "$WHEEL_DIR"/nvidia_pytriton-$PYTRITON_VERSION-*manylinux*x86_64.whl | head -n1)
fi

# ---- tritonserver.tar.xz, rebuilt only when the wheel or the stub list changed (a stamp file
# records both; xz -9 of ~90 MB takes a minute or two).
stamp="wheel=$(sha256sum "$wheel" | cut -c1-16) stubs=$STUB_PYTHONS"
if [[ -f $OUT/tritonserver.tar.xz && "$(cat "$OUT/tritonserver.stamp" 2>/dev/null)" == "$stamp" ]]; then
    echo "tritonserver.tar.xz is up to date"
else
    staging=$(mktemp -d /tmp/tritonserver-carry.XXXXXX)
    trap 'rm -rf "$staging"' EXIT
    python3 - "$wheel" "$staging" <<'EOF'
# Extract only what the server needs; keep the unix mode bits the wheel recorded (executables).
import sys, zipfile, os
wheel, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith(("pytriton/tritonserver/", "nvidia_pytriton.libs/", "nvidia_pytriton-")):
            continue
        path = z.extract(info, dest)
        mode = info.external_attr >> 16
        if not info.is_dir():  # the wheel records 0777/0666: keep only "is executable"
            os.chmod(path, 0o755 if mode & 0o111 else 0o644)
EOF
    # Drop the stubs of other Python versions and the libpython 3.13 only the 3.13 stub links.
    for stub_dir in "$staging"/pytriton/tritonserver/python_backend_stubs/*; do
        [[ " $STUB_PYTHONS " == *" $(basename "$stub_dir") "* ]] || rm -rf "$stub_dir"
    done
    if [[ " $STUB_PYTHONS " != *" 3.13 "* ]]; then
        rm -f "$staging"/nvidia_pytriton.libs/libpython3-*.13.so.1.0
    fi
    rm -f "$staging"/nvidia_pytriton-*.dist-info/RECORD   # lists files we dropped
    chmod +x "$staging"/pytriton/tritonserver/bin/tritonserver \
        "$staging"/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub
    echo "packing tritonserver.tar.xz (xz -9, a minute or two)..."
    XZ_OPT="-9 -T0" tar -C "$staging" -cJf "$OUT/tritonserver.tar.xz.part" \
        pytriton nvidia_pytriton.libs $(cd "$staging" && ls -d nvidia_pytriton-*.dist-info)
    mv "$OUT/tritonserver.tar.xz.part" "$OUT/tritonserver.tar.xz"
    echo "$stamp" > "$OUT/tritonserver.stamp"
fi

# ---- numpy 1.26.4 wheels for the stub's Python(s); remove ones for Pythons not asked for so a
# wheel left over from a local test does not ride along to the GPU machine.
keep=()
for py in $NUMPY_PYTHONS; do
    tag=cp${py/./}
    keep+=("$tag")
    if ! ls "$OUT"/numpy-$NUMPY_VERSION-$tag-$tag-manylinux*x86_64.whl >/dev/null 2>&1; then
        $PIP download --quiet --no-deps --only-binary=:all: --python-version "$py" \
            --platform manylinux2014_x86_64 --dest "$OUT" "numpy==$NUMPY_VERSION"
    fi
done
for whl in "$OUT"/numpy-*.whl; do
    [[ -e $whl ]] || continue
    tag=$(basename "$whl" | cut -d- -f3)
    [[ " ${keep[*]} " == *" $tag "* ]] || { echo "removing $(basename "$whl") (not in NUMPY_PYTHONS)"; rm -f "$whl"; }
done

echo "--- $OUT"
ls -l "$OUT" | tail -n +2 | awk '{printf "%8.1f MB  %s\n", $5 / 1e6, $9}'
du -sb "$OUT" | awk '{printf "%8.1f MB  total (%.1f MiB; the carry limit is 64 MiB for everything carried)\n", $1 / 1e6, $1 / 1048576}'
