"""The link from pb_utils to the worker process it runs in (set by the Naiad worker at start-up)."""

from __future__ import annotations

from typing import Any

from triton_python_backend_utils._errors import TritonModelException

_current: Any = None
_phase = "none"  # "auto_complete", "initialize", "execute", "finalize"


def install(runtime: Any) -> None:
    global _current
    _current = runtime


def set_phase(phase: str) -> None:
    global _phase
    _phase = phase


def phase() -> str:
    return _phase


def current() -> Any:
    """The worker runtime; raises when pb_utils is used outside a Naiad Python-backend worker."""
    if _current is None:
        raise TritonModelException(
            "this pb_utils call needs a running server: it only works inside a model's worker process"
        )
    return _current


def optional() -> Any:
    return _current
