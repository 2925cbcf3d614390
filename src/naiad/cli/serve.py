"""`naiad serve`: one event loop hosting the Server, the HTTP, gRPC and metrics frontends."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable
from typing import TypeVar

from naiad import __version__
from naiad.cli.startup_checks import (
    Listener,
    StartupError,
    check_ports,
    check_repositories,
    describe_bind_error,
    listeners,
)
from naiad.cli.startup_report import (
    endpoint_line,
    load_counts,
    load_summary,
    model_table,
    table,
)
from naiad.config.collector import freeze_startup_heap
from naiad.config.cpu_placement import WORKER_CPUS_VARIABLE, reserve_core_cpu
from naiad.config.server_config import ServerConfig
from naiad.core.facade import ServerAPI
from naiad.core.server import Server
from naiad.observability.log_settings import VERBATIM, LogSettings, install_root_handler
from naiad.runtime.memory import keep_freed_buffers

log = logging.getLogger("naiad")
T = TypeVar("T")
FORCED_EXIT_GRACE_SECS = 2.0  # what cancelled requests get to unwind after a second signal


def _configure_logging(settings: LogSettings) -> None:
    """One handler on the root logger, filtered and formatted by the server's live settings."""
    root = install_root_handler(settings)
    settings.listeners.append(lambda changed: root.setLevel(changed.logger_level))


def _frontend_class(key: str, config: ServerConfig) -> type:
    from naiad.frontends.grpc.server import GrpcFrontend
    from naiad.frontends.http.server import HttpFrontend
    from naiad.frontends.metrics import MetricsFrontend
    from naiad.frontends.openai.server import OpenAIFrontend
    from naiad.frontends.sagemaker import SageMakerFrontend
    from naiad.frontends.vertex import VertexFrontend

    if key == "http_port" and config.frontend_processes > 0:
        from naiad.frontends.workers.pool import WorkerHttpFrontend

        return WorkerHttpFrontend
    if key == "grpc_port" and config.frontend_processes > 0:
        from naiad.frontends.workers.pool import WorkerGrpcFrontend

        return WorkerGrpcFrontend
    return {"http_port": HttpFrontend, "grpc_port": GrpcFrontend, "metrics_port": MetricsFrontend,
            "sagemaker_port": SageMakerFrontend, "vertex_ai_port": VertexFrontend, "openai_port": OpenAIFrontend}[key]


