#!/usr/bin/env bash
# Start (or stop) a REAL tritonserver with our model_repository on the GPU machine, which has no
# tritonserver, no internet and no pip index. Run from anywhere in the repository, with
# .gpu-carry/server carried (built by tools/build_gpu_server_carry.sh).
#
#   EMBEDDER_CHECKPOINT=/path/minilm GENERATOR_CHECKPOINT=/path/smollm2 tools/gpu_server.sh [start]
#   tools/gpu_server.sh status
#   tools/gpu_server.sh stop
#   STOCK=1 EMBEDDER_CHECKPOINT=... GENERATOR_CHECKPOINT=... tools/gpu_server.sh start
#       the stock set-ups instead (client/stock_repository: hf_embedder, hf_generator = HF models
#       behind Triton's dynamic batcher), the baselines of the served benchmarks
#
# Environment (all optional except the two checkpoints):
#   EMBEDDER_CHECKPOINT, GENERATOR_CHECKPOINT  checkpoint folders (config.pbtxt "checkpoint")
#   EMBEDDER_PARAMS, GENERATOR_PARAMS  more config.pbtxt overrides, "key=value key=value"
#   EMBEDDER_INSTANCES, GENERATOR_INSTANCES  instance_group count (model instances on the GPU)
#   EMBEDDER_TRITON_BATCHING=1  the embedder behind Triton's batcher, several requests per
#                   execute() call (client/config_variants.py; clients send shapes [1, ...])
#   TRITONFORMER_HTTP_PORT/_GRPC_PORT/_METRICS_PORT  ports (8000/8001/8002)
#   IMAGE_PYTHON    the Python that has torch and triton (python3); its minor version picks the
#                   Python-backend stub and the numpy wheel
#   IMAGE_SITE_PACKAGES  ':'-separated dirs to expose to the stub (default: IMAGE_PYTHON's
#                   site-packages / dist-packages)
#   SERVE_MODELS    the models to serve instead, e.g. "reranker" (STOCK=1: "hf_reranker"); each
#                   needs its checkpoint: RERANKER_CHECKPOINT (and RERANKER_PARAMS, _INSTANCES) for
#                   reranker / hf_reranker, the variables above for the others
#   READY_TIMEOUT   seconds to wait for both models (300)
#   HIDE_PACKAGES   STOCK=1 only: image packages the stub must not see ("scipy sklearn"), see below
#
# How it works (details: /work/shared/reference/env.md):
# * /tmp/tritonserver: the tritonserver tree unpacked from the nvidia-pytriton wheel, laid out as
#   in site-packages; client/server.py finds it through $TRITONFORMER_TRITONSERVER_ROOT, so
#   pytriton need not be installed.
# * /tmp/stubenv: a venv whose own site-packages has numpy 1.26.4 (the 2.51 stub silently breaks
#   CPU tensors under numpy 2) and a .pth naming the image's site-packages (torch, triton) and
#   /tmp/tf (where `tritonformer` is a symlink to this repository). The stub's embedded Python
#   ignores PYTHONPATH and takes its prefix from the first python3 on PATH, so the launcher runs
#   under /tmp/stubenv/bin/python3 and client/server.py puts that bin/ first on the server's PATH.
# * Our models never import `transformers`. The stock ones must, and under numpy 1.26 the image's
#   transformers failed to import (its optional scipy/scikit-learn are built for numpy 2). With
#   STOCK=1 the stub therefore sees the image's site-packages through an overlay of symlinks that
#   leaves out HIDE_PACKAGES: transformers then finds them absent and never imports them (checked
#   here with transformers 5.17 and numpy 1.26: BertModel and generate work without them).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

