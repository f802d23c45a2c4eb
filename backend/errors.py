"""Errors that decide how a request is answered, shared by the engines and the Triton glue."""


class InvalidRequest(ValueError):
    """A request the client must fix; answered with INVALID_ARG and never queued."""


class ModelNotConfigured(RuntimeError):
    """The model was loaded without what it needs to serve (a reranker or classifier with no
    checkpoint named); answered with UNAVAILABLE and a message that says how to name one."""
