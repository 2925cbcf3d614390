"""HttpFrontend: the HTTP/REST endpoint, uvicorn (httptools, guarded) inside the caller's asyncio loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from naiad.frontends.http.app import HttpApp
from naiad.frontends.http.protocol import DEFAULT_MAX_HEADER_BYTES, GuardedHttpToolsProtocol
from naiad.frontends.uvicorn_embed import UvicornRunner

if TYPE_CHECKING:
    from naiad.core.server import Server

KEEP_ALIVE_SECS = 75


class HttpFrontend:
    """The HTTP/REST endpoint of one Server."""

    def __init__(self, server: Server, host: str, port: int) -> None:
        self.server = server
        self.app = HttpApp(server)
        settings = server.config
        protocol = GuardedHttpToolsProtocol.configured(
            max_header_bytes=DEFAULT_MAX_HEADER_BYTES,
            header_timeout=float(settings.http_header_timeout_secs),
        )
        self._runner = UvicornRunner(
            self.app, host, port, "naiad-http",
            http=protocol, ws="none", interface="asgi3", proxy_headers=False,
            timeout_keep_alive=KEEP_ALIVE_SECS,
            timeout_graceful_shutdown=max(1, int(settings.exit_timeout_secs)),
        )

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        return await self._runner.start()

    async def stop(self) -> None:
        await self._runner.stop()
