"""tritonformer.client."""
