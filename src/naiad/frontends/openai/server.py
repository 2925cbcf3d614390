"""OpenAIFrontend: the /v1 API alone on its own port (--openai-port), on the HTTP frontend's connection protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING

from naiad.frontends.http.connection import DEFAULT_MAX_HEADER_BYTES, HttpConnection
from naiad.frontends.openai.app import OpenAIApp
from naiad.frontends.uvicorn_embed import UvicornRunner

if TYPE_CHECKING:
    from naiad.core.server import Server


class OpenAIFrontend:
    def __init__(self, server: Server, host: str, port: int) -> None:
        self.server = server
        self.app = OpenAIApp(server)
        config = server.config
        protocol = HttpConnection.configured(DEFAULT_MAX_HEADER_BYTES, float(config.http_header_timeout_secs),
                                             float(config.http_body_timeout_secs))
        self._runner = UvicornRunner(self.app, host, port, "naiad-openai", http=protocol, ws="none",
                                     interface="asgi3", timeout_graceful_shutdown=max(1, int(server.config.exit_timeout_secs)))

    async def start(self) -> int:
        return await self._runner.start()

    async def stop(self) -> None:
        await self._runner.stop()
