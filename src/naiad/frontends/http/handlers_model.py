"""Health, server metadata and per-model ready/metadata/config/statistics handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from naiad.frontends.http.endpoint import RouteRequest
from naiad.frontends.http.responses import Reply, empty_reply, error_reply, json_reply
from naiad.protocol.errors import ErrorCode, NaiadError

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI


class ModelHandlers:
    """Read-only endpoints answered straight from the facade."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server

    async def live(self, request: RouteRequest) -> Reply:
        return empty_reply(200 if self.server.control.is_live() else 400)

    async def ready(self, request: RouteRequest) -> Reply:
        return empty_reply(200 if self.server.control.is_ready() else 400)

    async def server_metadata(self, request: RouteRequest) -> Reply:
        return json_reply(self.server.info.metadata())

    async def model_ready(self, request: RouteRequest) -> Reply:
        try:
            ready = self.server.control.model_ready(request.param("model"), request.param("version"))
        except NaiadError as exc:
            # A live Triton answers an unknown model's readiness with 400, not 404.
            status = 400 if exc.code is ErrorCode.NOT_FOUND else exc.code.http_status
            return error_reply(status, exc.message)
        if not ready:
            return error_reply(400, "Model version not ready")
        return empty_reply(200)

    async def model_metadata(self, request: RouteRequest) -> Reply:
        return json_reply(self.server.info.model_metadata(request.param("model"), request.param("version")))

    async def model_config(self, request: RouteRequest) -> Reply:
        return json_reply(self.server.info.model_config_dict(request.param("model"), request.param("version")))

    async def model_stats(self, request: RouteRequest) -> Reply:
        return json_reply(self.server.info.model_statistics(request.param("model"), request.param("version")))
