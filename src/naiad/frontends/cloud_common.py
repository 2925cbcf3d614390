"""What the SageMaker and Vertex AI frontends share: the v2 infer call under a platform's binary MIME
type (same codec as the HTTP frontend), health answers and small replies."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from naiad.frontends.http.body import Receive, RequestHeaders, body_timeout, read_body
from naiad.frontends.http.errors import (
    ClientDisconnected,
    HttpError,
    status_and_message,
)
from naiad.frontends.http.infer_codec import parse_header_length
from naiad.frontends.http.infer_handler import infer_payload
from naiad.frontends.http.responses import (
    JSON,
    TEXT,
    Reply,
    Send,
    error_reply,
    send_error,
    send_reply,
)
from naiad.frontends.security import HeaderForwarder
from naiad.protocol.errors import NaiadError, invalid_arg
from naiad.protocol.request_json import load_request_json

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI

logger = logging.getLogger("naiad.cloud")


def content_type(scope: dict[str, Any]) -> str | None:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.decode("latin-1")
    return None


def header_length_from_mime(mime: str | None, prefix: str, body_length: int) -> int | None:
    """JSON header size from `<prefix><N>` (e.g. application/vnd.sagemaker-triton.binary+json;json-header-size=N).

    None = the whole body is JSON (any other content type); 0 = raw binary input, as over HTTP.
    """
    if mime is None:
        return None
    position = mime.find(prefix)
    if position < 0:
        return None
    if position != 0:
        raise invalid_arg(f"expect MIME type for binary data starts with '{prefix}', got: {mime}")
    value = mime[len(prefix):].split(";", 1)[0].strip()
    return parse_header_length(value.encode("latin-1"), body_length)


def health_reply(server: ServerAPI, mode: str) -> Reply:
    """200 when live (mode `live`) or ready (mode `ready`), else 400; empty body, as Triton answers."""
    healthy = server.control.is_live() if mode == "live" else server.control.is_ready()
    return Reply(200 if healthy else 400, b"", TEXT)


class CloudInfer:
    """One v2 infer request on a cloud route: body and binary blobs in, JSON (+ blobs) out."""

    def __init__(self, server: ServerAPI, binary_mime: str) -> None:
        self.server = server
        self.binary_mime = binary_mime
        self.forward_headers: HeaderForwarder | None = None

    async def handle(self, scope: dict[str, Any], receive: Receive, send: Send, model: str, version: str = "") -> None:
        server = self.server
        headers = RequestHeaders.from_scope(scope)
        try:
            body = await read_body(receive, headers, server.config.http_max_input_size, body_timeout(scope, server.config.http_body_timeout_secs))
            header_length = header_length_from_mime(content_type(scope), self.binary_mime, len(body))
            payload, json_length = await infer_payload(server, model, version, body, header_length, scope, self.forward_headers)
        except ClientDisconnected:
            return
        except (NaiadError, HttpError) as exc:
            status, message = self.error_status(exc)
            await send_error(send, status, message, close=getattr(exc, "close", False))
            return
        except Exception as exc:  # a bug of ours: answer 500, keep serving
            logger.exception("error handling a cloud infer for model '%s'", model)
            await send_error(send, 500, f"internal server error: {type(exc).__name__}: {exc}")
            return
        mime = JSON if json_length is None else f"{self.binary_mime}{json_length}".encode()
        await send_reply(send, Reply(200, payload, mime))

    def error_status(self, exc: Exception) -> tuple[int, str]:
        """HTTP status of a failed infer; platforms may refine it (SageMaker: 507 when out of memory)."""
        return status_and_message(exc)


async def reply(send: Send, reply: Reply, scope: dict[str, Any]) -> None:
    """Send a reply, closing the connection when the request body was left unread."""
    await send_reply(send, reply, close=RequestHeaders.from_scope(scope).may_have_body())


async def error(send: Send, status: int, message: str, scope: dict[str, Any]) -> None:
    await reply(send, error_reply(status, message), scope)


async def read_json_object(scope: dict[str, Any], receive: Receive, server: ServerAPI) -> dict[str, Any]:
    """A small JSON object body (empty body = {})."""
    headers = RequestHeaders.from_scope(scope)
    body = await read_body(receive, headers, server.config.http_max_input_size, body_timeout(scope, server.config.http_body_timeout_secs))
    if not body.strip():
        return {}
    doc = load_request_json(body)
    if not isinstance(doc, dict):
        raise invalid_arg("failed to parse the request JSON buffer: expected a JSON object")
    return doc

