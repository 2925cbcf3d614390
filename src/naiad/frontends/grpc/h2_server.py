"""Naiad's own gRPC server: HTTP/2 (h2c or TLS with ALPN "h2") on asyncio, hosting grpc-style method handlers.

It takes the same handler objects grpcio does (`add_generic_rpc_handlers`,
`add_registered_method_handlers`), so the generated `add_*Servicer_to_server` functions, the
servicer and the health service are shared with the grpcio implementation; the Guard applies
the restricted-protocol, model-name and header-forwarding rules to every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import logging
import ssl
import sys
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from naiad.frontends.first_step import run_first_step, run_next_step
from naiad.frontends.grpc import h2_limits as lim
from naiad.frontends.grpc import h2_wire as w
from naiad.frontends.grpc.guard import Guard
from naiad.frontends.grpc.h2_connection import H2Connection
from naiad.frontends.grpc.h2_inflater import Inflater
from naiad.frontends.grpc.h2_stream import Stream
from naiad.frontends.handoff import ConnectionServer
from naiad.frontends.sockets import BACKLOG, bind_socket

logger = logging.getLogger(__name__)

MAX_DECOMPRESSED = 1 << 26  # what a compressed request message may inflate to (by default)
REQUEST_TIMEOUT = 30.0   # a half-sent unary request, a partial frame or a missing preface waits this long (by default)
WRITE_BACKLOG = 1 << 20  # a streaming call pauses when this many response bytes wait for window

_OK = grpc.StatusCode.OK
_UNKNOWN = grpc.StatusCode.UNKNOWN
_INTERNAL = grpc.StatusCode.INTERNAL


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim (None on other C libraries and systems)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


class _CallDetails(grpc.HandlerCallDetails):
    def __init__(self, method: str, invocation_metadata: Any) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class H2GrpcServer:
    """Listener, method table, server-wide limits and graceful stop of Naiad's gRPC server."""

    def __init__(self, guard: Guard | None = None, max_concurrent_streams: int = 0, max_concurrent_rpcs: int = 0,
                 request_timeout: float = REQUEST_TIMEOUT, max_message_size: int = w.MAX_MESSAGE_LENGTH,
                 max_decompressed_size: int = MAX_DECOMPRESSED) -> None:
        self.loop = asyncio.get_running_loop()
        self.guard = guard
        self.max_concurrent_streams = max_concurrent_streams
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.request_timeout = request_timeout
        self.max_message_size = max_message_size
        self.max_inflated = min(max_decompressed_size, max_message_size)
        self.inflater = Inflater(lim.INFLATE_THREADS)
        self.watch_interval = min(1.0, self.request_timeout / 4)
        self.connections: set[H2Connection] = set()
        self._methods: dict[str, grpc.RpcMethodHandler] = {}
        # registered methods with the guard applied (looked up by connections first: a call fewer per request)
        self.resolved: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        self._rpcs = 0
        self._listener: asyncio.AbstractServer | None = None
        self._trim: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ grpc.Server-like registration

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self._methods[f"/{service}/{name}"] = handler
        self.resolved.clear()

    def handler(self, path: str, metadata: Any) -> grpc.RpcMethodHandler | None:
        resolved = self.resolved.get(path)
        if resolved is not None:
            return resolved
        found = self._methods.get(path)
        if found is None:
            details = _CallDetails(path, metadata)
            for generic in self._generic:
                found = generic.service(details)
                if found is not None:
                    break
        elif self.guard is None or not self.guard.restrictions:
            # what the guard makes of a registered method depends on its path alone: kept for the next call
            resolved = self.resolved[path] = self._guarded(path, found, metadata)
            return resolved
        return self._guarded(path, found, metadata)

    def _guarded(self, path: str, handler: grpc.RpcMethodHandler | None, metadata: Any) -> grpc.RpcMethodHandler | None:
        return handler if self.guard is None else self.guard.apply(path, handler, metadata)

    # ------------------------------------------------------------------ limits

    def acquire_rpc(self) -> bool:
        if self.max_concurrent_rpcs and self._rpcs >= self.max_concurrent_rpcs:
            return False
        self._rpcs += 1
        return True

    def release_rpc(self) -> None:
        self._rpcs -= 1

    def memory_freed(self) -> None:
        """A connection that buffered much closed: return the freed heap memory to the system soon."""
        if _TRIM is not None and self._trim is None:
            self._trim = self.loop.call_later(lim.TRIM_INTERVAL, self._trim_now)

    def _trim_now(self) -> None:
        self._trim = None
        _TRIM(0)

    # ------------------------------------------------------------------ running calls

    def start_unary(self, conn: H2Connection, stream: Stream, message: bytes | w.Compressed) -> None:
        """The request of a unary-request call is complete: decode it and run the handler in a task."""
        handler = stream.handler
        if type(message) is w.Compressed:
            coro = self._inflated_call(conn, stream, message)
        else:
            try:
                request = handler.request_deserializer(message) if handler.request_deserializer else message
            except Exception:
                conn.finish(stream, _INTERNAL, "Exception deserializing request!")
                return
            coro = self.run_call(conn, stream, request)
        # The handler's first step runs now, as an eager task would: calls that finish without
        # waiting (health, metadata) need no task, and an infer request reaches the scheduler in
        # this event-loop turn. A call that waits goes on in the callback of what it waited for.
        conn.handlers += 1
        awaited = run_first_step(coro, lambda coro, ctx: self._resume(conn, stream, coro, ctx))
        if awaited is not None:
            stream.awaited = awaited
        elif stream.task is None:
            conn.handlers -= 1  # it finished in its first step

    def _resume(self, conn: H2Connection, stream: Stream, coro: Any, context: contextvars.Context) -> None:
        awaited, stream.awaited = stream.awaited, None
        if awaited is not None and awaited.done():
            # What the handler waited on (the model's reply) is done: its next step runs here, so the
            # answer is written in this turn rather than after a task's first step a turn later; a
            # task is made only after a bare yield.
            ended = True
            try:
                stream.awaited = run_next_step(coro, context, lambda coro, ctx: self._resume(conn, stream, coro, ctx))
                ended = stream.awaited is None and stream.task is None
            except asyncio.CancelledError:
                pass  # cancelled outside run_call (while inflating): ended, as a cancelled task would be
            finally:
                if ended:
                    conn.handlers -= 1
            return
        stream.task = self.loop.create_task(coro, context=context)
        stream.task.add_done_callback(conn.handler_done)

    async def _inflated_call(self, conn: H2Connection, stream: Stream, message: w.Compressed) -> None:
        raw = await conn.inflate(stream, message.data)
        if raw is None:
            return
        deserialize = stream.handler.request_deserializer
        try:
            request = deserialize(raw) if deserialize else raw
        except Exception:
            conn.finish(stream, _INTERNAL, "Exception deserializing request!")
            return
        del raw
        await self.run_call(conn, stream, request)

    async def run_call(self, conn: H2Connection, stream: Stream, request: Any) -> None:
        """Run the handler; send its responses and then its status."""
        handler = stream.handler
        ctx = stream.ctx
        serialize = handler.response_serializer
        try:
            if not handler.response_streaming:
                call = handler.unary_unary if not handler.request_streaming else handler.stream_unary
                response = await call(request, ctx)
                if ctx.code_ is None or ctx.code_ is _OK:
                    # a handler may return its message already serialized
                    payload = response if serialize is None or type(response) is bytes else serialize(response)
                    if not ctx.details_ and not ctx.trailing:
                        conn.answer(stream, payload)
                        return
                    conn.send_message(stream, payload)
            else:
                call = handler.unary_stream if not handler.request_streaming else handler.stream_stream
                await self._stream_out(conn, stream, call(request, ctx), serialize)
        except grpc.aio.AbortError:
            pass
        except asyncio.CancelledError:
            return  # reset by the client, past its deadline, or shutdown: the stream is already closed
        except Exception as exc:
            logger.exception("gRPC handler for stream %d failed", stream.sid)
            if ctx.code_ is None or ctx.code_ is _OK:
                ctx.code_, ctx.details_ = _UNKNOWN, f"Unexpected {type(exc)}: {exc}"
        code = ctx.code_ if ctx.code_ is not None else _OK
        conn.finish(stream, code, ctx.details_, ctx.trailing)

    async def _stream_out(self, conn: H2Connection, stream: Stream, responses: Any, serialize: Any) -> None:
        if not hasattr(responses, "__aiter__"):
            await responses  # a handler that wrote nothing through its return value
            return
        async with contextlib.aclosing(responses) as items:
            async for response in items:
                conn.send_message(stream, serialize(response) if serialize else response)
                if stream.finished:
                    return
                if stream.pending_bytes > WRITE_BACKLOG or conn._paused:
                    await conn.writable(stream, WRITE_BACKLOG)

    # ------------------------------------------------------------------ listening

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        """Listen; returns the bound port (0 picks a free one)."""
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        sock = bind_socket(host, port)
        try:
            self._listener = await self.loop.create_server(lambda: H2Connection(self), sock=sock, ssl=ssl_context,
                                                           backlog=BACKLOG)
        except BaseException:
            sock.close()
            raise
        return self._listener.sockets[0].getsockname()[1]

    def connection_server(self, ssl_context: ssl.SSLContext | None) -> ConnectionServer:
        """What serves a connection accepted elsewhere (handoff.py) on this server, listening or not."""
        return ConnectionServer(lambda: H2Connection(self), ssl_context, lambda: len(self.connections))

    async def stop(self, grace: float) -> None:
        """GOAWAY to every connection, let in-flight calls finish within `grace` seconds, then cancel the rest."""
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections):
            conn.goaway()
        deadline = self.loop.time() + max(grace, 0.0)
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.abort()
        self.inflater.close()
        if self._trim is not None:
            self._trim.cancel()
        await asyncio.sleep(0)


