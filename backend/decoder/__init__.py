"""The decoder engine: iteration-level scheduling over a paged KV cache, graphs, sampling, detokenization."""