CARRY=${CARRY:-$REPO/.gpu-carry/server}
IMAGE_PYTHON=${IMAGE_PYTHON:-python3}
SERVER_DIR=/tmp/tritonserver
STUBENV=/tmp/stubenv
MODEL_REPO=/tmp/model_repository
IMPORT_DIR=/tmp/tf
LOG=/tmp/tritonserver.log
PIDFILE=/tmp/tritonserver.pid
HTTP_PORT=${TRITONFORMER_HTTP_PORT:-8000}
GRPC_PORT=${TRITONFORMER_GRPC_PORT:-8001}
METRICS_PORT=${TRITONFORMER_METRICS_PORT:-8002}
READY_TIMEOUT=${READY_TIMEOUT:-300}
STOCK=${STOCK:-0}
HIDE_PACKAGES=${HIDE_PACKAGES:-"scipy sklearn"}
if [[ $STOCK == 1 ]]; then
    MODELS=(hf_embedder hf_generator)
    SOURCE_REPO=$REPO/client/stock_repository
    STUBENV=/tmp/stubenv-stock
else
    MODELS=(embedder generator)
    SOURCE_REPO=$REPO/model_repository
fi
if [[ -n ${SERVE_MODELS:-} ]]; then read -ra MODELS <<<"$SERVE_MODELS"; fi
# A model's environment prefix: its checkpoint is ${PREFIX}_CHECKPOINT.
prefix_of() { case $1 in *embedder) echo EMBEDDER ;; *generator) echo GENERATOR ;; *reranker) echo RERANKER ;; *) echo "${1^^}" ;; esac; }

say() { echo "gpu_server: $*" >&2; }

