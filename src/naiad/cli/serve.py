"""`naiad serve`: one event loop hosting the Server, the HTTP, gRPC and metrics frontends."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

from naiad.config.server_config import ServerConfig
from naiad.core.server import Server

log = logging.getLogger("naiad")


def _configure_logging(verbose: int) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose > 0 else logging.INFO,
        format="%(levelname).1s%(asctime)s %(process)d %(name)s] %(message)s",
        datefmt="%m%d %H:%M:%S",
        stream=sys.stderr,
    )


async def _serve(config: ServerConfig) -> int:
    from naiad.frontends.grpc.server import GrpcFrontend
    from naiad.frontends.http.server import HttpFrontend
    from naiad.frontends.metrics import MetricsFrontend

    server = Server(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.startup()
    except (RuntimeError, ValueError) as exc:
        log.error("%s", exc)
        await server.shutdown(timeout=0)
        return 1
    frontends = []
    ports: dict[str, int | None] = {"http_port": None, "grpc_port": None, "metrics_port": None}
    specs = [
        ("http_port", config.allow_http, HttpFrontend, config.http_address, config.http_port, "HTTPService"),
        ("grpc_port", config.allow_grpc, GrpcFrontend, config.grpc_address, config.grpc_port, "GRPCInferenceService"),
        ("metrics_port", config.allow_metrics, MetricsFrontend, config.metrics_address, config.metrics_port, "Metrics Service"),
    ]
    try:
        for key, enabled, cls, host, port, label in specs:
            if not enabled:
                continue
            frontend = cls(server, host, port)
            ports[key] = await frontend.start()
            frontends.append(frontend)
            log.info("Started %s at %s:%d", label, host, ports[key])
    except OSError as exc:
        log.error("failed to start a frontend: %s", exc)
        for frontend in reversed(frontends):
            await frontend.stop()
        await server.shutdown(timeout=0)
        return 1
    print("NAIAD_READY " + json.dumps(ports), flush=True)
    await stop.wait()
    log.info("shutting down: waiting up to %ss for in-flight requests", config.exit_timeout_secs)
    server.begin_shutdown()
    await server.shutdown()
    for frontend in reversed(frontends):
        await frontend.stop()
    log.info("stopped")
    return 0


def run_serve(config: ServerConfig) -> int:
    _configure_logging(config.log_verbose)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_serve(config))
    return uvloop.run(_serve(config))
