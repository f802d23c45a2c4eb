"""Set module-level knobs in every Python process of a run, spawned workers included.

`tools/gpu/ab_decode_step.py` sets a knob inside its one process; a tensor-parallel engine runs
its ranks in processes of their own (spawned: they import tritonformer afresh), which no setattr
in the parent reaches. Python imports `sitecustomize` at every start from its path, so with this
folder on PYTHONPATH each process (the bench, each size's process, each rank's worker) applies

    TRITONFORMER_KNOBS="kernels.triton_gemv._LONG_K_FACTOR=1;kernels.triton_pdl.USE_PDL=False"

(module paths under tritonformer, values Python expressions) before anything else runs, and
says so on stderr. A/B: the same command with and without the variable, in one machine start:

    PYTHONPATH=tools/gpu/knobs:$PYTHONPATH TRITONFORMER_KNOBS="kernels.triton_gemv._LONG_K_FACTOR=1" \\
        tritonformer bench tensor-parallel --model llama-3.1-70b --sizes 2 --batches 1 --parts steps
"""
import os

_SPEC = os.environ.get("TRITONFORMER_KNOBS")
if _SPEC:
    import importlib
    import sys

    for _item in filter(None, _SPEC.split(";")):
        _path, _expr = _item.split("=", 1)
        _module, _, _attr = _path.strip().rpartition(".")
        _owner = importlib.import_module(f"tritonformer.{_module}")
        if not hasattr(_owner, _attr):
            raise SystemExit(f"tritonformer.{_module} has no attribute {_attr}")
        setattr(_owner, _attr, eval(_expr, {"__builtins__": {}}))  # noqa: S307 - a dev tool's argument
        print(f"[knob {_path.strip()} = {getattr(_owner, _attr)!r} in process {os.getpid()}]", file=sys.stderr)
