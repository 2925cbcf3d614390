"""The metrics listener: GET /metrics in Prometheus text format on --metrics-port."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from naiad.core.server import Server
from naiad.frontends.uvicorn_embed import UvicornRunner
from naiad.observability.metrics import build_registry


class MetricsFrontend:
    """Serves the server-owned registry; port 0 picks a free port."""

    def __init__(self, server: Server, host: str, port: int) -> None:
        self._registry = build_registry(server.model_statistics, server.pending_requests)

        async def metrics(request: Request) -> Response:
            return Response(generate_latest(self._registry), media_type=CONTENT_TYPE_LATEST)

        async def not_found(request: Request, exc: Exception) -> Response:
            return JSONResponse({"error": "Not Found"}, status_code=404)

        app = Starlette(routes=[Route("/metrics", metrics, methods=["GET"])], exception_handlers={404: not_found})
        self._runner = UvicornRunner(app, host, port, http="h11")

    async def start(self) -> int:
        return await self._runner.start()

    async def stop(self) -> None:
        await self._runner.stop()
