"""Worker-side reading of the server channel, done by whichever thread needs a message (no per-request thread hop)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from naiad.runtime.process.framing import BlockingChannel

BUSY_HANDOVER = 0.05  # seconds of main-thread execute after which the helper takes over reading
IDLE_POLL = 0.5


class Call:
    """A reply (or a stream of replies) some thread or coroutine waits for."""

    __slots__ = ("items", "async_waiters", "finished")

    def __init__(self) -> None:
        self.items: collections.deque[Any] = collections.deque()
        self.async_waiters: list[Any] = []
        self.finished = False


def _resolve(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)


class Inbox:
    """Owns the read side of the channel; `dispatch` handles each message and returns it if it is a command.

    The idle main thread reads the next batch itself; a thread waiting for a BLS reply reads until it
    arrives; a helper thread reads when nobody else can (the main thread is in a long execute, or
    coroutines await replies). Messages one thread reads for another are handed over under one lock.
    """

    def __init__(self, channel: BlockingChannel, dispatch: Callable[[tuple[Any, ...]], Any], on_eof: Callable[[], None]) -> None:
        self._channel = channel
        self._dispatch = dispatch
        self._on_eof = on_eof
        # Taken directly (cheaper than the Condition's own enter/exit); both conditions share it, so waits
        # and notifies happen under it. On the per-message path it is taken as acquire() / try / finally
        # release(): a `with` statement costs ~1.1k instructions more (it binds __enter__ and __exit__).
        self._lock = lock = threading.Lock()
        self._cv = threading.Condition(lock)  # threads waiting for a command, a reply or the reading role
        self._helper_cv = threading.Condition(lock)  # only the helper: woken when coroutines need a reader
        self._reading = False
        self._waiting = 0  # threads in self._cv.wait(): without any, handing back the role needs no notify
        self._commands: collections.deque[tuple[Any, ...]] = collections.deque()
        self._async_waiting = 0
        self._busy_since: float | None = None

    # ------------------------------------------------------------ reading

    def _read_one(self) -> Any:
        """Read and dispatch one message (in order: the role is kept until it is dispatched)."""
        try:
            try:
                message = self._channel.receive()
            except (EOFError, OSError):
                self._on_eof()
                raise SystemExit(0) from None
            return self._dispatch(message)
        finally:
            self._lock.acquire()
            try:
                self._reading = False
                if self._waiting:
                    self._cv.notify_all()
            finally:
                self._lock.release()

    def next_command(self) -> tuple[Any, ...]:
        """The next command for the calling (main) thread, reading the channel itself when it can."""
        self._busy_since = None
        lock = self._lock
        while True:
            lock.acquire()
            try:
                while not self._commands and self._reading:
                    self._wait()
                if self._commands:
                    self._busy_since = time.monotonic()
                    return self._commands.popleft()
                self._reading = True
            finally:
                lock.release()
            command: tuple[Any, ...] | None = self._read_one()
            if command is not None:
                self._busy_since = time.monotonic()
                return command

    def _wait(self) -> None:
        """Wait on the condition (its lock held) for a notify."""
        self._waiting += 1
        try:
            self._cv.wait()
        finally:
            self._waiting -= 1

    def post_command(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._commands.append(message)
            if self._waiting:
                self._cv.notify_all()

    # ------------------------------------------------------------ replies

    def push(self, call: Call, item: Any) -> None:
        with self._lock:
            call.items.append(item)
            waiters, call.async_waiters = call.async_waiters, []
            if self._waiting:
                self._cv.notify_all()
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def wait(self, call: Call) -> Any:
        """Block until the call has an item, reading the channel meanwhile if nobody else is."""
        while True:
            with self._lock:
                while not call.items and self._reading:
                    self._wait()
                if call.items:
                    return call.items.popleft()
                self._reading = True
            command = self._read_one()
            if command is not None:
                self.post_command(command)

    async def wait_async(self, call: Call) -> Any:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if call.items:
                    return call.items.popleft()
                future = loop.create_future()
                call.async_waiters.append((loop, future))
                self._async_waiting += 1
                self._helper_cv.notify()  # someone must read for us
            try:
                await future
            finally:
                with self._lock:
                    self._async_waiting -= 1

    # ------------------------------------------------------------ helper reader

    def _helper_needed(self) -> bool:
        if self._async_waiting > 0:
            return True
        busy = self._busy_since
        return busy is not None and time.monotonic() - busy > BUSY_HANDOVER

    def start_helper(self) -> None:
        threading.Thread(target=self._helper, name="naiad-worker-reader", daemon=True).start()

    def _helper(self) -> None:
        while True:
            with self._lock:
                while self._reading or not self._helper_needed():
                    # Poll often only while the main thread is inside execute (idle workers stay quiet).
                    self._helper_cv.wait(BUSY_HANDOVER if self._busy_since is not None else IDLE_POLL)
                self._reading = True
            try:
                command = self._read_one()
            except SystemExit:
                return
            if command is not None:
                self.post_command(command)
