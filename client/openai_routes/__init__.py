"""OpenAI-compatible routes in front of a tritonserver that serves our model repository.

`tritonformer serve` starts them beside the server (port $TRITONFORMER_OPENAI_PORT, 9000); they
are a Triton *client*: every request becomes one tritonclient asyncio gRPC call (a stream for
the generator, so that a client who hangs up cancels its Triton request), and nothing here runs
a model. One concern per module:

    served_models   which models Triton serves, their checkpoint's tokenizer and context length
    schemas         the OpenAI request bodies (pydantic) and OpenAI error objects
    triton_calls    the generator's vLLM-format stream and the embedder's infer, over gRPC
    generation      a chat / completions request: max_tokens, sampling parameters, the answer
    responses       OpenAI response objects and stream chunks built from the generator's pieces
    app             the FastAPI application: routes, API key, errors, disconnects
    runner          uvicorn in a thread (for `tritonformer serve`) or on its own (``python -m``)
"""
from tritonformer.client.openai_routes.app import create_app
from tritonformer.client.openai_routes.runner import OpenAIRoutes, serve_forever

__all__ = ["OpenAIRoutes", "create_app", "serve_forever"]
