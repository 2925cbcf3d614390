"""A frontend worker process: serves its share of the HTTP/REST or gRPC port and hands requests to the core.

Started by pool.py as `python -m naiad.frontends.workers.worker_main CHANNEL_FD HANDOFF_FD INDEX PROTOCOL`
(PROTOCOL `http` or `grpc`: it serves the connections the core sends over the hand-off socket
HANDOFF_FD (handoff.py); HANDOFF_FD -1 with `grpc`: grpcio binds the gRPC port the core reserved,
with SO_REUSEPORT). The first frame on the channel is the ServerConfig. SIGTERM: stop taking
connections, finish the requests in flight, exit. SIGINT is the core's to act on (a terminal's
Ctrl-C reaches the whole group). When the core goes away, the worker exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable

from naiad.config.collector import freeze_startup_heap
from naiad.config.server_config import ServerConfig
from naiad.frontends.handoff import HandedConnections
from naiad.frontends.http.listener import HttpListener, tls_options
from naiad.frontends.workers import wire
from naiad.frontends.workers.channel import Channel, read_frame
from naiad.frontends.workers.core_client import CoreClient
from naiad.frontends.workers.worker_app import WorkerApp
from naiad.observability.log_settings import LogSettings, install_root_handler

log = logging.getLogger("naiad.frontends")


def _configure_logging(config: ServerConfig) -> None:
    """The core's log settings and format (its later changes through /v2/logging stay in the core)."""
    settings = LogSettings(log_file=config.log_file, log_info=config.log_info, log_warning=config.log_warning,
                           log_error=config.log_error, log_verbose_level=config.log_verbose,
                           log_format=config.log_format)
    install_root_handler(settings)


async def _start_http(config: ServerConfig, core: CoreClient, handoff: socket.socket,
                      index: int) -> Callable[[], Awaitable[None]]:
    tls = tls_options(config.http_ssl_certfile, config.http_ssl_keyfile,
                      config.http_ssl_ca_certs, config.http_ssl_client_cert_required)
    listener = HttpListener.for_server(WorkerApp(config, core), config, config.http_address, config.http_port,
                                       f"naiad-http-worker-{index}", tls=tls, listening=False)
    await listener.start()
    handed = HandedConnections(handoff, listener.connection_server())

    async def stop() -> None:
        handed.close()
        await listener.stop()

    return stop


async def _start_grpc(config: ServerConfig, core: CoreClient,
                      handoff: socket.socket | None) -> Callable[[], Awaitable[None]]:
    from naiad.frontends.workers.grpc_worker import start_grpc  # gRPC modules only in the processes serving it

    server, connections = await start_grpc(config, core)
    handed = HandedConnections(handoff, connections) if handoff is not None and connections is not None else None

    async def stop() -> None:
        if handed is not None:
            handed.close()
        await server.stop(config.exit_timeout_secs)

    return stop


async def serve(config: ServerConfig, channel_sock: socket.socket, handoff: socket.socket | None,
                index: int, protocol: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    core = CoreClient()
    channel = await Channel.open(channel_sock, core.on_message)
    core.channel = channel
    if protocol == "http" and handoff is not None:
        stop_listening = await _start_http(config, core, handoff, index)
    else:
        stop_listening = await _start_grpc(config, core, handoff)
    freeze_startup_heap()  # as `naiad serve` does in the core
    channel.send((wire.READY, os.getpid()))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({stopping, channel.closed}, return_when=asyncio.FIRST_COMPLETED)
    if channel.closed.done():
        core.core_gone()
        log.warning("frontend worker %d: the core process went away; exiting", index)
    await stop_listening()
    channel.close()


def main(argv: list[str]) -> int:
    channel_fd, handoff_fd, index = (int(arg) for arg in argv[:3])
    protocol = argv[3] if len(argv) > 3 else "http"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel_sock = socket.socket(fileno=channel_fd)
    handoff = socket.socket(fileno=handoff_fd) if handoff_fd >= 0 else None
    try:
        config: ServerConfig = read_frame(channel_sock)
    except EOFError:
        return 1
    _configure_logging(config)
    work = serve(config, channel_sock, handoff, index, protocol)
    try:
        import uvloop
    except ImportError:
        asyncio.run(work)
    else:
        uvloop.run(work)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
