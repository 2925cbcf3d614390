"""PreciseTimer: sub-millisecond deadlines on the event loop, O(log n) schedule, O(1) cancel."""

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from naiad.runtime.precise_timer import PreciseTimer
from tests.support.timing import quietest_median

LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}


def _run(loop_name: str, body: Callable[[], Awaitable[object]]) -> object:
    return LOOPS[loop_name](body())


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_half_millisecond_timers_fire_on_time(loop_name: str) -> None:
    async def body() -> list[int]:
        timer = PreciseTimer()
        assert timer.precise  # Linux: a timerfd
        waits = []
        try:
            for _ in range(200):
                start = time.monotonic_ns()
                await timer.sleep_ns(500_000)
                waits.append(time.monotonic_ns() - start)
        finally:
            timer.close()
        return waits

    waits = _run(loop_name, body)
    assert min(waits) >= 500_000  # never early
    # The loop's own timers round to milliseconds (asyncio: >= 1 ms, uvloop: 0 ms).
    assert quietest_median(waits) < 750_000


def test_callbacks_run_in_deadline_order_and_cancelled_ones_never() -> None:
    async def body() -> tuple[list[int], list[int]]:
        timer = PreciseTimer()
        ran: list[int] = []
        delays = (5, 1, 4, 2, 3)
        handles = [timer.call_later_ns(delay * 100_000, ran.append, delay) for delay in delays]
        handles[2].cancel()  # the 4
        handles[2].cancel()  # idempotent
        assert len(timer) == 4
        await timer.sleep_ns(1_000_000)
        assert len(timer) == 0
        timer.close()
        # Deadline order: on a loaded machine the calls above may be far enough apart to change it.
        by_deadline = [d for d, h in sorted(zip(delays, handles), key=lambda pair: pair[1].deadline_ns) if d != 4]
        return ran, by_deadline

    ran, by_deadline = asyncio.run(body())
    assert ran == by_deadline and sorted(ran) == [1, 2, 3, 5]


def test_cancel_is_constant_time_and_the_heap_stays_bounded() -> None:
    async def body() -> None:
        timer = PreciseTimer()
        keep = timer.call_later_ns(60_000_000_000, lambda: None)
        handles = [timer.call_later_ns(30_000_000_000 + i, lambda: None) for i in range(1000)]
        handles[500].cancel()  # lazy: a flag, the heap is not searched or rebuilt
        assert len(timer._heap) == 1001 and len(timer) == 1000
        for handle in handles:
            handle.cancel()
        # Cancelled entries are dropped once they outnumber the live ones: memory stays bounded
        # under a stream of scheduled-then-cancelled timeouts that never reach their deadline.
        assert len(timer) == 1 and len(timer._heap) < 200
        for i in range(20_000):
            timer.call_later_ns(30_000_000_000 + i, lambda: None).cancel()
        assert len(timer) == 1 and len(timer._heap) < 200
        keep.cancel()
        timer.close()

    asyncio.run(body())


def test_a_callback_may_schedule_and_cancel_timers() -> None:
    async def body() -> list[str]:
        timer = PreciseTimer()
        ran: list[str] = []
        done = asyncio.get_running_loop().create_future()
        later = timer.call_later_ns(300_000, ran.append, "cancelled by first")

        def second() -> None:
            ran.append("scheduled by first")
            done.set_result(None)

        def first() -> None:
            ran.append("first")
            later.cancel()
            timer.call_later_ns(100_000, second)

        timer.call_later_ns(100_000, first)
        await asyncio.wait_for(done, 10)
        await asyncio.sleep(0.01)  # past the cancelled one's deadline
        timer.close()
        return ran

    assert asyncio.run(body()) == ["first", "scheduled by first"]


def test_close_drops_pending_timers() -> None:
    async def body() -> list[int]:
        timer = PreciseTimer()
        ran: list[int] = []
        handles = [timer.call_later_ns(100_000, ran.append, i) for i in range(200)]
        timer.close()
        handles[0].cancel()  # after close: a no-op
        assert len(timer) == 0 and all(handle.cancelled for handle in handles)
        await asyncio.sleep(0.005)
        return ran

    assert asyncio.run(body()) == []


def test_a_failing_callback_does_not_stop_the_others() -> None:
    async def body() -> tuple[list[str], list[object]]:
        loop = asyncio.get_running_loop()
        errors: list[object] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context.get("exception")))
        timer = PreciseTimer()
        ran: list[str] = []

        def fail() -> None:
            raise RuntimeError("boom")

        timer.call_later_ns(100_000, fail)
        timer.call_later_ns(100_000, ran.append, "same deadline")
        timer.call_later_ns(400_000, ran.append, "later")
        await asyncio.sleep(0.05)  # the loop's timer: this one does not depend on the timer under test
        timer.close()
        return ran, errors

    ran, errors = asyncio.run(body())
    assert ran == ["same deadline", "later"]
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)


def test_a_callback_may_close_the_timer() -> None:
    async def body() -> tuple[list[int], int]:
        timer = PreciseTimer()
        ran: list[int] = []
        timer.call_later_ns(100_000, timer.close)
        for i in range(100):
            timer.call_later_ns(100_000, ran.append, i)
        await asyncio.sleep(0.02)
        return ran, len(timer)

    assert asyncio.run(body()) == ([], 0)