class _Signals:
    """First SIGINT/SIGTERM: drain and stop. Second: cancel what runs and exit at once (as Triton and uvicorn)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.stop = asyncio.Event()
        self.force = asyncio.Event()
        self.received: signal.Signals | None = None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self.stop.is_set():
            self.received = sig
            log.info("received %s: shutting down (send it again to exit at once)", sig.name)
            self.stop.set()
            return
        log.warning("received %s again: cancelling %d request(s) in flight and exiting now",
                    sig.name, self.server.inflight_requests)
        self.received = sig
        self.force.set()

    async def unless_forced(self, work: Awaitable[T]) -> T:
        """Run `work`; a second signal meanwhile cancels every task and ends the process."""
        task = asyncio.ensure_future(work)
        forced = asyncio.ensure_future(self.force.wait())
        await asyncio.wait({task, forced}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            forced.cancel()
            return task.result()
        await self._exit_now()
        raise AssertionError("unreachable")

    async def _exit_now(self) -> None:
        me = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not me]
        for task in others:
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=FORCED_EXIT_GRACE_SECS)
        log.warning("exited without draining")
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        # Threads still inside a backend (a model load, an ONNX Runtime run) cannot be cancelled: leave them.
        os._exit(128 + int(self.received or signal.SIGTERM))


def _log_settings_table(changed: list[tuple[str, str]]) -> None:
    log.info("Naiad %s (Triton-compatible inference server)", __version__)
    if changed:
        log.info("settings that differ from the defaults:\n%s", table(("Option", "Value"), changed), extra={VERBATIM: True})


def _log_models(server: Server) -> None:
    index = server.control.repository_index()
    # A model whose config could not be read has no version state; the table still shows why it failed.
    index += [{"name": name, "version": "-", "state": "UNAVAILABLE", "reason": reason}
              for name, reason in sorted(server.control.unreadable_models().items())]
    log.info("\n%s", model_table(index), extra={VERBATIM: True})
    _, failed = load_counts(index)
    (log.warning if failed else log.info)("%s", load_summary(index))


async def _start_frontends(server: ServerAPI, config: ServerConfig) -> tuple[list, dict[str, int | None]]:
    """Start every enabled endpoint; on a failure stop those started and raise StartupError."""
    frontends: list = []
    ports: dict[str, int | None] = {"http_port": None, "grpc_port": None, "metrics_port": None,
                                    "sagemaker_port": None, "vertex_ai_port": None, "openai_port": None}
    bound: list[tuple[Listener, int]] = []
    for listener in listeners(config):
        try:
            frontend = _frontend_class(listener.key, config)(server, listener.host, listener.port)
            port = await frontend.start()
        except (OSError, ValueError) as exc:  # ValueError: a setting the frontend refuses (TLS files, Vertex model)
            for started in reversed(frontends):
                await started.stop()
            if isinstance(exc, OSError) and exc.errno is not None:
                raise StartupError(describe_bind_error(listener, exc)) from None
            raise StartupError(f"cannot start {listener.label} ({listener.port_flag} {listener.port}): {exc}") from None
        frontends.append(frontend)
        ports[listener.key] = port
        bound.append((listener, port))
        log.info("Started %s at %s:%d", listener.label, listener.host, port)
    log.info("serving: %s", endpoint_line(bound))
    return frontends, ports


async def _serve(config: ServerConfig, changed: list[tuple[str, str]], notices: list[str]) -> int:
    try:
        warnings = notices + check_repositories(config.model_repositories)
        check_ports(config)  # before models load: a taken port should not cost a long load first
        server = Server(config)
    except (StartupError, ImportError, ValueError, OSError) as exc:
        # also a malformed s3:// URL, unreadable credentials, or a missing optional extra
        print(f"naiad: {exc}", file=sys.stderr)
        return 1
    _configure_logging(server.log_settings)
    _log_settings_table(changed)
    for warning in warnings:
        log.warning("%s", warning)
    # In the environment before any child starts: frontend workers read their CPUs from it (model workers are not placed).
    worker_cpus = reserve_core_cpu(os.environ, config.frontend_processes)
    if worker_cpus:
        log.info("frontend workers run on CPUs %s (%s), the server process and model workers on every CPU", worker_cpus, WORKER_CPUS_VARIABLE)
    signals = _Signals(server)
    try:
        await signals.unless_forced(server.startup())
    except (RuntimeError, ValueError) as exc:
        if server.control.repository_index():
            _log_models(server)
        log.error("%s", exc)
        await signals.unless_forced(server.shutdown(timeout=0))
        return 1
    _log_models(server)
    frontends: list = []
    if not signals.stop.is_set():
        try:
            frontends, ports = await signals.unless_forced(_start_frontends(server, config))
        except StartupError as exc:
            log.error("%s", exc)
            await signals.unless_forced(server.shutdown(timeout=0))
            return 1
        freeze_startup_heap()
        print("NAIAD_READY " + json.dumps(ports), flush=True)
        await signals.stop.wait()
    await signals.unless_forced(_shutdown(server, frontends))
    return 0


async def _shutdown(server: Server, frontends: list) -> None:
    server.begin_shutdown()
    for frontend in frontends:  # frontend worker pools: no worker is started again while in-flight requests end
        begin_stop = getattr(frontend, "begin_stop", None)
        if begin_stop is not None:
            begin_stop()
    await server.shutdown()
    for frontend in reversed(frontends):
        await frontend.stop()
    log.info("stopped")


def run_serve(config: ServerConfig, changed: list[tuple[str, str]] | None = None, notices: list[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; `changed` (flag, value) pairs and `notices` (warnings) are logged at start."""
    keep_freed_buffers()
    main = _serve(config, changed or [], notices or [])
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
