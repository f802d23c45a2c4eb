"""The encoder engine: length-aware batching of embedding requests, CUDA graphs, activation arena, cost table."""
