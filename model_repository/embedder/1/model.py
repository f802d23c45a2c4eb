"""Triton model `embedder`: all the work happens in tritonformer.backend."""
from tritonformer.backend.triton.embedder_model import TritonPythonModel  # noqa: F401
