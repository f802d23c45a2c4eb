"""tritonformer.scheduler."""
