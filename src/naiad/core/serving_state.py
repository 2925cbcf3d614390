"""Whether the server takes requests, and how many it is answering (what draining waits for)."""

from __future__ import annotations

import asyncio

from naiad.core.idle_spin import IdleSpin
from naiad.protocol.errors import unavailable


class ServingState:
    """Owned by the Server (which starts and stops it); read by the inference and control services."""

    def __init__(self) -> None:
        self.live = False  # startup finished, shutdown not finished
        # The event loop the server serves on, set as start-up begins: requests make their futures
        # on it, where asking for the running loop costs a system call each time (getpid, Python 3.11).
        self.loop: asyncio.AbstractEventLoop | None = None
        self.exiting = False  # shutdown began: new requests are refused
        self.inflight = 0
        # Futures of wait_idle() callers, resolved when inflight drops to 0 (request_done): nothing per
        # request while nobody waits, where an Event was cleared and set around every lone request.
        self.idle_waiters: list[asyncio.Future[None]] = []
        self.idle_spin: IdleSpin | None = None  # made by Server.startup() unless --idle-spin-us is 0

    def check_serving(self) -> None:
        if self.exiting or not self.live:
            raise unavailable("Server not ready")

    async def wait_idle(self) -> None:
        """Return once no request is in flight."""
        while self.inflight:
            waiter = asyncio.get_running_loop().create_future()
            self.idle_waiters.append(waiter)
            await waiter

    def request_done(self) -> None:
        """One request left: when it was the last one in flight, poll for the next one (IdleSpin) and wake
        whoever waits in wait_idle()."""
        self.inflight -= 1
        if not self.inflight:
            if self.idle_spin is not None:
                self.idle_spin.start()
            if self.idle_waiters:
                waiters, self.idle_waiters = self.idle_waiters, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
