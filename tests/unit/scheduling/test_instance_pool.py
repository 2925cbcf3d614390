"""Instance pools (plain and rate-limited): a caller may wait for one particular instance."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from naiad.backends.base import InProcessRequestInstance
from naiad.runtime.thread_instance import InstancePool
from naiad.scheduling.rate_limiter import InstanceLimits, RateLimiter


class Inst(InProcessRequestInstance):
    def __init__(self, name: str) -> None:
        self.name = name

    def execute_requests(self, requests):  # request-level: the pool needs no thread for it
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


def _plain(instances: list) -> InstancePool:
    return InstancePool(instances)


def _limited(instances: list) -> InstancePool:
    return RateLimiter("execution_count").pool(instances, [InstanceLimits()] * len(instances))


POOLS: dict[str, Callable[[list], InstancePool]] = {"plain": _plain, "rate_limited": _limited}


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_a_caller_waiting_for_its_instance_is_not_given_another(kind: str) -> None:
    async def body() -> None:
        first, second = Inst("m_0"), Inst("m_1")
        pool = POOLS[kind]([first, second])
        assert pool.try_acquire(first) is first
        waiting = asyncio.ensure_future(pool.acquire(first))
        await _settle()
        assert not waiting.done(), "the other instance is idle, but it is not the one asked for"
        assert pool.try_acquire(first) is None
        assert pool.try_acquire() is second  # anyone else may still take the other one
        pool.release(second)
        await _settle()
        assert not waiting.done()
        pool.release(first)
        assert await asyncio.wait_for(waiting, 5) is first
        pool.release(first)
        assert {pool.try_acquire(), pool.try_acquire()} == {first, second}

    asyncio.run(body())


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_a_cancelled_waiter_is_skipped_and_the_instance_goes_to_the_next(kind: str) -> None:
    async def body() -> None:
        only = Inst("m_0")
        pool = POOLS[kind]([only])
        assert await pool.acquire() is only
        gone = asyncio.ensure_future(pool.acquire(only))
        served = asyncio.ensure_future(pool.acquire())
        await _settle()
        gone.cancel()
        pool.release(only)  # before the cancelled waiter could withdraw itself
        assert await asyncio.wait_for(served, 5) is only
        with pytest.raises(asyncio.CancelledError):
            await gone
        pool.release(only)
        assert pool.try_acquire(only) is only

    asyncio.run(body())


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_waiters_that_withdrew_leave_the_instances_to_anyone(kind: str) -> None:
    async def body() -> None:
        first, second = Inst("m_0"), Inst("m_1")
        pool = POOLS[kind]([first, second])
        assert {pool.try_acquire(), pool.try_acquire()} == {first, second}
        waiting = [asyncio.ensure_future(pool.acquire()), asyncio.ensure_future(pool.acquire(first))]
        await _settle()
        for waiter in waiting:
            waiter.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert pool.try_acquire() is None  # both are still busy
        pool.release(first)
        pool.release(second)
        # nobody waits any more: both are idle, for any caller and for the one asking for `first`
        assert pool.try_acquire(first) is first
        assert pool.try_acquire() is second
        served = asyncio.ensure_future(pool.acquire())
        await _settle()
        pool.release(first)
        assert await asyncio.wait_for(served, 5) is first

    asyncio.run(body())


class Pipelined(Inst):
    """An instance that takes `room` executions at once (a Python model's worker with room in its pipeline)."""

    def __init__(self, name: str, room: int) -> None:
        super().__init__(name)
        self.room = room

    def takes_at_once(self) -> int:
        return self.room


async def _released_while_waited_for(instance: Inst, callers: int) -> tuple[InstancePool, list[asyncio.Future]]:
    """A pool of `instance`, held while `callers` wait for any instance, then released once."""
    pool = InstancePool([instance])
    assert pool.try_acquire() is instance
    waiting = [asyncio.ensure_future(pool.acquire()) for _ in range(callers)]
    await _settle()
    pool.release(instance)
    await _settle()
    return pool, waiting


def test_a_released_instance_goes_to_as_many_waiters_as_it_takes_at_once_and_is_idle_after_the_last() -> None:
    async def body() -> None:
        worker = Pipelined("m_0", room=3)
        pool, waiting = await _released_while_waited_for(worker, 5)
        # three waiters got it in one go (one hand-over, one turn of the loop), in the order they came
        assert [w.done() for w in waiting] == [True, True, True, False, False]
        assert all(w.result() is worker for w in waiting[:3])
        pool.release(worker)
        pool.release(worker)
        await _settle()
        assert not waiting[3].done(), "one holder still has it"
        worker.room = 1
        pool.release(worker)  # the last holder: the next waiter, alone now (the instance takes one)
        assert await asyncio.wait_for(waiting[3], 5) is worker
        await _settle()
        assert not waiting[4].done()
        pool.release(worker)
        assert await asyncio.wait_for(waiting[4], 5) is worker
        pool.release(worker)
        assert pool.try_acquire() is worker  # idle again: nobody holds it

    asyncio.run(body())


def test_a_cancelled_caller_among_those_handed_the_instance_at_once_gives_back_only_its_share() -> None:
    async def body() -> None:
        worker = Pipelined("m_0", room=2)
        pool = InstancePool([worker])
        assert pool.try_acquire() is worker
        kept, gone = asyncio.ensure_future(pool.acquire()), asyncio.ensure_future(pool.acquire())
        await _settle()
        pool.release(worker)  # both are handed it
        gone.cancel()  # before its caller ran: acquire() gives its share back
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert await asyncio.wait_for(kept, 5) is worker
        assert pool.try_acquire() is None, "the caller still running holds it"
        pool.release(worker)
        assert pool.try_acquire() is worker

    asyncio.run(body())


def test_an_instance_taking_one_at_a_time_goes_to_one_waiter_at_a_time() -> None:
    async def body() -> None:
        only = Inst("m_0")  # takes_at_once() == 1, as every instance but a pipelined worker
        _, waiting = await _released_while_waited_for(only, 3)
        assert [w.done() for w in waiting] == [True, False, False]

    asyncio.run(body())
