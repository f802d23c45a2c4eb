"""tritonformer.backend.models."""
