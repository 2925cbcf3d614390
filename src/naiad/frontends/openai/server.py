"""OpenAIFrontend: the /v1 API alone on its own port (--openai-port), on the shared listener set-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from naiad.frontends.http.listener import HttpListener
from naiad.frontends.openai.app import OpenAIApp

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI


class OpenAIFrontend:
    def __init__(self, server: ServerAPI, host: str, port: int) -> None:
        self.server = server
        self.app = OpenAIApp(server)
        self._listener = HttpListener.for_server(self.app, server.config, host, port, "naiad-openai")

    async def start(self) -> int:
        return await self._listener.start()

    async def stop(self) -> None:
        await self._listener.stop()
