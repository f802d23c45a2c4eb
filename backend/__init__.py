"""tritonformer.backend."""
