"""The one listener set-up of every HTTP-style port (HTTP/REST, metrics, SageMaker, Vertex AI, OpenAI).

Each port binds a socket Naiad owns (so port 0 works and a taken port fails with the OS's errno),
optionally wraps it in TLS, serves an ASGI app with Naiad's HTTP/1.1 connection protocol
(http/connection.py) on uvicorn's server inside the caller's event loop, and stops gracefully:
no new connections, in-flight requests finish within --exit-timeout-secs, then the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn

from naiad.config.server_config import ServerConfig
from naiad.frontends.handoff import ConnectionServer
from naiad.frontends.http.connection import DEFAULT_MAX_HEADER_BYTES, HttpConnection
from naiad.frontends.sockets import BACKLOG, bind_socket

logger = logging.getLogger("naiad.frontends")

KEEP_ALIVE_SECS = 75  # idle keep-alive connections are closed after this long


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


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling (`naiad serve` owns SIGINT/SIGTERM); reports when listening."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.listening.set()

    def new_connection(self) -> asyncio.Protocol:
        """The protocol of one connection, as uvicorn's own listening sockets make it."""
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state)
        return protocol


class HttpListener:
    """Serves an ASGI app on host:port within the running loop; `options` are uvicorn.Config settings."""

    def __init__(self, app: Any, host: str, port: int, name: str, listening: bool = True,
                 **options: Any) -> None:
        self._app = app
        self._listening = listening  # False: it serves only the connections handed to its connection_server()
        self._host = host
        self._port = port
        self._name = name
        self._options = options
        self._socket: socket.socket | None = None
        self._server: _EmbeddedUvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def for_server(cls, app: Any, config: ServerConfig, host: str, port: int, name: str,
                   tls: dict[str, Any] | None = None, listening: bool = True) -> HttpListener:
        """The listener every Naiad port uses: its HTTP/1.1 connections with the server's header and body
        timeouts, keep-alive, a graceful stop bounded by --exit-timeout-secs, and `tls` (see tls_options);
        `listening` False: it binds nothing and serves the connections accepted elsewhere (handoff.py)."""
        protocol = HttpConnection.configured(
            max_header_bytes=DEFAULT_MAX_HEADER_BYTES,
            header_timeout=float(config.http_header_timeout_secs),
            body_timeout=float(config.http_body_timeout_secs),
        )
        return cls(app, host, port, name, listening,
                   http=protocol, ws="none", interface="asgi3", proxy_headers=False,
                   timeout_keep_alive=KEEP_ALIVE_SECS,
                   timeout_graceful_shutdown=max(1, int(config.exit_timeout_secs)),
                   **(tls or {}))

    async def start(self) -> int:
        """Bind and start serving; returns the bound port (0 when not listening)."""
        if self._task is not None:
            raise RuntimeError(f"{self._name} already started")
        self._socket = bind_socket(self._host, self._port) if self._listening else None
        bound_port = self._socket.getsockname()[1] if self._socket is not None else 0
        options: dict[str, Any] = {"lifespan": "off", "access_log": False, "log_config": None,
                                   "server_header": False, "backlog": BACKLOG}
        options.update(self._options)
        self._server = _EmbeddedUvicorn(uvicorn.Config(self._app, **options))
        sockets = [self._socket] if self._socket is not None else []
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=sockets), name=self._name)
        listening = asyncio.ensure_future(self._server.listening.wait())
        done, _ = await asyncio.wait({self._task, listening}, return_when=asyncio.FIRST_COMPLETED)
        if self._task in done:
            listening.cancel()
            error = self._task.exception()
            self._task = None
            if self._socket is not None:
                self._socket.close()
                self._socket = None
            raise OSError(f"{self._name} failed to start on {self._host}:{bound_port}: {error!r}")
        return bound_port

    def connection_server(self) -> ConnectionServer:
        """What serves a connection accepted elsewhere on this listener's app, TLS and graceful stop (once started)."""
        server = self._server
        if server is None:
            raise RuntimeError(f"{self._name} is not started")
        return ConnectionServer(server.new_connection, server.config.ssl, lambda: len(server.server_state.connections))

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (bounded by the graceful timeout), close."""
        if self._task is None or self._server is None:
            return
        self._server.should_exit = True
        grace = self._server.config.timeout_graceful_shutdown or 1
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=grace + 5)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        except Exception:
            logger.exception("%s stopped with an error", self._name)
        finally:
            self._task = None
            if self._socket is not None:
                self._socket.close()
                self._socket = None
