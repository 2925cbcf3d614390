"""Worker side of the channel: the core process as awaitable calls (infer, relay)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from naiad.frontends.workers import wire
from naiad.frontends.workers.channel import Channel
from naiad.frontends.workers.codec import response_from_wire, wire_request
from naiad.protocol.errors import unavailable
from naiad.protocol.types import InferenceRequest, InferenceResponse

_END = object()
_now = time.perf_counter_ns  # the clock of the core's work items (system-wide: CLOCK_MONOTONIC)


class RelayedStatus(Exception):
    """How a gRPC call run by the core ended: a grpc.StatusCode name ("OK" or an error) and its details."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class CoreClient:
    """Sends requests to the core over `channel` and routes the answers back to their callers (made in the
    worker's running event loop)."""

    def __init__(self) -> None:
        self.channel: Channel | None = None
        self._loop = asyncio.get_running_loop()  # kept: asyncio.get_running_loop() costs a getpid() system call
        self._ids = itertools.count(1)
        self._results: dict[int, asyncio.Future[Any]] = {}
        self._relays: dict[int, asyncio.Queue[Any]] = {}
        self._windows: dict[int, asyncio.Semaphore] = {}  # streams: request messages the core has yet to read

    def on_message(self, message: tuple[Any, ...]) -> None:
        kind, request_id = message[0], message[1]
        if kind == wire.RESULT or kind == wire.ERROR:
            future = self._results.pop(request_id, None)
            if future is not None and not future.done():
                if kind == wire.RESULT:
                    future.set_result(response_from_wire(message[2]))
                else:
                    future.set_exception(wire.error_from_value(message[2]))
            return
        if kind == wire.GRPC_TAKEN:
            window = self._windows.get(request_id)
            if window is not None:
                window.release()
            return
        queue = self._relays.get(request_id)
        if queue is not None:
            if kind == wire.ASGI or kind == wire.GRPC_OUT:
                queue.put_nowait(message[2])
            elif kind == wire.GRPC_END:
                queue.put_nowait(RelayedStatus(message[2], message[3]))
            else:
                queue.put_nowait(_END)

    def core_gone(self) -> None:
        """The core went away: every pending call fails (the worker exits next)."""
        for future in self._results.values():
            if not future.done():
                future.set_exception(unavailable("Server not ready"))
        self._results.clear()
        for queue in self._relays.values():
            queue.put_nowait(_END)

    def _channel(self) -> Channel:
        if self.channel is None or not self.channel.is_open:
            raise unavailable("Server not ready")
        return self.channel

    async def infer(self, request: InferenceRequest, traceparent: str) -> InferenceResponse:
        request_id, answer = self.submit(request, traceparent)
        try:
            return await answer
        except asyncio.CancelledError:
            self.withdraw(request_id)
            raise

    def submit(self, request: InferenceRequest, traceparent: str) -> tuple[int, asyncio.Future[InferenceResponse]]:
        """Send an infer request (UnsendableMessage: the caller relays it): its id, and the future of its
        answer (a NaiadError when the core refused it). `infer` awaits it; a caller awaiting it itself
        calls `withdraw` if it is cancelled."""
        channel = self._channel()
        request_id = next(self._ids)
        wired, plain = wire_request(request)
        # the request's clock starts here, not when the core reads it: its batching delay, queue time and
        # duration include the hand-over to the core process (a batched model at c=8: 13% more requests/s)
        received = _now()
        if plain:
            channel.send_plain((wire.INFER, request_id, wired, traceparent, received))
        else:
            channel.send((wire.INFER, request_id, wired, traceparent, received))
        future: asyncio.Future[InferenceResponse] = self._loop.create_future()
        self._results[request_id] = future
        return request_id, future

    def withdraw(self, request_id: int) -> None:
        """The caller no longer waits for this infer request: the core cancels it (if not answered yet)."""
        if self._results.pop(request_id, None) is not None and self.channel is not None:
            self.channel.send((wire.CANCEL, request_id))

    async def relay(self, scope: dict[str, Any], body: bytes) -> AsyncIterator[dict[str, Any]]:
        """The ASGI messages the core's HTTP application sends for this request, in order."""
        channel = self._channel()
        request_id = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._relays[request_id] = queue
        channel.send((wire.RELAY, request_id, wire.relayed_scope(scope), body))
        finished = False
        try:
            while True:
                message = await queue.get()
                if message is _END:
                    finished = True
                    return
                yield message
        finally:
            self._relays.pop(request_id, None)
            if not finished:
                channel.send((wire.CANCEL, request_id))

    async def grpc_call(self, method: str, metadata: Sequence[tuple[str, Any]], request: bytes | None = None,
                        requests: AsyncIterator[bytes] | None = None) -> AsyncIterator[bytes]:
        """The serialized responses of a gRPC call the core's servicer runs (one `request`, or a stream of
        `requests`); raises RelayedStatus when it ends with an error, unavailable() when the core is gone."""
        channel = self._channel()
        request_id = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._relays[request_id] = queue
        channel.send((wire.GRPC_CALL, request_id, method, tuple(metadata), request))
        pump = None
        if requests is not None:
            window = self._windows[request_id] = asyncio.Semaphore(wire.STREAM_WINDOW)
            pump = asyncio.ensure_future(self._pump(channel, request_id, requests, window))
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    finished = True
                    raise unavailable("Server not ready")
                if isinstance(item, RelayedStatus):
                    finished = True
                    if item.code != "OK":
                        raise item
                    return
                yield item
        finally:
            if pump is not None:
                pump.cancel()
            self._relays.pop(request_id, None)
            self._windows.pop(request_id, None)
            if not finished:
                channel.send((wire.CANCEL, request_id))

    @staticmethod
    async def _pump(channel: Channel, request_id: int, requests: AsyncIterator[bytes],
                    window: asyncio.Semaphore) -> None:
        """The client's request messages to the core, then the half-close; at most the window ahead of
        what the core has read (then this stops reading the client, and flow control holds it back)."""
        try:
            async for request in requests:
                await window.acquire()
                channel.send((wire.GRPC_MESSAGE, request_id, request))
        except Exception:  # the client's side of the stream failed: the call is cancelled with it
            return
        channel.send((wire.GRPC_HALF_CLOSE, request_id))
