"""Triton model `classifier`: all the work happens in tritonformer.backend."""
from tritonformer.backend.triton.classifier_model import TritonPythonModel  # noqa: F401
