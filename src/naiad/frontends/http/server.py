"""HttpFrontend: the HTTP/REST endpoint, Naiad's HTTP/1.1 connections (connection.py) on uvicorn's server in the caller's loop."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any

from naiad.frontends.http.app import HttpApp
from naiad.frontends.http.connection import DEFAULT_MAX_HEADER_BYTES, HttpConnection
from naiad.frontends.uvicorn_embed import UvicornRunner

if TYPE_CHECKING:
    from naiad.core.server import Server

KEEP_ALIVE_SECS = 75


def tls_options(certfile: str, keyfile: str, ca_certs: str, client_cert_required: bool) -> dict[str, Any]:
    """uvicorn's ssl_* settings for --http-ssl-*: none without a certificate; client certificates
    are verified against ca_certs (required, or optional when only the CA is given)."""
    if not certfile:
        if keyfile or ca_certs or client_cert_required:
            raise ValueError("--http-ssl-keyfile/--http-ssl-ca-certs/--http-ssl-client-cert-required need --http-ssl-certfile")
        return {}
    if client_cert_required and not ca_certs:
        raise ValueError("--http-ssl-client-cert-required needs --http-ssl-ca-certs (the CA that signs client certificates)")
    options: dict[str, Any] = {"ssl_certfile": certfile, "ssl_keyfile": keyfile or None}
    if ca_certs:
        options["ssl_ca_certs"] = ca_certs
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED if client_cert_required else ssl.CERT_OPTIONAL
    return options


class HttpFrontend:
    """The HTTP/REST endpoint of one Server."""

    def __init__(self, server: Server, host: str, port: int) -> None:
        self.server = server
        self.app = HttpApp(server)
        settings = server.config
        protocol = HttpConnection.configured(
            max_header_bytes=DEFAULT_MAX_HEADER_BYTES,
            header_timeout=float(settings.http_header_timeout_secs),
            body_timeout=float(settings.http_body_timeout_secs),
        )
        self._runner = UvicornRunner(
            self.app, host, port, "naiad-http",
            http=protocol, ws="none", interface="asgi3", proxy_headers=False,
            timeout_keep_alive=KEEP_ALIVE_SECS,
            timeout_graceful_shutdown=max(1, int(settings.exit_timeout_secs)),
            **tls_options(settings.http_ssl_certfile, settings.http_ssl_keyfile,
                          settings.http_ssl_ca_certs, settings.http_ssl_client_cert_required),
        )

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        return await self._runner.start()

    async def stop(self) -> None:
        await self._runner.stop()
