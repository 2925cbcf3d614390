"""Minimal HTTP/1.1 client wire for load generation: an incremental response parser and an asyncio connection.

Requests are pre-built bytes; responses are framed by Content-Length or chunked encoding without
being decoded, so the generator spends its time waiting on the server, not in a client library.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

MAX_HEAD_BYTES = 64 * 1024


class ProtocolError(ConnectionError):
    """The server's bytes are not a valid HTTP/1.1 response."""


class ResponseParser:
    """Feed bytes; `feed` returns True once one whole response has arrived.

    Body bytes go to `on_body` when given (streaming, e.g. Server-Sent Events), else into `body`.
    """

    def __init__(self, on_body: Callable[[bytes], None] | None = None) -> None:
        self.on_body = on_body
        self.buffer = bytearray()
        self.body = bytearray()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.state = "head"
        self.remaining = 0
        self.done = False

    def _emit(self, data: bytes) -> None:
        if data:
            if self.on_body is not None:
                self.on_body(bytes(data))
            else:
                self.body += data

    def _parse_head(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise ProtocolError("response headers too large")
            return False
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        del self.buffer[: end + 4]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {lines[0]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self.state = "chunk-size"
        else:
            self.remaining = int(self.headers.get("content-length", "0") or 0)
            self.state = "body"
        return True

    def _parse_chunked(self) -> bool:
        """Consume what the buffer holds; True when the final chunk and trailers are in."""
        while True:
            if self.state == "chunk-size":
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    return False
                size_text = bytes(self.buffer[:end]).split(b";", 1)[0].strip()
                del self.buffer[: end + 2]
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {size_text!r}") from None
                if size == 0:
                    self.state = "trailer"
                else:
                    self.state, self.remaining = "chunk-data", size
            elif self.state == "chunk-data":
                if not self.buffer:
                    return False
                take = min(self.remaining, len(self.buffer))
                self._emit(bytes(self.buffer[:take]))
                del self.buffer[:take]
                self.remaining -= take
                if self.remaining:
                    return False
                self.state = "chunk-end"
            elif self.state == "chunk-end":
                if len(self.buffer) < 2:
                    return False
                del self.buffer[:2]
                self.state = "chunk-size"
            else:  # trailer: lines until an empty one
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    return False
                line_empty = end == 0
                del self.buffer[: end + 2]
                if line_empty:
                    return True

    def feed(self, data: bytes) -> bool:
        self.buffer += data
        if self.state == "head" and not self._parse_head():
            return False
        if self.state == "body":
            take = min(self.remaining, len(self.buffer))
            self._emit(bytes(self.buffer[:take]))
            del self.buffer[:take]
            self.remaining -= take
            self.done = self.remaining == 0
        else:
            self.done = self._parse_chunked()
        return self.done


class HttpConnection(asyncio.Protocol):
    """One persistent connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future[ResponseParser] | None = None
        self.first_byte_ns = 0
        self.received_ns = 0  # perf_counter_ns when the bytes being parsed arrived
        self.closed = False

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(cls, host, port)
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            import socket

            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if self.parser is None or self.waiter is None:
            return
        self.received_ns = time.perf_counter_ns()
        if not self.first_byte_ns:
            self.first_byte_ns = time.monotonic_ns()
        try:
            complete = self.parser.feed(data)
        except ProtocolError as exc:
            if not self.waiter.done():
                self.waiter.set_exception(exc)
            return
        if complete and not self.waiter.done():
            self.waiter.set_result(self.parser)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection closed by the server ({exc or 'EOF'})"))

    def start(self, payload: bytes, on_body: Callable[[bytes], None] | None = None) -> asyncio.Future[ResponseParser]:
        """Write the request; the future resolves with the parser once the whole response is in."""
        assert self.transport is not None
        self.parser = ResponseParser(on_body)
        self.first_byte_ns = 0
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
