"""Triton model `embedder`: all the work happens in tritonformer.backend."""
from tritonformer.backend.triton_embedder import TritonPythonModel  # noqa: F401
