"""Vertex AI mode (--allow-vertex-ai): the health and predict routes Vertex AI names in AIP_HEALTH_ROUTE and
AIP_PREDICT_ROUTE, on AIP_HTTP_PORT (--vertex-ai-port).

  GET  <health route>    200 when ready, else 400 (empty body)
  POST <predict route>   v2 infer on the default model (--vertex-ai-default-model, else the repository's
                         only model); binary tensors with Content-Type
                         `application/vnd.vertex-ai-triton.binary+json;json-header-size=<N>`
  POST <predict route> with header `X-Vertex-Ai-Triton-Redirect: <v2 path>`: the request is served by
                         that v2 endpoint instead (v2/models/<m>/infer, .../ready, .../config, .../stats,
                         v2/models/stats, v2, v2/health/..., v2/repository/..., v2/systemsharedmemory/...,
                         metrics), as Triton's Vertex AI server does; the HTTP restrictions still apply.
  anything else          400
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from naiad.frontends.cloud_common import (
    CloudInfer,
    error,
    health_reply,
    reply,
)
from naiad.frontends.http.app import HttpApp
from naiad.frontends.http.body import Receive
from naiad.frontends.http.guard import header_value
from naiad.frontends.http.listener import HttpListener
from naiad.frontends.http.responses import Reply, Send
from naiad.observability.exposition import CONTENT_TYPE as METRICS_CONTENT_TYPE

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT_HEADER = "x-vertex-ai-triton-redirect"

# Redirect targets Triton's Vertex AI server serves, with the method the v2 endpoint expects.
_MODEL = r"v2/models/[^/]+(?:/versions/[0-9]+)?"
_REDIRECTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(_MODEL + r"/infer"), "POST"),
    (re.compile(_MODEL + r"(?:/ready|/config|/stats)?"), "GET"),
    (re.compile(r"v2/models/stats"), "GET"),
    (re.compile(r"v2"), "GET"),
    (re.compile(r"v2/health/(?:live|ready)"), "GET"),
    (re.compile(r"v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/status"), "GET"),
    (re.compile(r"v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(?:register|unregister)"), "POST"),
    (re.compile(r"v2/repository(?:/[^/]+)?/index"), "POST"),
    (re.compile(r"v2/repository(?:/[^/]+)?/models/[^/]+/(?:load|unload)"), "POST"),
]


def redirect_method(target: str) -> str | None:
    """The method a redirect target is served with, or None when Vertex redirects do not reach it."""
    for pattern, method in _REDIRECTS:
        if pattern.fullmatch(target):
            return method
    return None


def resolve_default_model(server: ServerAPI, configured: str) -> str:
    """--vertex-ai-default-model (which must be loaded), else the only loaded model; ValueError otherwise."""
    names = sorted({entry["name"] for entry in server.control.repository_index(ready_only=True)})
    if configured:
        if configured not in names:
            raise ValueError(f"Expect the default model '{configured}' is loaded")
        return configured
    if len(names) != 1:
        raise ValueError(
            "Expect the model repository contains only a single model if default model is not specified "
            f"(--vertex-ai-default-model); found {len(names)}: {', '.join(names) or 'none'}"
        )
    return names[0]


class VertexApp:
    """ASGI app of the Vertex AI port."""

    def __init__(self, server: ServerAPI, default_model: str) -> None:
        config = server.config
        self.server = server
        self.default_model = default_model
        self.v2 = HttpApp(server)  # serves redirected requests, restrictions and model-name checks included
        self.infer = CloudInfer(server, BINARY_MIME)
        self.infer.forward_headers = self.v2.infer.forward_headers
        # The route table: the two routes Vertex AI names (AIP_HEALTH_ROUTE wins if both are the same);
        # anything else is a 400.
        self.routes: dict[str, Callable[[dict[str, Any], Receive, Send], Awaitable[None]]] = {
            config.vertex_ai_predict_route: self._predict,
            config.vertex_ai_health_route: self._health,
        }

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        route = self.routes.get(scope["path"])
        if route is None:
            await error(send, 400, f"unknown Vertex AI route: {scope['method']} {scope['path']}", scope)
            return
        await route(scope, receive, send)

    async def _health(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if await self.v2.guard.refuse(scope, send, "health"):
            return
        if scope["method"] != "GET":
            await error(send, 405, "Method Not Allowed", scope)
            return
        await reply(send, health_reply(self.server, "ready"), scope)

    async def _predict(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await error(send, 405, "Method Not Allowed", scope)
            return
        target = header_value(scope, REDIRECT_HEADER)
        if target is None:
            if not await self.v2.guard.refuse(scope, send, "inference"):
                await self.infer.handle(scope, receive, send, self.default_model, "")
            return
        await self._redirect(scope, receive, send, target.strip().lstrip("/"))

    async def _redirect(self, scope: dict[str, Any], receive: Receive, send: Send, target: str) -> None:
        if target == "metrics":
            body = self.server.info.metrics_text()
            await reply(send, Reply(200, body.encode() if isinstance(body, str) else body, METRICS_CONTENT_TYPE.encode()), scope)
            return
        method = redirect_method(target)
        if method is None:
            await error(send, 400, f"unsupported Vertex AI redirect target '{target}'", scope)
            return
        raw = "/" + target
        redirected = dict(scope, path=unquote(raw), raw_path=raw.encode("utf-8"), method=method)
        await self.v2(redirected, receive, send)


class VertexFrontend:
    """The Vertex AI listener (port --vertex-ai-port / AIP_HTTP_PORT, address --http-address)."""

    def __init__(self, server: ServerAPI, host: str, port: int) -> None:
        self._server = server
        self._host = host
        self._port = port
        self._listener: HttpListener | None = None

    async def start(self) -> int:
        """Resolve the default model (models are loaded by now), then bind."""
        config = self._server.config
        app = VertexApp(self._server, resolve_default_model(self._server, config.vertex_ai_default_model))
        self._listener = HttpListener.for_server(app, config, self._host, self._port, "naiad-vertex-ai")
        return await self._listener.start()

    async def stop(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
