"""HttpFrontend: the HTTP/REST endpoint (--http-port, TLS from --http-ssl-*) on the shared listener set-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from naiad.frontends.http.app import HttpApp
from naiad.frontends.http.listener import HttpListener, tls_options

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI


class HttpFrontend:
    """The HTTP/REST endpoint of one Server."""

    def __init__(self, server: ServerAPI, host: str, port: int) -> None:
        self.server = server
        self.app = HttpApp(server)
        settings = server.config
        tls = tls_options(settings.http_ssl_certfile, settings.http_ssl_keyfile,
                          settings.http_ssl_ca_certs, settings.http_ssl_client_cert_required)
        self._listener = HttpListener.for_server(self.app, settings, host, port, "naiad-http", tls=tls)

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        return await self._listener.start()

    async def stop(self) -> None:
        await self._listener.stop()
