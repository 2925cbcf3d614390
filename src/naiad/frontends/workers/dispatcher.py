"""Core side of one worker's channel: runs its requests through the facade as if they came in here.

Decoded infer requests go to the inference interface (`InferenceAPI.infer`); every other HTTP request is run by the core's own
HTTP application (the one the HTTP port serves without workers), and every other gRPC call by the core's
own servicer (grpc_relay.py), so model control, metadata, statistics, shared-memory registration and
the rest give the one server's answers by construction.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from naiad.frontends.first_step import run_first_step, run_next_step
from naiad.frontends.workers import wire
from naiad.frontends.workers.channel import Channel, UnsendableMessage
from naiad.frontends.workers.codec import request_from_wire, response_to_wire
from naiad.observability.trace_context import incoming_traceparent
from naiad.protocol.errors import NaiadError, internal

if TYPE_CHECKING:
    from naiad.core.facade import InferenceAPI
    from naiad.frontends.http.app import HttpApp
    from naiad.frontends.workers.grpc_relay import GrpcCalls

log = logging.getLogger("naiad.frontends")


class Dispatcher:
    """Answers one worker's messages; `tasks` are its requests in flight (cancelled if the worker dies):
    each one's task, or the future the first step of an infer request waits on (no task yet)."""

    def __init__(self, inference: InferenceAPI, app: HttpApp | None, on_ready: Any,
                 grpc_calls: GrpcCalls | None = None) -> None:
        self.inference = inference
        self.app = app
        self.grpc_calls = grpc_calls
        self.streams: dict[int, asyncio.Queue[bytes | None]] = {}  # request messages of streaming gRPC calls
        self.on_ready = on_ready
        self.channel: Channel | None = None
        self.tasks: dict[int, asyncio.Future[Any]] = {}
        self._loop = asyncio.get_running_loop()

    def on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == wire.INFER:
            self._start_eagerly(message[1], self._infer(message[1], message[2], message[3]))
        elif kind == wire.CANCEL:
            task = self.tasks.pop(message[1], None)
            if task is not None:
                task.cancel()
        elif kind == wire.RELAY:
            self._start(message[1], self._relay(message[1], message[2], message[3]))
        elif kind == wire.GRPC_MESSAGE or kind == wire.GRPC_HALF_CLOSE:
            stream = self.streams.get(message[1])
            if stream is not None:
                stream.put_nowait(message[2] if kind == wire.GRPC_MESSAGE else None)
        elif kind == wire.GRPC_CALL:
            requests: asyncio.Queue[bytes | None] = asyncio.Queue()
            if message[4] is None:  # a stream: its messages may be in this very read, before the task runs
                self.streams[message[1]] = requests
            self._start(message[1], self._grpc_call(message[1], message[2], message[3], message[4], requests))
        elif kind == wire.READY:
            self.on_ready(message[1])
        else:
            log.error("frontend worker sent an unknown message kind %r", kind)

    async def _grpc_call(self, request_id: int, method: str, metadata: tuple[tuple[str, Any], ...],
                         request: bytes | None, queue: asyncio.Queue[bytes | None]) -> None:
        async def requests() -> AsyncIterator[bytes]:
            while (raw := await queue.get()) is not None:
                self._send((wire.GRPC_TAKEN, request_id))
                yield raw

        try:
            if self.grpc_calls is None:
                code, details = "UNIMPLEMENTED", "gRPC is not served by this process"
            else:
                code, details = await self.grpc_calls.run(
                    method, metadata, request, requests(),
                    lambda response: self._send((wire.GRPC_OUT, request_id, response)))
            self._send((wire.GRPC_END, request_id, code, details))
        finally:
            self.streams.pop(request_id, None)

    def cancel_all(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()

    def _start(self, request_id: int, work: Any) -> None:
        task = self._loop.create_task(work)
        self.tasks[request_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(request_id, None))

    def _start_eagerly(self, request_id: int, work: Any) -> None:
        """Run the request's first step now (as the single server's frontends do): a request on an inline
        model is answered in this turn of the loop, with no task; one that waits gets its task then."""
        awaited = run_first_step(work, lambda coro, context: self._resume(request_id, coro, context))
        if awaited is not None:
            self.tasks[request_id] = awaited  # cancelling it cancels the request, as cancelling its task would

    def _resume(self, request_id: int, work: Any, context: contextvars.Context) -> None:
        awaited = self.tasks.pop(request_id, None)
        if awaited is not None and awaited.done():
            # What the request waited on is done (its batch, its model's answer): its next step runs in
            # this callback, and it gets a task only if it waits again after a bare yield (a task and
            # two turns of the loop fewer per request, as the single server's frontends do).
            try:
                awaited = run_next_step(work, context, lambda coro, ctx: self._resume(request_id, coro, ctx))
            except asyncio.CancelledError:
                return  # cancelled from elsewhere (shutdown): it ends, as its task would
            if awaited is not None:
                self.tasks[request_id] = awaited
            return
        # after a bare yield, or cancelled by the worker (CANCEL took its entry): a task goes on
        task = self._loop.create_task(work, context=context)
        self.tasks[request_id] = task
        task.add_done_callback(lambda _: self._forget(request_id, task))

    def _forget(self, request_id: int, task: asyncio.Future[Any]) -> None:
        if self.tasks.get(request_id) is task:
            del self.tasks[request_id]

    def _send(self, message: tuple[Any, ...]) -> None:
        if self.channel is not None:
            self.channel.send(message)

    async def _infer(self, request_id: int, wired: tuple[Any, ...], traceparent: str) -> None:
        request = request_from_wire(wired)
        try:
            if traceparent:
                with incoming_traceparent(((b"traceparent", traceparent.encode("latin-1")),)):
                    response = await self.inference.infer(request)
            else:
                response = await self.inference.infer(request)
        except NaiadError as exc:
            self._send((wire.ERROR, request_id, wire.error_value(exc)))
        except Exception as exc:  # a bug of ours: the client gets a 500, the server keeps serving
            log.exception("error running a frontend worker's infer request for model '%s'", request.model_name)
            self._send((wire.ERROR, request_id, wire.error_value(internal(f"{type(exc).__name__}: {exc}"))))
        else:
            channel = self.channel
            if channel is not None:
                try:
                    channel.send((wire.RESULT, request_id, response_to_wire(response)))
                except UnsendableMessage as exc:
                    channel.send((wire.ERROR, request_id, wire.error_value(internal(str(exc)))))

    async def _relay(self, request_id: int, scope: dict[str, Any], body: bytes) -> None:
        delivered = False
        gone = asyncio.Event()  # never set: a client that goes away cancels this task instead

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            body = message.get("body")
            if body is not None and not isinstance(body, bytes):  # a memoryview does not pickle
                message = {**message, "body": bytes(body)}
            self._send((wire.ASGI, request_id, message))

        try:
            if self.app is not None:
                await self.app(scope, receive, send)
        except Exception:
            log.exception("error relaying %s %s from a frontend worker", scope.get("method"), scope.get("path"))
        finally:
            self._send((wire.DONE, request_id))
