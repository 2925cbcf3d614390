"""Runtime settings extensions answered by the facade: logging and trace settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from naiad.frontends.http.endpoint import RouteRequest
from naiad.frontends.http.responses import Reply, json_reply

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI


class SettingsHandlers:
    """Log settings: GET shows all six keys, POST applies a subset and returns the result."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server

    async def logging(self, request: RouteRequest) -> Reply:
        if request.scope["method"] == "POST":
            changes = await request.json_object(required=True)
            return json_reply(self.server.info.update_log_settings(changes))
        return json_reply(self.server.info.get_log_settings())

    async def trace(self, request: RouteRequest) -> Reply:
        """GET/POST /v2/trace/setting and /v2/models/{model}/trace/setting."""
        model = request.param("model")
        if request.scope["method"] == "POST":
            changes = await request.json_object(required=True)
            return json_reply(self.server.info.update_trace_settings(model, changes))
        return json_reply(self.server.info.get_trace_settings(model))
