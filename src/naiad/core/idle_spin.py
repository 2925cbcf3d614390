"""A short busy-wait for the next request after the server's last one in flight is answered.

A closed-loop client sends its next request 0.1-0.3 ms after reading an answer (measured). When
the server has nothing else to do, its event loop sleeps in epoll meanwhile and the CPU goes idle;
the request then has to wake it (on a virtual machine an inter-processor interrupt and a wake-up of the
virtual CPU by the hypervisor), which costs more than the wait. Turning the loop over without sleeping
(zero-timeout polls) for a little while instead reads that request at once: see "Waiting for the next
request" in benchmarks/README.md.

Only while no request is in flight (a spin never takes the CPU from a model's worker busy with one),
for at most the spin's window after the last answer (--idle-spin-us), and yielding the CPU at every
turn to any other process ready to run on it (a client on the same CPU is not delayed). A spin that
ends without a request doubles how many idle moments are let by before the next one (1, 2, 4 ... up to
MAX_SKIP); one that sees a request halves it. So the server keeps spinning only while most of its
spins catch a request (a closed-loop client), and one whose requests come at random, mostly later
than the window, spins now and then.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

MAX_SKIP = 1024
SERVE_WINDOW_US = 500  # `naiad serve --idle-spin-us`'s default


class IdleSpin:
    """Started when the server's in-flight count drops to 0; `busy()` tells whether a request came."""

    def __init__(self, loop: asyncio.AbstractEventLoop, busy: Callable[[], bool], window_secs: float) -> None:
        self._loop = loop
        self._busy = busy
        self._window = window_secs
        self._spinning = False
        self._deadline = 0.0
        self._backoff = 0  # how many idle moments the last miss lets by
        self._skip = 0  # idle moments still to let by

    @property
    def spinning(self) -> bool:
        return self._spinning

    def start(self) -> None:
        """The server just became idle: spin for the next request (unless a recent miss says not to)."""
        if self._spinning:
            # a request came and went during the spin (answered in the turn that read it): a hit
            self._backoff //= 2
            self._deadline = time.perf_counter() + self._window
            return
        if self._skip:
            self._skip -= 1
            return
        self._spinning = True
        self._deadline = time.perf_counter() + self._window
        self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        if self._busy():
            self._spinning = False
            self._backoff //= 2
            return
        if time.perf_counter() < self._deadline:
            os.sched_yield()
            self._loop.call_soon(self._turn)  # a ready callback: the loop polls without sleeping
            return
        self._spinning = False
        self._backoff = min(max(1, 2 * self._backoff), MAX_SKIP)
        self._skip = self._backoff
