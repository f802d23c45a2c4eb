"""An engine in a process of its own, one per GPU, fed by thin Triton model instances (the
generator's by default on a GPU; the encoders' with the parameter engine_process true).

Triton's Python-backend stub runs `execute()`, every response's IPC to the server, the metrics
and cancellation polls in one process under one GIL. With the engine in that process too, the
host work of serving starves the GPU. Here the engine (its queue and scheduler, its runner and, with
tensor parallelism, rank 0 of the split model whose workers it starts) runs in one process per
GPU, started by the first model instance; each instance's stub parses and tokenizes, sends its
requests over a local connection in one message per execute() call, and answers Triton from a
receiver thread with the engine's batches of outputs, one message per engine pass.

protocol.py (what crosses), rendezvous.py (how instances find one engine), batching_sink.py (the
engine's response sink: one message per stub per iteration), server.py (the engine process),
client.py (the stub's side).
"""
