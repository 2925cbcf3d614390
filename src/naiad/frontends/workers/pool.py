"""The HTTP/REST and gRPC ports served by N frontend worker processes each (`--frontend-processes N`, N >= 1).

HTTP, and gRPC on Naiad's own HTTP/2 server: the core binds the port's one listening socket, accepts,
serves up to --frontend-core-connections K connections itself and hands the others to the workers in
turn (handoff.py). With K >= 1 the workers start when they are first needed, as the port's open
connections first pass K (until they are up the core serves every connection): a server that never
has more than K clients at once runs no worker. gRPC on grpcio (`--grpc-server-impl grpcio`): the
core reserves the port with one bound, not listening, SO_REUSEPORT socket (port 0 resolves to one
port for all) and each worker's grpcio server binds it too, from the start. Each worker has a
channel (a unix socket pair) to a Dispatcher here. A worker that dies is started again (meanwhile the
connections it would get go to the others, or to the core); stop() stops accepting, asks every worker
to drain (SIGTERM), bounded by --exit-timeout-secs, then kills what is left.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from naiad.config.cpu_placement import place_frontend_worker
from naiad.config.server_config import ServerConfig
from naiad.frontends.grpc.h2_server import H2GrpcServer
from naiad.frontends.grpc.server import server_credentials, serving_h2_server, tls_context
from naiad.frontends.handoff import Acceptor, ConnectionServer, handoff_pair
from naiad.frontends.http.app import HttpApp
from naiad.frontends.http.listener import HttpListener, tls_options
from naiad.frontends.sockets import bind_socket, reserve_port
from naiad.frontends.workers.channel import Channel, encode_frame
from naiad.frontends.workers.dispatcher import Dispatcher
from naiad.frontends.workers.grpc_relay import GrpcCalls

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI

log = logging.getLogger("naiad.frontends")

START_TIMEOUT_SECS = 120.0  # a worker imports Naiad's frontends before it listens: slow on a loaded machine
RESTART_BACKOFF_SECS = 1.0  # a worker that dies this soon after starting waits this long before the next try
KILL_GRACE_SECS = 5.0


class WorkerProcess:
    """One worker: its process, its channel and the dispatcher answering it."""

    def __init__(self, index: int, protocol: str, handed: bool, server: ServerAPI,
                 config: ServerConfig, dispatcher: Callable[[Callable[[int], object]], Dispatcher]) -> None:
        self.index = index
        self.protocol = protocol  # "http" or "grpc"
        self.handed = handed  # serves connections the core hands over; False: a grpcio worker binding the port
        self.outlet: socket.socket | None = None  # the core's end of its hand-off socket, while it runs
        self.server = server
        self.config = config
        self.make_dispatcher = dispatcher
        self.process: asyncio.subprocess.Process | None = None
        self.dispatcher: Dispatcher | None = None
        self.ready: asyncio.Future[int] | None = None
        self.started_at = 0.0

    async def spawn(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ready = loop.create_future()
        ready = self.ready
        dispatcher = self.make_dispatcher(lambda pid: ready.done() or ready.set_result(pid))
        outlet, handoff = handoff_pair() if self.handed else (None, None)
        fds = (theirs.fileno(),) if handoff is None else (theirs.fileno(), handoff.fileno())
        try:
            ours.sendall(encode_frame(self.config))  # read by the worker before its loop starts
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "naiad.frontends.workers.worker_main",
                str(theirs.fileno()), str(-1 if handoff is None else handoff.fileno()), str(self.index),
                self.protocol, pass_fds=fds)
        except BaseException:
            if outlet is not None:
                outlet.close()
            raise
        finally:
            theirs.close()
            if handoff is not None:
                handoff.close()
        self.outlet = outlet
        place_frontend_worker(self.process.pid)
        self.started_at = time.monotonic()
        dispatcher.channel = await Channel.open(ours, dispatcher.on_message)
        self.dispatcher = dispatcher

    async def wait_ready(self, timeout: float) -> None:
        assert self.ready is not None and self.process is not None
        exited = asyncio.ensure_future(self.process.wait())
        try:
            done, _ = await asyncio.wait({self.ready, exited}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if self.ready not in done:
            code = self.process.returncode
            raise OSError(f"frontend worker {self.index} did not start "
                          + (f"(exit code {code})" if code is not None else f"within {timeout:g} s"))

    def taking_connections(self) -> bool:
        return self.outlet is not None and self.ready is not None and self.ready.done()

    def forget(self) -> None:
        """After the process ended: fail its requests in flight, close its channel and hand-off socket."""
        if self.outlet is not None:
            self.outlet.close()
            self.outlet = None
        if self.dispatcher is not None:
            self.dispatcher.cancel_all()
            if self.dispatcher.channel is not None:
                self.dispatcher.channel.close()
            self.dispatcher = None

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)


class WorkerPool(abc.ABC):
    """One endpoint of one server, served by `config.frontend_processes` worker processes (and, for
    the connections it keeps, the core); each protocol (WorkerHttpFrontend, WorkerGrpcFrontend) says
    how its port is bound and its calls dispatched."""

    label = ""
    protocol = ""

    def __init__(self, server: ServerAPI, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port
        self.config: ServerConfig = server.config
        self.workers: list[WorkerProcess] = []
        self._sockets: list[socket.socket] = []
        self._acceptor: Acceptor | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._starting: asyncio.Task[None] | None = None  # the workers' start, when it waits for the first need
        self._stopping = False

    @abc.abstractmethod
    def _bind(self) -> int:
        """Bind the port (self._sockets[0]: the listening socket, or the port reserved for grpcio); the bound port."""

    @abc.abstractmethod
    async def _serve_here(self) -> ConnectionServer | None:
        """Start what serves the connections the core keeps; None: the workers bind the port themselves."""

    @abc.abstractmethod
    async def _stop_here(self) -> None:
        """Drain the connections the core serves (bounded by --exit-timeout-secs)."""

    @abc.abstractmethod
    def _dispatcher(self, on_ready: Callable[[int], object]) -> Dispatcher:
        """What answers a worker's messages in the server process."""

    def _worker_config(self, port: int) -> ServerConfig:
        return self.config

    async def start(self) -> int:
        """Bind and serve; the workers are started and waited for here, or at their first need (K >= 1 on a
        port the core accepts for). Returns the bound port."""
        port = self._bind()
        keep = self.config.frontend_core_connections
        try:
            config = self._worker_config(port)
            here = await self._serve_here()
            self.workers = [WorkerProcess(i, self.protocol, here is not None, self.server, config, self._dispatcher)
                            for i in range(self.config.frontend_processes)]
            if here is not None and keep > 0:
                self._acceptor = Acceptor(self._sockets[0], here, keep, self._outlets_on_demand)
                log.info("%s: %d frontend worker processes start once more than %d of its connections are open",
                         self.label, len(self.workers), keep)
                return port
            await self._start_workers()
            if here is not None:
                self._acceptor = Acceptor(self._sockets[0], here, keep, self._outlets)
        except BaseException:
            await self.stop()
            raise
        return port

    async def _start_workers(self) -> None:
        """Start every worker and wait until each serves; raises OSError when one does not."""
        for worker in self.workers:
            await worker.spawn()
        for worker in self.workers:
            await worker.wait_ready(START_TIMEOUT_SECS)
        self._watch_started()
        log.info("%s served by %d frontend worker processes (pids %s)", self.label, len(self.workers),
                 ", ".join(str(w.process.pid) for w in self.workers if w.process is not None))

    def _outlets(self) -> list[socket.socket]:
        return [worker.outlet for worker in self.workers if worker.outlet is not None and worker.taking_connections()]

    def _outlets_on_demand(self) -> list[socket.socket]:
        """The Acceptor asks for outlets only once the core has K connections open: the first time, the
        workers start (meanwhile the core serves every connection, as with no worker up)."""
        if self._starting is None and not self._stopping:
            self._starting = asyncio.get_running_loop().create_task(self._start_on_demand())
        return self._outlets()

    async def _start_on_demand(self) -> None:
        try:
            await self._start_workers()
        except Exception as exc:  # the core serves the connections meanwhile; each worker is watched and restarted
            if isinstance(exc, OSError):
                log.error("%s", exc)
            else:
                log.exception("%s frontend workers failed to start", self.label)
            self._watch_started()

    def _watch_started(self) -> None:
        """Watch every worker that was started (all of them after a start that went through)."""
        self._watchers = [asyncio.get_running_loop().create_task(self._watch(w))
                          for w in self.workers if w.process is not None]

    async def _watch(self, worker: WorkerProcess) -> None:
        """Start the worker again whenever it ends while the server runs."""
        while True:
            assert worker.process is not None
            code = await worker.process.wait()
            worker.forget()
            if self._stopping:
                return
            log.warning("%s frontend worker %d (pid %d) exited with code %s; starting it again",
                        self.label, worker.index, worker.process.pid, code)
            if time.monotonic() - worker.started_at < RESTART_BACKOFF_SECS:
                await asyncio.sleep(RESTART_BACKOFF_SECS)
            try:
                await worker.spawn()
                await worker.wait_ready(START_TIMEOUT_SECS)
            except OSError as exc:
                log.error("%s", exc)
            else:
                log.info("%s frontend worker %d started again (pid %d)", self.label, worker.index, worker.process.pid)

    def begin_stop(self) -> None:
        """The server began shutting down: from now on no worker is started, or started again when it
        exits (a signal sent to the server's whole process group stops the workers too)."""
        self._stopping = True

    async def stop(self) -> None:
        """Every worker drains its connections (bounded by --exit-timeout-secs) and exits."""
        self.begin_stop()
        if self._acceptor is not None:
            self._acceptor.close()
            self._acceptor = None
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
        for watcher in self._watchers:
            watcher.cancel()
        here_drained = asyncio.ensure_future(self._stop_here())
        running = [w for w in self.workers if w.process is not None and w.process.returncode is None]
        for worker in running:
            worker.signal(signal.SIGTERM)
        waits = [w.process.wait() for w in running if w.process is not None]
        if waits:
            grace = max(1.0, float(self.config.exit_timeout_secs)) + KILL_GRACE_SECS
            done, pending = await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=grace)
            if pending:
                for worker in running:
                    worker.signal(signal.SIGKILL)
                await asyncio.wait(pending)
        for worker in self.workers:
            worker.forget()
        await here_drained
        for sock in self._sockets:
            sock.close()
        self._sockets = []