def tls_requested(config: Any) -> bool:
    """Whether --grpc-use-ssl[-mutual] is on, after checking the PEM flags it needs (both servers)."""
    if not (config.grpc_use_ssl or config.grpc_use_ssl_mutual):
        return False
    if not config.grpc_server_cert or not config.grpc_server_key:
        raise ValueError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if config.grpc_use_ssl_mutual and not config.grpc_root_cert:
        raise ValueError("--grpc-use-ssl-mutual needs --grpc-root-cert (the CA that signs client certificates)")
    return True


def ssl_context(config: Any, read: Any) -> ssl.SSLContext | None:
    """The TLS context of --grpc-use-ssl[-mutual] (ALPN h2), or None for a plaintext port.

    `read(path, flag)` reads a PEM file, raising OSError that names the flag."""
    if not tls_requested(config):
        return None
    read(config.grpc_server_cert, "--grpc-server-cert")
    read(config.grpc_server_key, "--grpc-server-key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(config.grpc_server_cert, config.grpc_server_key)
        if config.grpc_root_cert:
            root = read(config.grpc_root_cert, "--grpc-root-cert")
            context.load_verify_locations(cadata=root.decode("ascii", "replace"))
            context.verify_mode = ssl.CERT_REQUIRED if config.grpc_use_ssl_mutual else ssl.CERT_OPTIONAL
    except ssl.SSLError as exc:
        raise ValueError(f"--grpc-server-cert/--grpc-server-key/--grpc-root-cert: {exc}") from None
    return context
