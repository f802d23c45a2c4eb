"""Triton model `generator`: all the work happens in tritonformer.backend."""
from tritonformer.backend.triton_generator import TritonPythonModel  # noqa: F401
