"""GPU detection: NVML when the package and a driver exist, otherwise no GPU (CPU path)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def gpu_count() -> int:
    """Number of NVIDIA GPUs visible through NVML; 0 without pynvml or a driver."""
    try:
        import pynvml  # optional: installed with the `gpu` extra
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0
