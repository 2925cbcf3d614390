"""The metrics listener: GET /metrics in Prometheus text format on --metrics-port."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from naiad.frontends.http.listener import HttpListener
from naiad.observability.exposition import CONTENT_TYPE

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI


class MetricsFrontend:
    """Serves the server's metric families; port 0 picks a free port."""

    def __init__(self, server: ServerAPI, host: str, port: int) -> None:
        info = server.info

        async def metrics(request: Request) -> Response:
            if request.method != "GET":  # Starlette routes HEAD with GET; Triton answers it 405
                return await not_allowed(request, None)
            return Response(info.metrics_text(), media_type=CONTENT_TYPE)

        async def not_found(request: Request, exc: Exception) -> Response:
            return JSONResponse({"error": "Not Found"}, status_code=404)

        async def not_allowed(request: Request, exc: Exception | None) -> Response:
            return JSONResponse({"error": "Method Not Allowed"}, status_code=405)

        app = Starlette(
            routes=[Route("/metrics", metrics, methods=["GET"])],
            exception_handlers={404: not_found, 405: not_allowed},
        )
        self._listener = HttpListener.for_server(app, server.config, host, port, "naiad-metrics")

    async def start(self) -> int:
        return await self._listener.start()

    async def stop(self) -> None:
        await self._listener.stop()
