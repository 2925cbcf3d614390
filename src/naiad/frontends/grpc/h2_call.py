"""What a handler sees of one call on Naiad's own gRPC server: a small grpc.aio.ServicerContext look-alike
and the inbound message iterator of client-streaming calls."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from naiad.frontends.grpc.h2_wire import Compressed

logger = logging.getLogger(__name__)

_EOF = object()


class CallContext:
    """The subset of grpc.aio.ServicerContext the servicer, the guard and the health service use."""

    __slots__ = ("_metadata", "_deadline", "_peer", "_auth", "code_", "details_", "trailing", "_callbacks",
                 "cancelled_", "done_", "_loop")

    def __init__(self, metadata: tuple[tuple[str, Any], ...], deadline: float | None, peer: str,
                 auth: dict[str, list[bytes]] | None, loop: asyncio.AbstractEventLoop) -> None:
        self._metadata = metadata
        self._deadline = deadline
        self._peer = peer
        self._auth = auth
        self._loop = loop
        self.code_: grpc.StatusCode | None = None
        self.details_ = ""
        self.trailing: Any = ()
        self._callbacks: list[Callable[[Any], None]] | None = None
        self.cancelled_ = False
        self.done_ = False

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort() needs a non-OK status code")
        self.code_, self.details_ = code, details
        if trailing_metadata:
            self.trailing = trailing_metadata
        raise grpc.aio.AbortError()

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code_ = code

    def set_details(self, details: str) -> None:
        self.details_ = details

    def code(self) -> grpc.StatusCode | None:
        return self.code_

    def details(self) -> str:
        return self.details_

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing = metadata

    async def send_initial_metadata(self, metadata: Any) -> None:
        """Accepted for compatibility; Naiad's handlers never send initial metadata."""

    def set_compression(self, compression: Any) -> None:
        """Responses are never compressed (the client accepts identity)."""

    def disable_next_message_compression(self) -> None:
        """Nothing to disable: responses are never compressed."""

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._loop.time())

    def peer(self) -> str:
        return self._peer

    def peer_identities(self) -> list[bytes] | None:
        return self._auth.get("x509_common_name") if self._auth else None

    def peer_identity_key(self) -> str | None:
        return "x509_common_name" if self._auth and self._auth.get("x509_common_name") else None

    def auth_context(self) -> dict[str, list[bytes]]:
        return dict(self._auth or {})

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self.done_:
            callback(self)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)

    def cancelled(self) -> bool:
        return self.cancelled_

    def done(self) -> bool:
        return self.done_

    def finish(self, cancelled: bool) -> None:
        """The call ended (answered, or cancelled by the client, a deadline or shutdown)."""
        if self.done_:
            return
        self.done_ = True
        self.cancelled_ = cancelled
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            try:
                callback(self)
            except Exception:
                logger.exception("gRPC done callback failed")


class RequestStream:
    """Inbound messages of a client-streaming call, as an async iterator of decoded requests.

    `on_consumed(size)` is called after each message is taken (with its size on the wire), so the
    connection can stop holding those bytes and reopen the stream's flow-control window once the
    handler keeps up. Compressed messages are inflated by `inflate` when taken.
    """

    __slots__ = ("_items", "_waiter", "_deserialize", "_on_consumed", "_inflate", "_error")

    def __init__(self, deserialize: Callable[[bytes], Any], on_consumed: Callable[[int], None],
                 inflate: Callable[[bytes], Awaitable[bytes | bytearray | memoryview]]) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._deserialize = deserialize
        self._on_consumed = on_consumed
        self._inflate = inflate
        self._error: BaseException | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, message: bytes | Compressed) -> None:
        self._items.append(message)
        self._wake()

    def close(self, error: BaseException | None = None) -> None:
        """End of the client's messages (half-close), or an error the iterator raises."""
        self._error = error
        self._items.append(_EOF)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items[0]
        if item is _EOF:
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        self._items.popleft()
        self._on_consumed(5 + len(item))
        if isinstance(item, Compressed):
            item = await self._inflate(item.data)
        return self._deserialize(item)

    async def read(self) -> Any:
        """grpc.aio style read(): the next message or grpc.aio.EOF."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return grpc.aio.EOF
