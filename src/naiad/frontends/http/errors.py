"""HTTP-level errors (statuses outside the core's error table) and the one JSON error body shape."""

from __future__ import annotations

import orjson

from naiad.protocol.errors import NaiadError


class HttpError(Exception):
    """An error answered with an explicit HTTP status; `close` ends the connection after the reply."""

    def __init__(self, status: int, message: str, *, close: bool = False, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close
        self.headers = headers or []


class ClientDisconnected(Exception):
    """The client went away before the request body was complete: nothing to answer."""


def error_body(message: str) -> bytes:
    """The body every error carries: {"error": "<message>"}."""
    return orjson.dumps({"error": message})


def status_and_message(exc: Exception) -> tuple[int, str]:
    """HTTP status and message for a NaiadError or HttpError."""
    if isinstance(exc, HttpError):
        return exc.status, exc.message
    if isinstance(exc, NaiadError):
        return exc.code.http_status, exc.message
    raise TypeError(f"not a client-facing error: {exc!r}")


def body_too_large(size: int | None, limit: int) -> HttpError:
    """400 for a body over --http-max-input-size; the connection is closed so the rest is not read."""
    shown = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return HttpError(
        400,
        f"Request JSON size of {shown} exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit.",
        close=True,
    )
