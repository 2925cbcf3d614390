"""The HTTP/REST port's ASGI application: the API restrictions, then the route table of routes.py."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from naiad.frontends.http.body import Receive
from naiad.frontends.http.endpoint import method_not_allowed
from naiad.frontends.http.generate import GenerateHandler
from naiad.frontends.http.guard import HttpGuard
from naiad.frontends.http.infer_handler import InferHandler
from naiad.frontends.http.responses import Send
from naiad.frontends.http.routes import build_routes
from naiad.frontends.openai.app import OpenAIApp
from naiad.frontends.security import header_forwarder

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI


class HttpApp:
    """ASGI 3 callable for one Server (no lifespan, no websockets)."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server
        self.infer = InferHandler(server)
        self.generate = GenerateHandler(server)
        self.openai = OpenAIApp(server)  # the OpenAI-compatible API under /v1
        table = build_routes(server, self.infer, self.generate, self.openai)
        self.fast, self.mounts, self.router = table.fast, table.mounts, table.router
        self.guard = HttpGuard(server.config.http_restricted_api)
        forwarder = header_forwarder(server.config.http_header_forward_pattern)
        self.infer.forward_headers = self.generate.forward_headers = forwarder

    def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> Awaitable[Any]:
        """The coroutine of whatever answers the request: the guard's refusal, a fast entry's handler, a
        mount or the router. (Returned, not awaited here: every step of a request that waits then
        resumes one frame fewer.) The server awaits it as it would this app's own coroutine."""
        if scope["type"] != "http":
            return _ignored()
        if self.guard.refusal(scope) is not None:  # (checked without a coroutine first: almost every request passes)
            return self.guard.refuse(scope, send)
        path = scope["path"]
        try:
            target = self.fast.known[path]
        except KeyError:
            target = self.fast.target(path)
        if target is not None:
            if scope["method"] == "POST":
                handler, arguments = target
                return handler(scope, receive, send, *arguments)
            return method_not_allowed(scope, send, ("POST",))
        for prefix, app in self.mounts:
            if path.startswith(prefix):
                return app(scope, receive, send)
        return self.router(scope, receive, send)


async def _ignored() -> None:
    """What a lifespan or websocket scope gets: nothing (this app serves HTTP only)."""
