"""Triton-compatible Python backend: one spawned worker process per instance, tensors in shared memory."""
