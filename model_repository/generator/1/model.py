"""Triton model `generator`: all the work happens in tritonformer.backend."""
from tritonformer.backend.triton.generator_model import TritonPythonModel  # noqa: F401
