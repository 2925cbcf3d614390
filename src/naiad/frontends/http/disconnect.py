"""Cancel a request's work when its HTTP client disconnects (ASGI http.disconnect)."""

from __future__ import annotations

import asyncio
from asyncio import CancelledError
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from naiad.frontends.http.body import Receive
from naiad.frontends.http.errors import ClientDisconnected

T = TypeVar("T")

# Requests answered sooner never pay for a watcher task; a disconnect is noticed this late at worst.
WATCH_AFTER_S = 0.02


def cancelled_by_disconnect(gone: bool) -> bool:
    """In an `except CancelledError`: the cancel came from the connection's loss (`gone`, reported by the
    `naiad.on_disconnect` hook) and from nothing else (no other cancel is pending on the task)."""
    current = asyncio.current_task()
    return gone and (current is None or current.uncancel() == 0)


class DisconnectWatch:
    """`with DisconnectWatch(hook): await work` -- the work awaited in the caller's own coroutine (two
    coroutines fewer per request than through until_disconnect), watched through Naiad's connection
    (`hook` is the scope's `naiad.on_disconnect`): a cancel that the client's loss caused (and nothing
    else: see cancelled_by_disconnect) leaves the block as ClientDisconnected."""

    __slots__ = ("gone", "hook")

    def __init__(self, hook: Callable[[Callable[[], None] | None], None]) -> None:
        self.gone = False
        self.hook = hook

    def __call__(self) -> None:
        """The client is gone (the watch is its own callback: no bound method made per request)."""
        self.gone = True

    def __enter__(self) -> DisconnectWatch:
        self.hook(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        self.hook(None)
        if kind is CancelledError and cancelled_by_disconnect(self.gone):
            raise ClientDisconnected() from None


async def until_disconnect(receive: Receive, work: Awaitable[T], scope: dict[str, Any] | None = None) -> T:
    """Await `work` (after the whole body was read); if the client disconnects first, cancel it.

    Cancelling reaches the scheduler: a request still queued is dropped and never executes.
    Naiad's own connection (connection.py) calls back on a lost connection and then cancels the
    request's work itself (`naiad.on_disconnect` in the scope's extensions; this may run before the
    request has a task). Under another ASGI server: after the body, receive() only returns when the
    connection is lost (or the response is complete), so a watcher task, started once the work has
    taken WATCH_AFTER_S, waits on it and cancels this task.
    """
    extensions = scope.get("extensions") if scope is not None else None
    hook = extensions.get("naiad.on_disconnect") if extensions else None
    if hook is not None:
        with DisconnectWatch(hook):
            return await work
    gone = False
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    watcher: asyncio.Task | None = None

    async def watch() -> None:
        nonlocal gone
        message = await receive()
        if message["type"] == "http.disconnect":
            gone = True
            task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER_S, start_watching)
    try:
        return await work
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            raise ClientDisconnected() from None
        raise
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