class WorkerHttpFrontend(WorkerPool):
    """The HTTP/REST endpoint: one listening socket; the connections the core keeps are served by the
    core's own HTTP application, the others by the workers."""

    label = "HTTP/REST"
    protocol = "http"

    def __init__(self, server: ServerAPI, host: str, port: int) -> None:
        super().__init__(server, host, port)
        config = self.config
        self.tls = tls_options(config.http_ssl_certfile, config.http_ssl_keyfile,  # refuse bad TLS settings here, not in N workers
                               config.http_ssl_ca_certs, config.http_ssl_client_cert_required)
        self.app = HttpApp(server)  # answers what the workers relay, as the HTTP port would without them
        self._here: HttpListener | None = None

    def _bind(self) -> int:
        self._sockets = [bind_socket(self.host, self.port)]
        return int(self._sockets[0].getsockname()[1])

    async def _serve_here(self) -> ConnectionServer:
        self._here = HttpListener.for_server(self.app, self.config, self.host, self.port, "naiad-http",
                                             tls=self.tls, listening=False)
        await self._here.start()
        return self._here.connection_server()

    async def _stop_here(self) -> None:
        if self._here is not None:
            await self._here.stop()

    def _dispatcher(self, on_ready: Callable[[int], object]) -> Dispatcher:
        return Dispatcher(self.server.inference, self.app, on_ready)


