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
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

from naiad.frontends.first_step import taken_future
from naiad.frontends.workers import wire
from naiad.frontends.workers.channel import Channel, UnsendableMessage
from naiad.frontends.workers.codec import request_from_wire, wire_response
from naiad.observability.trace_context import REMOTE_TRACEPARENT, propagating
from naiad.protocol.errors import NaiadError, internal

if TYPE_CHECKING:
    from naiad.core.facade import InferenceAPI
    from naiad.frontends.http.app import HttpApp
    from naiad.frontends.workers.grpc_relay import GrpcCalls
    from naiad.protocol.types import InferenceResponse

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
            self._infer(message[1], message[2], message[3], message[4])
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

    def _send(self, message: tuple[Any, ...]) -> None:
        if self.channel is not None:
            self.channel.send(message)

    def _infer(self, request_id: int, wired: tuple[Any, ...], traceparent: str, received_ns: int) -> None:
        """Run an infer request's coroutine (the inference interface's own) now, as run_first_step would
        run a handler wrapping it: a request on an inline model is answered in this turn of the loop, a
        waiting one goes on in the callback of what it waits on (_step). Driving the interface's
        coroutine itself saves the wrapper's frame, closures and context switches (with codec.py's
        shorter messages, ~10k fewer core instructions per add_sub request, callgrind)."""
        request = request_from_wire(wired)
        request.received_ns = received_ns
        context = contextvars.copy_context()
        if traceparent and propagating():  # (incoming_traceparent's rule, in the request's own context)
            context.run(REMOTE_TRACEPARENT.set, traceparent)
        self._step(request_id, request.model_name, self.inference.infer(request), context)

    def _step(self, request_id: int, model: str, work: Coroutine[Any, Any, InferenceResponse],
              context: contextvars.Context) -> None:
        try:
            awaited = context.run(work.send, None)
        except StopIteration as done:
            self._answer(request_id, done.value)
            return
        except BaseException as exc:
            self._failed(request_id, model, exc)
            return
        future = taken_future(awaited)
        if future is not None:
            future.add_done_callback(lambda _: self._resume(request_id, model, work, context))
            self.tasks[request_id] = future  # cancelling it cancels the request, as cancelling its task would
        else:
            self._go_on_in_task(request_id, model, work, context)  # after a bare yield

    def _resume(self, request_id: int, model: str, work: Coroutine[Any, Any, InferenceResponse],
                context: contextvars.Context) -> None:
        awaited = self.tasks.pop(request_id, None)
        if awaited is not None and awaited.done():
            # What the request waited on is done (its batch, its model's answer): its next step runs in
            # this callback, with no task (a task and two turns of the loop fewer per request)
            self._step(request_id, model, work, context)
        else:  # cancelled by the worker (CANCEL took its entry): a task goes on, and sees the cancellation
            self._go_on_in_task(request_id, model, work, context)

    def _go_on_in_task(self, request_id: int, model: str, work: Coroutine[Any, Any, InferenceResponse],
                       context: contextvars.Context) -> None:
        task = self._loop.create_task(work, context=context)
        self.tasks[request_id] = task
        task.add_done_callback(lambda _: self._task_done(request_id, model, task))

    def _task_done(self, request_id: int, model: str, task: asyncio.Task[InferenceResponse]) -> None:
        if self.tasks.get(request_id) is task:
            del self.tasks[request_id]
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            self._answer(request_id, task.result())
        else:
            self._failed(request_id, model, exc)

    def _answer(self, request_id: int, response: InferenceResponse) -> None:
        channel = self.channel
        if channel is not None:
            try:
                wired, plain = wire_response(response)
                if plain:
                    channel.send_plain((wire.RESULT, request_id, wired))
                else:
                    channel.send((wire.RESULT, request_id, wired))
            except UnsendableMessage as exc:
                channel.send((wire.ERROR, request_id, wire.error_value(internal(str(exc)))))

    def _failed(self, request_id: int, model: str, exc: BaseException) -> None:
        if isinstance(exc, NaiadError):
            self._send((wire.ERROR, request_id, wire.error_value(exc)))
        elif isinstance(exc, Exception):  # a bug of ours: the client gets a 500, the server keeps serving
            log.error("error running a frontend worker's infer request for model '%s'", model, exc_info=exc)
            self._send((wire.ERROR, request_id, wire.error_value(internal(f"{type(exc).__name__}: {exc}"))))
        elif not isinstance(exc, asyncio.CancelledError):
            raise exc  # (KeyboardInterrupt, SystemExit: as a task's step would let them out)

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
