"""Triton model `reranker`: all the work happens in tritonformer.backend."""
from tritonformer.backend.triton.reranker_model import TritonPythonModel  # noqa: F401