# ':'-separated overlays of the ':'-separated site dirs $1: symlinks to every entry except the
# HIDE_PACKAGES (their modules, dist-info and bundled .libs), so `find_spec` cannot find them.
hide_packages() {
    local overlays=() dir i=0 entry name pkg hidden
    IFS=: read -ra dirs <<<"$1"
    for dir in "${dirs[@]}"; do
        local overlay=$STUBENV/image-site-$i
        i=$(( i + 1 ))
        mkdir -p "$overlay"
        for entry in "$dir"/* "$dir"/.[!.]*; do
            [[ -e $entry ]] || continue
            name=$(basename "$entry")
            hidden=0
            for pkg in $HIDE_PACKAGES; do
                local dist=$pkg  # the distribution's name, in dist-info and .libs
                [[ $pkg == sklearn ]] && dist=scikit_learn
                case $name in
                    "$pkg" | "$pkg".py | "$pkg"-* | "$pkg".libs | "$dist"-* | "$dist".libs) hidden=1 ;;
                esac
            done
            (( hidden )) || ln -s "$entry" "$overlay/$name"
        done
        overlays+=("$overlay")
    done
    local IFS=:
    echo "${overlays[*]}"
}

# The launcher's pid, if it is alive and really our launcher (pids get reused).
running_pid() {
    [[ -f $PIDFILE ]] || return 1
    local pid
    pid=$(cat "$PIDFILE")
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && grep -qa "tritonformer.client.serve" "/proc/$pid/cmdline" \
        && echo "$pid"
}

stop() {
    local pid
    if ! pid=$(running_pid); then
        say "not running"
        rm -f "$PIDFILE"
        return 0
    fi
    # SIGTERM to the launcher: `run_serve` stops tritonserver in order (models unload, stubs
    # exit, its /dev/shm regions are removed). If it hangs, SIGKILL it; the server then gets
    # SIGTERM from the kernel (PR_SET_PDEATHSIG in client/server.py).
    say "stopping (launcher pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        say "still running after 30 s: SIGKILL"
        kill -KILL "$pid"
    fi
    rm -f "$PIDFILE"
    say "stopped"
}

# HTTP status of a GET on our server ("000" when nothing answers).
http_code() {
    if command -v curl >/dev/null; then
        curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$HTTP_PORT$1" || true
    else
        "$STUBENV/bin/python3" - "http://127.0.0.1:$HTTP_PORT$1" <<'EOF' || echo 000
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=2).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("000")
EOF
    fi
}

all_ready() {
    [[ $(http_code /v2/health/ready) == 200 ]] || return 1
    local m
    for m in "${MODELS[@]}"; do
        [[ $(http_code "/v2/models/$m/ready") == 200 ]] || return 1
    done
}

status() {
    local pid m
    if pid=$(running_pid); then say "launcher pid $pid, log $LOG"; else say "not running"; fi
    say "health/ready: $(http_code /v2/health/ready)"
    for m in "${MODELS[@]}"; do say "$m ready: $(http_code "/v2/models/$m/ready")"; done
}

start() {
    if pid=$(running_pid); then
        say "already running (launcher pid $pid); run: tools/gpu_server.sh stop"
        exit 1
    fi
    for m in "${MODELS[@]}"; do
        var=$(prefix_of "$m")_CHECKPOINT
        if [[ -z ${!var:-} || ! -d ${!var} ]]; then
            say "error: set $var to an existing checkpoint folder (now: '${!var:-}')"
            exit 2
        fi
    done

    if command -v nvidia-smi >/dev/null; then
        say "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n1)"
    else
        say "GPU: none (no nvidia-smi)"
    fi

    # The stub and the numpy wheel must match the Python the stub will embed.
    local py_minor tag libdir
    py_minor=$("$IMAGE_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    tag=cp${py_minor/./}
    # The stub links libpython3.X.so.1.0: take the image's own (LIBDIR), not another patch version.
    libdir=$("$IMAGE_PYTHON" -c "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))")
    say "image python: $(command -v "$IMAGE_PYTHON") ($py_minor), LIBDIR $libdir"

    # ---- 1. tritonserver, unpacked once per carried tarball (the stamp says which one)
    [[ -f $CARRY/tritonserver.tar.xz ]] || { say "error: $CARRY/tritonserver.tar.xz missing (carry .gpu-carry/server)"; exit 2; }
    local want_stamp
    want_stamp="$(cat "$CARRY/tritonserver.stamp" 2>/dev/null || echo none) $(stat -c %s "$CARRY/tritonserver.tar.xz")"
    if [[ "$(cat "$SERVER_DIR/.stamp" 2>/dev/null)" != "$want_stamp" ]]; then
        say "unpacking tritonserver into $SERVER_DIR"
        rm -rf "$SERVER_DIR"
        mkdir -p "$SERVER_DIR"
        tar -C "$SERVER_DIR" -xJf "$CARRY/tritonserver.tar.xz"
        echo "$want_stamp" > "$SERVER_DIR/.stamp"
    fi
    local stubs=$SERVER_DIR/pytriton/tritonserver/python_backend_stubs
    if [[ ! -x $stubs/$py_minor/triton_python_backend_stub ]]; then
        say "error: no Python-backend stub for Python $py_minor (carried: $(ls "$stubs" | tr '\n' ' '));"
        say "       rebuild with STUB_PYTHONS=\"... $py_minor\" tools/build_gpu_server_carry.sh"
        exit 2
    fi

    # ---- 2. the stub's Python: a venv with numpy 1.26 of its own + the image's packages
    local wheel
    wheel=$(ls "$CARRY"/numpy-1.26.4-$tag-$tag-manylinux*x86_64.whl 2>/dev/null | head -n1 || true)
    [[ -n $wheel ]] || { say "error: no numpy 1.26.4 $tag wheel in $CARRY; rebuild with NUMPY_PYTHONS=\"$py_minor\" tools/build_gpu_server_carry.sh"; exit 2; }
    local image_sites
    image_sites=${IMAGE_SITE_PACKAGES:-$("$IMAGE_PYTHON" -c '
import sys
print(":".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))')}
    local env_stamp="$(command -v "$IMAGE_PYTHON") $(basename "$wheel") $image_sites stock=$STOCK $HIDE_PACKAGES"
    if [[ "$(cat "$STUBENV/.stamp" 2>/dev/null)" != "$env_stamp" ]]; then
        say "building $STUBENV (numpy 1.26.4 + the image's site-packages)"
        rm -rf "$STUBENV"
        "$IMAGE_PYTHON" -m venv --without-pip "$STUBENV"
        local site
        site=$("$STUBENV/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        # --target into the venv's own site-packages, which comes before the .pth entries on
        # sys.path: numpy 1.26 shadows the image's numpy 2.
        if "$IMAGE_PYTHON" -m pip --version >/dev/null 2>&1; then
            "$IMAGE_PYTHON" -m pip install --quiet --no-index --no-deps --disable-pip-version-check \
                --target "$site" "$wheel"
        else  # a wheel is a zip laid out for site-packages
            "$IMAGE_PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$site"
        fi
        local sites=$image_sites
        if [[ $STOCK == 1 ]]; then sites=$(hide_packages "$image_sites"); fi
        # A .pth line is a path appended to sys.path (the stub honours .pth, unlike PYTHONPATH).
        { echo "$IMPORT_DIR"; tr ':' '\n' <<<"$sites"; } > "$site/tritonformer-image.pth"
        echo "$env_stamp" > "$STUBENV/.stamp"
    fi

    # `import tritonformer.*` without installing: /tmp/tf/tritonformer -> this repository.
    mkdir -p "$IMPORT_DIR"
    ln -sfn "$REPO" "$IMPORT_DIR/tritonformer"
    PYTHON="$STUBENV/bin/python3" bash "$REPO/tools/build_native.sh"  # the compiled DP loop, for this Python
    "$STUBENV/bin/python3" -c '
import numpy, torch, triton, tritonformer.client.server
print("gpu_server: stub env: numpy", numpy.__version__, "from", numpy.__file__.rsplit("/", 2)[0],
      "| torch", torch.__version__, "| triton", triton.__version__, flush=True)
assert numpy.__version__.startswith("1."), "the stub needs numpy 1.x"
' >&2
    if [[ $STOCK == 1 ]]; then  # fail here, not as a model that never loads
        "$STUBENV/bin/python3" -c '
import transformers
from transformers import AutoModel, AutoModelForCausalLM, BertModel, GPT2LMHeadModel
print("gpu_server: stub env: transformers", transformers.__version__, "imports", flush=True)
' >&2
    fi

    # ---- 3. the model repository: our models with checkpoint (and optional) overrides
    rm -rf "$MODEL_REPO"
    mkdir -p "$MODEL_REPO"
    local m
    for m in "${MODELS[@]}"; do
        cp -r "$SOURCE_REPO/$m" "$MODEL_REPO/$m"
        find "$MODEL_REPO/$m" -name __pycache__ -prune -exec rm -rf {} +
    done
    "$STUBENV/bin/python3" - "$MODEL_REPO" "${MODELS[@]}" <<'EOF'
# Override string parameters of config.pbtxt in place; every other line stays as it is.
import os, re, sys
from pathlib import Path

def override(config: Path, values: dict[str, str]) -> None:
    text = config.read_text()
    for key, value in values.items():
        pattern = re.compile(r'(parameters\s*\{\s*key:\s*"' + re.escape(key)
                             + r'"\s*value:\s*\{\s*string_value:\s*")((?:[^"\\]|\\.)*)(")')
        if len(pattern.findall(text)) != 1:
            sys.exit(f"gpu_server: error: {config} has no single parameter {key!r}")
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        text = pattern.sub(lambda m: m.group(1) + escaped + m.group(3), text)
        print(f"gpu_server: {config.parent.name}: {key} = {value}", file=sys.stderr)
    config.write_text(text)

def prefix_of(model: str) -> str:  # as the shell's prefix_of
    return next((p.upper() for p in ("embedder", "generator", "reranker") if model.endswith(p)), model.upper())

for model in sys.argv[2:]:
    prefix = prefix_of(model)
    values = {"checkpoint": str(Path(os.environ[f"{prefix}_CHECKPOINT"]).resolve())}
    for item in os.environ.get(f"{prefix}_PARAMS", "").split():
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"gpu_server: error: {prefix}_PARAMS item {item!r} is not key=value")
        values[key] = value
    override(Path(sys.argv[1]) / model / "config.pbtxt", values)
    instances = os.environ.get(f"{prefix}_INSTANCES")
    if instances:  # model instances (stub processes) on the GPU: each has its own queue and IPC
        config = Path(sys.argv[1]) / model / "config.pbtxt"
        text, n = re.subn(r"instance_group \[ \{ count: \d+", f"instance_group [ {{ count: {int(instances)}",
                          config.read_text())
        if n != 1:
            sys.exit(f"gpu_server: error: {config} has no single instance_group count")
        config.write_text(text)
        print(f"gpu_server: {model}: instances = {instances}", file=sys.stderr)
    if model == "embedder" and os.environ.get("EMBEDDER_TRITON_BATCHING") == "1":
        from tritonformer.client.config_variants import with_triton_batching

        config = Path(sys.argv[1]) / model / "config.pbtxt"
        config.write_text(with_triton_batching(config.read_text()))
        print(f"gpu_server: {model}: behind Triton's batcher (inputs and outputs shaped [1, ...])", file=sys.stderr)
EOF

    # ---- 4. start: client/server.py's TritonServer (same flags as `tritonformer serve`) under the
    # stub env's python3, in its own session so it outlives this script.
    export TRITONFORMER_TRITONSERVER_ROOT=$SERVER_DIR/pytriton/tritonserver
    export PATH=$STUBENV/bin:$PATH
    export LD_LIBRARY_PATH=$SERVER_DIR/nvidia_pytriton.libs:$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PYTHONPATH=$IMPORT_DIR  # for the launcher; the stub gets /tmp/tf from the .pth
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
    # Fail now if another server holds a port: its /ready answers would pass for ours below.
    "$STUBENV/bin/python3" -c '
import sys
from tritonformer.client.server import TritonServer, TritonServerError
try:
    TritonServer(sys.argv[1], http_port=sys.argv[2], grpc_port=sys.argv[3], metrics_port=sys.argv[4]).check_ports()
except TritonServerError as e:
    sys.exit(f"gpu_server: error: {e}")
' "$MODEL_REPO" "$HTTP_PORT" "$GRPC_PORT" "$METRICS_PORT"
    local t0
    t0=$(date +%s.%N)
    # Not `tritonformer serve` (cli.py): building its parser imports every subcommand's module.
    # run_serve waits for readiness too, prints the server's output and stops it on SIGTERM.
    "$STUBENV/bin/python3" -c '
import argparse, os, sys
os.setsid()  # own session: no SIGHUP when the calling shell goes away
from tritonformer.client.serve import add_serve_arguments, run_serve
parser = argparse.ArgumentParser(prog="gpu_server")
add_serve_arguments(parser)
sys.exit(run_serve(parser.parse_args()))
' --model-repository "$MODEL_REPO" --models "${MODELS[@]}" --no-prepare \
      --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" \
      --ready-timeout "$READY_TIMEOUT" </dev/null >"$LOG" 2>&1 &
    local pid=$!
    echo "$pid" > "$PIDFILE"
    say "launcher pid $pid, log $LOG; waiting for ${MODELS[*]} (timeout ${READY_TIMEOUT} s)"

    local next_note=10 elapsed
    while ! all_ready; do
        elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%d", b - a }')
        if ! kill -0 "$pid" 2>/dev/null || (( elapsed >= READY_TIMEOUT )); then
            if kill -0 "$pid" 2>/dev/null; then say "not ready after $READY_TIMEOUT s"; else say "the server exited"; fi
            say "--- last lines of $LOG"
            grep -v '^[+|]' "$LOG" | tail -n 60 >&2 || true
            stop
            exit 1
        fi
        if (( elapsed >= next_note )); then
            say "still waiting ($elapsed s): health $(http_code /v2/health/ready)," \
                "$(for m in "${MODELS[@]}"; do printf '%s %s ' "$m" "$(http_code "/v2/models/$m/ready")"; done)"
            next_note=$(( elapsed + 10 ))
        fi
        sleep 0.5
    done
    kill -0 "$pid" 2>/dev/null || { say "error: the launcher exited; see $LOG"; exit 1; }
    say "ready in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s:" \
        "HTTP 127.0.0.1:$HTTP_PORT, gRPC 127.0.0.1:$GRPC_PORT, metrics 127.0.0.1:$METRICS_PORT"
    say "stop with: tools/gpu_server.sh stop"
}

case ${1:-start} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
