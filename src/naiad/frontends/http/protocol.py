"""uvicorn's httptools protocol plus the limits it lacks: a header size cap and a header deadline.

httptools (llhttp) has no header size limit and uvicorn only bounds idle keep-alive time, so a
client could stream headers forever or trickle them byte by byte. This subclass counts the bytes
received while a request's headers are incomplete (431 past `max_header_bytes`) and arms a
timer from the first byte of a request (or from connect) until its headers are complete
(408 after `header_timeout`, or a silent close when nothing was sent). Body deadlines are
enforced by the application (see body.py).
"""

from __future__ import annotations

import asyncio
import http
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from naiad.frontends.http.errors import error_body

DEFAULT_MAX_HEADER_BYTES = 64 * 1024


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with bounded header size and header time."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._awaiting_headers = True
        self._message_started = False
        self._started_in_chunk = False
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None

    @classmethod
    def configured(cls, max_header_bytes: int, header_timeout: float) -> type[GuardedHttpToolsProtocol]:
        """A subclass carrying these limits (uvicorn instantiates the class itself)."""
        return type(cls.__name__, (cls,), {"max_header_bytes": max_header_bytes, "header_timeout": header_timeout})

    # -- connection lifecycle

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        in_headers = self._awaiting_headers and self._message_started
        self._started_in_chunk = False
        try:
            super().data_received(data)
        except httptools.HttpParserError:  # defensive: uvicorn handles these itself
            self._reject(400, "Invalid HTTP request received.")
            return
        if not self._awaiting_headers or self.transport is None or self.transport.is_closing():
            return
        # Count only chunks that are header bytes from end to end (a chunk that began a request
        # is not counted: at most one read is missed, so the bound stays limit + one read).
        if in_headers and self._message_started and not self._started_in_chunk:
            self._header_bytes += len(data)
        if self._header_bytes > self.max_header_bytes:
            self._reject(431, f"request headers exceed the maximum of {self.max_header_bytes} bytes")

    # -- parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers = True
        self._message_started = True
        self._started_in_chunk = True
        self._header_bytes = 0
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._cancel_header_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_headers = True
        self._message_started = False
        self._header_bytes = 0

    # -- limits

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and self.header_timeout > 0:
            self._header_timer = self.loop.call_later(self.header_timeout, self._on_header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if not self._awaiting_headers or self.transport is None or self.transport.is_closing():
            return
        if self._message_started:
            self._reject(408, f"request headers were not received within {self.header_timeout:g} seconds")
        elif self.cycle is None or self.cycle.response_complete:
            self.transport.close()

    def _reject(self, status: int, message: str) -> None:
        """Answer a protocol-level error (when no response is in flight) and close the connection."""
        self._cancel_header_timer()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            body = error_body(message)
            head = (
                f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
                "content-type: application/json\r\n"
                f"content-length: {len(body)}\r\n"
                "connection: close\r\n\r\n"
            ).encode("latin-1")
            transport.write(head + body)
        transport.close()
