"""The ASGI application: POST .../infer short-cuts straight to the infer handler, the rest goes through the router."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from naiad.frontends.http.body import Receive
from naiad.frontends.http.generate import GenerateHandler
from naiad.frontends.http.guard import HttpGuard
from naiad.frontends.http.infer_handler import InferHandler
from naiad.frontends.http.responses import Send, send_error
from naiad.frontends.http.routes import build_router
from naiad.frontends.openai.app import OpenAIApp
from naiad.frontends.security import header_forwarder

if TYPE_CHECKING:
    from naiad.core.server import Server

_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")
_GENERATE_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/generate(_stream)?")


class HttpApp:
    """ASGI 3 callable for one Server (no lifespan, no websockets)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.infer = InferHandler(server)
        self.generate = GenerateHandler(server)
        self.router = build_router(server, self.infer)
        self.openai = OpenAIApp(server)  # the OpenAI-compatible API under /v1
        self.guard = HttpGuard(server.config.http_restricted_api)
        forwarder = header_forwarder(server.config.http_header_forward_pattern)
        self.infer.forward_headers = self.generate.forward_headers = forwarder

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if self.guard.refusal(scope) is not None and await self.guard.refuse(scope, send):
            return  # (checked without a coroutine first: almost every request passes)
        if scope["method"] == "POST":
            path = scope["path"]
            if path.endswith("/infer"):
                match = _INFER_PATH.fullmatch(path)
                if match is not None:
                    await self.infer.handle(scope, receive, send, match.group(1), match.group(2) or "")
                    return
            elif "/generate" in path:
                match = _GENERATE_PATH.fullmatch(path)
                if match is not None:
                    await self.generate.handle(scope, receive, send, match.group(1), match.group(2) or "", bool(match.group(3)))
                    return
        elif "/generate" in scope["path"] and _GENERATE_PATH.fullmatch(scope["path"]):
            await send_error(send, 405, "Method Not Allowed")
            return
        if scope["path"].startswith("/v1/"):
            await self.openai(scope, receive, send)
            return
        await self.router(scope, receive, send)
