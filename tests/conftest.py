"""Shared fixtures: real checkpoints, Hugging Face references, and a real tritonserver."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Without a GPU the Triton-language kernels are tested in Triton's CPU interpreter, which must
# be chosen before anything imports triton.
if not (Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi")):
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from tritonformer.backend.checkpoints import minilm_dir

    return minilm_dir()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2 checkpoint converted from its GGUF (cached like the server does)."""
    from tritonformer.backend.checkpoints import prepare_smollm2

    return prepare_smollm2(progress=False)


@pytest.fixture(scope="session")
def gemma3_270m_dir() -> Path:
    """The real Gemma 3 270M converted from its GGUF (cached like the server does)."""
    from tritonformer.backend.checkpoints import prepare_gemma3_270m

    try:
        return prepare_gemma3_270m(progress=False)
    except FileNotFoundError as err:  # its packages are not installed
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def triton_server(smollm2_dir):
    """A real tritonserver serving model_repository/ on free loopback ports, for the session."""
    from helpers import serving

    with serving(REPO / "model_repository", ["embedder", "generator"], timeout=600) as server:
        yield server



@pytest.fixture(scope="session")
def openai_routes(triton_server):
    """The bundled server's OpenAI routes, run in this process (as `tritonformer serve` runs
    them) in front of the session's tritonserver."""
    pytest.importorskip("fastapi")
    from tritonformer.client.openai_routes.runner import OpenAIRoutes
    from tritonformer.client.server import free_port

    running = OpenAIRoutes("127.0.0.1", free_port()).start(triton_server.grpc_url)
    try:
        yield running
    finally:
        running.stop()
