"""`naiad serve`: one event loop hosting the Server, the HTTP, gRPC and metrics frontends."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

from naiad.config.server_config import ServerConfig
from naiad.core.server import Server
from naiad.observability.log_settings import LogSettings, SettingsFilter, TritonFormatter
from naiad.runtime.memory import keep_freed_buffers

log = logging.getLogger("naiad")


def _configure_logging(settings: LogSettings) -> None:
    """One handler on the root logger, filtered and formatted by the server's live settings."""
    handler: logging.Handler = logging.FileHandler(settings.log_file) if settings.log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(TritonFormatter(settings))
    handler.addFilter(SettingsFilter(settings))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.logger_level)
    settings.listeners.append(lambda changed: root.setLevel(changed.logger_level))
    for noisy in ("uvicorn", "uvicorn.error", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def _serve(config: ServerConfig) -> int:
    from naiad.frontends.grpc.server import GrpcFrontend
    from naiad.frontends.http.server import HttpFrontend
    from naiad.frontends.metrics import MetricsFrontend
    from naiad.frontends.openai.server import OpenAIFrontend
    from naiad.frontends.sagemaker import SageMakerFrontend
    from naiad.frontends.vertex import VertexFrontend

    try:
        server = Server(config)
    except (ImportError, ValueError, OSError) as exc:
        # e.g. a malformed s3:// URL, unreadable credentials, or a missing optional extra
        print(f"naiad: {exc}", file=sys.stderr)
        return 1
    _configure_logging(server.log_settings)
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
    ports: dict[str, int | None] = {"http_port": None, "grpc_port": None, "metrics_port": None,
                                    "sagemaker_port": None, "vertex_ai_port": None, "openai_port": None}
    specs = [
        ("http_port", config.allow_http, HttpFrontend, config.http_address, config.http_port, "HTTPService"),
        ("grpc_port", config.allow_grpc, GrpcFrontend, config.grpc_address, config.grpc_port, "GRPCInferenceService"),
        ("metrics_port", config.allow_metrics, MetricsFrontend, config.metrics_address, config.metrics_port, "Metrics Service"),
        ("sagemaker_port", config.allow_sagemaker, SageMakerFrontend, config.http_address, config.sagemaker_port, "Sagemaker HTTPService"),
        ("vertex_ai_port", config.allow_vertex_ai, VertexFrontend, config.http_address, config.vertex_ai_port, "Vertex AI HTTPService"),
        ("openai_port", config.openai_port is not None, OpenAIFrontend, config.http_address, config.openai_port or 0, "OpenAI HTTPService"),
    ]
    try:
        for key, enabled, cls, host, port, label in specs:
            if not enabled:
                continue
            frontend = cls(server, host, port)
            ports[key] = await frontend.start()
            frontends.append(frontend)
            log.info("Started %s at %s:%d", label, host, ports[key])
    except (OSError, ValueError) as exc:  # ValueError: a setting the frontend refuses (TLS files, Vertex default model)
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
    keep_freed_buffers()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_serve(config))
    return uvloop.run(_serve(config))
