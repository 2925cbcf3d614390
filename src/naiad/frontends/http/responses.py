"""Replies and the raw ASGI messages that send them (JSON, empty, error)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from naiad.frontends.http.compression import choose_encoding, compress
from naiad.frontends.http.errors import error_body

Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = b"application/json"
JSON_HEAD_LINES = b"content-type: application/json\r\n"  # the plain JSON answer's header lines, written once
BINARY_HEAD_LINES = b"content-type: application/octet-stream\r\ninference-header-content-length: %d\r\n"  # % JSON length
TEXT = b"text/plain"
OCTET_STREAM = b"application/octet-stream"


@dataclass(slots=True)
class Reply:
    """What a route handler answers: status, body, content type and any extra headers."""

    status: int = 200
    body: bytes = b""
    content_type: bytes = JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def json_reply(obj: Any, status: int = 200) -> Reply:
    return Reply(status, orjson.dumps(obj), JSON)


def empty_reply(status: int = 200) -> Reply:
    """Health/ready style answer: no body, text/plain."""
    return Reply(status, b"", TEXT)


def error_reply(status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> Reply:
    return Reply(status, error_body(message), JSON, list(headers or []))


async def send_reply(send: Send, reply: Reply, close: bool = False) -> None:
    """Send a whole reply in one body message, with Content-Length (and Connection: close if asked)."""
    headers = [
        (b"content-type", reply.content_type),
        (b"content-length", str(len(reply.body)).encode()),
    ]
    headers.extend(reply.headers)
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


async def send_error(
    send: Send, status: int, message: str, *, close: bool = False, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_reply(send, error_reply(status, message, headers), close)


def send_infer_answer(
    send: Send, payload: bytes, json_length: int | None, accept_encoding: bytes | None,
    send_response: Callable[[Send, int, bytes, bytes], bool] | None = None,
) -> Awaitable[None] | None:
    """A 200 infer answer: JSON, or binary with its JSON header length; compressed when the client accepts it.

    `send_response`: the server's whole-answer writer (scope extension `naiad.send_response`, see
    connection.send_response), tried first when given. None when the answer went out that way (the
    usual case: no coroutine made), else the coroutine sending the two ASGI messages, to await."""
    if json_length is None:
        if send_response is not None and accept_encoding is None and send_response(send, 200, JSON_HEAD_LINES, payload):
            return None  # the usual answer: plain JSON, uncompressed
        headers = [(b"content-type", JSON)]
    elif send_response is not None and accept_encoding is None and send_response(
            send, 200, BINARY_HEAD_LINES % json_length, payload):
        return None  # binary tensors, uncompressed: the same lines as below, in one format
    else:
        headers = [(b"content-type", OCTET_STREAM), (b"inference-header-content-length", b"%d" % json_length)]
    if accept_encoding is not None:
        encoding = choose_encoding(accept_encoding)
        if encoding is not None:
            payload = compress(payload, encoding)
            headers.append((b"content-encoding", encoding))
    if send_response is not None and send_response(send, 200, b"".join(b"%s: %s\r\n" % pair for pair in headers), payload):
        return None
    headers.append((b"content-length", b"%d" % len(payload)))
    return _send_start_and_body(send, headers, payload)


async def _send_start_and_body(send: Send, headers: list[tuple[bytes, bytes]], payload: bytes) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
