"""Errors that decide how a request is answered, shared by the engines and the Triton glue."""


class InvalidRequest(ValueError):
    """A request the client must fix; answered with INVALID_ARG and never queued."""
