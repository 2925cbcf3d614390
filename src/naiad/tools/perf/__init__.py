"""`naiad perf`: perf_analyzer's measurement model for any KServe v2 server (load in separate processes).

The names below load on first use, so that building the command line does not import the profiler.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PerfError", "PerfOptions", "ProfileResult", "run_perf"]


def __getattr__(name: str) -> Any:
    if name == "PerfOptions":
        from naiad.tools.perf.options import PerfOptions

        return PerfOptions
    if name in ("PerfError", "ProfileResult", "run_perf"):
        from naiad.tools.perf import profiler

        return getattr(profiler, name)
    raise AttributeError(f"module 'naiad.tools.perf' has no attribute {name!r}")
