"""Tensor parallelism: one model split over the GPUs of a host, one process per GPU.

Rank 0 lives where the engine lives and runs the scheduler; the other ranks are workers that
only execute what rank 0's runner executes (`workers.py`), on their own slices of the weights
(`group.py`'s splits, read straight from the checkpoint's files) and their own KV heads.
"""
