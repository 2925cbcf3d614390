"""Glue between Starlette routing and our handlers: request context, error mapping, JSON 404/405."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.routing import Route

from naiad.frontends.http.body import Receive, RequestHeaders, body_timeout, read_body
from naiad.frontends.http.errors import (
    ClientDisconnected,
    HttpError,
    status_and_message,
)
from naiad.frontends.http.responses import (
    Reply,
    Send,
    error_reply,
    send_error,
    send_reply,
)
from naiad.protocol.errors import NaiadError, invalid_arg
from naiad.protocol.request_json import load_request_json

logger = logging.getLogger("naiad.http")


class RouteRequest:
    """One request as a handler sees it: path parameters, body (bounded), JSON body."""

    __slots__ = ("scope", "receive", "headers", "limit", "timeout", "body_consumed")

    def __init__(self, scope: dict[str, Any], receive: Receive, limit: int, timeout: float) -> None:
        self.scope = scope
        self.receive = receive
        self.headers = RequestHeaders.from_scope(scope)
        self.limit = limit
        self.timeout = timeout
        self.body_consumed = False

    def param(self, name: str) -> str:
        return self.scope.get("path_params", {}).get(name, "") or ""

    async def body(self) -> bytes:
        data = await read_body(self.receive, self.headers, self.limit, body_timeout(self.scope, self.timeout))
        self.body_consumed = True
        return data

    async def json(self, required: bool = False) -> Any:
        """The JSON body, or None for an empty body (unless required)."""
        data = await self.body()
        if not data.strip() and not required:
            return None
        return load_request_json(data)

    async def json_object(self, required: bool = False) -> dict[str, Any]:
        doc = await self.json(required)
        if doc is None:
            return {}
        if not isinstance(doc, dict):
            raise invalid_arg("failed to parse the request JSON buffer: expected a JSON object")
        return doc


Handler = Callable[[RouteRequest], Awaitable[Reply]]


class Endpoint:
    """ASGI app for one handler: client errors become {"error": ...} with their status, never a 500."""

    def __init__(self, handler: Handler, limit: Callable[[], int], timeout: Callable[[], float]) -> None:
        self.handler = handler
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        request = RouteRequest(scope, receive, self.limit(), self.timeout())
        close = False
        try:
            reply = await self.handler(request)
        except ClientDisconnected:
            return
        except (NaiadError, HttpError) as exc:
            status, message = status_and_message(exc)
            reply = error_reply(status, message, getattr(exc, "headers", None))
            close = getattr(exc, "close", False)
        except Exception as exc:  # a bug of ours: answer 500, keep serving
            logger.exception("error handling %s %s", scope.get("method"), scope.get("path"))
            reply = error_reply(500, f"internal server error: {type(exc).__name__}: {exc}")
        if not request.body_consumed and request.headers.may_have_body():
            close = True
        await send_reply(send, reply, close)


async def method_not_allowed(scope: dict[str, Any], send: Send, methods: Iterable[str]) -> None:
    """JSON 405 like Triton's, with the Allow header; closes when the unread body may follow."""
    allow = ", ".join(sorted(methods)).encode()
    close = RequestHeaders.from_scope(scope).may_have_body()
    await send_error(send, 405, "Method Not Allowed", close=close, headers=[(b"allow", allow)])


class JsonRoute(Route):
    """A Starlette route whose wrong-method answer is JSON 405 like Triton's."""

    async def handle(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if self.methods and scope["method"] not in self.methods:
            await method_not_allowed(scope, send, self.methods)
            return
        await self.app(scope, receive, send)


async def not_found(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """Router default: JSON 404 for any unknown path."""
    if scope["type"] != "http":
        return
    close = RequestHeaders.from_scope(scope).may_have_body()
    await send_error(send, 404, "Not Found", close=close)
