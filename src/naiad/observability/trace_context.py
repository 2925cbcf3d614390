"""W3C trace context of the request being served, carried in context variables.

A frontend awaits the server inside `incoming_traceparent(headers or metadata)`; `Server.infer_async`
reads the value there. The server then keeps the trace of the running request in `ACTIVE_SPAN`,
so requests it makes on its own behalf in the same task tree (ensemble steps) are traced as its
children, as in Triton.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextvars import ContextVar, Token
from typing import Any

# `00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>` (version ff is invalid, ids not all zero)
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")

REMOTE_TRACEPARENT: ContextVar[str] = ContextVar("naiad_remote_traceparent", default="")
# The trace of the request running in this task tree: its OtelRequest (OpenTelemetry mode), its
# Trace (Triton mode), or NOT_TRACED when it is not traced.
ACTIVE_SPAN: ContextVar[Any] = ContextVar("naiad_active_span", default=None)
NOT_TRACED = object()
# Headers are only looked at once a server in this process exports OpenTelemetry spans
# (the frontends' request path stays as cheap as before otherwise).
_PROPAGATING = False


def enable_propagation() -> None:
    global _PROPAGATING
    _PROPAGATING = True


def propagating() -> bool:
    """True once an OpenTelemetry exporter runs here: only then do frontends collect request metadata."""
    return _PROPAGATING


def valid_traceparent(value: str) -> bool:
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None:
        return False
    version, trace_id, span_id, _, rest = match.groups()
    if version == "ff" or trace_id == "0" * 32 or span_id == "0" * 16:
        return False
    return version != "00" or rest is None


def find_traceparent(pairs: Iterable[tuple[Any, Any]]) -> str:
    """The traceparent value among HTTP header (bytes) or gRPC metadata (str) pairs; '' when absent.

    ASGI and gRPC both hand over lower-case names, so this is a plain comparison (it runs per request)."""
    for key, value in pairs:
        if key == b"traceparent":
            return value.decode("latin-1")
        if key == "traceparent":
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return ""


class incoming_traceparent:  # used like a function: `with incoming_traceparent(headers):`
    """The request's traceparent (if any) for the server calls made inside the block.

    Reset on the way out: a frontend may serve several requests in one context (a connection's
    reader callback), and one request's trace context must not leak into the next."""

    __slots__ = ("_value", "_token")

    def __init__(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        self._value = find_traceparent(pairs) if _PROPAGATING else ""
        self._token: Token[str] | None = None

    def __enter__(self) -> None:
        if self._value:  # nothing to do for the usual request without one
            self._token = REMOTE_TRACEPARENT.set(self._value)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            REMOTE_TRACEPARENT.reset(self._token)
