"""Runs a uvicorn server inside the caller's event loop on a socket we bind (so port 0 works)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from typing import Any

import uvicorn


class EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: `naiad serve` owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class UvicornRunner:
    """Start/stop an ASGI app on host:port within the running loop."""

    def __init__(self, app: Any, host: str, port: int, **config: Any) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._config = config
        self._server: EmbeddedUvicorn | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> int:
        sock = bind_socket(self._host, self._port)
        config = uvicorn.Config(self._app, lifespan="off", access_log=False, log_config=None, **self._config)
        self._server = EmbeddedUvicorn(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # re-raise the start-up error
                raise OSError(f"server on {self._host}:{self._port} stopped during start-up")
            await asyncio.sleep(0.002)
        return sock.getsockname()[1]

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