class WorkerGrpcFrontend(WorkerPool):
    """The gRPC endpoint: one listening socket, as the HTTP endpoint's (Naiad's own HTTP/2 server);
    with grpcio the core reserves the port and each worker's grpcio server binds it too."""

    label = "gRPC"
    protocol = "grpc"

    def __init__(self, server: ServerAPI, host: str, port: int) -> None:
        super().__init__(server, host, port)
        self.grpcio = self.config.grpc_server_impl == "grpcio"
        self.tls: ssl.SSLContext | None = None
        if self.grpcio:  # refuse bad TLS settings here, not in N workers
            server_credentials(self.config)
        else:
            self.tls = tls_context(self.config)
        self.calls = GrpcCalls(server)  # runs what the workers relay, as the gRPC port would without them
        self._here: H2GrpcServer | None = None

    def _bind(self) -> int:
        host = self.host.strip("[]")
        self._sockets = [reserve_port(host, self.port) if self.grpcio else bind_socket(host, self.port)]
        return int(self._sockets[0].getsockname()[1])

    async def _serve_here(self) -> ConnectionServer | None:
        if self.grpcio:
            return None
        self._here = serving_h2_server(self.server)
        return self._here.connection_server(self.tls)

    async def _stop_here(self) -> None:
        if self._here is not None:
            await self._here.stop(self.config.exit_timeout_secs)

    def _worker_config(self, port: int) -> ServerConfig:
        return dataclasses.replace(self.config, grpc_port=port)

    def _dispatcher(self, on_ready: Callable[[int], object]) -> Dispatcher:
        return Dispatcher(self.server.inference, None, on_ready, self.calls)
