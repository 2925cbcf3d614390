"""Reading a request body safely: size cap before and while reading, a deadline, and bounded decompression."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from naiad.frontends.http.errors import ClientDisconnected, HttpError, body_too_large

Receive = Callable[[], Awaitable[dict[str, Any]]]

_ACTED_ON = frozenset((b"content-length", b"inference-header-content-length", b"content-encoding",
                       b"accept-encoding", b"transfer-encoding"))  # the names RequestHeaders.from_scope reads


@dataclass(slots=True)
class RequestHeaders:
    """The request headers the frontend acts on (raw values, lower-cased names)."""

    content_length: bytes | None = None
    content_encoding: bytes | None = None
    accept_encoding: bytes | None = None
    infer_header_length: bytes | None = None
    chunked: bool = False

    @classmethod
    def from_scope(cls, scope: dict[str, Any]) -> RequestHeaders:
        found = cls()
        for name, value in scope["headers"]:
            if name not in _ACTED_ON:
                continue  # (one set lookup passes over Host, Content-Type, ...)
            if name == b"content-length":
                found.content_length = value
            elif name == b"inference-header-content-length":
                found.infer_header_length = value
            elif name == b"content-encoding":
                found.content_encoding = value
            elif name == b"accept-encoding":
                found.accept_encoding = value
            elif name == b"transfer-encoding":
                found.chunked = b"chunked" in value.lower()
        return found

    def declared_length(self) -> int | None:
        """Content-Length as an int (None when absent or unparsable; the HTTP parser already vetted it)."""
        if self.content_length is None:
            return None
        try:
            return int(self.content_length)
        except ValueError:
            return None

    def may_have_body(self) -> bool:
        return self.chunked or (self.declared_length() or 0) > 0


def body_timeout(scope: dict[str, Any], configured: float) -> float | None:
    """The body deadline read_body should keep: None when the server enforces it itself (Naiad's own
    connection, scope extension `naiad.body_deadline`), which also lets the read run outside a task."""
    return None if "naiad.body_deadline" in scope.get("extensions", ()) else configured


def body_at_hand(scope: dict[str, Any], receive: Receive, headers: RequestHeaders, limit: int) -> bytes | None:
    """The whole request body without waiting, when the server already holds all of it (scope
    extension `naiad.take_body`, connection.take_body), refused past `limit` bytes as read_body
    refuses it. None when it is not at hand: read_body."""
    take = scope["extensions"].get("naiad.take_body") if "extensions" in scope else None
    if take is None:
        return None
    body = take(receive)
    if body is None or len(body) > limit:  # (Content-Length is looked at only then: a body at hand has that length)
        declared = headers.declared_length()
        if declared is not None and declared > limit:
            raise body_too_large(declared, limit)
        if body is not None:
            raise body_too_large(None, limit)
    return body


async def read_body(receive: Receive, headers: RequestHeaders, limit: int, timeout: float | None) -> bytes:
    """The whole request body, refused (400, connection closed) past `limit` bytes or `timeout` seconds
    (None: the server enforces the body deadline itself)."""
    declared = headers.declared_length()
    if declared is not None and declared > limit:
        raise body_too_large(declared, limit)
    received = [0]
    if timeout is None:
        return await _collect(receive, limit, received)
    try:
        async with asyncio.timeout(timeout):
            return await _collect(receive, limit, received)
    except TimeoutError:
        raise HttpError(
            408,
            f"request body was not received within {timeout:g} seconds (received {received[0]} bytes)",
            close=True,
        ) from None


async def _collect(receive: Receive, limit: int, received: list[int]) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk = message.get("body", b"")
        if chunk:
            received[0] += len(chunk)
            if received[0] > limit:
                raise body_too_large(None, limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    """Decompress one or more concatenated streams, never producing more than `limit` bytes."""
    parts: list[bytes] = []
    produced = 0
    data = body
    while True:
        stream = zlib.decompressobj(wbits)
        out = stream.decompress(data, limit - produced + 1)
        produced += len(out)
        if produced > limit or stream.unconsumed_tail:
            raise body_too_large(None, limit)
        parts.append(out)
        if not stream.eof:
            raise zlib.error("compressed data is truncated")
        data = stream.unused_data
        if not data:
            break
    return b"".join(parts)


def decompress_body(body: bytes, encoding: bytes | None, limit: int) -> bytes:
    """Undo Content-Encoding gzip/deflate (identity/absent: as is); anything else is a 400."""
    if not encoding:
        return body
    name = encoding.strip().lower()
    if name == b"identity":
        return body
    if name not in (b"gzip", b"deflate", b"x-gzip"):
        raise HttpError(
            400,
            f"Unsupported compression type '{encoding.decode('latin-1')}', supported are 'gzip' and 'deflate'",
            headers=[(b"accept-encoding", b"gzip, deflate")],
        )
    if not body:
        return body
    try:
        if name == b"deflate":
            try:
                return _inflate(body, zlib.MAX_WBITS, limit)
            except zlib.error:
                return _inflate(body, -zlib.MAX_WBITS, limit)
        return _inflate(body, 16 + zlib.MAX_WBITS, limit)
    except zlib.error as exc:
        raise HttpError(400, f"unable to decompress the request body ({name.decode()}): {exc}") from None
