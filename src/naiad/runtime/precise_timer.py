"""Sub-millisecond timers for an event loop: one Linux timerfd watched by the loop, plus a heap.

asyncio and uvloop round timer deadlines to whole milliseconds (epoll_wait and libuv take their
timeout in ms): a 500 us delay fired ~580 us late on asyncio, and at once on uvloop (0.5 ms rounds
down to 0), which left the caller polling until due. A timerfd armed at an absolute
CLOCK_MONOTONIC deadline makes the loop's poll return when it expires; it is set 50 us early and
the loop's next turns poll the rest, because a thread woken from epoll_wait on a busy machine
runs 30-40 us after the expiry.

Why a timerfd and not a timer thread that calls loop.call_soon_threadsafe: measured on the same
two-core machine (1,000 timers of 500 us, one at a time, asyncio and uvloop), the timerfd fired a
median of 1 us late (p99 19-30 us) for ~50 us of CPU per timer; the thread fired 86-90 us late
(p99 124-136 us, milliseconds when the machine is loaded) for 42-52 us: it must win the GIL from
the loop thread (up to the 5 ms switch interval while the loop runs Python) and wakes the loop
through its self-pipe, two thread switches per timer. Where timerfd is missing (not Linux) the
loop's own timers are used.

Schedule is O(log n) (a heap push), cancel is O(1) (a flag; cancelled entries are dropped when
they reach the top of the heap, or all at once when they outnumber the live ones).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import os
import time
from collections.abc import Callable
from typing import Any

_CLOCK_MONOTONIC = 1  # time.monotonic_ns() reads this clock on Linux
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1
# The timerfd is set this much before the deadline and the loop polls the rest on its next turns:
# a thread woken from epoll_wait on a busy machine runs 30-40 us after the expiry, a polling
# loop within a few microseconds. Polling costs at most this much CPU per wake-up.
_EARLY_NS = 50_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _TimerFd:
    """A non-blocking CLOCK_MONOTONIC timerfd, armed at absolute deadlines (via libc: os.timerfd_* needs 3.13)."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._settime = libc.timerfd_settime
        self.fd = int(libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self._spec = _Itimerspec()

    def arm(self, deadline_ns: int) -> None:
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(max(deadline_ns, 1), 1_000_000_000)
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

    def drain(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:  # re-armed after it fired: nothing to read, nothing lost
            pass

    def close(self) -> None:
        os.close(self.fd)


def _open_timerfd() -> _TimerFd | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        if not hasattr(libc, "timerfd_create"):
            return None
        return _TimerFd(libc)
    except OSError:
        return None


class TimerHandle:
    """A scheduled callback; cancel() is O(1) and idempotent."""

    __slots__ = ("deadline_ns", "_callback", "_args", "_owner", "cancelled")

    def __init__(self, deadline_ns: int, callback: Callable[..., object], args: tuple[Any, ...], owner: PreciseTimer) -> None:
        self.deadline_ns = deadline_ns
        self._callback = callback
        self._args = args
        self._owner: PreciseTimer | None = owner
        self.cancelled = False

    def cancel(self) -> None:
        owner = self._owner
        if owner is None:  # already run or cancelled
            return
        self._owner = None
        self.cancelled = True
        owner._cancelled += 1
        if owner._cancelled > 64 and owner._cancelled * 2 > len(owner._heap):
            owner._compact()

    def _detach(self) -> None:
        """Its timer closed: it will never run."""
        self._owner = None
        self.cancelled = True

    def _run(self) -> None:
        self._owner = None
        self._callback(*self._args)

    def __lt__(self, other: TimerHandle) -> bool:
        return self.deadline_ns < other.deadline_ns


class PreciseTimer:
    """Callbacks at sub-millisecond deadlines on one event loop (its owner closes it).

    Use it from the loop's thread only, like the loop's own call_later.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._heap: list[TimerHandle] = []
        self._cancelled = 0  # cancelled handles still in the heap
        self._armed_ns = 0  # deadline the timerfd is set to (0: disarmed)
        self._fallback: asyncio.TimerHandle | None = None
        self._poll: asyncio.Handle | None = None  # the loop's next turn checks the heap again
        self._timerfd = _open_timerfd()
        if self._timerfd is not None:
            self._loop.add_reader(self._timerfd.fd, self._expired)

    @property
    def precise(self) -> bool:
        """True when backed by a timerfd (sub-millisecond), False on the loop's millisecond timers."""
        return self._timerfd is not None

    def call_later_ns(self, delay_ns: int, callback: Callable[..., object], *args: Any) -> TimerHandle:
        """Run callback(*args) on the loop once delay_ns has passed."""
        handle = TimerHandle(time.monotonic_ns() + delay_ns, callback, args, self)
        heapq.heappush(self._heap, handle)
        if self._heap[0] is handle:
            self._arm(handle.deadline_ns)
        return handle

    async def sleep_ns(self, delay_ns: int) -> None:
        """Sleep for delay_ns with sub-millisecond precision."""
        future: asyncio.Future[None] = self._loop.create_future()
        handle = self.call_later_ns(delay_ns, _resolve, future)
        try:
            await future
        finally:
            handle.cancel()

    def __len__(self) -> int:
        """Live (not cancelled, not yet run) timers."""
        return len(self._heap) - self._cancelled

    def _arm(self, deadline_ns: int) -> None:
        if self._armed_ns and self._armed_ns <= deadline_ns:
            return  # an earlier wake-up is already set; it re-arms for the rest
        self._armed_ns = deadline_ns
        if self._timerfd is not None:
            self._timerfd.arm(deadline_ns - _EARLY_NS)
            return
        if self._fallback is not None:
            self._fallback.cancel()
        self._fallback = self._loop.call_later(max(deadline_ns - time.monotonic_ns(), 0) / 1e9, self._fired)

    def _expired(self) -> None:
        if self._timerfd is not None:
            self._timerfd.drain()
        self._fired()

    def _fired(self) -> None:
        self._armed_ns = 0
        self._fallback = None
        now = time.monotonic_ns()
        # self._heap, not a local: a callback may close the timer (which replaces the heap).
        while self._heap and (self._heap[0].cancelled or self._heap[0].deadline_ns <= now):
            handle = heapq.heappop(self._heap)
            if handle.cancelled:
                self._cancelled -= 1
                continue
            try:
                handle._run()
            except Exception as exc:  # one failing callback must not strand the timers after it
                self._loop.call_exception_handler({"message": "timer callback failed", "exception": exc})
        if not self._heap:
            return
        next_ns = self._heap[0].deadline_ns
        if self._timerfd is not None and next_ns - time.monotonic_ns() <= _EARLY_NS:
            self._armed_ns = next_ns  # woken early on purpose: poll until it is due
            if self._poll is None:
                self._poll = self._loop.call_soon(self._polled)
        else:
            self._arm(next_ns)

    def _polled(self) -> None:
        self._poll = None
        self._fired()

    def _compact(self) -> None:
        """Drop cancelled handles when they are the majority (amortised O(1) per cancel)."""
        self._heap[:] = [handle for handle in self._heap if not handle.cancelled]
        heapq.heapify(self._heap)
        self._cancelled = 0

    def close(self) -> None:
        """Drop every pending timer and release the timerfd."""
        heap, self._heap = self._heap, []
        self._cancelled = 0
        for handle in heap:
            handle._detach()
        for pending in (self._fallback, self._poll):
            if pending is not None:
                pending.cancel()
        self._fallback = self._poll = None
        if self._timerfd is not None:
            self._loop.remove_reader(self._timerfd.fd)
            self._timerfd.close()
            self._timerfd = None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
