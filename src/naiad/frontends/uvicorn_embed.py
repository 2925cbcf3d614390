"""Runs a uvicorn server inside the caller's event loop on a socket we bind (so port 0 works)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

logger = logging.getLogger("naiad.frontends")

BACKLOG = 2048


class EmbeddedUvicorn(uvicorn.Server):
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


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0 = any free port); IPv6 when the host is IPv6."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and host in ("::", ""):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class UvicornRunner:
    """Start/stop an ASGI app on host:port within the running loop."""

    def __init__(self, app: Any, host: str, port: int, name: str, **config: Any) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._name = name
        self._config = config
        self._socket: socket.socket | None = None
        self._server: EmbeddedUvicorn | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        if self._task is not None:
            raise RuntimeError(f"{self._name} already started")
        self._socket = bind_socket(self._host, self._port)
        bound_port = self._socket.getsockname()[1]
        options = {"lifespan": "off", "access_log": False, "log_config": None, "server_header": False, "backlog": BACKLOG}
        options.update(self._config)
        self._server = EmbeddedUvicorn(uvicorn.Config(self._app, **options))
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[self._socket]), name=self._name)
        listening = asyncio.ensure_future(self._server.listening.wait())
        done, _ = await asyncio.wait({self._task, listening}, return_when=asyncio.FIRST_COMPLETED)
        if self._task in done:
            listening.cancel()
            error = self._task.exception()
            self._task = None
            raise OSError(f"{self._name} failed to start on {self._host}:{bound_port}: {error!r}")
        return bound_port

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
